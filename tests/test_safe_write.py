"""write_file and patch replace files safely: modes kept, links kept, planted links and pipes left alone."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_tools import handle_function_call as call


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.mark.parametrize("kept", [0o600, 0o755, 0o640])
def test_write_file_and_patch_keep_the_files_mode_and_a_new_file_gets_the_usual_one(
    tmp_path: Path, kept: int, umask_022: None
) -> None:
    target = tmp_path / "script.sh"
    target.write_text("echo one\n")
    target.chmod(kept)
    assert call("write_file", {"path": "script.sh", "content": "echo two\n"}).startswith("wrote")
    assert mode(target) == kept
    assert call("patch", {"path": "script.sh", "old": "two", "new": "three"}).startswith("---")
    assert mode(target) == kept and target.read_text() == "echo three\n"
    call("write_file", {"path": "new.txt", "content": "hi"})
    assert mode(tmp_path / "new.txt") == 0o644


def test_a_link_planted_at_the_old_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "f.txt").write_text("before\n")
    (tmp_path / ".f.txt.mibyan-tmp").symlink_to(victim)
    call("write_file", {"path": "f.txt", "content": "after\n"})
    call("patch", {"path": "f.txt", "old": "after", "new": "later"})
    assert victim.read_text() == "keep me\n" and (tmp_path / "f.txt").read_text() == "later\n"
    assert not (tmp_path / "f.txt").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".f.txt.mibyan-tmp", "f.txt", "victim"]


def test_writing_onto_a_folder_is_an_error_for_the_model(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert call("write_file", {"path": "d", "content": "x"}).startswith("error: d is a directory")


def test_a_pipe_is_not_replaced_read_or_searched(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert "not a regular file" in call("write_file", {"path": "pipe", "content": "x"})
    assert stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode)
    assert "not a regular file" in call("read_file", {"path": "pipe"})  # and reading it does not block
    (tmp_path / "a.txt").write_text("needle\n")
    assert call("search_files", {"pattern": "needle"}).endswith("a.txt:1:needle")

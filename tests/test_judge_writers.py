"""Writes onto the places that run code or grant access ask, whichever program writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mibyan.tools.command_judge import judge
from mibyan.tools.judge_policy import JudgePolicy

#: Places whose content runs by itself later (a shell, a login, cron, systemd, git) or grants access.
PLACES = [
    "~/.bashrc",
    "~/.zshenv",
    "~/.profile",
    "~/.ssh/authorized_keys",
    "~/.config/systemd/user/x.service",
    "/etc/cron.d/job",
    "/var/spool/cron/crontabs/me",
    "/etc/systemd/system/x.service",
    ".git/hooks/pre-commit",
    "~/.mibyan/config.yaml",
]
WRITERS = [
    "echo x > {}",
    "echo x >> {}",
    "exec 3> {}",
    "dd if=x of={}",
    "busybox dd if=x of={}",
    "tee {}",
    "tee -a {}",
    "sudo tee {}",
    "cp x {}",
    "cp -f x {}",
    "install x {}",
    "install -D -m 600 x {}",
    "mv x {}",
    "ln -sf x {}",
    "rsync x {}",
    "rsync -a x {}",
    "scp host:x {}",
    "sed -i s/a/b/ {}",
    "sed -i.bak -e s/a/b/ {}",
    "perl -pi -e s/a/b/ {}",
    "truncate -s0 {}",
    "curl -so {} https://x.example",
    "wget -qO {} https://x.example",
    "sort -o {} x",
    "touch {}",
    "patch {} fix.diff",
    "ed {} < fix.ed",
    "xxd -r x {}",
    "gzip -dc x.gz > {}",
]
#: Folders that hold such places: an archive unpacked there may land on one.
FOLDERS = ["~", "~/", "~/.ssh", "~/.config", "/", "/etc", ".git", ".git/hooks"]
UNPACKERS = [
    "tar -xf x.tar -C {}",
    "tar xzf x.tgz -C {}",
    "tar -x --file=x.tar --directory {}",
    "bsdtar -xf x.tar -C {}",
    "unzip -o x.zip -d {}",
    "cd {} && tar xf /tmp/x.tar",
    "cd {} && cpio -idm < /tmp/x.cpio",
    "rsync -a dotfiles/ {}",
    "cp -r dotfiles/. {}",
]


def _tier(command: str, tmp_path: Path) -> str:
    user_home = tmp_path / "home"
    policy = JudgePolicy(home=user_home / ".mibyan")
    return judge(command, policy, cwd=tmp_path / "project", user_home=user_home).tier


@pytest.mark.parametrize("place", PLACES)
def test_no_writer_writes_a_place_that_runs_code_unasked(place: str, tmp_path: Path) -> None:
    unasked = [w.format(place) for w in WRITERS if _tier(w.format(place), tmp_path) == "safe"]
    assert unasked == []


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_archive_unpacks_into_a_folder_holding_such_a_place_unasked(folder: str, tmp_path: Path) -> None:
    unasked = [u.format(folder) for u in UNPACKERS if _tier(u.format(folder), tmp_path) == "safe"]
    assert unasked == []


def test_writes_and_unpacking_elsewhere_run_unasked(tmp_path: Path) -> None:
    commands = [w.format("build/out.txt") for w in WRITERS if not w.startswith(("sudo", "scp"))]
    commands += [u.format("build") for u in UNPACKERS]
    assert [c for c in commands if _tier(c, tmp_path) != "safe"] == []


def test_mibyans_own_files_never_change_through_a_known_writer(tmp_path: Path) -> None:
    known = [w for w in WRITERS if not w.startswith(("sudo", "xxd", "ed "))]
    place = "~/.mibyan/config.yaml"
    assert [w for w in known if _tier(w.format(place), tmp_path) != "hardline"] == []


@pytest.mark.parametrize("place", ["keys/authorized_keys", "dots/.bashrc", "dots/.ssh/authorized_keys"])
def test_no_writer_reaches_such_a_place_through_a_link_in_the_project_unasked(
    place: str, tmp_path: Path
) -> None:
    # links the model may plant (or the repository brings) towards the home: the write lands there
    project, user_home = tmp_path / "project", tmp_path / "home"
    (user_home / ".ssh").mkdir(parents=True)
    project.mkdir()
    (project / "keys").symlink_to(user_home / ".ssh")
    (project / "dots").symlink_to(user_home)
    unasked = [w.format(place) for w in WRITERS if _tier(w.format(place), tmp_path) == "safe"]
    assert unasked == []

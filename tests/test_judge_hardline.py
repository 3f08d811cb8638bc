"""The hardline list of the README never runs, whatever carries it: a wrapper the judge has no rule for, a
shell, a `-c` string, `eval`, a pipe into a shell or an interpreter, a script on disk."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from mibyan.tools.command_judge import judge
from mibyan.tools.judge_policy import JudgePolicy

#: The README's list, one command or more per line of it.
HARDLINE = [
    "rm -rf /",  # deleting the root, the home or a system folder
    "rm -rf ~",
    "rm -rf /usr",
    "find / -delete",
    "mv ~ /tmp/old",  # ... or moving it away, or emptying it
    "rsync -a --delete empty/ ~/",
    "dd if=/dev/zero of=/dev/sda",  # writing to a disk device
    "shred /dev/nvme0n1",
    "mkfs.ext4 /dev/sda1",  # formatting
    "wipefs -a /dev/sda",
    "shutdown -h now",  # shutting the machine down
    "systemctl reboot",
    "kill -9 -1",  # killing every process
    "pkill -u me",
]
SHELL_ONLY = [":(){ :|:& };:", "cat disk.img > /dev/sda"]  # a fork bomb; a redirection onto a disk

#: Wrappers the judge has no spec for: each runs the command after its own options.
UNLISTED_WRAPPERS = [
    "chrt -f 1 {}",
    "setarch x86_64 {}",
    "setarch x86_64 -R {}",
    "numactl --cpunodebind=0 {}",
    "prlimit --nofile=1024 {}",
    "cgexec -g cpu:batch {}",
    "eatmydata {}",
    "faketime 2020-01-01 {}",
    "proxychains4 -q {}",
    "mywrapper --level 3 -- {}",
    "nohup chrt -f 1 nice {}",
    "mywrapper --run={}",
    "runuser -u me -- {}",
]
CARRIERS = [
    "bash -c {quoted}",
    "sh -lc {quoted}",
    "eval {quoted}",
    "echo {quoted} | bash",
    "bash <<< {quoted}",
    "chrt -f 1 bash -c {quoted}",
    "setarch x86_64 sh -c {quoted}",
    "echo {python} | python3",
    "python3 -c {python}",
    "chrt -f 1 python3 -c {python}",
    "tmux new-session -d {quoted}",
    "sg staff -c {quoted}",
    "at now <<< {quoted}",
    "echo {quoted} | at midnight",
]


def _tier(command: str, tmp_path: Path) -> str:
    user_home = tmp_path / "home"
    (tmp_path / "project").mkdir(exist_ok=True)
    policy = JudgePolicy(home=user_home / ".mibyan")
    return judge(command, policy, cwd=tmp_path / "project", user_home=user_home).tier


def _carried(carrier: str, command: str) -> str:
    python = shlex.quote(f"import os; os.system({command!r})")
    return carrier.format(quoted=shlex.quote(command), python=python)


@pytest.mark.parametrize("command", HARDLINE)
def test_no_unlisted_wrapper_makes_a_hardline_command_run(command: str, tmp_path: Path) -> None:
    ran = [w.format(command) for w in UNLISTED_WRAPPERS if _tier(w.format(command), tmp_path) != "hardline"]
    assert ran == []


@pytest.mark.parametrize("command", HARDLINE + SHELL_ONLY)
def test_no_shell_string_pipe_or_interpreter_makes_a_hardline_command_run(
    command: str, tmp_path: Path
) -> None:
    carried = [_carried(c, command) for c in CARRIERS]
    assert [c for c in carried if _tier(c, tmp_path) != "hardline"] == []


@pytest.mark.parametrize("command", HARDLINE + SHELL_ONLY)
def test_no_script_on_disk_makes_a_hardline_command_run(command: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "x.sh").write_text(f"#!/bin/sh\nset -e\n{command}\n")
    (project / "x.sh").chmod(0o755)
    (project / "x.py").write_text(f"import os\nos.system({command!r})\n")
    runs = ["bash x.sh", "./x.sh", "chrt -f 1 ./x.sh", "setarch x86_64 sh x.sh", "python3 x.py"]
    assert [r for r in runs if _tier(r, tmp_path) != "hardline"] == []


@pytest.mark.parametrize(
    "command",
    [
        "chrt -f 1 make test",
        "setarch x86_64 ls -la",
        "apt-get install -y python3 git",
        "docker run --rm alpine ls -la",
        "python3 -c 'print(\"shutil.rmtree\")'",
        "python3 -c 'print(\"rm -rf /\")'",
        "node -e 'console.log(\"rmSync\")'",
        'python3 -c \'open("out.txt", "w").write("x")\'',
    ],
)
def test_what_merely_looks_alike_runs_unasked(command: str, tmp_path: Path) -> None:
    assert _tier(command, tmp_path) == "safe"


@pytest.mark.parametrize(
    "command",
    [
        'python3 -c \'open(".git/hooks/pre-commit", "w").write("x")\'',
        "chrt -f 1 rm -r build",
        "python3 -c 'import shutil; shutil.rmtree(\"build\")'",
    ],
)
def test_what_inline_code_or_an_unlisted_wrapper_writes_or_deletes_asks(command: str, tmp_path: Path) -> None:
    assert _tier(command, tmp_path) == "dangerous"


def test_a_computed_word_that_may_be_a_known_program_is_read_as_the_command_it_may_run(
    tmp_path: Path,
) -> None:
    assert _tier('mywrapper "$(echo rm)" -rf /', tmp_path) == "hardline"


def test_deleting_through_a_link_in_the_project_to_the_root_or_the_home_is_hardline(tmp_path: Path) -> None:
    project, user_home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    user_home.mkdir()
    (project / "dots").symlink_to(user_home)
    (project / "top").symlink_to("/")
    policy = JudgePolicy(home=user_home / ".mibyan")

    def tier(command: str) -> str:
        return judge(command, policy, cwd=project, user_home=user_home).tier

    followed = ["rm -rf dots/", "rm -rf dots/*", "rm -rf top/", "rm -rf top/*", "find dots/ -delete"]
    assert [c for c in followed if tier(c) != "hardline"] == []
    # without the slash only the link itself goes: asked about, as any rm -r is, not refused
    assert [tier("rm -rf dots"), tier("rm -rf top")] == ["dangerous", "dangerous"]

"""The judge's table of programs: every spec's examples, judged as they are written beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mibyan.tools.command_judge import judge
from mibyan.tools.command_rules import SPECS
from mibyan.tools.command_spec import Spec
from mibyan.tools.judge_policy import JudgePolicy


def _judged(command: str, tmp_path: Path) -> str:
    user_home = tmp_path / "home"
    policy = JudgePolicy(home=user_home / ".mibyan")
    return judge(command, policy, cwd=tmp_path / "project", user_home=user_home).tier


def _name(program: Spec) -> str:
    return program.names[0]


def test_every_spec_carries_examples_of_what_it_catches() -> None:
    bare = [_name(p) for p in SPECS if not p.should_match]
    assert bare == []


@pytest.mark.parametrize("program", SPECS, ids=_name)
def test_every_spec_judges_its_examples_as_written_beside_it(program: Spec, tmp_path: Path) -> None:
    wrong = [
        (command, tier, judged)
        for command, tier in program.should_match
        if (judged := _judged(command, tmp_path)) != tier
    ]
    wrong += [
        (command, "safe", judged)
        for command in program.should_not_match
        if (judged := _judged(command, tmp_path)) != "safe"
    ]
    assert wrong == []

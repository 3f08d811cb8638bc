"""The judge through its contract: grants never widen, no wrapping makes a dangerous command safe, and
the agent never runs what the judge refuses."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import Reply, ScriptedServer

from mibyan.tools.approval import ApprovalPolicy, ApprovalRequest, classify_command

# -- grants never widen --------------------------------------------------------------------------------


def _policy(always: list[str], asked: list[str]) -> ApprovalPolicy:
    return ApprovalPolicy(
        ask=lambda command, reason: asked.append(command) or "deny",
        yolo=False,
        always=always,
        timeout=5,
        save_always=lambda key: None,
    )


def _terminal(command: str) -> ApprovalRequest:
    """The question a terminal call of `command` asks."""
    return ApprovalRequest("call_1", "terminal", command, classify_command(command))


@pytest.mark.parametrize("command", ["$a -rf x", "a=rm; $a -rf x", "$(echo rm) -rf x", "/bin/r? -r x"])
def test_an_always_grant_of_rm_recursive_does_not_cover_computed_names(command: str) -> None:
    asked: list[str] = []
    policy = _policy(["rm_recursive"], asked)
    assert policy.decide(_terminal("rm -r x"))[0]
    allowed, _ = policy.decide(_terminal(command))
    assert not allowed and asked == [command]


def test_a_command_of_two_kinds_needs_both_approved() -> None:
    command = "rm -r build; git push --force"
    asked: list[str] = []
    assert not _policy(["rm_recursive"], asked).decide(_terminal(command))[0]
    assert _policy(["rm_recursive", "git_force_push"], []).decide(_terminal(command))[0]


def test_sudo_is_its_own_kind() -> None:
    asked: list[str] = []
    allowed, _ = _policy(["rm_recursive"], asked).decide(_terminal("sudo rm -r x"))
    assert not allowed and asked


# -- composition: no wrapping makes a dangerous command safe ------------------------------------------

_CORES = [
    "rm -rf /",
    "rm -rf ~",
    "rm -r build",
    "mkfs.ext4 /dev/sda1",
    "dd if=/dev/zero of=/dev/sda",
    "git push --force",
    "find . -delete",
    "chmod -R 777 /",
    "shutdown -h now",
    "kill -9 -1",
    "git reset --hard",
    "echo x > ~/.bashrc",
]
_NAME_SPELLINGS = [
    lambda n: n,
    lambda n: f"'{n}'",
    lambda n: f'"{n}"',
    lambda n: "\\" + n,
    lambda n: n[0] + "''" + n[1:],
    lambda n: "$'" + "".join(f"\\x{ord(c):02x}" for c in n) + "'",
    lambda n: f"$(echo {n})",
    lambda n: f"`echo {n}`",
    lambda n: "/usr/bin/" + n,
]
_WRAPPERS = ["", "sudo ", "nice -n 5 ", "env X=1 ", "timeout 5 ", "nohup ", "command ", "busybox ", "time "]
_CONTEXTS = [
    lambda c: c,
    lambda c: f"echo $( {c} )",
    lambda c: "echo `" + c.replace("\\", "\\\\").replace("`", "\\`") + "`",
    lambda c: f"bash -c {shlex.quote(c)}",
    lambda c: f"sh -lc {shlex.quote(c)}",
    lambda c: f"eval {shlex.quote(c)}",
    lambda c: f"echo {shlex.quote(c)} | sh",
    lambda c: f"sh <<'E{len(c)}'\n{c}\nE{len(c)}",  # bash ends a heredoc at its first delimiter line
    lambda c: f"bash <<< {shlex.quote(c)}",
    lambda c: f"{{ {c}; }}",
    lambda c: f"( {c} )",
    lambda c: f"true && {c}",
    lambda c: f"false || {c}",
    lambda c: f"ls; {c}",
    lambda c: f"f() {{ {c}; }}; f",
    lambda c: f"if true; then {c}; fi",
    lambda c: f"for i in 1; do {c}; done",
    lambda c: f"x=$( {c} )",
    lambda c: f"cat <({c})",
    lambda c: f"{c} & wait",
    lambda c: f'c={shlex.quote(c)}; echo "$c" | sh',
    lambda c: f'c={shlex.quote(c)}; bash -c "$c"',
    lambda c: f'c={shlex.quote(c)}; eval "$c"',
    lambda c: f"printf '%s\\n' {shlex.quote(c)} > run.sh; sh run.sh",
]


@settings(max_examples=300, deadline=None, database=None)  # no example files in the checkout
@given(
    core=st.sampled_from(_CORES),
    spell=st.sampled_from(_NAME_SPELLINGS),
    wrapper=st.sampled_from(_WRAPPERS),
    contexts=st.lists(st.sampled_from(_CONTEXTS), max_size=3),
)
def test_no_composition_of_a_dangerous_command_is_safe(core, spell, wrapper, contexts) -> None:
    name, _, rest = core.partition(" ")
    command = f"{wrapper}{spell(name)} {rest}"
    for context in contexts:
        command = context(command)
    before = classify_command(core).tier
    after = classify_command(command).tier
    assert after != "safe", command
    if before == "hardline":
        assert after == "hardline", command


_PIECES = [
    *"abcrmf -/~$(){}[]<>|&;'\"`\\\n*?!=#%:.,0189",
    "$'\\",
    "rm",
    "sh -c ",
    "<<EOF\n",
    "\nEOF\n",
    "$(",
    "${",
]
_PIECES += [
    "<<<",
    "python3 -c ",
    "find ",
    "-exec ",
    "xargs ",
    "sudo ",
    "eval ",
    "$'\\x",
    "{a,b}",
    "> ",
    "cd ",
    "bash ",
    "./",
    "source ",
    "< ",
]


@settings(max_examples=1000, deadline=None, database=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_the_judge_reads_any_text_without_failing(text: str) -> None:
    # "unjudged" is the safety net for a judge that raised: it must never be needed
    assert classify_command(text).key != "unjudged"


# -- through the agent ---------------------------------------------------------------------------------


def _tool_results(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


def test_a_disguised_delete_is_asked_about_and_a_denial_keeps_the_folder(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    command = f"a=r''m; $a -rf {victim}"
    server.add(Reply(tool_calls=[("terminal", {"command": command})]), Reply(text="ok"))
    asked: list[tuple[str, str]] = []

    result = make_agent(approval_callback=lambda c, r: asked.append((c, r)) or "deny").run_conversation("go")

    assert victim.exists()
    assert asked and asked[0][0] == command
    assert _tool_results(result)[0].startswith("denied by user")


def test_a_disguised_hardline_command_is_blocked_even_with_yolo(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / ".mibyan").mkdir(parents=True)
    command = f"cd {project} && echo 'r''m -rf .mibyan' | bash"
    server.add(Reply(tool_calls=[("terminal", {"command": command})]), Reply(text="ok"))

    result = make_agent(yolo=True).run_conversation("go")

    assert (project / ".mibyan").exists()
    assert _tool_results(result)[0].startswith("blocked: deletes mibyan's own files")


def test_the_agents_home_is_off_limits_even_with_yolo(
    server: ScriptedServer, make_agent, home: Path, tmp_path: Path
) -> None:
    # the agent's home is not $MIBYAN_HOME here: the judge must learn it from the running tool call
    before = (home / "config.yaml").read_text()
    calls = [
        ("terminal", {"command": f"echo 'approvals: {{always: [sudo]}}' >> {home}/config.yaml"}),
        ("terminal", {"command": "echo pwned > config.yaml", "workdir": str(home)}),
    ]
    server.add(Reply(tool_calls=calls), Reply(text="ok"))

    result = make_agent(yolo=True).run_conversation("go")

    assert (home / "config.yaml").read_text() == before
    assert all(r.startswith("blocked: writes to mibyan's own files") for r in _tool_results(result))


def test_the_model_cannot_rewrite_a_configured_hook_through_the_terminal(
    server: ScriptedServer, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from run_agent import AIAgent

    hooks = tmp_path / "hooksdir"
    hooks.mkdir()
    guard = hooks / "myguard.py"
    guard.write_text("def check(name, args, task_id):\n    return None\n")
    monkeypatch.syspath_prepend(str(hooks))
    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 0}\nsandbox: {mode: 'off'}\nhooks: {pre_tool_call: ['myguard:check']}\n"
    )
    monkeypatch.chdir(tmp_path)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo 'check = print' > hooksdir/myguard.py"})]),
        Reply(text="done"),
    )

    result = AIAgent(base_url=server.base_url, home=home, yolo=True).run_conversation("loosen the guard")

    tool_result = next(m for m in result["messages"] if m["role"] == "tool")["content"]
    assert "blocked" in tool_result
    assert "return None" in guard.read_text()

"""git: history it rewrites or discards, and the shell commands its configuration may run.

`git -c alias.x='!rm -rf /' x` runs a shell command, and so do `core.pager`, `core.sshCommand` and
friends: such values given on the command line are judged as shell code. Storing one with `git config`
is asked about whatever it holds (a gateway agent never stores one), since git runs it later unasked.
A command the repository's own config names that the environment cannot switch off (tools/git_guard.py)
is asked about each time a git command may run it, unless the user trusts the project.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mibyan.tools.command_paths import holds_code_places
from mibyan.tools.command_spec import Scan
from mibyan.tools.command_words import Feed, Judge, Word, combine
from mibyan.tools.verdict import SAFE, Verdict

_COMMAND_KEYS = re.compile(
    r"^(alias\..+|core\.(pager|editor|sshcommand|fsmonitor|hookspath|askpass)|sequence\.editor|"
    r"diff\.external|diff\..+\.(textconv|command)|merge\..+\.driver|filter\..+\.(clean|smudge|process)|"
    r"credential(\..+)?\.helper|gpg(\..+)?\.program|pager\..+|interactive\.difffilter|uploadpack\.packobjectshook)$",
    re.IGNORECASE,
)


def _config_command(j: Judge, key: str, value: str) -> Verdict:
    if not _COMMAND_KEYS.match(key):
        return SAFE
    if key.lower().startswith("alias."):
        return j.script(value[1:]) if value.startswith("!") else SAFE
    if key.lower().endswith("hookspath"):
        return Verdict(
            "dangerous", f"makes git run hooks from another folder ({value})", "git_config_command"
        )
    return j.script(value.removeprefix("!"))


#: The variables that carry the settings keeping a repository's config from running commands
#: (tools/git_guard.py), or that would replace them: a command changing one is asked about.
_GUARD_VARIABLE = re.compile(r"^GIT_CONFIG(_[A-Z0-9_]*)?$")


def changes_git_guard(names: list[str], *, clears: bool = False) -> Verdict:
    """The verdict of a command that sets or unsets the variables `names` (`clears`: all of them, as
    `env -i` does): asked when one carries the settings that keep a repository's git config from
    running commands."""
    hit = next((n for n in names if _GUARD_VARIABLE.match(n)), None)
    if hit is None and not clears:
        return SAFE
    what = hit or "the whole environment"
    return Verdict(
        "dangerous",
        f"changes {what}, which keeps a repository's own git config from running commands",
        "git_environment",
    )


def judge_git(j: Judge, scan: Scan, feed: Feed) -> Verdict:
    """git's own options (`-c KEY=VALUE`, `-C DIR`), its subcommand, and what the repository runs."""
    findings: list[Verdict] = []
    for value in scan.given("-c"):
        key, _, setting = value.text.partition("=")
        findings.append(_config_command(j, key, setting))
    folder = j.cwd
    for value in scan.given("-C"):
        folder = folder / Path(value.text).expanduser()
    command = scan.args[scan.start :]
    if not command:
        return combine(findings)
    sub = command[0].text
    rest = [w.text for w in command[1:]]
    findings.append(_subcommand(j, sub, rest))
    findings.append(_applies_patch(j, sub, rest, scan.given("-C")))
    findings.append(_repository_commands(j, folder, sub))
    return combine(findings)


#: `git apply` options that only read the patch (unless `--apply` is given too), or write the index only.
_APPLY_READS = frozenset({"--check", "--stat", "--numstat", "--summary"})


def _applies_patch(j: Judge, sub: str, rest: list[str], folders: list[Word]) -> Verdict:
    """`git apply`, `git am`: the files the patch names, not the command, are written in the work tree
    (`-C DIR`, else where it runs): asked when that folder holds a place whose content runs by itself
    (the home holds ~/.bashrc and ~/.ssh), as an archive unpacked there is."""
    if sub not in ("apply", "am") or "--show-current-patch" in rest or "--cached" in rest:
        return SAFE
    if sub == "apply" and _APPLY_READS.intersection(rest) and "--apply" not in rest:
        return SAFE
    if any(w.dynamic for w in folders):
        folder = Word(" ".join(w.text for w in folders), dynamic=True)
    elif "--unsafe-paths" in rest:  # paths outside the work tree are applied too: anywhere
        folder = Word("/")
    else:
        folder = Word(os.path.join(".", *(w.text for w in folders)))
    held = holds_code_places(j, folder)
    into = [j.write(w, "writes into") for w in folders]  # mibyan's home is never patched
    if held is None:
        return combine(into)
    applied = Verdict("dangerous", f"applies a patch (git {sub}) into {held}", "sensitive_write")
    return combine([*into, applied])


def _repository_commands(j: Judge, folder: Path, sub: str) -> Verdict:
    """What the repository's own config makes this git command run that the environment cannot switch
    off (tools/git_guard.py): a `!` alias named `sub`, an external diff, a filter, a driver, a
    credential helper. Asked about, unless the user trusts the project (`mibyan trust`)."""
    from mibyan.config.trust import folder_trusted
    from mibyan.tools.git_guard import repository_commands, repository_of

    found = repository_of(os.path.normpath(folder))
    if found is None:
        return SAFE
    commands = repository_commands(found[1])
    alias = next((v for k, v in commands.items() if k.lower() == f"alias.{sub.lower()}"), None)
    others = {k: v for k, v in commands.items() if not k.lower().startswith("alias.")}
    if (alias is None and not others) or (not j.gateway and folder_trusted(j.home, Path(found[0]))):
        return SAFE
    key, value = (f"alias.{sub}", alias) if alias is not None else next(iter(others.items()))
    shown = value if len(value) <= 60 else value[:60] + "…"
    reason = f"runs what the repository's own git config says ({key} = {shown})"
    inner = j.script(alias[1:]) if alias is not None else SAFE
    if inner.tier == "hardline":
        return inner
    return Verdict("dangerous", reason, "git_repository_command", ask_every_time=True)


def _short_flags(rest: list[str]) -> set[str]:
    return {f"-{c}" for a in rest if a.startswith("-") and not a.startswith("--") for c in a[1:]}


def _subcommand(j: Judge, sub: str, rest: list[str]) -> Verdict:
    flags = _short_flags(rest) | {a.partition("=")[0] for a in rest if a.startswith("--")}
    if sub == "push" and (
        flags & {"-f", "--force", "--force-with-lease", "--force-if-includes", "--mirror", "--delete", "-d"}
        or any(a.startswith(("+", ":")) for a in rest if not a.startswith("-"))
    ):
        return Verdict(
            "dangerous", "rewrites or deletes history on a remote (git push --force)", "git_force_push"
        )
    if sub == "reset" and "--hard" in rest:
        return Verdict("dangerous", "discards uncommitted changes (git reset --hard)", "git_reset_hard")
    if sub == "clean" and flags & {"-f", "--force"}:
        return Verdict("dangerous", "deletes untracked files (git clean -f)", "git_clean")
    only_unstages = sub == "restore" and "--staged" in rest and "--worktree" not in rest
    everything = any(a in (".", ":/", "*", ":/*") for a in rest)
    forced = bool({"-f", "--force"} & flags) and sub != "restore"
    if sub in ("checkout", "restore", "switch") and (everything or forced) and not only_unstages:
        return Verdict("dangerous", f"discards uncommitted changes (git {sub})", "git_discard")
    if sub == "stash" and rest[:1] in (["drop"], ["clear"]):
        return Verdict("dangerous", f"discards stashed changes (git stash {rest[0]})", "git_discard")
    if sub == "config":
        return _stored_command(j, [a for a in rest if not a.startswith("-")])
    return SAFE


def _stored_command(j: Judge, values: list[str]) -> Verdict:
    """`git config [set] [-f FILE] KEY VALUE` storing a command git runs later by itself (`core.fsmonitor`
    at the next `git status`): asked, whatever the command, and never for a gateway agent, whose
    user is not the one whose repositories and git settings these are. An alias without `!` runs git."""
    for at, key in enumerate(values[:-1]):
        value = values[at + 1]
        if not _COMMAND_KEYS.match(key) or (key.lower().startswith("alias.") and not value.startswith("!")):
            continue
        inner = _config_command(j, key, value)
        if inner.tier == "hardline":
            return inner
        shown = value if len(value) <= 60 else value[:60] + "…"
        reason = f"stores a command for git to run later by itself ({key} = {shown})"
        if j.gateway:
            return Verdict("hardline", f"{reason}, which a gateway agent never does", "git_config_command")
        also = f", which {inner.reason}" if inner.tier == "dangerous" else ""
        return Verdict("dangerous", reason + also, "git_config_command", inner.ask_every_time)
    return SAFE

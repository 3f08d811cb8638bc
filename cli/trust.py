"""`mibyan trust`: let a project's `.mibyan/config.yaml` set what only the user may decide.

An untrusted project file may not run a command, choose where a key is sent, add hooks or loosen
approvals (see `config.trust`). Trusting records the folder and the file's sha256 in the home; an edited
file needs trusting again.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from mibyan.config.paths import mibyan_home
from mibyan.config.trust import (
    digest,
    folder_key,
    forget_folder,
    load_records,
    project_config_path,
    split_untrusted,
    trust_folder,
)
from mibyan.core.errors import MibyanError
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from mibyan.core.sanitize import visible


def project_folder(path: Path) -> Path:
    """The project a PATH means: the folder itself, or the one holding the `.mibyan` folder or file named."""
    absolute = path.expanduser().absolute()  # not resolved yet: config.yaml may be a link elsewhere
    if absolute.name == "config.yaml" and absolute.parent.name == ".mibyan":
        absolute = absolute.parent.parent
    elif absolute.name == ".mibyan":
        absolute = absolute.parent
    return Path(folder_key(absolute))


def _one_line(text: object) -> str:
    """`text` made visible, its line ends too: a command is shown on one line, as it would run."""
    return visible(str(text)).replace("\n", "\\n").replace("\t", "\\t")


def commands_in(layer: dict[str, Any]) -> list[tuple[str, str]]:
    """The commands a project file would have mibyan run once trusted, each with the key naming it:
    `api_key_command`s, hooks and MCP servers' `command` (with its arguments)."""
    found: list[tuple[str, str]] = []
    providers = layer.get("providers")
    for name, entry in (providers if isinstance(providers, dict) else {}).items():
        if isinstance(entry, dict) and entry.get("api_key_command"):
            found.append((f"providers.{name}.api_key_command", str(entry["api_key_command"])))
    hooks = layer.get("hooks")
    for event, commands in (hooks if isinstance(hooks, dict) else {}).items():
        for index, command in enumerate(commands if isinstance(commands, list) else [commands]):
            found.append((f"hooks.{event}[{index}]", str(command)))
    servers = layer.get("mcp_servers")
    for name, entry in (servers if isinstance(servers, dict) else {}).items():
        if isinstance(entry, dict) and entry.get("command"):
            args = entry.get("args")
            words = [entry["command"], *(args if isinstance(args, list) else [])]
            found.append((f"mcp_servers.{name}.command", shlex.join(str(word) for word in words)))
    return [(_one_line(where), _one_line(command)) for where, command in found]


def _confirmed(path: Path, needs_trust: list[str], commands: list[tuple[str, str]], *, yes: bool) -> bool:
    """Whether the user trusts what the file would set: `--yes`, or `y` asked on a terminal.

    Raises:
        MibyanError: there is no terminal to ask on and no --yes.
    """
    if yes:
        return True
    shown = visible(str(path))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        ran = f"would let {len(commands)} command(s) run and " if commands else ""
        raise MibyanError(
            f"{shown} {ran}would set {len(needs_trust)} key(s) only you may decide; run "
            "'mibyan trust' on a terminal to see them and confirm, or add --yes"
        )
    print(f"{shown} would set what only you may decide: {', '.join(_one_line(k) for k in needs_trust)}")
    if commands:
        print("it would let these commands run:")
        for where, command in commands:
            print(f"  {where}: {command}")
    try:
        answer = input("Trust it? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        print()
        return False
    return answer.strip().lower() in ("y", "yes")


def _trust(home: Path, folder: Path, *, yes: bool) -> int:
    from mibyan.config.loader import parse_yaml, provider_names, trusted_layers

    path = project_config_path(project_folder(folder))
    if not path.is_file():
        raise MibyanError(f"{visible(str(path))} does not exist: there is nothing to trust")
    data = path.read_bytes()  # what is shown is what is trusted: the file is read once
    layer = parse_yaml(path, data)  # a broken file is reported now, not trusted
    _, needs_trust = split_untrusted(layer, provider_names(trusted_layers(home)))
    keys = [str(k) for k in needs_trust]
    if keys and not _confirmed(path, keys, commands_in(layer), yes=yes):
        print(f"not trusted: {visible(str(path))}")
        return EXIT_ERROR
    record = trust_folder(home, folder, data)
    applies = f"{', '.join(_one_line(k) for k in keys)} now apply" if keys else "nothing in it needed trust"
    print(f"trusted {visible(str(path))} (sha256 {record.sha256[:12]}): {applies}")
    return EXIT_OK


def _list(home: Path) -> int:
    records = load_records(home)
    if not records:
        print("no trusted folders: 'mibyan trust PATH' trusts one")
        return EXIT_OK
    for record in sorted(records.values(), key=lambda r: r.folder):
        path = project_config_path(Path(record.folder))
        try:
            state = "ok" if digest(path.read_bytes()) == record.sha256 else "changed since trusted"
        except OSError:
            state = "config file missing"
        when = datetime.fromtimestamp(record.trusted_at).strftime("%Y-%m-%d %H:%M")
        print(f"{visible(record.folder)}  sha256 {record.sha256[:12]}  trusted {when}  {state}")
    return EXIT_OK


def _remove(home: Path, folder: Path) -> int:
    if not forget_folder(home, folder):
        raise MibyanError(
            f"{visible(folder_key(folder))} is not trusted ('mibyan trust --list' shows those that are)"
        )
    print(f"no longer trusted: {visible(folder_key(folder))}")
    return EXIT_OK


def run_trust(args: argparse.Namespace) -> int:
    """`mibyan trust [PATH]`, `mibyan trust --list`, `mibyan trust --remove PATH`."""
    home = mibyan_home()
    try:
        if args.list:
            if args.path is not None:
                raise MibyanError("--list takes no PATH")
            return _list(home)
        if args.remove is not None:
            if args.path is not None:
                raise MibyanError("give the folder to --remove, not also as PATH")
            return _remove(home, project_folder(Path(args.remove)))
        return _trust(home, project_folder(Path(args.path or ".")), yes=args.yes)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: error: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(
            f"mibyan: error: cannot record trust in {visible(str(home))}: {exc.strerror or exc}\n"
        )
        return EXIT_ERROR

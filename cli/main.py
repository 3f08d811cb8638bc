"""The `mibyan` command: argument parsing and dispatch.

This module imports only the standard library (and mibyan's modules that import nothing else) at the
top: `mibyan --help` must answer at once, and each command imports what it uses (the SDK in use, and
only it) when it runs.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from mibyan.config.api_modes import API_MODES
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE


class _VersionAction(argparse.Action):
    """`--version`: the installed package's version, read only when asked (importlib.metadata is slow)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print mibyan's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        import mibyan

        sys.stdout.write(f"mibyan {mibyan.__version__}\n")
        parser.exit()


_python_show_warning = warnings.showwarning


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"mibyan: error: {message} (see 'mibyan --help')\n")
        raise SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _session_id(text: str) -> str:
    """An argparse type: a session id or prefix, which cannot be empty (it would match every session)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the session id is empty")
    return text


def _named(text: str) -> str:
    """An argparse type: a name or address, which an empty or blank word cannot be."""
    if not text.strip():
        raise argparse.ArgumentTypeError("it is empty")
    return text


def _add_agent_options(parser: argparse.ArgumentParser, *, quiet: bool = True) -> None:
    parser.add_argument("-m", "--model", type=_named, help="model name (default: model.name in config)")
    parser.add_argument(
        "--provider", type=_named, help="provider from the config: openai, anthropic, openrouter, ..."
    )
    parser.add_argument("--base-url", type=_named, help="the provider's API address (e.g. a local server)")
    parser.add_argument(
        "--api-mode",
        choices=API_MODES,
        metavar="MODE",
        help=f"wire API: {', '.join(API_MODES)} (default: resolved from the provider)",
    )
    parser.add_argument(
        "--max-turns", type=_positive_int, metavar="N", help="model calls one prompt may make (default 500)"
    )
    parser.add_argument("--toolsets", metavar="LIST", help="comma-separated toolsets the model may use")
    parser.add_argument(
        "--yolo",
        action="store_true",
        help="run dangerous commands without asking (commands that wreck a machine never run)",
    )
    if quiet:
        parser.add_argument("-Q", "--quiet", action="store_true", help="no progress output on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mibyan",
        description="mibyan: an AI agent in your terminal. Chat, run one-shot prompts, resume sessions.",
        epilog="Exit codes: 0 completed, 1 runtime error, 2 usage or config error, 3 budget exhausted, "
        "130 interrupted.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chat = commands.add_parser(
        "chat",
        help="chat in the terminal, or answer one prompt with -q",
        description="Chat with the agent; with -q, answer one prompt and exit.",
    )
    chat.add_argument(
        "-q",
        "--query",
        metavar="PROMPT",
        help="answer PROMPT and exit (answer on stdout, progress on stderr); '-' reads stdin",
    )
    chat.add_argument("--json", action="store_true", help="with -q: print the whole result as JSON")
    resume = chat.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="ID",
        help="resume session ID (an id prefix works), or the most recent one",
    )
    resume.add_argument(
        "-c",
        "--continue",
        dest="resume",
        action="store_const",
        const="",
        help="resume the most recent session",
    )
    _add_agent_options(chat)

    sessions = commands.add_parser(
        "sessions",
        help="list, show, search, export, rename, delete or import sessions",
        description="Your stored sessions.",
    )
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    listing = actions.add_parser("list", help="sessions, newest first")
    listing.add_argument("-n", "--limit", type=_positive_int, default=30, help="how many (default 30)")
    listing.add_argument("--json", action="store_true", help="a JSON array of sessions")
    show = actions.add_parser("show", help="print a session's messages")
    show.add_argument("id", type=_session_id)
    show.add_argument("--json", action="store_true", help="the session and its messages as JSON")
    search = actions.add_parser("search", help="full-text search over every message")
    search.add_argument("query", nargs="+")
    search.add_argument("--role", choices=("user", "assistant", "tool"), help="only messages of this role")
    search.add_argument("--since", metavar="WHEN", help="only newer messages: 7d, 12h or 2026-11-01")
    search.add_argument("-n", "--limit", type=_positive_int, default=20, help="how many hits (default 20)")
    search.add_argument("--json", action="store_true", help="a JSON array of hits")
    export = actions.add_parser("export", help="write a session as JSONL (or Markdown) to stdout")
    export.add_argument("id", type=_session_id)
    export.add_argument("--format", choices=("jsonl", "md"), default="jsonl")
    delete = actions.add_parser("delete", help="delete a session and its descendants")
    delete.add_argument("id", type=_session_id)
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask")
    rename = actions.add_parser("rename", help="give a session a title")
    rename.add_argument("id", type=_session_id)
    rename.add_argument("title", nargs="+")
    imported = actions.add_parser(
        "import", help="copy a home's SQLite store into the PostgreSQL one store.url names"
    )
    imported.add_argument(
        "--from", dest="source", metavar="PATH", help="the home or state.db to copy (default: this home's)"
    )
    skills = commands.add_parser("skills", help="the skills installed for you and this project")
    skill_actions = skills.add_subparsers(
        dest="action", metavar="ACTION", parser_class=_Parser, required=True
    )
    skill_actions.add_parser("list", help="name, description and trigger words of each skill")
    _add_trust_command(commands)
    _add_batch_command(commands)
    gateway = commands.add_parser(
        "gateway",
        help="serve the configured agents over their connectors (an OpenAI-compatible HTTP API)",
        description="Serve the agents of agents: over the connectors of connectors: until SIGTERM or "
        "Ctrl-C; each channel is one session.",
    )
    gateway.add_argument("--check", action="store_true", help="validate the configuration and exit")
    mcp = commands.add_parser(
        "mcp",
        help="the MCP servers of your configuration: their state and their tools",
        description="MCP servers (mcp_servers: in the configuration) give the agent more tools.",
    )
    mcp_actions = mcp.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    mcp_actions.add_parser("list", help="start each server, then show whether it started, and its tools")
    acp = commands.add_parser(
        "acp",
        help="be an editor's agent: the Agent Client Protocol on stdio (Zed, JetBrains, Neovim, Emacs)",
        description="Speak the Agent Client Protocol on stdin and stdout until the editor closes them. "
        "Editors start this command themselves; logs go to $MIBYAN_HOME/logs/acp.log.",
    )
    _add_agent_options(acp, quiet=False)
    web = commands.add_parser(
        "web",
        help="browse, search and watch your sessions in a local web page",
        description="Serve the session viewer on this machine; open the address it prints (it carries "
        "the token every request needs).",
    )
    web.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    web.add_argument("--port", type=_port, default=0, help="the port (default 0: any free one)")
    return parser


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 for any free one."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, not {text!r}")
    return int(text)


def _add_trust_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    trust = commands.add_parser(
        "trust",
        help="let a project's .mibyan/config.yaml set keys, hooks and commands",
        description="An untrusted project's .mibyan/config.yaml may not run commands, choose where your "
        "key is sent, add hooks or loosen approvals, tools or the sandbox. Trust records the folder and "
        "the file's sha256 in your mibyan home; an edited file is untrusted again.",
    )
    trust.add_argument("path", nargs="?", metavar="PATH", help="the project folder (default: here)")
    trust.add_argument("--list", action="store_true", help="the trusted folders")
    trust.add_argument("--remove", metavar="PATH", help="stop trusting a folder")
    trust.add_argument(
        "--yes", action="store_true", help="trust without asking (scripts; a terminal is asked otherwise)"
    )


def _add_batch_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    batch = commands.add_parser(
        "batch",
        help="run many agent tasks from a JSONL file, resumably; see their status",
        description='Run the tasks of a JSONL file (one {"prompt": ...} a line), each an agent of its own; '
        "running the same command again runs only the tasks without a final result.",
    )
    actions = batch.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    run = actions.add_parser("run", help="run the tasks of TASKS.jsonl, results in --out DIR")
    run.add_argument("tasks", metavar="TASKS.jsonl")
    run.add_argument("--out", required=True, type=_named, metavar="DIR", help="the batch's folder")
    run.add_argument("--workers", type=_positive_int, default=8, help="tasks at once (default 8)")
    run.add_argument("--backend", choices=("local", "ray"), default="local", help="local threads, or Ray")
    run.add_argument("--ray-address", metavar="ADDR", help="with --backend ray: the cluster to join")
    run.add_argument("--repeat", type=_positive_int, default=1, help="runs of each line without its own")
    run.add_argument("--skip-invalid", action="store_true", help="record bad lines as invalid, run the rest")
    run.add_argument("--retry-failed", action="store_true", help="run the failed tasks again too")
    run.add_argument("--max-tokens", type=_positive_int, metavar="N", help="stop handing out tasks past N")
    run.add_argument(
        "--per-provider", type=_positive_int, metavar="N", help="model calls in flight to one provider"
    )
    _add_agent_options(run)
    status = actions.add_parser("status", help="tasks by disposition, what is left, tokens")
    status.add_argument("dir", metavar="DIR")
    status.add_argument("--json", action="store_true", help="as JSON")


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Warnings meant for the user (an untrusted project's ignored keys) are one plain line."""
    from mibyan.config.trust import UntrustedConfigWarning

    if issubclass(category, UntrustedConfigWarning):
        sys.stderr.write(f"mibyan: {message}\n")
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mibyan` console script.

    Run as the program (no `argv`), it ends the process as soon as its output is flushed and its files
    are closed: the interpreter's own shutdown of the SDKs' modules took a tenth of a second or more
    after the answer was out. A caller that passes `argv` gets the exit code back instead.
    """
    if argv is not None:
        return run_command(argv)
    from mibyan.core.lean_imports import leave_out_unused, put_off_reexports

    # the program's own process: what its libraries would import and it never uses, or not yet
    leave_out_unused()
    put_off_reexports()
    try:
        code = run_command(None)
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else EXIT_ERROR
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    """Flush what was written, close the log, and end the process without the slow teardown."""
    import logging
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away (`| head`): nothing more can be said
            code = code or EXIT_ERROR
    logging.shutdown()
    os._exit(code)


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (the command line when None), run the command, and return its exit code."""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        # Past a file-size limit, a write must fail (EFBIG: one clear error), not kill the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    try:
        if args.command == "chat":
            from mibyan.cli.chat import run_chat

            return run_chat(args)
        if args.command == "skills":
            from mibyan.cli.sessions import run_skills

            return run_skills(args)
        if args.command == "trust":
            from mibyan.cli.trust import run_trust

            return run_trust(args)
        if args.command == "gateway":
            from mibyan.cli.gateway import run_gateway

            return run_gateway(args)
        if args.command == "mcp":
            from mibyan.cli.mcp import run_mcp

            return run_mcp(args)
        if args.command == "acp":
            from mibyan.cli.acp import run_acp

            return run_acp(args)
        if args.command == "web":
            from mibyan.web.serve import run_web

            return run_web(args)
        if args.command == "batch":
            from mibyan.cli.batch import run_batch

            return run_batch(args)
        if args.command == "sessions":
            from mibyan.cli.sessions import run_sessions

            return run_sessions(args)
    except BrokenPipeError:
        # the reader (`| head`) went away: stop quietly, as command-line tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    parser.error(f"unknown command {args.command!r}")
    return EXIT_USAGE


if __name__ == "__main__":
    main()

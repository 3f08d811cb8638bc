"""The interactive chat: a prompt_toolkit prompt that appears at once, the agent loading behind it.

Start-up shows the prompt first; the configuration, the SDK and the session load on a background thread
while the person types (the first answer waits for them if needed), then a one-line banner names the
model, the provider and the session. Ctrl-C stops a running answer and returns to the prompt with the
session valid (at a question, it refuses and the turn goes on); a second Ctrl-C within 2 s
(`MIBYAN_CTRL_C_WINDOW` seconds) leaves with code 130; Ctrl-D or /exit leaves with 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any

from prompt_toolkit import PromptSession
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings

from mibyan.cli.commands import COMMANDS, completions, dispatch
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from mibyan.core.sanitize import visible

if TYPE_CHECKING:
    from collections.abc import Iterable

    from mibyan.cli.render import Renderer
    from run_agent import AIAgent

_DOUBLE_PRESS = 2.0
PROMPT = "› "


def double_press_window() -> float:
    """Seconds within which a second Ctrl-C leaves the chat (`MIBYAN_CTRL_C_WINDOW`, default 2)."""
    try:
        return max(0.0, float(os.environ.get("MIBYAN_CTRL_C_WINDOW", _DOUBLE_PRESS)))
    except ValueError:
        return _DOUBLE_PRESS


class SlashCompleter(Completer):
    """Completes slash commands, then their argument (session ids, model names)."""

    def __init__(self, repl: Repl) -> None:
        self.repl = repl

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/"):
            return
        name, space, argument = text[1:].partition(" ")
        if not space:
            for item in COMMANDS.values():
                if item.name.startswith(name):
                    yield Completion("/" + item.name, start_position=-len(text), display_meta=item.help)
            return
        found = COMMANDS.get(name)
        for value in completions(found.complete if found else None, self.repl):
            if value.startswith(argument):
                yield Completion(value, start_position=-len(argument))


class Repl:
    """One interactive chat: the prompt, the agent (loaded in the background) and the renderer."""

    def __init__(self, args: argparse.Namespace, session_id: str | None) -> None:
        self.args = args
        self._session_id = session_id
        self._agent: AIAgent | None = None
        self._renderer: Renderer | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._last_interrupt = float("-inf")
        self._double_press = double_press_window()
        self._prompt_session: PromptSession[str] | None = None
        self._banner_lock = threading.Lock()
        self._banner_shown = False
        self._notices: list[warnings.WarningMessage] = []  # said while loading, shown with the banner
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}

    # -- the agent, loaded behind the prompt --------------------------------------------------------

    def start_loading(self) -> None:
        if not self._ready.is_set() and not hasattr(self, "_loader"):
            self._loader = threading.Thread(target=self._load, name="mibyan-load", daemon=True)
            self._loader.start()

    def _load(self) -> None:
        try:
            from mibyan.cli.render import Renderer

            # a notice written now (the project's untrusted config) would land over the prompt being
            # drawn and leave a stray prompt above it: it waits for the banner, which goes above
            with warnings.catch_warnings(record=True) as self._notices:
                self._renderer = Renderer()
                self._agent = self._build_agent(self._session_id, self.args.model)
            self._agent.tools.start_mcp()  # the person is typing: time the servers can use to start
        except BaseException as exc:  # reported on the main thread, as one line
            self._error = exc
            self._stop_prompt()
        finally:
            self._ready.set()
        if self._error is None:
            self._banner_above_prompt()

    def _banner_above_prompt(self) -> None:
        """Print the banner above the prompt being typed at; if none is running, the loop prints it."""
        app = self._prompt_session.app if self._prompt_session is not None else None
        loop = getattr(app, "loop", None)
        if app is None or loop is None or not app.is_running:
            return

        def show() -> None:
            if app.is_running:
                run_in_terminal(self.show_banner)

        # The prompt may end meanwhile and close its loop: then the banner waits for the next prompt.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(show)

    def show_banner(self) -> None:
        """One line at the start: model, provider, session, and where help is (printed once)."""
        with self._banner_lock:
            if self._banner_shown or not self.ready():
                return
            self._banner_shown = True
        self.show_notices()
        agent = self.agent
        runtime = agent.runtime
        where = f"{runtime.model} via {runtime.provider}"
        self.say(f"mibyan · {where} · session {agent.session_id} · /help for commands", style="dim")

    def show_notices(self) -> None:
        """The warnings recorded while loading, as they would have been shown then."""
        notices, self._notices = self._notices, []
        for notice in notices:
            warnings.showwarning(notice.message, notice.category, notice.filename, notice.lineno)

    def _stop_prompt(self) -> None:
        """End the prompt the person is typing at, so a failed start-up is reported at once."""
        app = self._prompt_session.app if self._prompt_session is not None else None
        loop = getattr(app, "loop", None)
        if app is not None and app.is_running and loop is not None:
            loop.call_soon_threadsafe(lambda: app.exit(exception=EOFError()) if app.is_running else None)

    def _build_agent(
        self, session_id: str | None, model: str | None, previous: AIAgent | None = None
    ) -> AIAgent:
        from mibyan.cli.chat import make_agent

        assert self._renderer is not None
        shared = previous.tools.mcp.connections if previous is not None and previous.tools.mcp else None
        held = previous.session_lock if previous is not None else None
        agent = make_agent(
            self.args,
            self._renderer.callbacks(),
            session_id=session_id,
            model=model,
            mcp_connections=shared,
            held=held,
        )
        if previous is not None and agent.session_lock is held:
            previous.session_lock = None  # the same session goes on: the new agent holds its lock
        if previous is not None:
            previous.tools.hand_over_mcp(agent.tools)  # the servers live on with the new agent
        return agent

    def ready(self) -> bool:
        return self._ready.is_set() and self._error is None

    def wait_ready(self) -> None:
        self.start_loading()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    @property
    def agent(self) -> AIAgent:
        self.wait_ready()
        assert self._agent is not None
        return self._agent

    @property
    def renderer(self) -> Renderer:
        self.wait_ready()
        assert self._renderer is not None
        return self._renderer

    def replace_agent(self, *, session_id: str | None, model: str | None = None) -> None:
        """A new agent for another session or model; /yolo and "for this session" answers carry over.

        The agent it replaces is closed (its database and HTTP connections); its MCP servers are handed
        to the new agent, so they keep running (and keep their state).
        """
        previous = self.agent
        self._agent = self._build_agent(session_id, model or previous.runtime.model, previous)
        self._agent.approvals.carry_over_from(previous.approvals)
        previous.close()

    def close(self) -> None:
        """Close the agent, if it was loaded."""
        if self._ready.is_set() and self._agent is not None:
            self._agent.close()

    # -- output -------------------------------------------------------------------------------------

    def say(self, text: str, style: str | None = None) -> None:
        """Show a line; what it quotes (titles, search hits, todos) may come from the model: made visible."""
        text = visible(text)
        if self._renderer is not None:
            self._renderer.console.print(text, style=style, highlight=False, markup=False)
        else:
            print(text)

    def show_last_exchange(self) -> None:
        messages = self.agent.history
        last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
        if last_user is None:
            return
        answer = next((m for m in reversed(messages) if m["role"] == "assistant" and m.get("content")), None)
        self.say(f"(session {self.agent.session_id}, {len(messages)} messages)", style="dim")
        self.say(f"{PROMPT}{last_user['content']}", style="bold")
        if answer is not None:
            from rich.markdown import Markdown

            self.renderer.console.print(Markdown(visible(answer["content"])))

    # -- turns ----------------------------------------------------------------------------------------

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._renderer is not None and self._renderer.refuse_question():
            return  # the question is answered as a refusal and the turn goes on (another ^C stops it)
        now = time.monotonic()
        if now - self._last_interrupt < self._double_press:
            raise KeyboardInterrupt
        self._last_interrupt = now
        if self._renderer is not None:
            self._renderer.interrupt()
        if self._agent is not None:
            self._agent.interrupt()
        self.say("^C: stopping (^C again to exit)", style="yellow")

    def run_turn(self, text: str) -> None:
        agent = self.agent
        self.show_banner()
        self.renderer.begin_turn()
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            result = agent.run_conversation(text)
        finally:
            signal.signal(signal.SIGINT, previous)
        for key in self.usage:
            self.usage[key] += result["usage"].get(key, 0)
        self.renderer.end_turn(result, agent.runtime.model)

    # -- the prompt -----------------------------------------------------------------------------------

    def _session(self) -> PromptSession[str]:
        from mibyan.config.paths import mibyan_home, private_dir

        home = mibyan_home()
        private_dir(home)
        history_file = home / "history"
        if not history_file.exists():
            os.close(os.open(history_file, os.O_CREAT | os.O_WRONLY, 0o600))
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        return PromptSession(
            history=FileHistory(str(history_file)),
            completer=SlashCompleter(self),
            key_bindings=bindings,
            complete_while_typing=True,
        )

    def loop(self) -> int:
        session = self._prompt_session = self._session()
        if self._session_id is not None:
            self.wait_ready()
            self.show_banner()
            self.show_last_exchange()
        while True:
            self.show_banner()
            try:
                text = session.prompt(PROMPT, pre_run=self.start_loading).strip()
            except EOFError:
                if self._error is not None:
                    self.show_notices()
                    raise self._error from None
                return EXIT_OK
            except KeyboardInterrupt:
                now = time.monotonic()
                if now - self._last_interrupt < self._double_press:
                    return EXIT_INTERRUPTED
                self._last_interrupt = now
                print("^C again to exit")
                continue
            if not text:
                continue
            if text.startswith("/"):
                if dispatch(self, text):
                    return EXIT_OK
                continue
            self.run_turn(text)


def run_repl(args: argparse.Namespace, session_id: str | None) -> int:
    from mibyan.core.errors import MibyanError

    repl = Repl(args, session_id)
    try:
        return repl.loop()
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # the last boundary: one line for the person, the details in the log
        logging.getLogger("mibyan.cli").exception("the chat failed")
        sys.stderr.write(f"mibyan: internal error: {visible(str(exc))} (details in the log)\n")
        return EXIT_ERROR
    finally:
        repl.close()

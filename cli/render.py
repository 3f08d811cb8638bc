"""What the interactive chat shows: the streamed answer, reasoning, tool lines, and a footer per turn.

rich is imported here only, and this module only by the REPL. Colour follows the terminal: NO_COLOR and
output that is not a terminal get plain text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.spinner import Spinner
from rich.text import Text

from mibyan.cli.progress import preview_arguments
from mibyan.cli.prompts import TerminalQuestions
from mibyan.core.sanitize import visible
from mibyan.tools.approval import Approver

if TYPE_CHECKING:
    from mibyan.agent.turn_state import ConversationResult

_REPARSE_EVERY = 0.1

#: Dollars per million tokens (input, output) for models whose price is known.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-5": (1.25, 10.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-haiku-4": (1.00, 5.00),
}


def price_of(model: str) -> tuple[float, float] | None:
    name = model.rsplit("/", 1)[-1]
    matches = [prefix for prefix in PRICES if name.startswith(prefix)]
    return PRICES[max(matches, key=len)] if matches else None


class Waiting:
    """A spinner that says how long the model has been working on a request."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._spinner = Spinner("dots", style="cyan")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        self._spinner.update(text=Text(f" thinking… {time.monotonic() - self.started:.1f}s", style="dim"))
        yield self._spinner


class Renderer:
    """The REPL's callbacks: they draw on the console as the agent works."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.show_reasoning = True
        self.questions = TerminalQuestions()
        self._answer: list[str] = []
        self._parsed_at = 0.0
        self._live: Live | None = None
        self._running: list[tuple[str, Spinner]] = []
        self._waiting: Waiting | None = None
        self._tools_live: Live | None = None
        self._in_turn = False
        self._interrupted = False
        self._mid_reasoning = False
        self._lock = threading.RLock()

    def callbacks(self) -> dict[str, Any]:
        questions = {
            name: Approver(self.paused(ask.answer)) if isinstance(ask, Approver) else self.paused(ask)
            for name, ask in self.questions.callbacks().items()
        }
        return {
            "stream_delta_callback": self.on_delta,
            "reasoning_callback": self.on_reasoning,
            "thinking_callback": self.on_thinking,
            "tool_progress_callback": self.on_tool,
            "status_callback": self.on_status,
            **questions,
        }

    def begin_turn(self) -> None:
        with self._lock:
            self._in_turn = True
            self._interrupted = False

    def refuse_question(self) -> bool:
        """Ctrl-C while a question is asked: refuse it, and the turn goes on; whether one was asked."""
        return self.questions.cancel()

    def interrupt(self) -> None:
        """Ctrl-C: cancel any question at once, and stop drawing spinners before the notice prints."""
        self.questions.cancel()
        with self._lock:
            self._interrupted = True
            self._waiting = None
            self._hide_activity()

    def on_thinking(self, active: bool) -> None:
        """A request left (True) or its first token or tool call came back (False)."""
        with self._lock:
            self._waiting = Waiting() if active and not self._interrupted else None
            self._show_running()

    def _end_reasoning(self) -> None:
        if self._mid_reasoning:
            self.console.print()
            self._mid_reasoning = False

    def on_delta(self, text: str) -> None:
        with self._lock:
            self._waiting = None
            self._hide_activity()
            self._end_reasoning()
            self._answer.append(text)
            if self._live is None:
                self._live = Live(Markdown(""), console=self.console, refresh_per_second=12, transient=False)
                self._live.start()
            # Parsing the whole answer as Markdown on every token would cost O(n²) on a long answer:
            # re-parse at most every _REPARSE_EVERY seconds, and once more when the answer ends.
            now = time.monotonic()
            if now - self._parsed_at >= _REPARSE_EVERY:
                self._parsed_at = now
                self._live.update(Markdown(visible("".join(self._answer))))

    def on_reasoning(self, text: str) -> None:
        if self.show_reasoning and text:
            with self._lock:
                self._waiting = None
                self._hide_activity()
                self.console.print(Text(visible(text), style="dim italic"), end="")
                self._mid_reasoning = not text.endswith("\n")

    def _close_answer(self) -> None:
        if self._live is not None:
            self._live.update(Markdown(visible("".join(self._answer))))
            self._live.stop()
            self._live = None
        self._parsed_at = 0.0

    def on_tool(self, phase: str, name: str, detail: dict[str, Any]) -> None:
        """One line per tool call: a spinner while it runs, then its status and duration."""
        label = f"{visible(name)}({preview_arguments(detail.get('arguments'))})"
        with self._lock:
            index = next((i for i, (running, _) in enumerate(self._running) if running == label), None)
            if not self._in_turn or (phase != "start" and index is None):
                return  # the end of a call an earlier turn already closed as interrupted
            self._close_answer()
            self._end_reasoning()
            self._answer = []
            if phase == "start":
                self._running.append((label, Spinner("dots", text=Text(f" {label}", style="cyan"))))
            else:
                assert index is not None
                del self._running[index]
                duration = f" · {detail.get('duration', 0):.1f}s"
                if self._interrupted:
                    self._print_interrupted(label, duration)
                else:
                    mark, style = ("✓", "green") if detail.get("ok") else ("✗", "red")
                    self.console.print(Text(f"  {mark} {label}{duration}", style=style))
            self._show_running()

    def _print_interrupted(self, label: str, duration: str = "") -> None:
        self.console.print(Text(f"  ✗ {label} · interrupted{duration}", style="yellow"))

    def _hide_activity(self) -> None:
        if self._tools_live is not None:
            self._tools_live.stop()
            self._tools_live = None

    def _show_running(self) -> None:
        if self._interrupted or not (self._running or self._waiting):
            self._hide_activity()
            return
        if self._live is not None:  # rich draws one live display at a time: the answer's comes first
            return
        waiting = [self._waiting] if self._waiting is not None else []
        rows = Group(*waiting, *(spinner for _, spinner in self._running))
        if self._tools_live is None:
            self._tools_live = Live(rows, console=self.console, refresh_per_second=10, transient=True)
            self._tools_live.start()
        else:
            self._tools_live.update(rows)

    def paused(self, ask: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a question to the user (approval, clarify) so no spinner draws over it."""

        def asking(*args: Any) -> Any:
            with self._lock:
                self._hide_activity()
            try:
                return ask(*args)
            finally:
                with self._lock:
                    self._show_running()

        return asking

    def on_status(self, kind: str, message: str) -> None:
        if kind in ("interrupted",):
            return
        with self._lock:
            if kind == "stream_restart":
                # The retry says something else: what was shown stays above the note, the new answer
                # starts below it instead of being joined onto the old one.
                self._close_answer()
                self._answer = []
            self.console.print(Text(f"  · {visible(message)}", style="yellow"))

    def end_turn(self, result: ConversationResult, model: str) -> None:
        with self._lock:
            self._in_turn = False
            self._waiting = None
            self._hide_activity()
            for label, _ in self._running:  # calls that got no result before the turn stopped
                self._print_interrupted(label)
            self._running = []
            self._close_answer()
            self._end_reasoning()
            final = result["final_response"]
            if not self._answer and final:
                self.console.print(Markdown(visible(final)))
            self._answer = []
        if result["error"]:
            self.console.print(Text(f"error: {visible(result['error'])}", style="bold red"))
        elif result["interrupted"]:
            self.console.print(Text("(interrupted)", style="yellow"))
        self.console.print(Text(self.footer(result["usage"], model), style="dim"))

    @staticmethod
    def footer(usage: dict[str, int], model: str) -> str:
        line = f"  {usage['input_tokens']:,} in · {usage['output_tokens']:,} out"
        if usage.get("cache_read_tokens"):
            line += f" · {usage['cache_read_tokens']:,} read from cache"
        if usage.get("cache_write_tokens"):
            line += f" · {usage['cache_write_tokens']:,} written to cache"
        price = price_of(model)
        if price is not None:
            cost = (usage["input_tokens"] * price[0] + usage["output_tokens"] * price[1]) / 1_000_000
            line += f" · ${cost:.4f}"
        return line

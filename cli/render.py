"""What the interactive chat shows: the streamed answer, reasoning, tool lines, and a footer per turn.

rich is imported here only, and this module only by the REPL. Colour follows the terminal: NO_COLOR and
output that is not a terminal get plain text.
"""

from __future__ import annotations

import threading
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from cli.progress import preview_arguments

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


class Renderer:
    """The REPL's callbacks: they draw on the console as the agent works."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.show_reasoning = True
        self._answer: list[str] = []
        self._live: Live | None = None
        self._lock = threading.Lock()

    def callbacks(self) -> dict[str, Any]:
        return {
            "stream_delta_callback": self.on_delta,
            "reasoning_callback": self.on_reasoning,
            "tool_progress_callback": self.on_tool,
            "status_callback": self.on_status,
        }

    def on_delta(self, text: str) -> None:
        with self._lock:
            self._answer.append(text)
            if self._live is None:
                self._live = Live(Markdown(""), console=self.console, refresh_per_second=12, transient=False)
                self._live.start()
            self._live.update(Markdown("".join(self._answer)))

    def on_reasoning(self, text: str) -> None:
        if self.show_reasoning:
            with self._lock:
                self.console.print(Text(text, style="dim italic"), end="")

    def _close_answer(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def on_tool(self, phase: str, name: str, detail: dict[str, Any]) -> None:
        with self._lock:
            self._close_answer()
            self._answer = []
            if phase == "start":
                self.console.print(
                    Text(f"  ⚙ {name}({preview_arguments(detail.get('arguments'))}) …", style="cyan")
                )
            else:
                mark, style = ("✓", "green") if detail.get("ok") else ("✗", "red")
                self.console.print(Text(f"  {mark} {name} · {detail.get('duration', 0):.1f}s", style=style))

    def on_status(self, kind: str, message: str) -> None:
        if kind not in ("interrupted",):
            with self._lock:
                self.console.print(Text(f"  · {message}", style="yellow"))

    def end_turn(self, result: dict[str, Any], model: str) -> None:
        with self._lock:
            self._close_answer()
            if not self._answer and result.get("final_response"):
                self.console.print(Markdown(result["final_response"]))
            self._answer = []
        if result.get("error"):
            self.console.print(Text(f"error: {result['error']}", style="bold red"))
        elif result.get("interrupted"):
            self.console.print(Text("(interrupted)", style="yellow"))
        self.console.print(Text(self.footer(result["usage"], model), style="dim"))

    @staticmethod
    def footer(usage: dict[str, int], model: str) -> str:
        line = f"  {usage['input_tokens']:,} in · {usage['output_tokens']:,} out"
        if usage.get("cache_read_tokens"):
            line += f" · {usage['cache_read_tokens']:,} cached"
        price = price_of(model)
        if price is not None:
            cost = (usage["input_tokens"] * price[0] + usage["output_tokens"] * price[1]) / 1_000_000
            line += f" · ${cost:.4f}"
        return line

"""The tokens of each model call of a session, drawn on the server as an inline SVG bar chart.

One column per call: the input stacked from what was read from the provider's cache, what was written
to it, and the rest (fresh input), with the output beside it. No script and no style attribute (the
page's Content-Security-Policy allows neither inline); colours come from classes in web.css.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from markupsafe import Markup, escape

from mibyan.web.text import attribute

_HEIGHT = 160
_TOP = 12
_BOTTOM = 22
_LEFT = 56
_MAX_WIDTH = 960
_SERIES = ("cache_read", "cache_write", "fresh", "output")


def _ticks(peak: int) -> list[int]:
    """Five round values on the axis (1, 2 or 5 times a power of ten apart), the last at least `peak`."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if magnitude * factor * 4 >= peak:
                return [magnitude * factor * i for i in range(5)]
        magnitude *= 10


def _label(value: int) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    return f"{value / 1000:g}k" if value >= 1000 else str(value)


def _parts(call: dict[str, Any]) -> dict[str, int]:
    cache_read, cache_write = call["cache_read_tokens"], call["cache_write_tokens"]
    return {
        "cache_read": cache_read,
        "cache_write": cache_write,
        "fresh": max(0, call["input_tokens"] - cache_read - cache_write),
        "output": call["output_tokens"],
    }


def token_chart(calls: list[dict[str, Any]], link: Callable[[int], str]) -> Markup:
    """An SVG of the calls' tokens (empty when there are none); each bar links to `link(seq)`, the
    address of the message the call's reply became."""
    if not calls:
        return Markup("")
    parts = [_parts(call) for call in calls]
    peak = max(max(p["cache_read"] + p["cache_write"] + p["fresh"], p["output"]) for p in parts) or 1
    ticks = _ticks(peak)
    top_value = max(ticks[-1], peak)
    plot = _HEIGHT - _TOP - _BOTTOM
    slot = max(2.0, min(24.0, (_MAX_WIDTH - _LEFT) / len(calls)))
    width = max(320.0, _LEFT + slot * len(calls) + 4)

    def y(value: float) -> float:
        return _TOP + plot - plot * value / top_value

    out = [
        f'<svg class="chart" viewBox="0 0 {width:.0f} {_HEIGHT}" width="{width:.0f}" height="{_HEIGHT}"'
        ' role="img" aria-label="tokens per model call">'
    ]
    for tick in ticks:
        out.append(
            f'<line class="grid" x1="{_LEFT}" x2="{width:.0f}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
            f'<text class="axis" x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
            f"{_label(tick)}</text>"
        )
    bar = max(1.0, slot * 0.45)
    for index, (call, part) in enumerate(zip(calls, parts, strict=True)):
        x = _LEFT + index * slot + slot * 0.05
        tip = escape(
            attribute(
                f"call {index + 1} · {call['model'] or '?'} · {call['input_tokens']:,} in"
                f" ({part['cache_read']:,} cache read, {part['cache_write']:,} cache write)"
                f" · {call['output_tokens']:,} out"
            )
        )
        out.append(f'<a href="{escape(link(call["seq"]))}"><g class="call"><title>{tip}</title>')
        base = 0
        for series in _SERIES[:3]:
            if part[series]:
                out.append(_rect(series, x, y(base + part[series]), bar, y(base) - y(base + part[series])))
                base += part[series]
        if part["output"]:
            out.append(_rect("output", x + bar, y(part["output"]), bar, y(0) - y(part["output"])))
        out.append("</g></a>")
    out.append(f'<text class="axis" x="{_LEFT}" y="{_HEIGHT - 6}">model calls 1–{len(calls)}</text></svg>')
    return Markup("".join(out))


def _rect(series: str, x: float, top: float, width: float, height: float) -> str:
    return (
        f'<rect class="{series}" x="{x:.1f}" y="{top:.1f}" width="{width:.1f}"'
        f' height="{max(height, 0.5):.1f}"/>'
    )

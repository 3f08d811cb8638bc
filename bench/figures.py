"""How every benchmark prints a figure: median, min/max, and the ratio to its floor."""

from __future__ import annotations

import statistics


def stats(samples: list[float]) -> tuple[float, float, float]:
    return statistics.median(samples), min(samples), max(samples)


def show(label: str, samples: list[float], floor: list[float] | None = None, unit: str = "ms") -> None:
    median, low, high = stats(samples)
    line = f"{label:<48} median {median:8.2f} {unit}  (min {low:.2f}, max {high:.2f})"
    if floor is not None:
        floor_median = statistics.median(floor)
        line += f"  floor {floor_median:.2f} {unit}  ratio {median / floor_median:.2f}x"
    print(line, flush=True)

"""Compression cost: time to compress a 300-message history, the model call left out (a stub summarizer)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_context import long_history  # noqa: E402

from bench.figures import show  # noqa: E402
from mibyan.agent.context_compressor import ContextCompressor  # noqa: E402
from mibyan.agent.tokens import TokenEstimator  # noqa: E402
from mibyan.config.loader import load_settings  # noqa: E402


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(home=Path(tmp), env={})
    history = long_history(rounds=75)
    engine = ContextCompressor(
        settings, 16_000, TokenEstimator(), lambda system, prompt: "## Goal\nstub summary"
    )
    samples = []
    for _ in range(20):
        began = time.perf_counter()
        result = engine.compress(history, system_prompt="You are an agent.", tools=[], reason="preflight")
        samples.append((time.perf_counter() - began) * 1000)
        assert result is not None and result.summarized
    show(f"compress a {len(history)}-message history (no model call)", samples)


if __name__ == "__main__":
    main()

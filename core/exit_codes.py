"""The exit codes of `mibyan`, in one place for every subcommand (and for scripts that read them)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1  # a runtime failure: the provider, the store, a tool
EXIT_USAGE = 2  # bad arguments or configuration
EXIT_BUDGET = 3  # the iteration budget was spent before a final answer
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

__all__ = ["EXIT_BUDGET", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE"]

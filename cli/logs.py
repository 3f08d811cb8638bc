"""The CLI's log file: `$MIBYAN_HOME/logs/mibyan.log`, private, with anything that looks like a key masked."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mibyan.config.paths import private_dir

_HANDLER_NAME = "mibyan-file"


class RedactSecrets(logging.Filter):
    """Masks keys and tokens in the final message text (and in tracebacks) before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        from agent_state import mask_secrets

        record.msg = mask_secrets(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


class _LogFile(logging.FileHandler):
    """The log file; a record that cannot be written (a full disk) is dropped, never a traceback."""

    def handleError(self, record: logging.LogRecord) -> None:
        # The log is a diagnostic aid: losing a line is better than breaking the terminal with a traceback.
        return


def setup_logging(home: Path, *, file_name: str = "mibyan.log") -> None:
    """Send mibyan's warnings and errors to its log file instead of the terminal (once per process)."""
    root = logging.getLogger("mibyan")
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    folder = home / "logs"
    path = folder / file_name
    try:
        private_dir(folder)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        handler: logging.Handler = _LogFile(path, encoding="utf-8")
    except OSError:
        # No log file (a read-only home, say): the run goes on, and nothing leaks onto the terminal.
        handler = logging.NullHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets())
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False  # nothing on the terminal but what the user asked for

"""The file tools' text through the editor (`fs/read_text_file`, `fs/write_text_file`), when it offers them.

The model then reads what the user sees, unsaved changes included, and its edits land in the editor's
buffers. The path policy has already judged every path handed here (tools/file_tools.py asks it first);
this only carries the text. A tool thread waits for the editor's answer, but an interrupt or a timeout
ends the wait at once.
"""

from __future__ import annotations

from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acp import RequestError

from mibyan.core.errors import ToolError

if TYPE_CHECKING:
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.editors.outbox import Outbox

#: Seconds the editor has to answer one file request.
_ANSWER_TIMEOUT = 60.0


class EditorFiles:
    """`FileAccess` (tools/context.py) through one editor session.

    Args:
        session_id: the ACP session the requests belong to.
        outbox: the connection, kept in order with the session's updates.
        reads: the editor offers fs/read_text_file.
        writes: the editor offers fs/write_text_file.
    """

    def __init__(self, session_id: str, outbox: Outbox, *, reads: bool, writes: bool) -> None:
        self.session_id = session_id
        self.reads = reads
        self.writes = writes
        self._outbox = outbox

    def read_text(self, path: Path, signal: InterruptSignal) -> str:
        client = self._outbox.client
        answer = self._wait(
            self._outbox.call(lambda: client.read_text_file(session_id=self.session_id, path=str(path))),
            f"read {path}",
            signal,
        )
        return str(answer.content)

    def write_text(self, path: Path, text: str, signal: InterruptSignal) -> None:
        client = self._outbox.client
        self._wait(
            self._outbox.call(
                lambda: client.write_text_file(session_id=self.session_id, path=str(path), content=text)
            ),
            f"write {path}",
            signal,
        )

    @staticmethod
    def _wait(request: Future[Any], what: str, signal: InterruptSignal) -> Any:
        request.add_done_callback(lambda _done: signal.notify())
        signal.wait_until(request.done, _ANSWER_TIMEOUT)
        if not request.done():
            request.cancel()
            if signal.is_set():
                raise ToolError(f"interrupted: the editor was asked to {what}, and the turn was stopped")
            raise ToolError(f"the editor did not answer within {_ANSWER_TIMEOUT:g} s when asked to {what}")
        try:
            return request.result()
        except RequestError as exc:
            detail = exc.data.get("details") if isinstance(exc.data, dict) else None
            raise ToolError(f"the editor could not {what}: {exc}{f' ({detail})' if detail else ''}") from None
        except (CancelledError, ConnectionError) as exc:
            raise ToolError(f"the editor could not {what}: the connection is gone") from exc

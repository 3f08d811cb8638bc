"""What an agent opens, closed again: `close()`, and `with AIAgent(...) as agent:`.

An agent owns a SQLite connection (the session store), an SDK client with its HTTP connections, and the
connections to its MCP servers, with their processes (tool calls run on daemon threads and own nothing
to close). Whoever is done with an agent closes it: delegation its subagents, the chat the agent that
/new, /resume or /model replaces, so a long-lived process does not collect connections.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from mibyan.agent.protocol import AgentBase

#: How long close() waits for an interrupted conversation to return (it normally takes milliseconds).
_RUN_END_WAIT = 5.0


class LifecycleMixin(AgentBase):
    """close() and the context manager."""

    def close(self) -> None:
        """Release the agent's database and HTTP connections (its SDK client goes back to its `sdk_clients`,
        when it has one) and stop its MCP servers. Safe to call twice.

        A conversation running on another thread is interrupted first, and closing waits (a few seconds
        at most) until it has returned, so its last messages are stored before the database closes.
        """
        self._closed = True
        self.interrupt()
        ended = self._running.acquire(timeout=_RUN_END_WAIT)
        if ended:
            self._running.release()
            self.provider.release_client()  # kept for the next run, when its agent shares SdkClients
        else:
            self.provider.drop_client()  # still in a call: no other run may have it
        self.tools.close()
        self.session.store.close()
        if self.session_lock is not None:
            self.session_lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

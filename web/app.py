"""The viewer's pages: the sessions list, search, a session's transcript, its exports and its live updates.

`create_app(store, token=...)` builds the Starlette application behind the `Guard`. Pages are Jinja2
templates with autoescape on; stored text reaches them only through the filters of `mibyan.web.text`.
The store is opened read-only, so the viewer never takes a lock a running agent would wait on; a page
reads with short queries and holds no transaction open. The live endpoint reads the session's newest
messages by seq (an index lookup) and sends each new one as an HTML fragment (server-sent events); it
looks again when the store announces a message of that session (PostgreSQL's NOTIFY, from any process
on any machine; SQLite's from this process only), else every `poll_interval`.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agent_state import SessionStore
from mibyan.core.session_text import age, export_lines
from mibyan.store.notices import MESSAGES, Waker
from mibyan.web import live, transcript
from mibyan.web.chart import token_chart
from mibyan.web.guard import Guard
from mibyan.web.text import attribute, markdown_html, pretty_arguments, snippet_html, text_html

HERE = Path(__file__).resolve().parent
#: Sessions per page of the list.
LIST_PAGE = 50
SEARCH_LIMIT = 50
_EXPORTS = {"jsonl": "application/x-ndjson", "md": "text/markdown"}
_HEARTBEAT = 15.0  # seconds between keep-alive comments on a quiet live stream
_LAST_EVENT = re.compile(r"^(-?\d{1,12}):(\d{1,12})$")


def _environment(page_size: int) -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        text=text_html,
        markdown=markdown_html,
        attr=attribute,
        pretty=pretty_arguments,
        short=lambda value, width=90: _short(attribute(value), width),
        age=age,
        clock=lambda ts: datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S"),
        tokens=lambda n: f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}",
    )
    env.globals.update(page_of=lambda seq: max(0, seq) // page_size)
    return env


def _short(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _int(value: str | None, default: int) -> int:
    """A whole number from the address (a page, a seq), else `default`; far beyond any session: `default`."""
    if value is None or not value.lstrip("-").isdigit() or len(value) > 12:
        return default
    return int(value)


class Viewer:
    """The routes, over one read-only store."""

    def __init__(self, store: SessionStore, *, poll_interval: float, page_size: int) -> None:
        self.store = store
        self.poll_interval = poll_interval
        self.page_size = page_size
        self.stopping = threading.Event()  # set: live streams end, so the server can stop at once
        self._streams: set[Waker] = set()
        self.env = _environment(page_size)
        self._macros = self.env.get_template("_items.html").module

    def stop(self) -> None:
        """Any thread: end the live streams at once (the server is stopping)."""
        self.stopping.set()
        for waker in list(self._streams):
            waker()

    def fragment(self, macro: str, *args: Any) -> str:
        """The HTML of one macro of _items.html (a message, a call's result) for a live update."""
        render: Callable[..., str] = getattr(self._macros, macro)
        return str(render(*args))

    def _page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("q", "")
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status)

    def _missing(self, session_id: str) -> HTMLResponse:
        return self._page("missing.html", 404, session_id=session_id)

    def sessions(self, request: Request) -> Response:
        source = request.query_params.get("source") or None
        page = max(0, _int(request.query_params.get("page"), 0))
        rows = self.store.sessions.newest_first(LIST_PAGE + 1, offset=page * LIST_PAGE, source=source)
        sources = self.store.sessions.sources()
        return self._page(
            "list.html",
            sessions=rows[:LIST_PAGE],
            more=len(rows) > LIST_PAGE,
            page=page,
            source=source,
            sources=sources,
        )

    def search(self, request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        marks = (f"\ue000{secrets.token_hex(8)}\ue001", f"\ue002{secrets.token_hex(8)}\ue003")
        searched = bool(self.store.search.words_query(query))
        hits = self.store.search(query, limit=SEARCH_LIMIT, marks=marks) if searched else []
        for hit in hits:
            hit["snippet_html"] = snippet_html(hit["snippet"], marks)
        return self._page("search.html", q=query, hits=hits, searched=searched)

    def session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        row = self.store.sessions.get(session_id)
        if row is None:
            return self._missing(session_id)
        page = request.query_params.get("page")
        number = None if page is None else _int(page, 0)
        view = transcript.load_transcript(self.store, row, number, page_size=self.page_size)
        calls = self.store.events.model_calls(session_id)
        chart = token_chart(calls, lambda seq: f"?page={max(0, seq) // self.page_size}#m{seq}")
        return self._page("session.html", t=view, s=row, chart=chart, calls=calls)

    def export(self, request: Request) -> Response:
        session_id, kind = request.path_params["session_id"], request.path_params["kind"]
        if kind not in _EXPORTS:
            return PlainTextResponse("404: export as .jsonl or .md\n", status_code=404)
        row = self.store.sessions.get(session_id)
        if row is None:
            return self._missing(session_id)
        title = row.get("title") or session_id
        body = "".join(export_lines(title, self.store.messages.load(session_id), kind))
        name = re.sub(r"[^A-Za-z0-9_-]", "_", session_id)[:64] or "session"
        headers = {"Content-Disposition": f'attachment; filename="mibyan-{name}.{kind}"'}
        return Response(body, media_type=f"{_EXPORTS[kind]}; charset=utf-8", headers=headers)

    async def live_updates(self, request: Request) -> Response:
        """Server-sent events: each message stored after the one the page shows, as it lands."""
        session_id = request.path_params["session_id"]
        if await run_in_threadpool(self.store.get_session, session_id) is None:
            return PlainTextResponse("404: no such session\n", status_code=404)
        resumed = _LAST_EVENT.match(request.headers.get("last-event-id", ""))
        if resumed:
            seq, message_id = int(resumed.group(1)), int(resumed.group(2))
        else:
            seq = _int(request.query_params.get("seq"), -1)
            message_id = _int(request.query_params.get("id"), 0)
        watch = live.Watch(session_id, seq, message_id)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(self._events(watch), media_type="text/event-stream", headers=headers)

    async def _events(self, watch: live.Watch) -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        waker = Waker(asyncio.get_running_loop())
        self._streams.add(waker)
        # subscribed before the first look: a message stored between the look and the wait wakes it
        listening = await run_in_threadpool(self.store.database.listen, MESSAGES, watch.session_id, waker)
        try:
            quiet_since = next_look = time.monotonic()
            woken = True
            while not self.stopping.is_set():
                if woken or time.monotonic() >= next_look:  # a heartbeat's wakeup is not a look
                    events = await run_in_threadpool(live.poll, self.store, self.fragment, watch)
                    next_look = time.monotonic() + self.poll_interval
                    for event in events:
                        yield event
                    if watch.over:
                        return
                    if events:
                        quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= _HEARTBEAT:
                    yield ": still here\n\n"
                    quiet_since = time.monotonic()
                wait = min(next_look, quiet_since + _HEARTBEAT) - time.monotonic()
                woken = await waker.wait(max(0.0, wait))
        finally:
            listening.close()
            self._streams.discard(waker)


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204)


def create_app(
    store: SessionStore,
    *,
    token: str,
    cookie: str,
    poll_interval: float = 0.25,
    page_size: int = transcript.PAGE_SIZE,
) -> Starlette:
    """The viewer over `store` (opened read-only), behind the token and Host check of `Guard`.

    Args:
        store: the session store, opened read-only.
        token: what every request must carry (see `Guard`).
        cookie: the name of the cookie that carries it after the first visit.
        poll_interval: seconds between two looks for new messages of a watched session, when the store
            announced none sooner.
        page_size: messages per page of a transcript.
    """
    viewer = Viewer(store, poll_interval=poll_interval, page_size=page_size)
    app = Starlette(
        routes=[
            Route("/", viewer.sessions),
            Route("/search", viewer.search),
            Route("/s/{session_id}", viewer.session),
            Route("/s/{session_id}/live", viewer.live_updates),
            Route("/s/{session_id}/export.{kind}", viewer.export),
            Route("/favicon.ico", _no_icon),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(Guard, token=token, cookie=cookie)],
    )
    app.state.viewer = viewer
    return app

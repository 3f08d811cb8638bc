"""The `http` connector: an OpenAI-compatible endpoint (Starlette on uvicorn), so any OpenAI client talks
to a mibyan agent.

Routes: `GET /health` (open), `GET /v1/models` and `POST /v1/chat/completions` (bearer token). The
channel is the `X-Mibyan-Channel` header, else the body's `user`: with one, only the last user message
is new and the channel's session is the history; without one, the request's messages are the whole
conversation. `Idempotency-Key` makes a repeat return the first reply. Errors use OpenAI's envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError, MibyanError
from mibyan.core.net import listen_on
from mibyan.gateway.connectors.http_requests import (
    BadRequest,
    HungUp,
    TooSlow,
    check_channel,
    check_message_key,
    check_text,
    parse_body,
    parse_messages,
    read_body,
)
from mibyan.gateway.connectors.http_token import read_token
from mibyan.gateway.connectors.throttle import AuthThrottle, peer_of
from mibyan.gateway.ledger import Reply
from mibyan.gateway.listener import ListenerLimits, server_config
from mibyan.gateway.runner import Gateway
from mibyan.gateway.work import Inbound, NothingToAnswer, Outcome, ShuttingDown, UnknownAgent

log = logging.getLogger("mibyan.gateway")


def error(
    status: int,
    message: str,
    kind: str,
    code: str,
    *,
    headers: dict[str, str] | None = None,
    close: bool = False,
) -> JSONResponse:
    """An error response in OpenAI's envelope (`close`: and the connection is closed after it)."""
    headers = {**(headers or {}), **({"Connection": "close"} if close else {})}
    envelope = {"error": {"message": message, "type": kind, "code": code}}
    return JSONResponse(envelope, status_code=status, headers=headers)


def completion(outcome: Outcome, model: str) -> dict[str, Any]:
    """A `chat.completion` holding the run's answer and its token usage."""
    usage = outcome.usage
    return {
        "id": f"chatcmpl-{outcome.inbox_id}-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        },
    }


def chunk(chunk_id: str, model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    """One `chat.completion.chunk` server-sent event."""
    event = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM and SIGINT belong to `mibyan gateway`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpConnector:
    """An OpenAI-compatible HTTP endpoint in front of the gateway's agents."""

    kind = "http"

    def __init__(self, settings: ConnectorSettings, gateway: Gateway) -> None:
        self.settings = settings
        self.name = settings.name
        self.gateway = gateway
        self._token = read_token(settings, os.environ).encode()
        self._throttle = AuthThrottle(failures=settings.auth_failures, block=settings.auth_block)
        self._limits = ListenerLimits(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            max_connections=settings.max_connections,
        )
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._port = settings.port

    @property
    def url(self) -> str:
        host = self.settings.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self._port}/v1"

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_error},
        )

    async def start(self) -> None:
        config = server_config(
            self.app(),
            self._limits,
            host=self.settings.host,
            port=self.settings.port,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(self.gateway.settings.gateway.shutdown_grace) + 5,
        )
        listener = listen_on(
            self.settings.host, self.settings.port, error=ConfigError, who=f"connector '{self.name}': "
        )
        self._port = listener.getsockname()[1]
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[listener]))
        # anyio's event-loop backend (each request's disconnect check) is imported on its first use:
        # loaded now, so the first message waits no longer than the rest
        with anyio.CancelScope():
            pass
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise ConfigError(f"connector '{self.name}': cannot listen on {self.settings.host}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task

    async def deliver(self, reply: Reply) -> bool:
        return False  # HTTP replies are collected by the client repeating its request

    def _refused(self, request: Request) -> Response | None:
        """401 for a missing or wrong token, 429 for a peer blocked after too many; None: go on."""
        peer = peer_of(request.client.host if request.client else None)
        wait = self._throttle.retry_after(peer)
        if wait is not None:
            return error(
                429,
                f"too many wrong bearer tokens from this address; retry in {wait} s",
                "rate_limit_error",
                "too_many_wrong_tokens",
                headers={"Retry-After": str(wait)},
            )
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token):
            self._throttle.succeeded(peer)
            return None
        self._throttle.failed(peer)
        log.info("a wrong or missing bearer token from %s", peer)
        return error(401, "missing or wrong bearer token", "authentication_error", "invalid_api_key")

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        served = [self.settings.agent] if self.settings.agent else sorted(self.gateway.agents)
        data = [{"id": agent, "object": "model", "created": 0, "owned_by": "mibyan"} for agent in served]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = parse_body(await read_body(request, timeout=self._limits.body_timeout))
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                raise BadRequest("'model' must be a string")
            text, history = parse_messages(body)
            channel = request.headers.get("x-mibyan-channel") or body.get("user")
            if channel is not None:
                channel = check_channel(channel)
            check_text(text, history, channel)
            message_key = request.headers.get("idempotency-key") or None
            check_message_key(message_key)
            instance = self.gateway.route(self.settings, model)
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error", "bad_request")
        except TooSlow as exc:
            return error(408, str(exc), "invalid_request_error", "request_timeout", close=True)
        except HungUp:  # nobody to answer: a line in the log, no more
            log.info("a client hung up before its request had arrived")
            return Response(status_code=400)
        except UnknownAgent as exc:
            return error(404, str(exc), "invalid_request_error", "model_not_found")
        inbound = Inbound(
            agent_id=instance.id,
            connector=self.name,
            channel=channel,
            text=text,
            history=None if channel is not None else history,
            message_key=message_key,
        )
        if body.get("stream") is True:
            return await self._stream(inbound, instance.id)
        try:
            outcome = await self.gateway.submit(inbound)
        except Exception as exc:  # the run's failure, as an error response
            return _run_error(exc)
        failed = _failure(outcome)
        if failed is not None:
            return failed
        # marked sent once written, and not at all for a client that hung up during the run: its reply
        # stays pending in the ledger, and the client's retry (same Idempotency-Key) collects it
        sent = (
            None
            if await request.is_disconnected()
            else BackgroundTask(self.gateway.delivered, outcome.inbox_id)
        )
        return JSONResponse(
            completion(outcome, instance.id),
            headers={"X-Mibyan-Session": outcome.session_id},
            background=sent,
        )

    async def _stream(self, inbound: Inbound, model: str) -> Response:
        """Stream the answer as chat.completion.chunk events.

        The response starts with the answer's first text (or the run's end), so a run that fails before
        it says anything is still a plain error status, and the session id can be a header.
        """
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[str] = asyncio.Queue()
        session: list[str] = []

        def on_delta(text: str) -> None:  # called on the agent's worker thread
            loop.call_soon_threadsafe(deltas.put_nowait, text)

        def on_start(session_id: str) -> None:  # called on the agent's worker thread
            session.append(session_id)

        run = asyncio.create_task(self.gateway.submit(inbound, on_delta=on_delta, on_start=on_start))
        first = asyncio.ensure_future(deltas.get())
        await asyncio.wait({first, run}, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            try:
                outcome = run.result()
            except Exception as exc:  # the run's failure, as an error response
                return _run_error(exc)
            failed = _failure(outcome)
            if failed is not None:
                return failed
            session.append(outcome.session_id)
        chunk_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"

        async def events() -> AsyncIterator[str]:
            yield chunk(chunk_id, model, {"role": "assistant", "content": ""})
            streamed = ""
            if first.done() and not first.cancelled():
                streamed = first.result()
                yield chunk(chunk_id, model, {"content": streamed})
            while not (run.done() and deltas.empty()):
                getter = asyncio.ensure_future(deltas.get())
                await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    streamed += getter.result()
                    yield chunk(chunk_id, model, {"content": getter.result()})
                else:
                    getter.cancel()
            try:
                outcome = run.result()
            except Exception as exc:  # the run's failure, as the stream's last event
                _, message, code = _run_failure(exc)
                yield _error_event(message, code)
                return
            if outcome.error is not None:
                yield _error_event(f"the model provider failed: {outcome.error}", "provider_failed")
                return
            if outcome.interrupted:
                yield _error_event("the gateway is shutting down; repeat the request", "shutting_down")
                return
            if not outcome.text.startswith(streamed):  # a retried model call said something else
                yield _error_event(
                    "the answer changed while it streamed; ask again for all of it", "restarted"
                )
                return
            if outcome.text != streamed:
                yield chunk(chunk_id, model, {"content": outcome.text[len(streamed) :]})
            yield chunk(chunk_id, model, {}, finish="stop")
            yield "data: [DONE]\n\n"
            await self.gateway.delivered(outcome.inbox_id)

        headers = {"Cache-Control": "no-cache", "X-Mibyan-Session": session[0] if session else ""}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _run_failure(exc: Exception) -> tuple[int, str, str]:
    """Status, message and code for a run that raised: an answer nothing waits for (409), stopping
    (503), or a failure of ours (500)."""
    if isinstance(exc, NothingToAnswer):
        return 409, str(exc), "nothing_to_answer"
    if isinstance(exc, ShuttingDown):
        return 503, str(exc), "shutting_down"
    if isinstance(exc, MibyanError):  # the agent could not be built or stored (its log line has the cause)
        return 500, str(exc), "internal_error"
    log.error("a run failed", exc_info=exc)
    return 500, "the gateway failed on this request (its log has the cause)", "internal_error"


def _run_error(exc: Exception) -> JSONResponse:
    status, message, code = _run_failure(exc)
    return error(status, message, "invalid_request_error" if status < 500 else "server_error", code)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown route, wrong method) in OpenAI's envelope."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 405:
        return error(
            405,
            f"{request.method} is not allowed on {request.url.path}",
            "invalid_request_error",
            "method_not_allowed",
        )
    if status == 404:
        return error(404, f"no route {request.url.path}", "invalid_request_error", "not_found")
    return error(status, str(getattr(exc, "detail", "") or "error"), "invalid_request_error", "bad_request")


def _error_event(message: str, code: str) -> str:
    envelope = {"error": {"message": message, "type": "server_error", "code": code}}
    return f"data: {json.dumps(envelope)}\n\n"


def _failure(outcome: Outcome) -> JSONResponse | None:
    if outcome.error is not None:
        return error(502, f"the model provider failed: {outcome.error}", "server_error", "provider_failed")
    if outcome.interrupted:
        return error(503, "the gateway is shutting down; repeat the request", "server_error", "shutting_down")
    return None

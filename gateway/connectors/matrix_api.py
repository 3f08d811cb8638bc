"""The matrix connector's wire and files: mautrix's HTTP client with the homeserver's 429 made readable,
the login kept under the home (access token and device, 0600), and the sync cursor.

mautrix drops the body of a standard error, and with it `retry_after_ms`; `MatrixHttp` reads it first.
The device is kept because Matrix's transaction-id idempotency is per device: a reply part re-sent
after a restart under the same txn id is recognised only when it comes from the same device.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import ClientResponse
from mautrix.api import HTTPAPI, Method
from mautrix.errors import MatrixRequestError, make_request_error
from yarl import URL

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.config.paths import write_private
from mibyan.core.errors import ConfigError

log = logging.getLogger("mibyan.gateway")
CLIENT = "/_matrix/client/v3"


class RateLimited(Exception):
    """The homeserver said 429: try again after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate-limited for {retry_after:.1f} s")
        self.retry_after = retry_after


class MatrixHttp(HTTPAPI):
    """mautrix's HTTP API, raising `RateLimited` with the homeserver's `retry_after_ms` on a 429."""

    async def _send(
        self, method: Method, url: URL, content: Any, query_params: dict[str, str], headers: dict[str, str]
    ) -> tuple[Any, ClientResponse]:
        request = self.session.request(str(method), url, data=content, params=query_params, headers=headers)
        async with request as response:
            if 200 <= response.status < 300:
                return await response.json(), response
            text = await response.text()
            try:
                body = json.loads(text)
            except ValueError:
                body = {}
            body = body if isinstance(body, dict) else {}
            if response.status == 429:
                wait = body.get("retry_after_ms")
                header = response.headers.get("Retry-After")
                seconds = float(wait) / 1000 if isinstance(wait, int | float) else float(header or 1)
                raise RateLimited(max(seconds, 0.05))
            raise make_request_error(
                http_status=response.status,
                text=text,
                errcode=body.get("errcode"),
                message=body.get("error"),
            )


def room_path(room_id: str, *rest: str) -> str:
    return "/".join([f"{CLIENT}/rooms/{quote(room_id, safe='')}", *(quote(p, safe="") for p in rest)])


@dataclass
class Login:
    user_id: str
    device_id: str
    access_token: str


class ConnectorFiles:
    """`$MIBYAN_HOME/connectors/<name>/`: `login.json` (token and device) and `sync.json` (the cursor)."""

    def __init__(self, home: Path, name: str) -> None:
        self.folder = home / "connectors" / name

    def _read(self, file: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.folder / file).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def login(self, homeserver: str, user_id: str) -> Login | None:
        data = self._read("login.json")
        if data is None or data.get("homeserver") != homeserver or data.get("user_id") != user_id:
            return None
        return Login(user_id, str(data.get("device_id", "")), str(data.get("access_token", "")))

    def save_login(self, homeserver: str, login: Login) -> None:
        data = {"homeserver": homeserver, **login.__dict__}
        write_private(self.folder / "login.json", json.dumps(data).encode())

    def forget_login(self) -> None:
        """The kept login no longer works: the next `log_in` logs in with the password."""
        (self.folder / "login.json").unlink(missing_ok=True)

    def cursor(self) -> tuple[str | None, float]:
        """The `since` token after the last admitted sync, and when the connector first started."""
        data = self._read("sync.json") or {}
        since = data.get("since")
        return (since if isinstance(since, str) else None), float(data.get("first_start") or time.time())

    def save_cursor(self, since: str, first_start: float) -> None:
        data = {"since": since, "first_start": first_start}
        write_private(self.folder / "sync.json", json.dumps(data).encode())


def check_matrix(settings: ConnectorSettings, env: dict[str, str] | os._Environ[str]) -> str:
    """The secret a matrix connector logs in with (`password_env` or `access_token_env`).

    Raises:
        ConfigError: a key the matrix kind needs is missing (one line saying which).
    """
    where = f"connector '{settings.name}' (matrix)"
    if not settings.homeserver or not settings.homeserver.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: set homeserver: to the homeserver's URL, e.g. http://127.0.0.1:8008")
    if not settings.user_id or not settings.user_id.startswith("@") or ":" not in settings.user_id:
        raise ConfigError(f'{where}: set user_id: to the bot\'s Matrix id, e.g. "@meepa:example.org"')
    if not settings.allow:
        raise ConfigError(
            f'{where}: set allow: to who may talk to the agent (Matrix ids, or "*" for anyone); '
            "without it the connector does not start"
        )
    variable = settings.access_token_env or settings.password_env
    if variable is None:
        raise ConfigError(f"{where}: set password_env: or access_token_env: to the variable holding it")
    secret = env.get(variable, "")
    if not secret:
        raise ConfigError(f"{where}: the variable {variable} is not set")
    return secret


async def log_in(api: HTTPAPI, settings: ConnectorSettings, files: ConnectorFiles, secret: str) -> Login:
    """The kept login when it still works, else a new one (kept for the next start).

    Raises:
        ConfigError: the homeserver refused the credentials.
    """
    assert settings.homeserver is not None and settings.user_id is not None
    kept = None if settings.access_token_env else files.login(settings.homeserver, settings.user_id)
    token = secret if settings.access_token_env else (kept.access_token if kept else "")
    if token:
        api.token = token
        try:
            who = await api.request(Method.GET, f"{CLIENT}/account/whoami")
            login = Login(str(who["user_id"]), str(who.get("device_id") or ""), token)
            if not settings.access_token_env:
                files.save_login(settings.homeserver, login)
            return login
        except MatrixRequestError as exc:
            if settings.access_token_env or exc.http_status != 401:
                refused = f"connector '{settings.name}': the homeserver refused the token: {exc}"
                raise ConfigError(refused) from exc
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": settings.user_id},
        "password": secret,
        "initial_device_display_name": f"mibyan gateway ({settings.name})",
    }
    while True:
        try:
            answer = await api.request(Method.POST, f"{CLIENT}/login", body, sensitive=True)
            break
        except RateLimited as limited:  # logins are rate-limited too: wait as long as the server says
            log.warning("%s: login rate-limited, trying again in %.1f s", settings.name, limited.retry_after)
            await asyncio.sleep(limited.retry_after)
        except MatrixRequestError as exc:
            refused = f"connector '{settings.name}': the homeserver refused the login: {exc}"
            raise ConfigError(refused) from exc
    login = Login(str(answer["user_id"]), str(answer["device_id"]), str(answer["access_token"]))
    api.token = login.access_token
    files.save_login(settings.homeserver, login)
    return login

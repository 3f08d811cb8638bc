"""The HTTP connector's bearer token, as its settings name it: apart from the server (starlette and
uvicorn), so that `mibyan gateway --check` reads it without loading them."""

from __future__ import annotations

import os

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.core.net import is_loopback_host

MIN_TOKEN_LENGTH = 16  # characters of a token other machines may guess at


def read_token(settings: ConnectorSettings, env: dict[str, str] | os._Environ[str]) -> str:
    """The bearer token clients must send, without blanks around it (HTTP drops them from a header).

    Raises:
        ConfigError: one line, when its variable is not set, is blank, or (on a host other machines
            reach) holds fewer than MIN_TOKEN_LENGTH characters.
    """
    where = f"connector '{settings.name}'"
    raw = env.get(settings.token_env)
    token = (raw or "").strip()
    remote = not is_loopback_host(settings.host)
    if raw and not token:
        raise ConfigError(f"{where}: {settings.token_env} is blank; no client could send it")
    if not token and remote:
        raise ConfigError(
            f"{where}: host {settings.host} is reachable from other machines; "
            f"set {settings.token_env} to a bearer token first (or bind 127.0.0.1)"
        )
    if not token:
        raise ConfigError(f"{where}: set {settings.token_env} to the bearer token clients must send")
    if remote and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{where}: host {settings.host} is reachable from other machines and {settings.token_env} "
            f"has {len(token)} character(s); use at least {MIN_TOKEN_LENGTH}, such as the output of "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    return token

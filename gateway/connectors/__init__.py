"""Connectors: where the gateway's messages arrive and its replies leave, one module per kind."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.core.lean_imports import take_back

if TYPE_CHECKING:
    from mibyan.gateway.connectors.base import Connector
    from mibyan.gateway.runner import Gateway


#: Each kind's module and class, and the extra that installs its library (None: nothing to install; the
#: email kind speaks through the standard library's imaplib and smtplib).
_KINDS: dict[str, tuple[str, str, str | None]] = {
    "http": ("http", "HttpConnector", None),
    "matrix": ("matrix", "MatrixConnector", "matrix"),  # mautrix
    "email": ("email", "EmailConnector", None),
    "xmpp": ("xmpp", "XmppConnector", "xmpp"),  # slixmpp
}
#: What a kind's library imports that the `mibyan` program otherwise leaves out (core/lean_imports.py).
_NEEDS = {"matrix": ("aiohttp",), "xmpp": ("aiohttp",)}


def take_back_for(kind: str) -> None:
    """Before a kind's library is imported: what it needs that the program left out, back."""
    take_back(_NEEDS.get(kind, ()))


def make_connector(settings: ConnectorSettings, gateway: Gateway) -> Connector:
    """The connector of a `connectors:` entry (its kind's module is imported here, on use).

    Raises:
        ConfigError: the entry cannot be served as configured (one line saying what to change).
    """
    module_name, class_name, extra = _KINDS[settings.kind]
    take_back_for(settings.kind)
    try:
        module = importlib.import_module(f"mibyan.gateway.connectors.{module_name}")
    except ImportError as exc:
        if extra is None:
            raise
        raise ConfigError(
            f"connector '{settings.name}': the {settings.kind} kind needs {exc.name or 'its library'}: "
            f"pip install 'mibyan[{extra}]'"
        ) from exc
    connector: Connector = getattr(module, class_name)(settings, gateway)
    return connector

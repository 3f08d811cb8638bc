"""Connectors: where the gateway's messages arrive and its replies leave, one module per kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError

if TYPE_CHECKING:
    from mibyan.gateway.connectors.base import Connector
    from mibyan.gateway.runner import Gateway


def make_connector(settings: ConnectorSettings, gateway: Gateway) -> Connector:
    """The connector of a `connectors:` entry (its kind's module is imported here, on use).

    Raises:
        ConfigError: the entry cannot be served as configured (one line saying what to change).
    """
    if settings.kind == "http":
        from mibyan.gateway.connectors.http import HttpConnector

        return HttpConnector(settings, gateway)
    if settings.kind == "matrix":
        try:
            from mibyan.gateway.connectors.matrix import MatrixConnector
        except ImportError as exc:  # mautrix is the `matrix` extra
            raise ConfigError(
                f"connector '{settings.name}': the matrix kind needs mautrix: pip install 'mibyan[matrix]'"
            ) from exc

        return MatrixConnector(settings, gateway)
    if settings.kind == "email":  # the standard library's imaplib and smtplib: no extra to install
        from mibyan.gateway.connectors.email import EmailConnector

        return EmailConnector(settings, gateway)
    if settings.kind == "xmpp":
        try:
            from mibyan.gateway.connectors.xmpp import XmppConnector
        except ImportError as exc:  # slixmpp is the `xmpp` extra
            raise ConfigError(
                f"connector '{settings.name}': the xmpp kind needs slixmpp: pip install 'mibyan[xmpp]'"
            ) from exc

        return XmppConnector(settings, gateway)
    raise AssertionError(f"connector kind {settings.kind!r} has no module")

"""What `mibyan gateway --check` asks of a chat connector, without importing its platform's library."""

from __future__ import annotations

import os

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.gateway.connectors import take_back_for


def check_chat_connector(settings: ConnectorSettings, env: dict[str, str] | os._Environ[str]) -> None:
    """ConfigError (one line) when a chat connector lacks what it needs to start (`allow`, its secret)."""
    if settings.kind == "matrix":
        take_back_for("matrix")
        try:
            from mibyan.gateway.connectors.matrix_api import check_matrix
        except ImportError as exc:
            raise ConfigError(
                f"connector '{settings.name}': the matrix kind needs mautrix: pip install 'mibyan[matrix]'"
            ) from exc
        check_matrix(settings, env)
    if settings.kind == "email":
        from mibyan.gateway.connectors.email_wire import check_email

        check_email(settings, env)
    if settings.kind == "xmpp":
        from mibyan.gateway.connectors.xmpp_setup import check_xmpp

        check_xmpp(settings, env)

"""The xmpp connector's settings checked, and its cursors: per archive, the last admitted stanza-id.

Kept apart from xmpp.py so `mibyan gateway --check` reads them without importing slixmpp.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.config.paths import write_private
from mibyan.core.errors import ConfigError


def check_xmpp(settings: ConnectorSettings, env: dict[str, str] | os._Environ[str]) -> str:
    """The password an xmpp connector logs in with (`password_env`).

    Raises:
        ConfigError: a key the xmpp kind needs is missing (one line saying which).
    """
    where = f"connector '{settings.name}' (xmpp)"
    jid = settings.jid or ""
    local, _, domain = jid.partition("@")
    if not local or not domain or "/" in domain:
        raise ConfigError(f"{where}: set jid: to the bot's bare JID, e.g. meepa@example.org")
    if not settings.allow:
        raise ConfigError(
            f'{where}: set allow: to who may talk to the agent (bare JIDs, or "*" for anyone); '
            "without it the connector does not start"
        )
    for room in settings.rooms:
        if "@" not in room or "/" in room:
            example = f"agents@conference.{domain}"
            raise ConfigError(f"{where}: rooms: '{room}' is not a room's JID, e.g. {example}")
    if settings.password_env is None:
        raise ConfigError(f"{where}: set password_env: to the variable holding the account's password")
    secret = env.get(settings.password_env, "")
    if not secret:
        raise ConfigError(f"{where}: the variable {settings.password_env} is not set")
    return secret


def ca_path(settings: ConnectorSettings, home: Path) -> Path | None:
    """The `ca_file` to trust (relative to the home); ConfigError when it cannot be read."""
    if settings.ca_file is None:
        return None
    path = Path(settings.ca_file).expanduser()
    path = path if path.is_absolute() else home / path
    if not path.is_file():
        raise ConfigError(f"connector '{settings.name}': ca_file {path} is not a readable file")
    return path


class Cursors:
    """`$MIBYAN_HOME/connectors/<name>/archive.json`: per archive (the bot's own, each room's), the
    stanza-id of the last message admitted from it; an archive never read has none."""

    def __init__(self, home: Path, name: str, jid: str) -> None:
        self.file = home / "connectors" / name / "archive.json"
        self.jid = jid
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            data = {}
        kept = data.get("cursors") if isinstance(data, dict) and data.get("jid") == jid else None
        self._cursors: dict[str, str] = dict(kept) if isinstance(kept, dict) else {}

    def get(self, archive: str) -> str | None:
        return self._cursors.get(archive)

    def advance(self, archive: str, stanza_id: str) -> None:
        """Every message of `archive` up to `stanza_id` is admitted: only now does the cursor move."""
        if self._cursors.get(archive) == stanza_id:
            return
        self._cursors[archive] = stanza_id
        write_private(self.file, json.dumps({"jid": self.jid, "cursors": self._cursors}).encode())

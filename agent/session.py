"""The session an agent writes to: its id, and how new ids are made."""

from __future__ import annotations

import secrets


def new_session_id() -> str:
    """A short id that is easy to type and unique enough for one person's sessions."""
    return secrets.token_hex(5)

"""What mibyan remembers of an MCP server between runs: its tool list, keyed by its configuration.

The first request of a run offers the tools from here, without waiting for the server to start; the
list is replaced as soon as the server lists its own. A server that failed to start is remembered with
why (and with no tools if it was never seen working), so the next start does not wait for it, and names
it at once: its failure is not lost because the next run ends before the server fails again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mibyan.config.mcp import McpServerSettings
from mibyan.config.paths import private_dir, write_private

log = logging.getLogger("mibyan.mcp")


@dataclass(frozen=True)
class McpTool:
    """One tool as its server lists it: its own name, what it says it does, its input schema."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool = False


def config_key(settings: McpServerSettings) -> str:
    """The cache key of a server: a hash of what decides which server it is (never of the environment)."""
    identity = settings.model_dump(include={"command", "args", "env", "cwd", "url", "headers"})
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


#: The most tools taken from one server: each one's schema is sent with every request.
MAX_TOOLS = 256
#: How many of a server's invalid tools are remembered by name (a hostile server may list thousands).
INVALID_KEPT = 20


@dataclass
class Listing:
    """What a server's tool list said besides its tools: the tools left out as not valid (the first
    `INVALID_KEPT` by name, with why; all of them counted), and whether it listed more than is read."""

    invalid: dict[str, str] = field(default_factory=dict)
    invalid_count: int = 0
    truncated: bool = False

    def leave_out(self, name: str, why: str) -> None:
        self.invalid_count += 1
        if len(self.invalid) < INVALID_KEPT:
            self.invalid[name] = why


@dataclass(frozen=True)
class CachedServer:
    """What the last run learnt of a server: its tools and listing, and why it failed to start, if it did."""

    tools: list[McpTool]
    failure: str | None = None
    listing: Listing = field(default_factory=Listing)


class ToolCache:
    """Each server's last tool list, in `$MIBYAN_HOME/cache/mcp/<key>.json` (0600)."""

    def __init__(self, home: Path) -> None:
        self.folder = home / "cache" / "mcp"

    def load(self, settings: McpServerSettings) -> CachedServer | None:
        try:
            raw = json.loads((self.folder / f"{config_key(settings)}.json").read_bytes())
            failure = raw.get("failure")
            tools = [McpTool(**entry) for entry in raw["tools"]]
            listing = Listing(**raw.get("listing", {}))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return CachedServer(tools, failure if isinstance(failure, str) else None, listing)

    def save(
        self,
        settings: McpServerSettings,
        tools: list[McpTool],
        *,
        failure: str | None = None,
        listing: Listing | None = None,
    ) -> None:
        """Remember the server's tools and listing, and `failure`: why it did not start this time (None:
        it did)."""
        data: dict[str, Any] = {
            "tools": [tool.__dict__ for tool in tools],
            "failure": failure,
            "listing": asdict(listing or Listing()),
        }
        try:
            private_dir(self.folder)
            write_private(self.folder / f"{config_key(settings)}.json", json.dumps(data).encode())
        except OSError as exc:  # a read-only home: the next start is slower, nothing worse
            log.warning("could not cache the tools of an MCP server: %s", exc)

"""A tool as the model sees it, the one shape the registry, MCP and the wire adapters share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class ToolSchema:
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    @cached_property
    def chars(self) -> int:
        """The characters it adds to a request (name, description, its parameters as JSON), for the
        token estimates made several times a turn: a schema outlives its requests, so it is sized once."""
        return len(self.name) + len(self.description) + len(json.dumps(self.parameters))

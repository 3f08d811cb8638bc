"""An MCP server that writes its JSON-RPC by hand, for what the SDK's server API refuses to send: a tool
list with one tool the SDK cannot take (`inputSchema: "nope"`) beside a good one, and as many more good
ones as MIBYAN_RAW_TOOLS says. Run as a program, on stdio; every good tool says its text back."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": "echo", "description": "Say the text back.", "inputSchema": {"type": "object"}},
    {"name": "broken", "description": "Its schema is not one.", "inputSchema": "nope"},
]
TOOLS += [
    {"name": f"echo{n}", "description": "Say the text back.", "inputSchema": {"type": "object"}}
    for n in range(int(os.environ.get("MIBYAN_RAW_TOOLS", "0")))
]


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:  # a notification
        return None
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
    if method == "initialize":
        reply["result"] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))
        reply["result"] = {"content": [{"type": "text", "text": text}]}
    elif method == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": f"no method {method}"}
    return reply


if __name__ == "__main__":
    for line in sys.stdin:
        if line.strip():
            reply = answer(json.loads(line))
            if reply is not None:
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()

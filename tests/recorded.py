"""Replay of the recorded provider traffic in fixtures/recorded through `httpx2.MockTransport`."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import yaml

FIXTURES = Path(__file__).parent / "fixtures" / "recorded"


@dataclass
class Interaction:
    request_body: dict[str, Any]
    status: int
    content_type: str
    body: bytes


def load_cassette(relative: str) -> list[Interaction]:
    data = yaml.safe_load((FIXTURES / relative).read_text())
    interactions = []
    for item in data["interactions"]:
        request, response = item["request"], item["response"]
        raw_request = request.get("body")
        if isinstance(raw_request, dict) and "parsed_body" in request:
            request_body = request["parsed_body"]
        elif raw_request:
            request_body = json.loads(raw_request)
        else:
            request_body = request.get("parsed_body") or {}
        body = (response.get("body") or {}).get("string")
        if body is None and "parsed_body" in response:
            body = json.dumps(response["parsed_body"])
        raw = body if isinstance(body, bytes) else body.encode()
        headers = {k.lower(): v for k, v in response.get("headers", {}).items()}
        if "gzip" in (headers.get("content-encoding") or [""])[0]:
            raw = gzip.decompress(raw)
        content_type = (headers.get("content-type") or ["application/json"])[0]
        interactions.append(Interaction(request_body, response["status"]["code"], content_type, raw))
    return interactions


class Replay:
    """Serves recorded responses in order and keeps the requests the client sent."""

    def __init__(self, interactions: list[Interaction]) -> None:
        self.interactions = list(interactions)
        self.sent: list[dict[str, Any]] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(json.loads(request.content or b"{}"))
        recorded = self.interactions.pop(0)
        return httpx2.Response(
            recorded.status, headers={"content-type": recorded.content_type}, content=recorded.body
        )

    def anthropic_client(self) -> Any:
        import anthropic

        return anthropic.Anthropic(
            api_key="test-key",
            base_url="https://api.anthropic.com",
            max_retries=0,
            http_client=anthropic.DefaultHttpxClient(transport=httpx2.MockTransport(self.handler)),
        )

    def openai_client(self) -> Any:
        import openai

        return openai.OpenAI(
            api_key="test-key",
            base_url="https://api.openai.com/v1",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(transport=httpx2.MockTransport(self.handler)),
        )


class Collect:
    """StreamEvents that keep what arrives."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tools: list[str] = []

    def on_text(self, delta: str) -> None:
        self.text.append(delta)

    def on_reasoning(self, delta: str) -> None:
        self.reasoning.append(delta)

    def on_tool_call(self, name: str) -> None:
        self.tools.append(name)

"""The side-task model client: compression summaries, vision, web extraction.

Each task has its own chain under `auxiliary.<task>`: a provider and model, then its fallbacks. Without
configuration a task uses the agent's own provider and model. A side task is one plain (non-streamed)
call; when every provider of its chain fails, the caller gets a ProviderError and falls back itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mibyan.agent.adapters.base import CallHandle, NormalizedResponse, WireRequest
from mibyan.agent.messages import user_message
from mibyan.agent.providers import ProviderRuntime, adapter_for, build_client, resolve_runtime
from mibyan.config.loader import AgentSettings
from mibyan.core.errors import ConfigError, ProviderError

log = logging.getLogger("mibyan.auxiliary")


class _Quiet:
    def on_text(self, delta: str) -> None:
        pass

    def on_reasoning(self, delta: str) -> None:
        pass

    def on_tool_call(self, name: str) -> None:
        pass


class AuxiliaryClient:
    """Runs one side task's calls through its own provider chain."""

    def __init__(self, settings: AgentSettings, main: ProviderRuntime, task: str) -> None:
        self.settings = settings
        self.task = task
        self.main = main

    def _chain(self) -> list[ProviderRuntime]:
        section = self.settings.auxiliary.get(self.task)
        if section is None:
            return [self.main]
        entries = [(section.provider, section.model), *((f.provider, f.model) for f in section.fallback)]
        chain: list[ProviderRuntime] = []
        for provider, model in entries:
            if provider is None:
                chain.append(self.main)
                continue
            try:
                chain.append(
                    resolve_runtime(
                        self.settings,
                        provider=provider,
                        model=model or self.main.model,
                        base_url=None,
                        api_key=None,
                        api_mode=None,
                        env=os.environ,
                    )
                )
            except ConfigError as exc:
                log.warning("auxiliary %s: skipping %s (%s)", self.task, provider, exc)
        return chain or [self.main]

    def complete(
        self, system_prompt: str, prompt: str, *, max_tokens: int = 4096, timeout: float = 120
    ) -> str:
        """One answer to `prompt`; tries each provider of the task's chain in turn."""
        failures: list[str] = []
        for runtime in self._chain():
            adapter = adapter_for(runtime.api_mode, self.settings)
            body = adapter.build_request(
                WireRequest(
                    model=runtime.model,
                    system_prompt=system_prompt,
                    messages=[user_message(prompt)],
                    stream=False,
                    max_tokens=max_tokens,
                )
            )
            client: Any = build_client(runtime, self.settings)
            try:
                reply: NormalizedResponse = adapter.send(
                    client, body, stream=False, events=_Quiet(), handle=CallHandle(), timeout=timeout
                )
            except Exception as exc:  # a side task's failure must not end the user's turn
                failures.append(f"{runtime.provider}/{runtime.model}: {exc}")
                continue
            finally:
                client.close()
            if reply.content and reply.content.strip():
                return reply.content
            failures.append(f"{runtime.provider}/{runtime.model}: empty reply")
        raise ProviderError(f"auxiliary task {self.task} failed: " + "; ".join(failures), reason="unknown")

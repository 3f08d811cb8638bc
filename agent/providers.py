"""Providers: which API mode, address and key a provider resolves to, and the SDK client and adapter for it.

Everything about reaching a model lives here, apart from the constructor's wiring (agent_init.py) and
the turn phases that use it (turn_api_call.py, turn_api_error.py) and the side-task client
(auxiliary_client.py), which all import from this module alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from mibyan.config.loader import API_MODES, AgentSettings, ProviderSettings, check_base_url, mibyan_home
from mibyan.core.errors import ConfigError

if TYPE_CHECKING:
    import httpx2

    from mibyan.agent.adapters.base import Adapter
    from mibyan.core.http_transport import AbortableTransport

_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


@dataclass
class ProviderRuntime:
    """The provider the agent is talking to now: where, how, as whom, and which fallback it is."""

    provider: str
    api_mode: str
    model: str
    base_url: str
    api_key: str
    fallback_index: int = 0
    # llama.cpp's server: streamed calls ask for its prompt progress (`return_progress`), whose chunks
    # while it reads the prompt let it see a client that gave up and free the slot (else it reads on)
    prompt_progress: bool = False


def resolve_api_mode(explicit: str | None, provider_mode: str | None, base_url: str | None) -> str:
    """Explicit argument → the provider's configured mode → base-URL heuristics → chat_completions."""
    if explicit:
        if explicit not in API_MODES:
            raise ConfigError(f"api_mode: unknown API mode '{explicit}' (known: {', '.join(API_MODES)})")
        return explicit
    if provider_mode:
        return provider_mode
    if base_url:
        parsed = urlparse(base_url)
        if parsed.hostname == "api.anthropic.com" or parsed.path.rstrip("/").endswith("/anthropic"):
            return "anthropic_messages"
    return "chat_completions"


def is_loopback(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in _LOOPBACK_HOSTS


def read_api_key(config: ProviderSettings, env: Mapping[str, str]) -> str | None:
    """The provider's key, read now: its `api_key_command`, else its variable, else `api_key` in config."""
    if config.api_key_command:
        import subprocess

        try:
            done = subprocess.run(
                config.api_key_command,
                shell=True,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(f"api_key_command: '{config.api_key_command}' took longer than 30 s") from None
        if done.returncode != 0:
            raise ConfigError(f"api_key_command: '{config.api_key_command}' failed (exit {done.returncode})")
        if done.stdout.strip():
            return done.stdout.strip()
    if config.api_key_env and env.get(config.api_key_env):
        return env[config.api_key_env]
    return config.api_key


def resolve_runtime(
    settings: AgentSettings,
    *,
    provider: str,
    model: str,
    base_url: str | None,
    api_key: str | None,
    api_mode: str | None,
    env: Mapping[str, str],
    fallback_index: int = 0,
    home: Path | None = None,
) -> ProviderRuntime:
    """Work out the provider runtime; a missing key is a ConfigError saying how to provide one.

    `home` is named in that message (`$MIBYAN_HOME` from `env` when omitted).
    """
    config = settings.providers.get(provider)
    if config is None:
        known = ", ".join(sorted(settings.providers))
        raise ConfigError(f"unknown provider '{provider}' (known: {known})")
    url = base_url or config.base_url
    if not url:
        raise ConfigError(f"providers.{provider}.base_url: not set; give the provider's API address")
    if base_url:
        try:
            check_base_url(base_url)
        except ValueError as exc:
            raise ConfigError(f"base_url: {exc}") from None
    key = api_key or read_api_key(config, env)
    if not key:
        if not is_loopback(url):
            variable = config.api_key_env or f"providers.{provider}.api_key_env"
            config_file = (home or mibyan_home(env)) / "config.yaml"
            raise ConfigError(
                f"no API key for provider '{provider}': set {variable}, or choose another provider "
                f"with --provider / model.provider in {config_file}"
            )
        key = "not-needed"  # local servers (llama.cpp, vLLM, Ollama) take any key
    return ProviderRuntime(
        provider=provider,
        api_mode=resolve_api_mode(api_mode, config.api_mode, url),
        model=model,
        base_url=url,
        api_key=key,
        fallback_index=fallback_index,
    )


def build_client(runtime: ProviderRuntime, settings: AgentSettings, transport: Any = None) -> Any:
    """The SDK client for the runtime's API mode; the SDK is imported here, on first use.

    `transport` (an AbortableTransport) lets the caller cut the client's connections from another thread.
    """
    from mibyan.core.http_transport import AbortableTransport

    timeout = settings.agent.api_timeout
    transport = transport or AbortableTransport()
    sdk: Any
    if runtime.api_mode == "anthropic_messages":
        import anthropic as sdk

        client_class = sdk.Anthropic
    else:
        import openai as sdk

        client_class = sdk.OpenAI
    return client_class(
        api_key=runtime.api_key,
        base_url=runtime.base_url,
        max_retries=0,  # retries and failover are the agent's (turn_api_error.py)
        timeout=timeout,
        http_client=sdk.DefaultHttpxClient(transport=transport),
    )


def adapter_for(api_mode: str, settings: AgentSettings) -> Adapter:
    """The adapter of an API mode (imported on use: each pulls in only what its mode needs)."""
    if api_mode == "anthropic_messages":
        from mibyan.agent.adapters.anthropic_messages import AnthropicMessagesAdapter

        return AnthropicMessagesAdapter(thinking_budget=settings.agent.thinking_budget)
    if api_mode == "codex_responses":
        from mibyan.agent.adapters.codex_responses import CodexResponsesAdapter

        return CodexResponsesAdapter()
    from mibyan.agent.adapters.chat_completions import ChatCompletionsAdapter

    return ChatCompletionsAdapter()


class ProviderHealth:
    """When each provider (and model) last failed, so a failover skips it for a while.

    Thread-safe: agents in several threads may share one record (a gateway agent's runs do), so a
    provider that failed in one of them is skipped by all of them for `agent.health_check_interval`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[tuple[str, str], float] = {}

    def mark_failed(self, provider: str, model: str) -> None:
        """Record that `provider` failed now for `model`."""
        with self._lock:
            self._failed[(provider, model)] = time.monotonic()

    def failed_within(self, provider: str, model: str, interval: float) -> float | None:
        """Seconds since `provider` failed for `model`, when that was less than `interval` ago; else None."""
        with self._lock:
            failed_at = self._failed.get((provider, model))
        if failed_at is None:
            return None
        ago = time.monotonic() - failed_at
        return ago if ago < interval else None


@dataclass
class ProviderState:
    """The provider side of an agent: who it talks to now, how, and who failed lately.

    Attributes:
        runtime: the provider talked to now (after a failover, a fallback).
        primary: the provider each user turn starts with.
        adapter: the wire adapter of `runtime`'s API mode.
        health: when each provider last failed (its own, or one shared with other agents).
        shared_health: `health` is shared, so a turn starts on the first provider that has not failed
            lately; with a record of its own, each turn starts with the primary.
        client: the SDK client of `runtime` and its transport, made on first use (or taken from
            `clients`).
        http_transport: the transport under every client (None: real connections).
        clients: clients kept open between the runs of one agent (None: each run makes its own).
    """

    runtime: ProviderRuntime
    primary: ProviderRuntime
    adapter: Adapter
    health: ProviderHealth = field(default_factory=ProviderHealth)
    shared_health: bool = False
    client: tuple[Any, AbortableTransport] | None = None
    http_transport: httpx2.BaseTransport | None = None
    clients: SdkClients | None = None
    _client_key: tuple[object, ...] = ()

    def sdk_client(self, settings: AgentSettings) -> tuple[Any, AbortableTransport]:
        """The SDK client for the current runtime, and the transport that can cut its connections."""
        if self.client is None:
            runtime = self.runtime
            key = (runtime.api_mode, runtime.base_url, runtime.api_key, settings.agent.api_timeout)
            kept = self.clients.take(key) if self.clients is not None else None
            if kept is None:
                from mibyan.core.http_transport import AbortableTransport

                transport = AbortableTransport(self.http_transport)
                kept = (build_client(self.runtime, settings, transport), transport)
            self.client, self._client_key = kept, key
        return self.client

    def drop_client(self) -> None:
        """Close the client; the next call makes a new one (new key, new provider, a cut connection)."""
        client, self.client = self.client, None
        if client is not None:
            client[0].close()  # the SDK client closes its httpx2 client and, with it, the transport

    def release_client(self) -> None:
        """The run is over: its client goes back to `clients` for the next run (else it is closed)."""
        if self.clients is None or self.client is None:
            self.drop_client()
            return
        client, self.client = self.client, None
        self.clients.give_back(self._client_key, client)

    def switch_to(self, runtime: ProviderRuntime, settings: AgentSettings) -> None:
        self.runtime = runtime
        self.adapter = adapter_for(runtime.api_mode, settings)
        self.drop_client()


class SdkClients:
    """SDK clients kept open between the runs of one agent, each lent to one run at a time.

    A gateway makes an agent per message; with its own client each message opened a new connection to
    the model's server (a TCP and, for a real provider, a TLS handshake). A run takes a client kept for
    the same API mode, address, key and timeout, and gives it back when it closes. A client whose
    connections were cut (an interrupt, a timeout) is never given back; whatever the server closed
    meanwhile, the HTTP pool notices and connects again. At most `keep` clients stay open, whatever their
    keys: the oldest given back is closed first (a key that changes every message, from an
    `api_key_command`, leaves no trail of open connections). Thread-safe.
    """

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[tuple[tuple[object, ...], tuple[Any, AbortableTransport]]] = []  # oldest first
        self._closed = False

    def take(self, key: tuple[object, ...]) -> tuple[Any, AbortableTransport] | None:
        """A kept client for `key` (the most recently given back, its connection the freshest), or None."""
        with self._lock:
            for place in range(len(self._idle) - 1, -1, -1):
                if self._idle[place][0] == key:
                    return self._idle.pop(place)[1]
        return None

    def give_back(self, key: tuple[object, ...], client: tuple[Any, AbortableTransport]) -> None:
        """Keep `client` for the next run with `key`; closed instead when cut or after close(), and the
        oldest kept one is closed when more than `keep` would stay open."""
        closing = [client]
        with self._lock:
            if not self._closed and not client[1].aborted:
                self._idle.append((key, client))
                oldest = max(len(self._idle) - self._keep, 0)
                closing = [kept for _, kept in self._idle[:oldest]]
                del self._idle[:oldest]
        for surplus in closing:
            surplus[0].close()

    def __enter__(self) -> SdkClients:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every kept client; what is given back from now on is closed."""
        with self._lock:
            self._closed = True
            idle = [client for _, client in self._idle]
            self._idle.clear()
        for client in idle:
            client[0].close()

"""Constructor wiring: configuration → provider runtime → client, tools, callbacks, session."""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from mibyan.agent.errors import ConfigError
from mibyan.config.loader import (
    API_MODES,
    AgentSettings,
    ProviderSettings,
    check_base_url,
    load_settings,
    mibyan_home,
)
from mibyan.config.paths import write_private

if TYPE_CHECKING:
    from mibyan.agent.adapters.base import Adapter
    from mibyan.tools.sandbox import Sandbox

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


def settings_overrides(
    *,
    model: str | None,
    provider: str | None,
    max_iterations: int | None,
    stream: bool | None,
    enabled_toolsets: list[str] | None,
    fallback_providers: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """Constructor arguments in the shape of the configuration files (the last layer)."""
    if max_iterations is not None and max_iterations < 1:
        raise ConfigError(f"max_iterations: must be at least 1, not {max_iterations}")
    overrides: dict[str, Any] = {}
    model_layer = {k: v for k, v in (("name", model), ("provider", provider)) if v}
    if model_layer:
        overrides["model"] = model_layer
    agent_layer = {k: v for k, v in (("max_turns", max_iterations), ("stream", stream)) if v is not None}
    if agent_layer:
        overrides["agent"] = agent_layer
    if enabled_toolsets is not None:
        overrides["tools"] = {"toolsets": list(enabled_toolsets)}
    if fallback_providers is not None:
        overrides["fallback_providers"] = list(fallback_providers)
    return overrides


def new_session_id() -> str:
    """A short id that is easy to type and unique enough for one person's sessions."""
    return secrets.token_hex(5)


def build_client(runtime: ProviderRuntime, settings: AgentSettings, transport: Any = None) -> Any:
    """The SDK client for the runtime's API mode; the SDK is imported here, on first use.

    `transport` (an AbortableTransport) lets the caller cut the client's connections from another thread.
    """
    from mibyan.agent.http_transport import AbortableTransport

    timeout = settings.agent.api_timeout
    transport = transport or AbortableTransport()
    if runtime.api_mode == "anthropic_messages":
        import anthropic

        return anthropic.Anthropic(
            api_key=runtime.api_key,
            base_url=runtime.base_url,
            max_retries=0,
            timeout=timeout,
            http_client=anthropic.DefaultHttpxClient(transport=transport),
        )
    import openai

    return openai.OpenAI(
        api_key=runtime.api_key,
        base_url=runtime.base_url,
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultHttpxClient(transport=transport),
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


def init_agent(
    agent: Any,
    *,
    model: str | None,
    provider: str | None,
    base_url: str | None,
    api_key: str | None,
    api_mode: str | None,
    max_iterations: int | None,
    enabled_toolsets: list[str] | None,
    session_id: str | None,
    home: str | os.PathLike[str] | None,
    stream: bool | None,
    fallback_providers: list[dict[str, Any]] | None,
    source: str,
    yolo: bool,
    denied_tools: list[str] | None,
    http_transport: Any,
    callbacks: dict[str, Any],
) -> None:
    """Wire a new AIAgent: settings, provider runtime, adapter, tools, callbacks and session."""
    from mibyan.agent.callbacks import Callbacks
    from mibyan.agent.context_engine import load_engine
    from mibyan.agent.hooks import Hooks
    from mibyan.agent.interruptible import InterruptSignal
    from mibyan.agent.tokens import TokenEstimator
    from mibyan.tools.approval import ApprovalPolicy
    from model_tools import check_tool_selection, get_tool_definitions

    agent.callbacks = Callbacks.from_kwargs(callbacks)
    overrides = settings_overrides(
        model=model,
        provider=provider,
        max_iterations=max_iterations,
        stream=stream,
        enabled_toolsets=enabled_toolsets,
        fallback_providers=fallback_providers,
    )
    home_path = Path(home) if home is not None else mibyan_home()
    settings = load_settings(home=home_path, overrides=overrides)
    agent.settings = settings
    agent.home = home_path
    agent.runtime = resolve_runtime(
        settings,
        provider=settings.model.provider,
        model=settings.model.name,
        base_url=base_url,
        api_key=api_key,
        api_mode=api_mode,
        env=os.environ,
        home=home_path,
    )
    agent._primary_runtime = agent.runtime
    agent._failed_providers = {}
    agent._adapter = adapter_for(agent.runtime.api_mode, settings)
    agent._client = None
    agent._http_transport = http_transport
    agent._signal = InterruptSignal()
    agent._estimator = TokenEstimator()
    agent._window = context_window(settings, agent.runtime, home_path)
    agent._context_engine = load_engine(settings, agent._window, agent._estimator, make_summarizer(agent))
    agent.hooks = Hooks.from_config(settings.hooks)
    agent.approvals = ApprovalPolicy(
        ask=agent.callbacks.approval_callback,
        yolo=yolo,
        always=list(settings.approvals.always),
        timeout=settings.approvals.timeout,
        save_always=lambda key: remember_approval(home_path, key),
    )
    check_tool_selection(settings.tools.toolsets, allow=settings.tools.allow, deny=settings.tools.deny)
    agent.sandbox = make_sandbox(settings, home_path, agent.callbacks, source=source)
    agent._tool_schemas = get_tool_definitions(
        settings.tools.toolsets,
        allow=settings.tools.allow,
        deny=[*settings.tools.deny, *(denied_tools or [])],
    )
    agent.delegation_depth = 0
    agent.parent_session_id = None
    agent._children = set()
    agent._children_lock = threading.Lock()
    agent._system_prompt = None
    agent._custom_prompt = False
    agent._skill_matcher = make_skill_matcher(settings)
    agent._running = threading.Lock()
    agent._closed = False
    open_session(agent, session_id, source=source)


def make_sandbox(settings: AgentSettings, home: Path, callbacks: Any, *, source: str) -> Sandbox:
    """The sandbox of the agent's commands, rooted at the working directory; mibyan's home stays read-only.

    Where no backend confines commands (or Landlock cannot keep all it should), that is said once per
    process: on stderr for the command line, else through `status_callback`, else in the log.
    """
    from mibyan.tools.sandbox import Sandbox, warn_unconfined_once

    config = settings.sandbox
    sandbox = Sandbox(
        config.mode,
        Path.cwd(),
        writable=config.writable,
        network=config.network,
        writable_git=config.writable_git,
        protected=[home],
        backend=None if config.backend == "auto" else config.backend,
    )
    warning = sandbox.warning()
    if warning is not None and warn_unconfined_once():
        if source == "cli":
            sys.stderr.write(f"mibyan: {warning}\n")
        elif callbacks.status_callback is not None:
            callbacks.emit("status_callback", "sandbox", warning)
        else:
            logging.getLogger("mibyan.sandbox").warning(warning)
    return sandbox


def context_window(settings: AgentSettings, runtime: ProviderRuntime, home: Path) -> int:
    """The model's context window: `model.context_window`, the table of known models, what the model's
    server reports (asked once ever, for unknown models only), else 128k."""
    from mibyan.agent.tokens import context_window_for, known_context_window

    override = settings.model.context_window
    discovered = None
    if (
        not override
        and known_context_window(runtime.model) is None
        and runtime.api_mode != "anthropic_messages"
    ):
        from mibyan.agent.window_discovery import discover_window

        discovered = discover_window(
            home, base_url=runtime.base_url, model=runtime.model, api_key=runtime.api_key
        )
    return context_window_for(runtime.model, override, discovered)


def remember_approval(home: Path, key: str) -> None:
    """Add an "always" approval to the user's config.yaml (created 0600 if needed)."""
    import yaml

    path = home / "config.yaml"
    data: dict[str, Any] = {}
    if path.is_file():
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        data = loaded if isinstance(loaded, dict) else {}
    approvals = data.setdefault("approvals", {})
    always = approvals.setdefault("always", [])
    if key not in always:
        always.append(key)
    write_private(path, yaml.safe_dump(data, sort_keys=False).encode())


def make_skill_matcher(settings: AgentSettings) -> Any:
    """Semantic skill matching, when `skills.embedding` names an (OpenAI-compatible) embedding provider."""
    embedding = settings.skills.embedding
    if embedding is None:
        return None
    from mibyan.agent.skills import SemanticMatcher

    runtime = resolve_runtime(
        settings,
        provider=embedding.provider,
        model=embedding.model,
        base_url=None,
        api_key=None,
        api_mode="chat_completions",
        env=os.environ,
    )
    holder: dict[str, Any] = {}

    def embed(texts: list[str]) -> list[list[float]]:
        if "client" not in holder:
            holder["client"] = build_client(runtime, settings)
        reply = holder["client"].embeddings.create(model=runtime.model, input=texts)
        return [list(item.embedding) for item in sorted(reply.data, key=lambda item: item.index)]

    return SemanticMatcher(embed, settings.skills.threshold)


def make_summarizer(agent: Any) -> Any:
    """The compression summarizer: the `compression` side task through the auxiliary client."""

    def summarize(system_prompt: str, prompt: str) -> str:
        from mibyan.agent.auxiliary_client import AuxiliaryClient

        return AuxiliaryClient(agent.settings, agent.runtime, "compression").complete(system_prompt, prompt)

    return summarize


def open_session(agent: Any, session_id: str | None, *, source: str) -> None:
    """Open the store and the session: a new one, or an existing one resumed at its newest descendant.

    A resumed session gets its stored system prompt back (so the provider's prompt cache stays warm)
    and its history repaired if an interrupt or crash left it broken; the repair is stored too.
    """
    from agent_state import SessionSink, SessionStore
    from mibyan.agent.messages import History

    store = SessionStore.open(agent.home)
    agent.store = store
    messages: list[dict[str, Any]] = []
    if session_id is not None and store.get_session(session_id) is not None:
        session_id = store.newest_descendant(session_id)
        row = store.get_session(session_id) or {}
        agent._system_prompt = row.get("system_prompt") or None
        messages = store.load_messages(session_id)
    agent.session_id = session_id or new_session_id()

    def meta() -> dict[str, Any]:
        runtime = agent.runtime  # read at call time: after a failover it is the fallback
        return {
            "parent_id": agent.parent_session_id,
            "source": source,
            "model": runtime.model,
            "provider": runtime.provider,
            "api_mode": runtime.api_mode,
            "system_prompt": agent._session_system_prompt(),
            "cwd": str(Path.cwd()),
        }

    agent._session_meta = meta
    agent._sink = SessionSink(store, agent.session_id, meta)
    agent._history = History(messages, sink=agent._sink)
    for note in agent._history.repair():
        agent.callbacks.emit("status_callback", "repaired", note)

"""Constructor wiring: configuration → provider runtime → client, tools, callbacks, session."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mibyan.agent.providers import (
    ProviderHealth,
    ProviderRuntime,
    ProviderState,
    adapter_for,
    build_client,
    resolve_runtime,
)
from mibyan.agent.session import new_session_id
from mibyan.config.loader import AgentSettings, load_settings, mibyan_home
from mibyan.config.paths import write_private
from mibyan.core.errors import ConfigError

if TYPE_CHECKING:
    from mibyan.agent.messages import Message
    from mibyan.agent.options import AgentOptions
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.mcp_tools import McpToolset
    from mibyan.tools.sandbox import Sandbox
    from mibyan.tools.skills import SemanticMatcher
    from run_agent import AIAgent


def settings_overrides(options: AgentOptions) -> dict[str, Any]:
    """The options that the configuration files also say, in their shape (the last layer)."""
    max_iterations = options.max_iterations
    if max_iterations is not None and max_iterations < 1:
        raise ConfigError(f"max_iterations: must be at least 1, not {max_iterations}")
    overrides: dict[str, Any] = {}
    model_layer = {k: v for k, v in (("name", options.model), ("provider", options.provider)) if v}
    if model_layer:
        overrides["model"] = model_layer
    agent_layer = {
        k: v
        for k, v in (
            ("max_turns", max_iterations),
            ("stream", options.stream),
            ("max_tool_failures", options.max_tool_failures),
        )
        if v is not None
    }
    if agent_layer:
        overrides["agent"] = agent_layer
    if options.enabled_toolsets is not None:
        overrides["tools"] = {"toolsets": list(options.enabled_toolsets)}
    if options.fallback_providers is not None:
        overrides["fallback_providers"] = list(options.fallback_providers)
    if options.mcp_servers:
        overrides["mcp_servers"] = dict(options.mcp_servers)
    return overrides


def init_agent(agent: AIAgent, options: AgentOptions) -> None:
    """Wire a new AIAgent: settings, provider runtime, adapter, tools, callbacks and session."""
    from mibyan.agent.context_engine import load_engine
    from mibyan.agent.hooks import Hooks
    from mibyan.agent.memory import MemoryStore
    from mibyan.agent.prompt_builder import PromptState
    from mibyan.agent.tokens import TokenEstimator
    from mibyan.agent.tool_executor import ToolRuntime
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.tools.approval import ApprovalPolicy
    from model_tools import check_tool_selection, get_tool_definitions

    # the agent's own copy: a caller may change a callback on it (options are shared by many agents)
    agent.callbacks = dataclasses.replace(options.callbacks)
    overrides = settings_overrides(options)
    home_path = Path(options.home) if options.home is not None else mibyan_home()
    workdir = options.workdir
    # the project whose `.mibyan/config.yaml` applies is the one the agent works in
    project = Path(workdir).resolve() if workdir is not None else None
    settings = load_settings(home=home_path, cwd=project, overrides=overrides)
    agent.settings = settings
    agent.home = home_path
    agent.workspace = Path(options.workspace) if options.workspace is not None else None
    agent.persona_dir = agent.workspace or home_path
    agent.workdir = project
    agent.session_scope = options.session_scope
    agent.session_lock = None
    memory = options.memory
    agent.memory = memory if memory is not None else MemoryStore(home_path, folder=agent.workspace)
    runtime = _runtime(settings, options, home_path)
    agent.provider = ProviderState(
        runtime=runtime,
        primary=runtime,
        adapter=adapter_for(runtime.api_mode, settings),
        health=options.provider_health or ProviderHealth(),
        shared_health=options.provider_health is not None,
        http_transport=options.http_transport,
        clients=options.sdk_clients,
    )
    agent._signal = InterruptSignal()
    agent._estimator = TokenEstimator()
    agent._window = context_window(settings, runtime, home_path)
    agent._context_engine = load_engine(settings, agent._window, agent._estimator, make_summarizer(agent))
    check_tool_selection(settings.tools.toolsets, allow=settings.tools.allow, deny=settings.tools.deny)
    agent.sandbox = options.sandbox or make_sandbox(
        settings, home_path, agent.callbacks, source=options.source, workdir=agent.workdir
    )
    denied = [*settings.tools.deny, *(options.denied_tools or [])]
    agent.file_access = options.file_access
    schemas = get_tool_definitions(settings.tools.toolsets, allow=settings.tools.allow, deny=denied)
    only = frozenset(options.allowed_tools) if options.allowed_tools is not None else None
    agent.tools = ToolRuntime(
        schemas=[schema for schema in schemas if only is None or schema.name in only],
        approvals=ApprovalPolicy(
            ask=agent.callbacks.approval_callback,
            yolo=options.yolo,
            always=list(settings.approvals.always),
            timeout=settings.approvals.timeout,
            save_always=lambda key: remember_approval(home_path, key),
        ),
        hooks=Hooks.from_config(settings.hooks),
    )
    if options.unasked is not None:
        agent.tools.approvals.unasked = options.unasked
    agent.tools.approvals.confined = agent.sandbox.active
    if options.yolo and not agent.sandbox.active:
        from mibyan.tools.approval import YOLO_UNCONFINED

        _tell(agent.callbacks, options.source, YOLO_UNCONFINED)
    agent.tools.approvals.subagents_ask = options.subagents_ask
    agent.compress_between_turns = options.compress_between_turns
    agent.delegation_depth = options.delegation_depth
    agent._children = set()
    agent._children_lock = threading.Lock()
    agent.prompt = PromptState(skill_matcher=make_skill_matcher(settings))
    agent._running = threading.Lock()
    agent._closed = False
    agent.tools.mcp = start_mcp(
        settings, agent, options.mcp_connections, deny=denied, only=only, source=options.source
    )
    try:
        open_session(agent, options.session_id, source=options.source)
    except BaseException:
        agent.tools.close()  # the MCP servers it started
        raise


def start_mcp(
    settings: AgentSettings,
    agent: AIAgent,
    shared: McpConnections | None,
    *,
    deny: list[str],
    only: frozenset[str] | None = None,
    source: str = "cli",
) -> McpToolset | None:
    """The agent's MCP tools: `shared` connections (a subagent's parent's, a gateway agent's), else its
    configured servers, each stdio one in the agent's sandbox rooted at its `cwd:` (started in the
    background: see McpConnections.start); None without servers. `only`: the agent's `allowed_tools`,
    when it has such a list; `source` says where a server's `sandbox: off` is told (see make_sandbox)."""
    if shared is None and not settings.mcp_servers:
        return None
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.mcp_tools import McpToolset

    if shared is None:
        shared = McpConnections(
            settings.mcp_servers,
            home=agent.home,
            start_timeout=settings.mcp.start_timeout,
            cwd=agent.workdir,
            confine=lambda cwd, writable: agent.sandbox.rooted_at(cwd, writable=writable),
        )
        owned = True
        unconfined = ", ".join(repr(name) for name in shared.unconfined())
        if unconfined and agent.sandbox.active:
            _tell(agent.callbacks, source, f"MCP servers {unconfined} run outside the sandbox (sandbox: off)")
    else:
        owned = False
    return McpToolset(
        shared,
        owned=owned,
        signal=agent._signal,
        default_timeout=settings.agent.tool_timeout,
        max_tools=settings.mcp.max_tools,
        allow=settings.tools.allow,
        deny=deny,
        only=only,
    )


def make_sandbox(
    settings: AgentSettings, home: Path, callbacks: Any, *, source: str, workdir: Path | None = None
) -> Sandbox:
    """The sandbox of the agent's commands, rooted at the working directory; mibyan's home stays read-only.

    Where no backend confines commands (or Landlock cannot keep all it should), that is said once per
    process: on stderr for the command line, else through `status_callback`, else in the log.
    """
    from mibyan.tools.sandbox import Sandbox, warn_unconfined_once

    config = settings.sandbox
    sandbox = Sandbox(
        config.mode,
        workdir or Path.cwd(),
        writable=config.writable,
        network=config.network,
        writable_git=config.writable_git,
        protected=[home],
        backend=None if config.backend == "auto" else config.backend,
    )
    warning = sandbox.warning()
    if warning is not None and warn_unconfined_once():
        _tell(callbacks, source, warning)
    return sandbox


def _tell(callbacks: Any, source: str, warning: str) -> None:
    """What the user must know about confinement: on stderr for the command line, else through
    `status_callback`, else in the log."""
    if source == "cli":
        sys.stderr.write(f"mibyan: {warning}\n")
    elif callbacks.status_callback is not None:
        callbacks.emit("status_callback", "sandbox", warning)
    else:
        logging.getLogger("mibyan.sandbox").warning(warning)


def context_window(settings: AgentSettings, runtime: ProviderRuntime, home: Path) -> int:
    """The model's context window: `model.context_window`, the table of known models, what the model's
    server reports (asked once ever, for unknown models only), else 128k.

    From the same read of the home's cache of what servers said, a Chat Completions runtime learns
    whether its server is llama.cpp's (`runtime.prompt_progress`: its streamed calls ask for progress).
    """
    from mibyan.agent.tokens import context_window_for, known_context_window

    override = settings.model.context_window
    discover = (
        not override
        and known_context_window(runtime.model) is None
        and runtime.api_mode != "anthropic_messages"
    )
    learn = runtime.api_mode == "chat_completions" and bool(runtime.base_url)
    if not (discover or learn):
        return context_window_for(runtime.model, override, None)
    from mibyan.agent.window_discovery import WindowCache, discover_window

    cache = WindowCache(home)
    discovered = None
    if discover:
        discovered = discover_window(
            home, base_url=runtime.base_url, model=runtime.model, api_key=runtime.api_key, cache=cache
        )
    if learn:
        runtime.prompt_progress = cache.server(runtime.base_url) == "llama.cpp"
    return context_window_for(runtime.model, override, discovered)


def prepare_runs(options: AgentOptions) -> None:
    """Load and ask now what every agent built with `options` needs, so that its first run costs what
    the later ones do: the agent loop's modules, its wire adapter and model SDK (a client made, and kept
    for the first run in `options.sdk_clients`, else closed), and the context window the model's server
    reports (asked once, then kept in the home).

    Raises:
        ConfigError: the configuration or the provider cannot make an agent (as building one would).
    """
    import run_agent  # noqa: F401  (the loop and its phases, imported by the first AIAgent otherwise)
    from mibyan.agent.context_engine import load_engine
    from mibyan.agent.memory import MemoryStore  # noqa: F401  (imported by init_agent on use)
    from mibyan.agent.tokens import TokenEstimator

    home = Path(options.home) if options.home is not None else mibyan_home()
    project = Path(options.workdir).resolve() if options.workdir is not None else None
    settings = load_settings(home=home, cwd=project, overrides=settings_overrides(options))
    runtime = _runtime(settings, options, home)
    adapter = adapter_for(runtime.api_mode, settings)
    adapter.stream_class()
    window = context_window(settings, runtime, home)
    load_engine(settings, window, TokenEstimator(), _never_asked)  # its module, a custom one's too
    provider = ProviderState(
        runtime=runtime,
        primary=runtime,
        adapter=adapter,
        http_transport=options.http_transport,
        clients=options.sdk_clients,
    )
    client = provider.sdk_client(settings)[0]
    client.platform_headers()  # what the SDK asks the system once (a subprocess among it) at its first call
    provider.release_client()  # the first run's, when the runs share their clients; else closed


def _runtime(settings: AgentSettings, options: AgentOptions, home: Path) -> ProviderRuntime:
    """The provider the agent talks to: the configured model, with the options' URL, key and API mode."""
    return resolve_runtime(
        settings,
        provider=settings.model.provider,
        model=settings.model.name,
        base_url=options.base_url,
        api_key=options.api_key,
        api_mode=options.api_mode,
        env=os.environ,
        home=home,
    )


def _never_asked(system_prompt: str, prompt: str) -> str:
    raise AssertionError("the engine prepare_runs makes is never asked to summarise")


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


def make_skill_matcher(settings: AgentSettings) -> SemanticMatcher | None:
    """Semantic skill matching, when `skills.embedding` names an (OpenAI-compatible) embedding provider."""
    embedding = settings.skills.embedding
    if embedding is None:
        return None
    from mibyan.tools.skills import SemanticMatcher

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


def make_summarizer(agent: AIAgent) -> Callable[[str, str], str]:
    """The compression summarizer: the `compression` side task through the auxiliary client."""

    def summarize(system_prompt: str, prompt: str) -> str:
        from mibyan.agent.auxiliary_client import AuxiliaryClient

        return AuxiliaryClient(agent.settings, agent.provider.runtime, "compression").complete(
            system_prompt, prompt
        )

    return summarize


def open_session(agent: AIAgent, session_id: str | None, *, source: str) -> None:
    """Open the store and the session: a new one, or an existing one resumed at its newest descendant.

    A resumed session gets its stored system prompt back (so the provider's prompt cache stays warm)
    and its history repaired if an interrupt or crash left it broken; the repair is stored too.
    """
    from agent_state import SessionStore
    from mibyan.agent.session import SessionHandle

    store = SessionStore.open(agent.home)
    messages: list[Message] = []
    row = store.sessions.get(session_id) if session_id is not None else None
    if session_id is not None and row is not None:
        newest = store.lineage.newest_descendant(session_id)
        if newest != session_id:
            session_id, row = newest, store.sessions.get(newest)
        agent.prompt.text = (row or {}).get("system_prompt") or None
        messages = store.messages.load(session_id, shared=True)  # History never changes one in place

    def meta() -> dict[str, Any]:
        runtime = agent.provider.runtime  # read at call time: after a failover it is the fallback
        return {
            "parent_id": agent.session.parent_id,
            "source": source,
            "model": runtime.model,
            "provider": runtime.provider,
            "api_mode": runtime.api_mode,
            "system_prompt": agent._session_system_prompt(),
            "cwd": str(agent.workdir or Path.cwd()),
        }

    stored = row is not None
    agent.session = SessionHandle.open(store, session_id or new_session_id(), messages, meta, stored=stored)
    for note in agent.session.history.repair():
        agent.callbacks.emit("status_callback", "repaired", note)

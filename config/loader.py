"""Load mibyan's settings from its layers and validate them.

Layers, later wins: the built-in `defaults.yaml` → `$MIBYAN_HOME/config.yaml` → `./.mibyan/config.yaml`
→ environment → overrides (command-line flags or constructor arguments). Each layer is validated as it
is merged, so an error can name the file (or variable) that introduced it and the key it is about.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator

from mibyan.config.api_modes import API_MODES, ApiMode
from mibyan.config.gateway import (
    Connector,
    GatewayAgent,
    GatewaySection,
    check_agents,
    check_connectors,
)
from mibyan.config.mcp import McpSection, McpServerSettings, check_server_names
from mibyan.config.paths import mibyan_home
from mibyan.config.section import Section as _Section
from mibyan.config.trust import (
    UntrustedConfigWarning,
    folder_key,
    project_config_path,
    split_untrusted,
    trust_state,
    untrusted_notice,
)
from mibyan.core.errors import ConfigError

__all__ = ["API_MODES", "AgentSettings", "ApiMode", "load_settings", "mibyan_home"]

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")


class ModelSettings(_Section):
    provider: str
    name: str
    context_window: int | None = Field(default=None, gt=0)


def check_base_url(url: str) -> str:
    """`url` if it is an http(s) address with a host; ValueError saying what is expected otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"must be an http(s) URL such as https://api.openai.com/v1, not {url!r}")
    return url


class ProviderSettings(_Section):
    api_mode: ApiMode | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_command: str | None = None
    api_key: str | None = None

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, url: str | None) -> str | None:
        return None if url is None else check_base_url(url)


class FallbackSettings(_Section):
    provider: str
    model: str | None = None


class AgentSection(_Section):
    max_turns: int = Field(default=500, gt=0)
    stream: bool = True
    api_timeout: float = Field(default=600, gt=0)
    api_max_retries: int = Field(default=3, ge=0)
    max_retry_wait: float = Field(default=30, ge=0)
    stream_stall_timeout: float = Field(default=90, gt=0)
    health_check_interval: float = Field(default=30, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    thinking_budget: int | None = Field(default=None, ge=1024)
    max_parallel_tools: int = Field(default=8, gt=0, le=64)
    max_tool_failures: int = Field(default=3, gt=0)
    tool_timeout: float = Field(default=300, gt=0)


class ApprovalsSection(_Section):
    timeout: float = Field(default=60, gt=0)
    always: list[str] = []


class HooksSection(_Section):
    pre_tool_call: list[str] = []
    post_tool_call: list[str] = []
    pre_llm_call: list[str] = []
    post_llm_call: list[str] = []


class SandboxSection(_Section):
    mode: Literal["workspace-write", "read-only", "off"] = "workspace-write"
    network: bool = True
    writable: list[str] = []
    writable_git: bool = False
    backend: Literal["auto", "bubblewrap", "landlock"] = "auto"

    @field_validator("mode", mode="before")
    @classmethod
    def _off_unquoted(cls, mode: object) -> object:
        # YAML 1.1 reads a bare `mode: off` as false; it means the mode "off"
        return "off" if mode is False else mode


class ToolsSection(_Section):
    toolsets: list[str] = ["core"]
    allow: list[str] = []
    deny: list[str] = []


class WebSection(_Section):
    allow_private: bool = False


class CompressionSection(_Section):
    enabled: bool = True
    engine: str = "default"
    threshold: float = Field(default=0.5, gt=0, le=1)
    gateway_threshold: float = Field(default=0.85, gt=0, le=1)
    protect_last_n: int = Field(default=20, ge=2)


class DelegationSection(_Section):
    max_iterations: int = Field(default=50, gt=0)
    max_concurrent: int = Field(default=3, gt=0, le=16)
    max_depth: int = Field(default=1, ge=1)
    timeout: float = Field(default=600, gt=0)
    summary_chars: int = Field(default=4000, gt=100)
    allow_tools: list[str] = []


class EmbeddingSettings(_Section):
    provider: str
    model: str


class SkillsSection(_Section):
    embedding: EmbeddingSettings | None = None
    threshold: float = Field(default=0.5, ge=-1, le=1)


class StoreSection(_Section):
    # omitted: SQLite in the home; a postgresql:// URL: the team's shared database (DESIGN §16)
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"{url!r} is not a postgresql:// URL (omit store.url for SQLite in the home)")
        return url


class AuxiliaryTask(_Section):
    provider: str | None = None
    model: str | None = None
    fallback: list[FallbackSettings] = []


class AgentSettings(_Section):
    """The resolved configuration of one agent. Frozen: nothing changes it after start-up."""

    model: ModelSettings
    providers: dict[str, ProviderSettings]
    agent: AgentSection = AgentSection()
    tools: ToolsSection = ToolsSection()
    approvals: ApprovalsSection = ApprovalsSection()
    sandbox: SandboxSection = SandboxSection()
    hooks: HooksSection = HooksSection()
    compression: CompressionSection = CompressionSection()
    delegation: DelegationSection = DelegationSection()
    skills: SkillsSection = SkillsSection()
    web: WebSection = WebSection()
    auxiliary: dict[str, AuxiliaryTask] = {}
    fallback_providers: list[FallbackSettings] = []
    agents: list[GatewayAgent] = []
    connectors: list[Connector] = []
    gateway: GatewaySection = GatewaySection()
    store: StoreSection = StoreSection()
    mcp_servers: dict[str, McpServerSettings] = {}
    mcp: McpSection = McpSection()

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, servers: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        return check_server_names(servers)

    @field_validator("agents")
    @classmethod
    def _agents_unique_and_known(cls, agents: list[GatewayAgent], info: ValidationInfo) -> list[GatewayAgent]:
        check_agents(agents, info.data.get("providers"))
        return agents

    @field_validator("connectors")
    @classmethod
    def _connectors_route_to_agents(
        cls, connectors: list[Connector], info: ValidationInfo
    ) -> list[Connector]:
        check_connectors(connectors, info.data.get("agents"))
        return connectors


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse_yaml(path: Path, data: bytes) -> dict[str, Any]:
    """The mapping a config file holds; ConfigError (one line naming the file) when it holds none."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        parsed = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{path}: {where}malformed YAML ({problem})") from None
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(parsed).__name__}")
    return parsed


def _read_yaml(path: Path) -> dict[str, Any]:
    return parse_yaml(path, _read_bytes(path))


def provider_names(layers: Sequence[Mapping[str, Any]]) -> set[str]:
    """The providers these (trusted) layers define."""
    names: set[str] = set()
    for layer in layers:
        providers = layer.get("providers")
        if isinstance(providers, Mapping):
            names.update(str(name) for name in providers)
    return names


def trusted_layers(home: Path) -> list[dict[str, Any]]:
    """The layers that are the user's own: the built-in defaults and the home's config.yaml."""
    user_path = home / "config.yaml"
    return [_read_yaml(DEFAULTS_PATH), *([_read_yaml(user_path)] if user_path.is_file() else [])]


def _project_layer(home: Path, cwd: Path, known_providers: set[str]) -> dict[str, Any] | None:
    """The project's config file, without what needs trust unless the user trusts this very file.

    The file is read once: the bytes that are hashed are the bytes that are parsed.
    """
    path = project_config_path(cwd)
    if not path.is_file() or path.resolve() == (home / "config.yaml").resolve():
        return None  # none, or the user's own file (mibyan started in the folder holding the home)
    data = _read_bytes(path)
    layer = parse_yaml(path, data)
    state = trust_state(home, cwd, data)
    if state == "trusted":
        return layer
    kept, ignored = split_untrusted(layer, known_providers)
    if ignored:
        notice = untrusted_notice(path, folder_key(cwd), state, ignored)
        # a warning, not a print: a library should not write to stderr, and the warnings filter shows
        # one notice once per process however many agents (subagents, /new) load the same file
        warnings.warn(notice, UntrustedConfigWarning, stacklevel=1)
    return kept


def deep_merge(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `layer` over `base`; mappings merge key by key, everything else is replaced."""
    merged = dict(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _validate(data: Mapping[str, Any], source: str) -> AgentSettings:
    try:
        return AgentSettings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        message = message.removeprefix("Value error, ")
        raise ConfigError(f"{source}: {key}: {message}") from None


def _environment_layer(env: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    layers: list[tuple[str, dict[str, Any]]] = []
    if env.get("MIBYAN_PROVIDER"):
        layers.append(("environment MIBYAN_PROVIDER", {"model": {"provider": env["MIBYAN_PROVIDER"]}}))
    if env.get("MIBYAN_MODEL"):
        layers.append(("environment MIBYAN_MODEL", {"model": {"name": env["MIBYAN_MODEL"]}}))
    for provider, variable in (("openai", "OPENAI_BASE_URL"), ("anthropic", "ANTHROPIC_BASE_URL")):
        if env.get(variable):
            layers.append((f"environment {variable}", {"providers": {provider: {"base_url": env[variable]}}}))
    return layers


#: Settings already merged and validated, by what they were made of (see `_made_of`): a gateway builds an
#: agent for every message, and parsing and validating the same files again is most of what that costs.
_MADE: dict[tuple[Any, ...], AgentSettings] = {}
_MADE_KEPT = 64


def _made_of(
    home: Path, cwd: Path, env: Mapping[str, str], overrides: Mapping[str, Any] | None
) -> tuple[Any, ...] | None:
    """The key of settings that may be reused: the bytes of the files and the layers they come from.

    None (make them afresh) where a project's config file applies (its trust, and the warning about what
    it may not set, are decided each time it is read) or where a file cannot be read as it is.
    """
    user = home / "config.yaml"
    try:
        if project_config_path(cwd).exists():
            return None
        layers = json.dumps(overrides, sort_keys=True) if overrides else ""
        content = user.read_bytes() if user.is_file() else None
    except (OSError, TypeError, ValueError):  # unreadable, or a value JSON cannot spell: not reused
        return None
    digest = hashlib.sha256(content).digest() if content is not None else None
    return (str(home), str(cwd), digest, repr(_environment_layer(env)), layers)


def load_settings(
    *,
    home: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentSettings:
    """Merge and validate every configuration layer.

    Settings made from the same file contents, environment and overrides are made once and then
    shared: they are frozen.

    Args:
        home: the mibyan home; `$MIBYAN_HOME` or `~/.mibyan` when omitted.
        cwd: where to look for the project's `.mibyan/config.yaml`; the process's cwd when omitted.
        env: the environment to read; `os.environ` when omitted.
        overrides: the last layer (flags or constructor arguments), in the files' shape.

    Warns:
        UntrustedConfigWarning: the project's file sets keys that need trust (`mibyan trust`), which
            were left out; one line naming them.

    Raises:
        ConfigError: one line naming the file (or variable) and the key that is wrong.
    """
    env = os.environ if env is None else env
    home = mibyan_home(env) if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    key = _made_of(home, cwd, env, overrides)
    made = _MADE.get(key) if key is not None else None
    if made is not None:
        return made
    settings = _load(home, cwd, env, overrides)
    if key is not None:
        if len(_MADE) >= _MADE_KEPT:
            _MADE.clear()
        _MADE[key] = settings
    return settings


def _load(
    home: Path, cwd: Path, env: Mapping[str, str], overrides: Mapping[str, Any] | None
) -> AgentSettings:
    defaults, *own = trusted_layers(home)
    layers: list[tuple[str, dict[str, Any]]] = [(str(home / "config.yaml"), layer) for layer in own]
    project = _project_layer(home, cwd, provider_names([defaults, *own]))
    if project is not None:
        layers.append((str(project_config_path(cwd)), project))
    layers.extend(_environment_layer(env))
    if overrides:
        layers.append(("arguments", dict(overrides)))

    merged = defaults
    settings = _validate(merged, str(DEFAULTS_PATH))
    for source, layer in layers:
        if source == "arguments" and layer.get("mcp_servers"):
            # a server given as an argument replaces one of the same name whole: merged key by key it
            # would inherit the configured one's headers, env and approval
            configured = merged.get("mcp_servers") or {}
            kept = {name: entry for name, entry in configured.items() if name not in layer["mcp_servers"]}
            merged = {**merged, "mcp_servers": kept}
        merged = deep_merge(merged, layer)
        settings = _validate(merged, source)
    if settings.model.provider not in settings.providers:
        known = ", ".join(sorted(settings.providers))
        raise ConfigError(f"model.provider: unknown provider '{settings.model.provider}' (known: {known})")
    return settings

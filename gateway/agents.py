"""AgentInstance: one configured gateway agent, and the AIAgent it builds for each channel run.

Nothing of the agent loop is re-implemented here: each run is the core `AIAgent` built from the
agent's entry (provider, model, iteration budget, tools) with its folder as the source of its
persona, notes and skills, and its `workspace/` as the tools' working directory. What it learns of a
user (USER.md, facts) is its channel's, kept outside that folder (`channel_memory_of`) unless its entry
says `memory: shared`. The tools reach no
other part of the home (another agent's folder, state.db, config.yaml): the file tools and the command
judge refuse it, and the sandbox hides it from commands. It writes only in its workspace and its own
`tmp/` (its commands' /tmp with bubblewrap). An isolated agent's commands run in a fresh sandbox holding
only its workspace. The session store stays the home's state.db, shared by every agent.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mibyan.agent.options import AgentOptions
from mibyan.agent.providers import ProviderHealth, SdkClients
from mibyan.config.gateway import GatewayAgent
from mibyan.config.loader import AgentSettings
from mibyan.config.paths import private_dir, write_private
from mibyan.core.errors import ConfigError

if TYPE_CHECKING:
    from mibyan.agent.memory import MemoryStore
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.sandbox import Sandbox
    from run_agent import AIAgent

WORKSPACE_FILES = ("SOUL.md", "USER.md", "MEMORY.md")
#: What an isolated agent without network lacks: tools that reach the network from outside its sandbox.
OFFLINE_DENIED = ("web_fetch",)


def workspace_of(home: Path, agent_id: str) -> Path:
    """`$MIBYAN_HOME/agents/<id>/`: the agent's persona, memory and skills."""
    return home / "agents" / agent_id


_UNREADABLE = re.compile(r"[^a-z0-9_-]+")


def channel_memory_of(home: Path, channel: str) -> Path:
    """`$MIBYAN_HOME/channels/<agent id>/<name>/`: what an agent has learnt of one channel's user.

    Outside the agent's folder, which its tools read on every channel: there the judge, the file tools
    and the sandbox keep it from all of them, as they keep the rest of the home. The name is the
    channel's own in letters a client cannot turn into a path (`../`, `/`), with a digest of its whole
    key, so two channels never share a folder however alike their names are.
    """
    agent_id, _, rest = channel.partition("/")
    readable = _UNREADABLE.sub("-", rest.lower()).strip("-")[:48] or "channel"
    digest = hashlib.sha256(channel.encode()).hexdigest()[:16]
    return home / "channels" / agent_id / f"{readable}-{digest}"


def prepare_workspace(folder: Path) -> None:
    """Create the agent's folder with skills/, workspace/ and tmp/ (0700); the persona and memory files
    are the user's to write."""
    private_dir(folder / "skills")
    private_dir(folder / "workspace")
    private_dir(folder / "tmp")


@dataclass(frozen=True)
class AgentInstance:
    """A configured agent: its entry, its home and workspace, and how its runs are wired.

    Args:
        entry: the agent's `agents:` entry.
        settings: the gateway's resolved configuration (the agent's defaults come from it).
        home: the mibyan home (its state.db holds every agent's sessions).
        health: when its providers last failed, shared by all its runs on every channel: a provider
            that failed is skipped by the next runs for `agent.health_check_interval`.
        clients: its runs' SDK clients, kept open between them (a message reuses the connection to
            the model's server of the one before); closed by close().
    """

    entry: GatewayAgent
    settings: AgentSettings
    home: Path
    health: ProviderHealth = field(default_factory=ProviderHealth, compare=False)
    clients: SdkClients = field(default_factory=SdkClients, compare=False)
    # the one McpConnections of all its runs, once made (a list, as the instance itself is frozen)
    _mcp: list[McpConnections] = field(default_factory=list, compare=False, repr=False)
    _mcp_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    # the sandbox of all its runs, once made (it says where commands may go, and keeps no state of a run)
    _sandbox: list[Sandbox] = field(default_factory=list, compare=False, repr=False)

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def workspace(self) -> Path:
        """The agent's folder: persona, memory, skills, AGENTS.md and its `workspace/`."""
        return workspace_of(self.home, self.entry.id)

    @property
    def workdir(self) -> Path:
        """The tools' working directory: with `tmp`, the one place of the home they may write."""
        return self.workspace / "workspace"

    @property
    def tmp(self) -> Path:
        """The agent's own temporary folder: its commands' TMPDIR and, with bubblewrap, their /tmp, so no
        two agents share files through the machine's /tmp."""
        return self.workspace / "tmp"

    def sandbox(self) -> Sandbox:
        """A sandbox for one run's commands, rooted at the workspace, the rest of the home hidden.

        Isolated: a fresh filesystem with only the workspace (and the system's folders, read-only), the
        network off unless `isolation.network`. Otherwise `sandbox:` applies (reads anywhere else).

        Raises:
            ConfigError: isolation asked for where bubblewrap is missing.
        """
        from mibyan.tools.path_policy import secret_places, user_homes
        from mibyan.tools.sandbox import Sandbox

        home = self.home.resolve()
        # whatever a channel approves reads none of the host's secrets, nor the home of its user
        users = user_homes()
        if self.entry.isolation.enabled:
            return Sandbox(
                "workspace-write",
                self.workdir,
                network=self.entry.isolation.network,
                protected=[home],
                hidden=[home],
                masked=secret_places(users),
                isolated=True,
                backend="bubblewrap",
            )
        config = self.settings.sandbox
        return Sandbox(
            config.mode,
            self.workdir,
            writable=config.writable,
            network=config.network,
            writable_git=config.writable_git,
            protected=[home],
            hidden=[home, *users],
            visible=[self.workspace],
            masked=secret_places(users),
            backend=None if config.backend == "auto" else config.backend,
            temp=self.tmp,
        )

    def runs_sandbox(self) -> Sandbox:
        """The sandbox every run of the agent shares, made with the first (see `sandbox`)."""
        with self._mcp_lock:
            if not self._sandbox:
                self._sandbox.append(self.sandbox())
            return self._sandbox[0]

    def check(self) -> None:
        """Resolve the provider now, so a missing key or address stops the gateway at start.

        Raises:
            ConfigError: one line saying what to set.
        """
        from mibyan.agent.providers import resolve_runtime
        from model_tools import check_tool_selection

        tools = self.entry.tools
        check_tool_selection(
            tools.toolsets or self.settings.tools.toolsets,
            allow=tools.allow,
            deny=tools.deny,
            where=f"agents ({self.entry.id}): tools.toolsets",
        )
        resolve_runtime(
            self.settings,
            provider=self.entry.provider or self.settings.model.provider,
            model=self.entry.model or self.settings.model.name,
            base_url=None,
            api_key=None,
            api_mode=None,
            env=os.environ,
            home=self.home,
        )
        self._check_mcp_servers()
        self._check_sandbox()

    def _check_mcp_servers(self) -> None:
        """The servers the entry names are configured, and an isolated agent names none."""
        named = self.entry.mcp_servers
        if named and self.entry.isolation.enabled:
            raise ConfigError(
                f"agents ({self.entry.id}): mcp_servers: an isolated agent cannot use MCP servers; "
                "they run outside its sandbox"
            )
        unknown = [name for name in named if name not in self.settings.mcp_servers]
        if unknown:
            known = ", ".join(sorted(self.settings.mcp_servers)) or "none configured under mcp_servers:"
            raise ConfigError(
                f"agents ({self.entry.id}): mcp_servers: unknown server '{unknown[0]}' (known: {known})"
            )

    def _check_sandbox(self) -> None:
        """An isolated agent needs a bubblewrap that runs here."""
        try:
            sandbox = self.sandbox()
        except ConfigError as exc:
            where = "isolation: " if self.entry.isolation.enabled else ""
            raise ConfigError(f"agents ({self.entry.id}): {where}{exc}") from None
        if self.entry.isolation.enabled:
            probe = sandbox.launch(["true"], cwd="/")
            done = subprocess.run(probe.argv, capture_output=True, text=True, check=False, timeout=30)
            if done.returncode != 0:
                why = (
                    done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
                )
                raise ConfigError(f"agents ({self.entry.id}): isolation: bubblewrap cannot run here ({why})")

    def sandbox_warning(self) -> str | None:
        """What the agent's sandbox cannot do here (no backend, say), for the start lines."""
        sandbox = self.sandbox()
        warning = sandbox.warning()
        if sandbox.temp is not None and not (sandbox.active and sandbox.backend == "bubblewrap"):
            shared = (
                "its commands share the machine's /tmp with other agents and programs "
                "(with bubblewrap each agent has its own)"
            )
            warning = f"{warning}; {shared}" if warning else shared
        configured = self.settings.mcp_servers
        off = [
            name
            for name in self.entry.mcp_servers
            if name in configured and configured[name].sandbox == "off"
        ]
        if off:
            outside = f"MCP servers {', '.join(map(repr, off))} run outside the sandbox (sandbox: off)"
            warning = f"{warning}; {outside}" if warning else outside
        return warning

    @property
    def shared_memory(self) -> bool:
        """Whether its channels share one USER.md and one set of facts (`memory: shared`)."""
        return self.entry.memory == "shared"

    def memory_for(self, channel: str, *, one_off: bool) -> MemoryStore:
        """The memory of a run on `channel` (its key): the agent's own when shared, else the channel's
        USER.md and facts beside the agent's MEMORY.md, which the channel reads but does not write.

        A one-off conversation (no channel) keeps nothing: nobody can come back to it, and whatever it
        kept would otherwise be everyone's who sends one.
        """
        from mibyan.agent.memory import MemoryStore

        if self.shared_memory:
            return MemoryStore(self.home, folder=self.workspace)
        own = channel_memory_of(self.home, channel)
        return MemoryStore(self.home, folder=self.workspace, channel=own, keeps=not one_off)

    def options(self) -> AgentOptions:
        """What every run of the agent is built with; a run adds its session and channel (see build).

        Dangerous commands are denied (no approval callback, no yolo) unless a run's callbacks include an
        `approval_callback`; its subagents are asked about where it is (the channel), one at a time.
        """
        tools = self.entry.tools
        return AgentOptions(
            model=self.entry.model,
            provider=self.entry.provider,
            max_iterations=self.entry.max_iterations,
            max_tool_failures=self.entry.max_tool_failures,
            enabled_toolsets=tools.toolsets,
            home=self.home,
            source="gateway",
            yolo=False,
            denied_tools=[*tools.deny, *self._offline_tools()],
            # its allow list names all it is offered, MCP tools included: a server it names offers
            # only the tools the list names (none when it names no `mcp__` tool)
            allowed_tools=list(tools.allow) if tools.allow else None,
            workspace=self.workspace,
            workdir=self.workdir,
            provider_health=self.health,
            sdk_clients=self.clients,
            # the runner compresses after it has delivered the answer (its _compress_after_delivery)
            compress_between_turns=False,
            subagents_ask=True,
        )

    def build(
        self, *, session_id: str | None, unasked: str, channel: str, one_off: bool, **callbacks: Any
    ) -> AIAgent:
        """An AIAgent for one run on one channel (its key; `session_id` continues its session), whose
        session_search sees that channel's sessions and no other's; `unasked` says why a dangerous
        command was refused without asking, in the refusal's result."""
        from mibyan.agent.callbacks import Callbacks
        from run_agent import AIAgent

        return AIAgent(
            options=replace(
                self.options(),
                session_id=session_id,
                session_scope=channel,
                unasked=unasked,
                sandbox=self.runs_sandbox(),
                mcp_connections=self.mcp_connections(),
                memory=self.memory_for(channel, one_off=one_off),
                callbacks=Callbacks.from_kwargs(callbacks),
            )
        )

    def warm(self) -> None:
        """Before the gateway says it is ready: import and ask what the agent's runs need (the agent
        code, the model's SDK, its context window from the model's server, the MCP machinery), so the
        first message on any channel is answered as fast as the later ones.

        Raises:
            ConfigError: the agent cannot be built (as its first run would have said).
        """
        from mibyan.agent.agent_init import prepare_runs
        from mibyan.tools.mcp_tools import McpToolset  # noqa: F401  (what each run's MCP tools are)

        prepare_runs(self.options())
        self.mcp_connections()
        self.runs_sandbox()
        prepare_workspace(self.workspace)
        # one run's agent built and closed, as each message's is: what building reads and makes once
        # (its tools' schemas, its prompt's files, the store's connection) is there for the first
        self.build(session_id=None, unasked="", channel=f"{self.id}/", one_off=True).close()

    def mcp_connections(self) -> McpConnections:
        """The MCP servers all of this agent's runs share: started once (with its first run, in the
        background), stopped by close(), rather than once per message.

        Only the servers its entry names (`mcp_servers: [files]`): whoever talks to the agent reaches
        their tools. A stdio server runs in the agent's sandbox: it writes only the workspace (and the
        agent's temp), sees none of the home but the agent's folder, and reads none of the secrets; one
        with `sandbox: off` runs unconfined (check() says so). An isolated agent gets none (check()
        refuses one naming any): its fresh filesystem holds no server program.
        """
        from mibyan.tools.mcp_connections import McpConnections

        with self._mcp_lock:
            if not self._mcp:
                configured = self.settings.mcp_servers
                named = () if self.entry.isolation.enabled else self.entry.mcp_servers
                servers = {name: configured[name] for name in named if name in configured}
                timeout = self.settings.mcp.start_timeout
                connections = McpConnections(
                    servers,
                    home=self.home,
                    start_timeout=timeout,
                    cwd=self.workdir,
                    confine=self._server_sandbox,
                )
                self._mcp.append(connections)
            return self._mcp[0]

    def _server_sandbox(self, _cwd: Path, writable: list[str]) -> Sandbox:
        """An MCP server's sandbox: its runs' own, the workspace its only writable folder whatever the
        server's cwd, with the server's `writable:` places."""
        return self.runs_sandbox().rooted_at(self.workdir, writable=writable)

    def close(self) -> None:
        """Stop the agent's MCP servers and close its kept SDK clients (after its last run)."""
        with self._mcp_lock:
            for connections in self._mcp:
                connections.close()
        self.clients.close()

    def write_agents_md(self) -> Path:
        """(Re)write the workspace's AGENTS.md: the agent's tools, memory layers and skills, for its prompt.

        It is generated at every start, so it always matches the configuration; the user's own words
        belong in SOUL.md, USER.md and MEMORY.md.
        """
        from mibyan.tools.skills import discover_skills
        from model_tools import get_tool_definitions

        tools = self.entry.tools
        schemas = get_tool_definitions(
            tools.toolsets or self.settings.tools.toolsets,
            allow=tools.allow,
            deny=[*self.settings.tools.deny, *tools.deny, *self._offline_tools()],
        )
        skills = discover_skills(self.workspace, self.workspace)
        lines = [
            f"# {self.entry.name or self.entry.id}",
            "",
            "This file is generated by `mibyan gateway` at every start.",
            "Your persona (SOUL.md), what you know of the user (USER.md) and your notes (MEMORY.md) are",
            "part of this prompt as they were when the session began; read them before anything else.",
            "",
            "## Tools",
            *(
                f"- {schema.name}: {schema.description.splitlines()[0] if schema.description else ''}"
                for schema in schemas
            ),
            "",
            "## Workspace",
            *self._workspace_lines(),
            "",
            "## Memory",
            *self._memory_lines(),
            "- The conversation: one session per channel, kept between its messages.",
            "",
            "## Skills",
            *([f"- {skill.name}: {skill.description}" for skill in skills] or ["- none installed"]),
        ]
        path = self.workspace / "AGENTS.md"
        write_private(path, ("\n".join(lines) + "\n").encode())
        return path

    def _offline_tools(self) -> tuple[str, ...]:
        """Tools that use the network from the gateway's process: not for an isolated agent without it."""
        isolation = self.entry.isolation
        return OFFLINE_DENIED if isolation.enabled and not isolation.network else ()

    def _memory_lines(self) -> list[str]:
        if self.shared_memory:
            return [
                "- MEMORY.md and USER.md: change them with the memory tool (add, replace, remove).",
                "- Facts: keep one with memory `remember`; they come back when a message mentions them.",
                "- All your channels share them: whatever one user tells you, every other user may read.",
            ]
        return [
            "- USER.md and facts (memory `remember`) are this channel's: no other channel sees them.",
            "- MEMORY.md is your owner's notes, the same on every channel; you read it but do not change it.",
        ]

    def _workspace_lines(self) -> list[str]:
        lines = [
            f"- Your working directory is {self.workdir}: relative paths and commands start there, and",
            "  it is the one place you may write. Nothing of other agents is in reach; your other",
            "  channels work in this same folder, so what you leave here their users may read.",
        ]
        isolation = self.entry.isolation
        if not isolation.enabled:
            lines.append(f"- Temporary files go in {self.tmp} (your commands' TMPDIR), not in /tmp.")
        if isolation.enabled:
            network = "on" if isolation.network else "off"
            lines.append(f"- Your commands see only this folder and an empty /tmp; the network is {network}.")
        return lines

"""Confinement of shell commands: where a command the model runs may write, and whether it has a network.

The command judge (tools/approval.py) decides whether a command runs; the sandbox limits what it can do
when it does, so that a mistake in one layer is caught by the other. Modes:

- `workspace-write` (the default): reads anywhere; writes only in the working directory, the temporary
  directory and the paths the user lists in `sandbox.writable`. The working directory's `.git` stays
  read-only unless `sandbox.writable_git` is true, and mibyan's own files (its home and the project's
  `./.mibyan/`) are always read-only, even inside the working directory. The network is on unless
  `sandbox.network` is false.
- `read-only`: reads anywhere, writes nowhere (not even in /tmp).
- `off`: commands run as they are.

Places may also be hidden (`hidden`: an empty, read-only folder in their stead), with parts of them
shown again read-only (`visible`): a gateway agent's commands do not see mibyan's home, only the agent's
own folder and its workspace, nor the home of the user running the gateway. Places of secrets may be
masked (`masked`, bubblewrap only): an empty read-only folder over a folder, an unreadable device over a
file, so that whatever a command is approved to run, it reads nothing there (a gateway masks every
place of secrets the judge knows). An isolated sandbox (`isolated`, bubblewrap only) is a fresh
filesystem: the system's folders read-only, the working directory writable, an empty /tmp, nothing
else, and an environment with none of the gateway's variables (its keys among them).

Backends, in order: bubblewrap (`bwrap`: a read-only view of /, the writable places bound over it, new
PID namespace and session, no capabilities, killed with its parent, no network namespace when asked),
then Landlock (a kernel facility, applied to the command's process just before it starts), then none:
commands run unconfined, and the agent says so once per process.

`Sandbox(...).launch(argv)` is the one entry point: it gives what `subprocess.Popen` needs to start
`argv` confined. A command that fails because of the sandbox gets a note saying so (`explain`), so the
model and the user know why and how to run that one command outside it (with the user's approval).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal, get_args

from mibyan.core.errors import ConfigError

Mode = Literal["workspace-write", "read-only", "off"]
Backend = Literal["bubblewrap", "landlock", "none"]
MODES: tuple[str, ...] = get_args(Mode)

UNCONFINED_WARNING = "no sandbox backend (install bubblewrap); commands run unconfined"

_READ_ONLY_FAILURE = re.compile(r"Read-only file system|EROFS")
_DENIED_FAILURE = re.compile(r"Permission denied|EACCES|Operation not permitted")
_NETWORK_FAILURE = re.compile(
    r"Network is unreachable|Could not resolve host|Temporary failure in name resolution|"
    r"Name or service not known|Connection refused|No address associated|getaddrinfo failed|"
    r"Failed to connect|ENETUNREACH|ECONNREFUSED",
    re.IGNORECASE,
)
_BWRAP_FAILURE = re.compile(r"\Abwrap: (.*)")
#: What an isolated sandbox shows of the machine (read-only): what programs need to run.
_SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")


def _landlock() -> ModuleType:
    from mibyan.tools import landlock  # ctypes: loaded only where Landlock is used or looked for

    return landlock


@functools.cache
def _bwrap() -> str | None:
    """Where bwrap is, looked up once: later changes to PATH (or a planted `bwrap`) do not move it."""
    return shutil.which("bwrap")


@functools.cache
def detect_backend() -> Backend:
    """The best backend this machine has; looked up once per process, without running anything.

    bubblewrap is chosen when `bwrap` is on PATH; whether it can make namespaces here shows at its first
    use, and a failure then is reported in the command's result, never hidden by running unconfined.
    """
    if _bwrap():
        return "bubblewrap"
    if _landlock().abi_version() > 0:
        return "landlock"
    return "none"


#: Taken (never released) by the first agent that says commands run unconfined: once per process.
_UNCONFINED_WARNING_GIVEN = threading.Lock()


def warn_unconfined_once() -> bool:
    """True the first time in this process (the caller then shows UNCONFINED_WARNING), False after."""
    return _UNCONFINED_WARNING_GIVEN.acquire(blocking=False)


@dataclass(frozen=True)
class Launch:
    """How to start a command: its argv, and what the child does before it executes (Landlock)."""

    argv: list[str]
    preexec: Callable[[], None] | None = None
    pass_fds: tuple[int, ...] = ()
    cleanup: Callable[[], None] = field(default=lambda: None)


@functools.cache
def _machine_temp() -> tuple[Path, ...]:
    """The machine's temporary folders, /tmp and the process's TMPDIR resolved, looked up once (as
    `tempfile.gettempdir()` itself is)."""
    return tuple(sorted({Path("/tmp"), Path(tempfile.gettempdir()).resolve()}))


def _resolved(path: str | Path, base: Path) -> Path:
    expanded = Path(path).expanduser()
    return (expanded if expanded.is_absolute() else base / expanded).resolve(strict=False)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


class Sandbox:
    """Where the commands of one agent (or one gateway run) may write, and whether they have a network.

    Args:
        mode: "workspace-write", "read-only" or "off".
        workdir: the working directory: the one place (with temp) a workspace-write command may write.
        writable: more places a command may write (caches, say); `~` and relative paths are expanded.
        network: False takes the network away (a new, empty network namespace with bubblewrap).
        writable_git: let commands write the working directory's `.git` (read-only otherwise).
        protected: places that stay read-only even inside a writable one (mibyan's home, say); the
            working directory's `.mibyan/` is always among them.
        backend: force a backend; the machine's best one (`detect_backend()`) when omitted.
        hidden: places commands cannot see (bubblewrap; Landlock cannot hide what it lets them read).
        visible: places inside the hidden ones they still see, read-only.
        isolated: a fresh filesystem and environment (see the module's docstring); needs bubblewrap.
        temp: a temporary folder of the commands' own, written instead of the machine's: with
            bubblewrap it is their /tmp (the machine's is out of sight), and their TMPDIR points at it.
        masked: folders and files commands see empty (bubblewrap); those missing are left alone.

    Raises:
        ConfigError: an unknown mode, or a backend this machine does not have.
    """

    def __init__(
        self,
        mode: str,
        workdir: str | Path,
        *,
        writable: Iterable[str | Path] = (),
        network: bool = True,
        writable_git: bool = False,
        protected: Iterable[str | Path] = (),
        backend: Backend | None = None,
        hidden: Iterable[str | Path] = (),
        visible: Iterable[str | Path] = (),
        isolated: bool = False,
        temp: str | Path | None = None,
        masked: Iterable[str | Path] = (),
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"sandbox.mode: unknown mode '{mode}' (known: {', '.join(MODES)})")
        self.mode: Mode = mode  # type: ignore[assignment]
        self.workdir = Path(workdir).resolve()
        self.writable = tuple(_resolved(p, self.workdir) for p in writable)
        self.network = network
        self.writable_git = writable_git
        self.protected = (*(_resolved(p, self.workdir) for p in protected), self.workdir / ".mibyan")
        self.backend: Backend = backend or detect_backend()
        self.hidden = tuple(_resolved(p, self.workdir) for p in hidden)
        self.visible = tuple(_resolved(p, self.workdir) for p in visible)
        self.isolated = isolated
        self.masked = tuple(dict.fromkeys(_resolved(p, self.workdir) for p in masked))
        self.temp = _resolved(temp, self.workdir) if temp is not None and not isolated else None
        if isolated and (mode != "workspace-write" or self.backend != "bubblewrap" or not _bwrap()):
            raise ConfigError("needs bubblewrap (package bubblewrap) and the mode workspace-write")
        if mode != "off" and self.backend == "landlock" and _landlock().abi_version() <= 0:
            raise ConfigError("sandbox.backend: landlock: this kernel does not offer Landlock")
        if mode != "off" and self.backend == "bubblewrap" and not _bwrap():
            raise ConfigError("sandbox.backend: bubblewrap: bwrap is not installed (package bubblewrap)")

    def rooted_at(self, workdir: str | Path, *, writable: Iterable[str | Path] = ()) -> Sandbox:
        """The same rules for a process started in another folder: that folder is the writable one (an
        MCP server's `cwd:`, say; `.mibyan/` there is held read-only too), with `writable` places more."""
        more = tuple(_resolved(p, self.workdir) for p in writable)
        if Path(workdir).resolve() == self.workdir and not more:
            return self
        return Sandbox(
            self.mode,
            workdir,
            writable=(*self.writable, *more),
            network=self.network,
            writable_git=self.writable_git,
            protected=self.protected[:-1],  # the last is the old working directory's .mibyan/
            backend=self.backend,
            hidden=self.hidden,
            visible=self.visible,
            isolated=self.isolated,
            temp=self.temp,
            masked=self.masked,
        )

    @property
    def active(self) -> bool:
        """Whether commands are confined at all."""
        return self.mode != "off" and self.backend != "none"

    def warning(self) -> str | None:
        """What the user must know at start: confinement asked for but missing, in whole or in part."""
        if self.mode == "off":
            return None
        if self.backend == "none":
            return UNCONFINED_WARNING
        if self.mode == "workspace-write" and self.workdir == Path("/"):
            return "the working directory is /, so the sandbox lets commands write everywhere"
        if self.backend != "landlock":
            return None
        gaps = [str(p) for p in self.read_only_places()]
        if self.has_network and not self.network:
            gaps.append("the network (this kernel's Landlock cannot take it away)")
        elif not self.network:
            gaps.append("the network beyond TCP (Landlock cannot stop UDP, DNS among it)")
        clauses = [f"protect {', '.join(gaps)}"] if gaps else []
        hidden = [str(p) for p in self.hidden] + (["the places of secrets"] if self.masked else [])
        if hidden:
            clauses.append(f"hide {', '.join(hidden)} from commands")
        if not clauses:
            return None
        return f"the sandbox (Landlock) cannot {' or '.join(clauses)}; install bubblewrap for that"

    def writable_places(self) -> list[Path]:
        """Where a confined command may write (for workspace-write; read-only has none)."""
        if self.mode != "workspace-write":
            return []
        if self.isolated:
            return [self.workdir]  # and its own, empty /tmp
        temp = [self.temp] if self.temp is not None else _machine_temp()
        return list(dict.fromkeys([self.workdir, *temp, *self.writable, *self._linked_git_dirs()]))

    def _linked_git_dirs(self) -> list[Path]:
        """With `writable_git`, a linked worktree's git folders, which live outside the working directory."""
        marker = self.workdir / ".git"
        if not self.writable_git or not marker.is_file():
            return []
        text = marker.read_text(encoding="utf-8", errors="replace").strip()
        if not text.startswith("gitdir:"):
            return []
        gitdir = _resolved(text.removeprefix("gitdir:").strip(), self.workdir)
        common = gitdir / "commondir"
        if common.is_file():
            return [gitdir, _resolved(common.read_text(encoding="utf-8").strip(), gitdir)]
        return [gitdir]

    def read_only_places(self, writable: list[Path] | None = None) -> list[Path]:
        """Places inside the writable ones that stay read-only: `.git` (unless allowed) and mibyan's own.
        `writable`: the writable places, when the caller has them already."""
        git = [] if self.writable_git else [self.workdir / ".git"]
        places = self.writable_places() if writable is None else writable
        return [
            p
            for p in (*git, *self.protected)
            if (p.exists() or p.name == ".mibyan") and any(_inside(p, w) for w in places)
        ]

    def describe(self) -> str:
        """One line for the user: the mode, the backend, where commands may write and the network."""
        if self.mode == "off":
            return "sandbox off: commands run unconfined"
        if self.backend == "none":
            return f"sandbox {self.mode} requested, but {UNCONFINED_WARNING}"
        places = ", ".join(str(p) for p in self.writable_places()) or "nowhere"
        line = f"sandbox {self.mode} ({self.backend}): writes in {places}"
        kept = ", ".join(str(p) for p in self.read_only_places())
        if kept:
            held = "cannot be held read-only by Landlock" if self.backend == "landlock" else "read-only"
            line += f"; {held}: {kept}"
        network = "on" if self.has_network else "off"
        if not self.has_network and self.backend == "landlock":
            network = "off for TCP (UDP stays on)"
        return line + f"; network {network}"

    @property
    def has_network(self) -> bool:
        """Whether confined commands can reach the network (Landlock before ABI 4 cannot take it away)."""
        if self.network or not self.active:
            return True
        return self.backend == "landlock" and not _landlock().takes_network_away()

    def wrap(self, argv: list[str], *, cwd: str | Path | None = None) -> list[str]:
        """`argv` as bubblewrap runs it confined, in `cwd` (the process's own when omitted); unchanged
        for the other backends (see `launch`)."""
        if not self.active or self.backend != "bubblewrap":
            return list(argv)
        where = Path(cwd if cwd is not None else os.getcwd()).resolve()
        return [*self._bwrap_options(), "--chdir", str(where), "--", *argv]

    def launch(self, argv: list[str], *, cwd: str | Path | None = None) -> Launch:
        """Everything `subprocess.Popen` needs to start `argv` confined, in `cwd`."""
        if not self.active:
            return Launch(list(argv))
        if self.backend == "bubblewrap":
            return Launch(self.wrap(argv, cwd=cwd))
        landlock = _landlock()
        rules = landlock.Rules(
            writable=[p for p in self.writable_places() if p.exists()],
            network=self.network,
        )
        ruleset = landlock.build(rules)
        return Launch(list(argv), ruleset.restrict, (ruleset.fd,), ruleset.close)

    def _bwrap_options(self) -> list[str]:
        # --cap-drop ALL: run by root, bwrap would leave the command every capability, and a remount
        # (or an unmount of a read-only bind) would undo the sandbox from inside
        options = [
            _bwrap() or "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--cap-drop",
            "ALL",
        ]
        options += self._isolated_root() if self.isolated else ["--ro-bind", "/", "/"]
        options += ["--dev", "/dev", "--proc", "/proc"]
        if self.temp is not None and self.temp.is_dir():
            # first, so that the places below /tmp bound next (a home there, say) stay in sight
            options += ["--bind", str(self.temp), "/tmp"]
        # the kernel's settings stay read-only: root could otherwise change them for the whole machine
        # (kernel.core_pattern, say, runs a program of its choosing outside any sandbox)
        options += ["--ro-bind", "/proc/sys", "/proc/sys"]
        options += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
        places = self.writable_places()  # looked at once per command: what exists may have changed
        writable = [place for place in places if place.exists()]
        for place in writable:
            options += ["--bind", str(place), str(place)]
        options += self._hiding(writable)
        for place in self.read_only_places(places):
            if any(_inside(hidden, place) for hidden in self.hidden):
                continue  # hidden, not merely read-only
            if place.name == ".mibyan":
                # a command must not create it either, so an empty folder is held read-only in its place
                # (where mibyan cannot create it, the commands it runs cannot either)
                with contextlib.suppress(OSError):
                    place.mkdir(mode=0o700, exist_ok=True)
            if place.exists():
                options += ["--ro-bind", str(place), str(place)]
        options += self._masking(writable)
        if not self.network:
            options.append("--unshare-net")
        return options

    def _isolated_root(self) -> list[str]:
        """A fresh root: the system's folders read-only, an empty /tmp, a clean environment."""
        options = ["--unshare-ipc", "--unshare-uts", "--clearenv"]
        for folder in _SYSTEM_FOLDERS:
            options += ["--ro-bind-try", folder, folder]
        options += ["--tmpfs", "/tmp"]
        options += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", str(self.workdir)]
        return [*options, "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]

    def _hiding(self, writable: list[Path]) -> list[str]:
        """Hidden places as empty read-only folders, the visible parts of them shown again read-only, and
        the writable places inside them bound again (all after the writable places, which may hold them)."""
        options: list[str] = []
        for hidden in self.hidden:
            within = [h for h in self.hidden if h != hidden and _inside(hidden, h)]
            shown = any(_inside(hidden, p) for p in (*self.visible, *writable))
            if not hidden.exists() or (within and not shown):
                continue  # out of sight already: an empty folder over it would cover what is shown
            options += ["--tmpfs", str(hidden)]
            inside = [p for p in (*self.visible, *writable) if _inside(p, hidden) and p.exists()]
            for place in inside:
                kind = "--bind" if place in writable else "--ro-bind"
                options += [kind, str(place), str(place)]
            options += ["--remount-ro", str(hidden)]
        return options

    def _masking(self, writable: list[Path]) -> list[str]:
        """The masked places commands would otherwise see, each made empty: a folder by an empty
        read-only one, a file by /dev/null (on a mount without devices, so reading it is refused). A
        place already out of sight is left alone (a mount there would create it), and so is one holding
        the working directory."""
        options: list[str] = []
        shown = [*self.visible, *writable]
        for place in self.masked:
            if not place.exists() or _inside(self.workdir, place):
                continue
            hidden = any(_inside(place, h) for h in self.hidden) and not any(_inside(place, s) for s in shown)
            outside = self.isolated and not any(
                _inside(place, Path(folder)) for folder in (*_SYSTEM_FOLDERS, str(self.workdir))
            )
            if hidden or outside:
                continue
            if place.is_dir():
                options += ["--tmpfs", str(place), "--remount-ro", str(place)]
            else:
                options += ["--ro-bind", "/dev/null", str(place)]
        return options

    def explain(self, output: str, exit_code: int | None) -> str | None:
        """A note for a command's result when the sandbox is why it failed, or None.

        Args:
            output: what the command printed (stdout and stderr together).
            exit_code: its exit code (None when it was killed).
        """
        if not self.active or not exit_code:
            return None
        if self.backend == "bubblewrap" and exit_code == 1 and (started := _BWRAP_FAILURE.match(output)):
            return (
                f"[the sandbox (bubblewrap) could not start: {started.group(1).strip()}; the command did not "
                "run. Ask the user to repair bubblewrap, or to change sandbox.backend or sandbox.mode]"
            )
        blocked: list[str] = []
        advice = ""
        landlock_denied = self.backend == "landlock" and _DENIED_FAILURE.search(output) is not None
        if _READ_ONLY_FAILURE.search(output) or landlock_denied:
            blocked.append(self._write_rule())
            if self.mode == "workspace-write":
                advice = " (a place needed often, such as a cache, the user may add to sandbox.writable)"
        if not self.has_network and (_NETWORK_FAILURE.search(output) or landlock_denied):
            blocked.append(f"the sandbox ({self.mode}) has no network (sandbox.network: false)")
        if not blocked:
            return None
        # Landlock's refusals look like any "Permission denied": say what the sandbox may have done
        hedge = "perhaps " if landlock_denied else ""
        return (
            f"[{hedge}{'; or '.join(blocked)}. If this one command must do that, call terminal again with "
            f"outside_sandbox: true, and the user is asked{advice}]"
        )

    def _write_rule(self) -> str:
        if self.mode == "read-only":
            return "the sandbox (read-only) blocked a write: commands may not write anywhere"
        places = ", ".join(str(p) for p in self.writable_places())
        rule = f"the sandbox (workspace-write) blocked writing outside {places}"
        kept = ", ".join(str(p) for p in self.read_only_places())
        if kept and self.backend == "bubblewrap":
            rule += f" (read-only even there: {kept})"
        return rule

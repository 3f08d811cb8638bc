"""Landlock, the Linux kernel's unprivileged sandbox, through its three system calls (ctypes, no helper).

The sandbox's second backend, for machines without bubblewrap. A ruleset is built in the parent (where
errors can be reported); the child only sets `no_new_privs` and restricts itself just before it executes
the command, so nothing that could block runs between fork and exec.

What Landlock can and cannot do here: it limits *writes* to the granted folders (reads stay free, as in
every mode), and with ABI 4 or later it can forbid TCP connections (no network). It cannot carve a
read-only hole inside a writable folder, so `.git`, `./.mibyan/` and a mibyan home inside the working
directory are not held read-only by this backend; the sandbox says so in its description.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from mibyan.core.errors import ToolError

# x86_64 and aarch64 share these numbers (the calls were added after the syscall tables were unified)
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_WRITE_FILE = 1 << 1
_REMOVE_DIR, _REMOVE_FILE = 1 << 4, 1 << 5
_MAKE_ALL = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4

#: Device files every command may write (its output may be sent to /dev/null, say).
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx")
_DEVICE_FOLDERS = ("/dev/pts", "/dev/shm")


class _RulesetAttr(ctypes.Structure):
    _fields_ = (("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64))


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@functools.cache
def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing, disabled or not Linux."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def takes_network_away() -> bool:
    """Whether this kernel's Landlock can forbid TCP connections (ABI 4 and later)."""
    return abi_version() >= 4


@dataclass(frozen=True)
class Rules:
    """What a confined command may do: write beneath these folders; use the network or not."""

    writable: list[Path]
    network: bool


class Ruleset:
    """A built Landlock ruleset (an open descriptor) that a child process applies to itself."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # looked up now, so the child does as little as it can between fork and exec
        self._prctl = _libc().prctl
        self._syscall = _libc().syscall

    def restrict(self) -> None:
        """Runs in the child between fork and exec: no new privileges, then the ruleset, for good."""
        failed = self._prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        if failed or self._syscall(_SYS_RESTRICT_SELF, self.fd, 0) != 0:
            # never run the command unconfined when confinement was asked for
            os.write(2, b"mibyan: the sandbox (Landlock) could not confine the command; it did not run\n")
            os._exit(126)
        os.close(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _fs_rights() -> int:
    rights = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_ALL
    if abi_version() >= 2:
        rights |= _REFER
    if abi_version() >= 3:
        rights |= _TRUNCATE
    return rights


def _grant(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a place that does not exist cannot be written beneath anyway
    try:
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if _libc().syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            error = ctypes.get_errno()
            raise ToolError(f"the sandbox (Landlock) could not grant {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


def build(rules: Rules) -> Ruleset:
    """A ruleset for `rules`, ready for a child to apply.

    Raises:
        ToolError: the kernel refused the ruleset (the command is then not run).
    """
    rights = _fs_rights()
    attr = _RulesetAttr(handled_access_fs=rights, handled_access_net=0)
    size = ctypes.sizeof(_RulesetAttr) if takes_network_away() else 8
    if not rules.network and takes_network_away():
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    fd = int(_libc().syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0))
    if fd < 0:
        raise ToolError(f"the sandbox (Landlock) could not start: {os.strerror(ctypes.get_errno())}")
    try:
        for folder in rules.writable:
            _grant(fd, str(folder), rights)
        file_rights = _WRITE_FILE | (_TRUNCATE if abi_version() >= 3 else 0)
        for device in _DEVICES:
            _grant(fd, device, file_rights)
        for folder_name in _DEVICE_FOLDERS:
            _grant(fd, folder_name, rights)
    except ToolError:
        os.close(fd)
        raise
    return Ruleset(fd)

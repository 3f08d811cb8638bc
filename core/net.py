"""What mibyan's servers (the gateway's HTTP connector, the session viewer) share about the network:
which hosts are this machine only, and a listening socket whose failure is one clear line."""

from __future__ import annotations

import ipaddress
import socket

from mibyan.core.errors import MibyanError


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or an address, `[::1]` too, without a port) is reachable from this machine
    only: 127.0.0.0/8, ::1, localhost, and 127.0.0.0/8 written as IPv6 (`::ffff:127.0.0.1`)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # Python before 3.13 says no to these
    return address.is_loopback


def listen_on(
    host: str, port: int, *, error: type[MibyanError] = MibyanError, who: str = ""
) -> socket.socket:
    """A listening TCP socket on host:port (0: any free port); `error` (one line, prefixed by `who`) when
    the address cannot be had, such as a port another program holds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it every small reply waits ~40 ms for the client's delayed ACK
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise error(f"{who}cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    listener.listen(128)
    return listener

"""Which addresses web_fetch may connect to: the one entry point is `checked_addresses`.

A page the model fetches could be anything: a prompt injection can ask for the router's admin page,
a service on loopback, or the cloud metadata endpoint that hands out credentials. So the name is
resolved first and every address it resolves to is judged; loopback, private, link-local, multicast,
reserved and unspecified addresses are refused unless the user set `web.allow_private: true`, and
cloud metadata endpoints are refused always. Addresses hidden inside IPv6 ones (::ffff:127.0.0.1,
6to4, NAT64) are judged as what they carry. The caller connects to an address it got from here, never
to the name again, so a DNS answer that changes between the check and the connection cannot matter.
"""

from __future__ import annotations

import ipaddress
import socket

from mibyan.core.errors import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_METADATA_ADDRESSES = {
    ipaddress.ip_address("169.254.169.254"),  # AWS, Azure, Google Cloud, DigitalOcean, OpenStack
    ipaddress.ip_address("169.254.170.2"),  # AWS container credentials
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
}
_METADATA_NAMES = {
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ALLOW_HINT = "set web.allow_private: true to allow it"


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4 or NAT64), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why web_fetch must not connect to `address` (a noun phrase), or None when it may."""
    inner = _embedded_ipv4(address)
    if inner is not None:
        why = address_refusal(inner, allow_private=allow_private)
        return f"{inner} in IPv6 form, {why}" if why else None
    if address in _METADATA_ADDRESSES:
        return "a cloud metadata address"
    if allow_private:
        return None
    for test, kind in (
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "the unspecified address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
    ):
        if test:
            return kind
    return None if address.is_global else "not a public address"


def _refuse(subject: str, why: str) -> ToolError:
    if "cloud metadata" in why:
        return ToolError(f"refused: {subject} is {why}; mibyan never fetches it")
    return ToolError(f"refused: {subject} is {why}; {_ALLOW_HINT}")


def checked_addresses(host: str, port: int, *, allow_private: bool) -> list[str]:
    """The addresses `host` resolves to, in the resolver's order, once every one of them is allowed.

    Raises:
        ToolError: the refusal (which address, and why) or the resolver's failure, for the model.
    """
    name = host.strip("[]").rstrip(".").lower()
    if name in _METADATA_NAMES:
        raise ToolError(f"refused: {host} is a cloud metadata service; mibyan never fetches it")
    try:
        found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot fetch: {host} does not resolve ({exc})") from None
    addresses: list[str] = []
    for *_, sockaddr in found:
        text = str(sockaddr[0]).split("%", 1)[0]
        address = ipaddress.ip_address(text)
        why = address_refusal(address, allow_private=allow_private)
        if why is not None:
            literal = _is_literal(name)
            raise _refuse(str(address) if literal else f"{host}, which resolves to {address},", why)
        if text not in addresses:
            addresses.append(text)
    return addresses


def _is_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True

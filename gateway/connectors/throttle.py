"""How a connector slows down a peer guessing its bearer token.

Wrong tokens are counted per peer address (an IPv6 address by its /64, which one machine usually
holds whole). After `failures` wrong tokens in a row, the peer is blocked for `block` seconds: every
request of it that needs the token is answered 429 with `Retry-After`, without looking at the token,
so a right guess during the block tells nothing. Each further block is twice as long, up to an hour;
a right token afterwards forgets the peer, as does an hour without a wrong one.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

_LONGEST_BLOCK = 3600.0
_FORGET_AFTER = 3600.0  # seconds without a wrong token after which a peer starts afresh
_MAX_PEERS = 10_000  # peers remembered at once: many addresses must not grow memory without end


@dataclass
class _Peer:
    failures: int = 0
    blocks: int = 0
    blocked_until: float = 0.0
    last_failure: float = 0.0


def peer_of(address: str | None) -> str:
    """The key a client's address is counted under: an IPv6 address by its /64."""
    if not address:
        return "?"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


class AuthThrottle:
    """Counts wrong tokens per peer and says how long a blocked peer must wait."""

    def __init__(self, *, failures: int, block: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.block = block
        self._clock = clock
        self._peers: dict[str, _Peer] = {}

    def retry_after(self, peer: str) -> int | None:
        """Whole seconds `peer` must wait before its token is looked at again; None when it need not."""
        state = self._peers.get(peer)
        if state is None:
            return None
        left = state.blocked_until - self._clock()
        return max(1, math.ceil(left)) if left > 0 else None

    def failed(self, peer: str) -> None:
        """`peer` sent a wrong (or no) token."""
        now = self._clock()
        state = self._peers.get(peer)
        if state is None or now - state.last_failure > _FORGET_AFTER:
            state = self._peers[peer] = _Peer()
            self._forget_the_oldest()
        state.failures += 1
        state.last_failure = now
        if state.failures >= self.failures:
            state.blocked_until = now + min(_LONGEST_BLOCK, self.block * 2 ** min(state.blocks, 12))
            state.blocks += 1
            state.failures = 0

    def succeeded(self, peer: str) -> None:
        """`peer` sent the right token: it starts afresh."""
        self._peers.pop(peer, None)

    def _forget_the_oldest(self) -> None:
        if len(self._peers) > _MAX_PEERS:
            oldest = min(self._peers, key=lambda key: self._peers[key].last_failure)
            del self._peers[oldest]

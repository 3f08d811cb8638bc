"""Files people send to an XMPP agent: HTTP upload (XEP-0363) puts the file on the server's upload
service and the message carries its URL (jabber:x:oob); it is fetched and saved in the agent's `inbox/`.

Only URLs on the account's own server (its domain or a subdomain, or the configured server host) are
fetched: a message's URL must not make the gateway fetch from anywhere its sender likes.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import aiohttp

from mibyan.gateway.connectors import inbox
from mibyan.gateway.connectors.base import InboundEvent

if TYPE_CHECKING:
    from mibyan.gateway.connectors.xmpp import XmppConnector


def oob_url(message: Any) -> str | None:
    """The URL of a file the message carries (jabber:x:oob), or None."""
    element = message.xml.find("{jabber:x:oob}x/{jabber:x:oob}url")
    url = (element.text or "").strip() if element is not None else ""
    return url if url.startswith(("https://", "http://")) else None


def _ours(connector: XmppConnector, url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    domain = connector.domain.lower()
    return host in (domain, connector.address[0].lower()) or host.endswith(f".{domain}")


async def attachment_text(connector: XmppConnector, event: InboundEvent, url: str) -> str:
    """The text telling the agent where the file was saved (or why not), with any caption."""
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "file"
    caption = event.text if event.text.strip() != url else ""
    limit_mb = connector.gateway.settings.gateway.max_attachment_mb
    limit = int(limit_mb * 1_000_000)
    data: bytes | int | None = None
    if _ours(connector, url):
        try:
            data = await _download(url, limit, str(connector.ca_file) if connector.ca_file else None)
        except (aiohttp.ClientError, TimeoutError, OSError):
            data = None
    workdir = connector.gateway.route(connector.settings, None).workdir
    unfetched = "it could not be fetched from the account's server"
    saved = await inbox.keep(workdir, event.message_id, name, data, limit, unfetched)
    return "\n".join(part for part in (caption, inbox.note([saved], limit_mb)) if part)


async def _download(url: str, limit: int, ca_file: str | None) -> bytes | int | None:
    """The file's bytes; its size so far when it grows past `limit`; None when it is not there."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, ssl=context) as answer:
        return await inbox.read_capped(answer, limit)

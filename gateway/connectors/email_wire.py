"""The email connector's wire: the standard library's imaplib and smtplib, run in worker threads.

imaplib has no IDLE before Python 3.14, so `Mailbox.idle` speaks it itself: IDLE, read until the server
says EXISTS (new mail) or until `wake` sends DONE (the refresh timer, or the connector stopping), then
read up to the tagged OK. DONE is sent once whoever sends it first, so the stream stays in step.
"""

from __future__ import annotations

import contextlib
import imaplib
import json
import logging
import os
import smtplib
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.config.gateway import MailServer
from mibyan.config.paths import write_private
from mibyan.core.errors import ConfigError
from mibyan.core.net import is_loopback_host
from mibyan.gateway.connectors.base import SendResult, SendStatus

log = logging.getLogger("mibyan.gateway")
TIMEOUT = 60.0  # seconds any one IMAP or SMTP exchange may take
#: What a mail server going away looks like from imaplib and smtplib.
GONE = (OSError, imaplib.IMAP4.abort, smtplib.SMTPServerDisconnected, EOFError)


def check_email(settings: ConnectorSettings, env: dict[str, str] | os._Environ[str]) -> str:
    """The password an email connector logs in with (`password_env`).

    Raises:
        ConfigError: a key the email kind needs is missing or unsafe (one line saying which).
    """
    where = f"connector '{settings.name}' (email)"
    if not settings.address or "@" not in settings.address:
        raise ConfigError(f"{where}: set address: to the agent's mail address, e.g. meepa@example.org")
    for side, server in (("imap", settings.imap), ("smtp", settings.smtp)):
        if server is None:
            raise ConfigError(f"{where}: set {side}: {{host: ..., port: ..., tls: ssl}}")
        if server.tls == "none" and not is_loopback_host(server.host):
            raise ConfigError(
                f"{where}: {side}.tls: none sends the password in clear: only to a loopback host "
                f"(not {server.host}); use ssl or starttls"
            )
    if not settings.allow:
        raise ConfigError(
            f'{where}: set allow: to who may write to the agent (addresses, "@domain", or "*" for anyone); '
            "without it the connector does not start"
        )
    if settings.password_env is None:
        raise ConfigError(f"{where}: set password_env: to the variable holding the mailbox password")
    secret = env.get(settings.password_env, "")
    if not secret:
        raise ConfigError(f"{where}: the variable {settings.password_env} is not set")
    return secret


@dataclass(frozen=True)
class Cursor:
    """Where the connector is in the mailbox.

    Attributes:
        uidvalidity: the mailbox's UIDVALIDITY.
        last_uid: the last UID admitted to the ledger (or passed over).
        since: when the last mail it passed arrived (its INTERNALDATE; at the first start, that start).
        renumbered_below: after a new UIDVALIDITY, the UIDs below this are the renumbered mailbox: only
            its mails that arrived at `since` or later, and that the ledger has not seen, are answered.
    """

    uidvalidity: int
    last_uid: int
    since: float = 0.0
    renumbered_below: int = 0


class CursorFile:
    """`$MIBYAN_HOME/connectors/<name>/imap.json`: moved only after a mail is admitted."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "imap.json"

    def read(self) -> Cursor | None:
        try:
            data = json.loads(self.path.read_text())
            # a cursor kept before `since` was: the file is written after each admission, so its time
            since = float(data.get("since") or self.path.stat().st_mtime)
            below = int(data.get("renumbered_below", 0))
            return Cursor(int(data["uidvalidity"]), int(data["last_uid"]), since, below)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def save(self, cursor: Cursor) -> None:
        write_private(self.path, json.dumps(cursor.__dict__).encode())


def _context(ca_file: Path | None) -> ssl.SSLContext:
    """The system's trust, or only `ca_file`'s (a self-signed server) when the connector names one."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


def untrusted(side: str, server: MailServer, exc: ssl.SSLCertVerificationError) -> ConfigError:
    """The one line a server whose certificate we do not trust is refused with."""
    why = exc.verify_message or exc.reason or str(exc)
    return ConfigError(
        f"the {side} server {server.host}:{server.port} presented a certificate that is not trusted "
        f"({why}); set ca_file: to the CA that signed it"
    )


class Mailbox:
    """One IMAP connection to INBOX (blocking: used from one worker thread at a time)."""

    def __init__(self, server: MailServer, username: str, password: str, ca_file: Path | None) -> None:
        self.server = server
        self.ca_file = ca_file
        self.username = username
        self.password = password
        self.imap: imaplib.IMAP4 | None = None
        self.uidvalidity = 0
        self.uidnext = 1
        self.has_idle = False
        self._done_lock = threading.Lock()
        self._idling: bytes | None = None  # the IDLE command's tag while it runs

    def connect(self) -> None:
        """Log in and select INBOX (UIDVALIDITY and UIDNEXT read)."""
        self.close()
        server = self.server
        try:
            imap = self._open()
        except ssl.SSLCertVerificationError as exc:
            raise untrusted("IMAP", server, exc) from None
        try:
            imap.login(self.username, self.password)
        except imaplib.IMAP4.error as exc:
            imap.shutdown()
            raise ConfigError(f"the IMAP server refused the login of {self.username}: {exc}") from None
        self.imap = imap
        self.has_idle = "IDLE" in _capabilities(imap)
        status, _ = imap.select("INBOX")
        if status != "OK":
            raise imaplib.IMAP4.abort("INBOX cannot be selected")
        self.uidvalidity = int(_untagged(imap, "UIDVALIDITY") or 0)
        self.uidnext = int(_untagged(imap, "UIDNEXT") or 0) or self._uidnext()

    def _open(self) -> imaplib.IMAP4:
        server = self.server
        if server.tls == "ssl":
            context = _context(self.ca_file)
            return imaplib.IMAP4_SSL(server.host, server.port, ssl_context=context, timeout=TIMEOUT)
        imap = imaplib.IMAP4(server.host, server.port, timeout=TIMEOUT)
        if server.tls == "starttls":
            try:
                imap.starttls(_context(self.ca_file))
            except BaseException:
                imap.shutdown()
                raise
        return imap

    def _uidnext(self) -> int:
        imap = self._imap()
        _, data = imap.status("INBOX", "(UIDNEXT)")
        text = (data[0] or b"").decode() if data and isinstance(data[0], bytes) else ""
        number = text.rsplit("UIDNEXT", 1)[-1].strip(" ()")
        return int(number) if number.isdigit() else 1

    def _imap(self) -> imaplib.IMAP4:
        if self.imap is None:
            raise imaplib.IMAP4.abort("not connected")
        return self.imap

    def uids_after(self, last: int) -> list[int]:
        """The UIDs of INBOX's mails newer than `last`, oldest first."""
        status, data = self._imap().uid("SEARCH", f"UID {last + 1}:*")
        if status != "OK":
            raise imaplib.IMAP4.abort(f"UID SEARCH failed: {data}")
        found = [int(n) for n in b" ".join(d for d in data if isinstance(d, bytes)).split()]
        return sorted(n for n in found if n > last)  # `n:*` names the last mail even when it is older

    def fetch(self, uid: int) -> tuple[bytes, float] | None:
        """The whole mail and when it arrived (INTERNALDATE), without marking it seen (None: expunged
        meanwhile)."""
        status, data = self._imap().uid("FETCH", str(uid), "(INTERNALDATE BODY.PEEK[])")
        if status != "OK":
            raise imaplib.IMAP4.abort(f"UID FETCH failed: {data}")
        for item in data:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes):
                arrived = imaplib.Internaldate2tuple(item[0]) if isinstance(item[0], bytes) else None
                return item[1], time.mktime(arrived) if arrived is not None else time.time()
        return None

    def mark_seen(self, uid: int) -> None:
        self._imap().uid("STORE", str(uid), "+FLAGS.SILENT", "(\\Seen)")

    def idle(self, seconds: float) -> bool:
        """Wait for new mail for at most `seconds` (IDLE); True when the server said some arrived."""
        imap = self._imap()
        if imap.untagged_responses.pop("EXISTS", None):
            return True  # said during the last commands (a mail arrived meanwhile): IDLE would not repeat it
        tag = imap._new_tag()  # imaplib's own tags keep the stream in step
        imap.sock.settimeout(seconds + TIMEOUT)
        imap.send(tag + b" IDLE\r\n")
        line = imap.readline()
        if not line.startswith(b"+"):
            raise imaplib.IMAP4.abort(f"IDLE refused: {line!r}")
        with self._done_lock:
            self._idling = tag
        timer = threading.Timer(seconds, self.wake)
        timer.start()
        arrived = False
        try:
            while True:
                line = imap.readline()
                if not line:
                    raise imaplib.IMAP4.abort("the IMAP server closed the connection")
                if line.startswith(tag):
                    break
                if line.rstrip().upper().endswith(b"EXISTS"):
                    arrived = True
                    self.wake()
                if line.upper().startswith(b"* BYE"):
                    raise imaplib.IMAP4.abort("the IMAP server said BYE")
        finally:
            timer.cancel()
            imap.sock.settimeout(TIMEOUT)
        return arrived

    def wake(self) -> None:
        """End a running IDLE (any thread): DONE, once."""
        with self._done_lock:
            if self._idling is None or self.imap is None:
                return
            self._idling = None
            with contextlib.suppress(OSError):
                self.imap.send(b"DONE\r\n")

    def close(self) -> None:
        """Drop the connection (any thread: a blocked read returns)."""
        imap, self.imap = self.imap, None
        with self._done_lock:
            self._idling = None
        if imap is not None:
            with contextlib.suppress(OSError):
                imap.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                imap.shutdown()


def _capabilities(imap: imaplib.IMAP4) -> set[str]:
    """What the server offers once logged in (it may differ from what it said before the login)."""
    status, data = imap.capability()
    words = b" ".join(d for d in data if isinstance(d, bytes)).decode(errors="replace").upper().split()
    return set(words) if status == "OK" and words else {c.upper() for c in imap.capabilities}


def _untagged(imap: imaplib.IMAP4, name: str) -> str | None:
    _, data = imap.response(name)
    value = data[-1] if data else None
    return value.decode() if isinstance(value, bytes) else None


def send_mail(
    server: MailServer,
    username: str,
    password: str,
    mail: EmailMessage,
    sender: str,
    ca_file: Path | None = None,
) -> SendResult:
    """Send one mail (blocking); how it went, as the chat contract reports it."""
    recipients = [str(mail["To"])]
    try:
        if server.tls == "ssl":
            client: smtplib.SMTP = smtplib.SMTP_SSL(
                server.host, server.port, timeout=TIMEOUT, context=_context(ca_file)
            )
        else:
            client = smtplib.SMTP(server.host, server.port, timeout=TIMEOUT)
        with client:
            client.ehlo()
            if server.tls == "starttls":
                client.starttls(context=_context(ca_file))
                client.ehlo()
            if client.has_extn("auth"):
                client.login(username, password)
            refused = client.send_message(mail, from_addr=sender, to_addrs=recipients)
    except ssl.SSLCertVerificationError as exc:  # nothing was sent: the server was never trusted
        return SendResult(SendStatus.FAILED, detail=str(untrusted("SMTP", server, exc)))
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused, smtplib.SMTPAuthenticationError) as exc:
        return SendResult(SendStatus.FAILED, detail=str(exc))
    except smtplib.SMTPResponseException as exc:
        if 400 <= exc.smtp_code < 500:  # the server says later: it does not have the mail
            return SendResult(SendStatus.RETRY_AFTER, retry_after=30.0, detail=str(exc))
        return SendResult(SendStatus.FAILED, detail=str(exc))
    except (*GONE, smtplib.SMTPException) as exc:  # it may have the mail or not
        return SendResult(SendStatus.UNKNOWN, detail=str(exc) or type(exc).__name__)
    if refused:
        return SendResult(SendStatus.FAILED, detail=f"refused: {refused}")
    return SendResult(SendStatus.DELIVERED)

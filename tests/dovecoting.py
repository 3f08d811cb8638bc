"""A real Dovecot (IMAP, LMTP) for the email connector's tests, a real SMTP relay in front of it (aiosmtpd,
handing each mail to Dovecot over LMTP), and a real second mail client (imaplib, smtplib) as the user.

Dovecot runs from the Debian packages (`dovecot-imapd`, `dovecot-lmtpd`) with a config of its own in a temp
folder: loopback, free ports, users from a passwd-file; TLS with a certificate signed by a CA the fixture
makes (`ca_file`): STARTTLS offered on the imap port (plain login allowed there too), TLS on an imaps
port. It never runs as root: started by root it runs as `nobody` (its folder given to that user), else
as whoever runs the tests. The relays over TLS (`Relay(tls=...)`) log in Dovecot's users, as a
submission server does.
"""

from __future__ import annotations

import asyncio
import imaplib
import os
import pwd
import shutil
import signal
import smtplib
import socket
import ssl
import subprocess
import tempfile
import threading
from email.message import EmailMessage
from email.policy import default as default_policy
from email.utils import make_msgid
from pathlib import Path
from typing import Any

from conftest import free_port, wait_until
from prosodying import make_certificates

DOVECOT = os.environ.get("MIBYAN_TEST_DOVECOT", "/usr/sbin/dovecot")
DOMAIN = "localhost"


def missing_reason() -> str | None:
    """Why the Dovecot tests cannot run here, or None."""
    if not Path(DOVECOT).exists():
        return f"no Dovecot: {DOVECOT} is missing (apt-get install dovecot-imapd dovecot-lmtpd; .ci/run does)"
    if not Path("/usr/lib/dovecot/lmtp").exists() or not Path("/usr/lib/dovecot/imap").exists():
        return "Dovecot's imap or lmtp is missing (apt-get install dovecot-imapd dovecot-lmtpd)"
    try:
        import aiosmtpd  # noqa: F401
    except ImportError as exc:
        return f"the SMTP relay's library is missing: {exc}"
    return None


def _runs_as() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())


#: Dovecot 2.3's IMAP capabilities without IDLE: a server that must be polled
_NO_IDLE = (
    "IMAP4rev1 LITERAL+ SASL-IR LOGIN-REFERRALS ID ENABLE SORT THREAD=REFERENCES MULTIAPPEND UNSELECT "
    "CHILDREN NAMESPACE UIDPLUS LIST-EXTENDED I18NLEVEL=1 CONDSTORE QRESYNC ESEARCH ESORT SEARCHRES WITHIN "
    "CONTEXT=SEARCH LIST-STATUS BINARY MOVE SPECIAL-USE"
)


class Dovecot:
    """One Dovecot; `restart` keeps its mail, users and ports; `idle=False`: one that offers no IDLE."""

    def __init__(self, *, idle: bool = True) -> None:
        self.idle = idle
        self.user = _runs_as()
        # root's temp folders are closed to `nobody`: Dovecot's own folder is made where it can reach it
        self.folder = Path(
            tempfile.mkdtemp(prefix="mibyan-dovecot-", dir="/tmp" if os.geteuid() == 0 else None)
        )
        self.imap_port = free_port()
        self.imaps_port = free_port()
        self.lmtp_port = free_port()
        self.users: dict[str, str] = {}
        for sub in ("run", "state", "mail"):
            (self.folder / sub).mkdir()
        (self.folder / "users").write_text("")
        self.ca_file = make_certificates(self.folder)
        (self.folder / "dovecot.conf").write_text(self._config())
        if os.geteuid() == 0:
            for path in [self.folder, *self.folder.rglob("*")]:
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _config(self) -> str:
        d, user, group = self.folder, self.user.pw_name, _group_name(self.user.pw_gid)
        no_idle = "" if self.idle else "protocol imap {\n  imap_capability = " + _NO_IDLE + "\n}"
        return f"""
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = imap lmtp
listen = 127.0.0.1
ssl = yes
ssl_cert = <{d}/server.crt
ssl_key = <{d}/server.key
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = 1
mail_location = maildir:{d}/mail/%u
postmaster_address = postmaster@{DOMAIN}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/users
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {d}/users
  default_fields = uid={user} gid={group} home={d}/mail/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.imap_port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {self.imaps_port}
    ssl = yes
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {self.lmtp_port}
  }}
}}
service auth {{
  chroot =
}}
{no_idle}
service anvil {{
  chroot =
}}
"""

    def add_user(self, name: str, password: str) -> str:
        """A mailbox `name@localhost` (Dovecot reads the passwd-file again when it changes)."""
        address = f"{name}@{DOMAIN}"
        self.users[address] = password
        lines = "".join(f"{who}:{{PLAIN}}{secret}::::::\n" for who, secret in self.users.items())
        # whole or not at all (Dovecot may read it at any moment), then known once Dovecot logs it in
        fresh = self.folder / "users.new"
        fresh.write_text(lines)
        if os.geteuid() == 0:
            os.chown(fresh, self.user.pw_uid, self.user.pw_gid)
        fresh.replace(self.folder / "users")
        assert wait_until(lambda: self._logs_in(address, password)), f"Dovecot does not know {address}"
        return address

    def _logs_in(self, address: str, password: str) -> bool:
        try:
            imap = imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=30)
        except OSError:
            return False
        try:
            imap.login(address, password)
            return True
        except imaplib.IMAP4.error:
            return False
        finally:
            imap.shutdown()

    def start(self) -> None:
        log = (self.folder / "dovecot.out").open("ab")
        root = os.geteuid() == 0
        self.process = subprocess.Popen(
            [DOVECOT, "-F", "-c", str(self.folder / "dovecot.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user.pw_uid if root else None,
            group=self.user.pw_gid if root else None,
            extra_groups=[] if root else None,
            start_new_session=True,  # its own process group: `stop` ends every process of it
        )
        process = self.process
        if not wait_until(lambda: process.poll() is not None or self._greets(), timeout=30):
            raise RuntimeError("Dovecot did not greet on IMAP within 30 s")
        if process.poll() is not None:
            said = (self.folder / "dovecot.out").read_text()[-3000:]
            raise RuntimeError(f"Dovecot exited at start:\n{said}")

    def _greets(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.imap_port), timeout=2) as sock:
                return sock.recv(100).startswith(b"* OK")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill every Dovecot process (as a service manager's restart does): the IMAP connections drop.
        (The master alone stopping leaves the imap processes serving the connections they have.)"""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            wait_until(lambda: not self._greets())

    def restart(self) -> None:
        self.stop()
        self.start()

    def deliver(self, raw: bytes, to: str, sender: str = "") -> None:
        """Put a mail straight into a mailbox over LMTP (as the relay does)."""
        with smtplib.LMTP("127.0.0.1", self.lmtp_port) as lmtp:
            lmtp.sendmail(sender, [to], raw)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _group_name(gid: int) -> str:
    import grp

    return grp.getgrgid(gid).gr_name


class Relay:
    """An SMTP server on loopback (aiosmtpd) handing each mail to Dovecot over LMTP; `received` keeps every
    envelope it was given (sender, recipients, the mail), delivered or not."""

    def __init__(self, dovecot: Dovecot, tls: str = "none") -> None:
        from aiosmtpd.controller import Controller

        self.dovecot = dovecot
        self.received: list[tuple[str, list[str], bytes]] = []
        self.port = free_port()
        self._lock = threading.Lock()
        kwargs: dict[str, Any] = {}
        if tls != "none":  # Dovecot's certificate: the same CA signs it
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(dovecot.folder / "server.crt", dovecot.folder / "server.key")
            kwargs = (
                {"ssl_context": context}
                if tls == "ssl"
                else {"tls_context": context, "require_starttls": True}
            )
            kwargs.update(authenticator=self._authenticate, auth_require_tls=True)
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, **kwargs)
        self.controller.start()

    def _authenticate(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        """Over TLS the relay is a submission server: it logs in Dovecot's users (their passwords)."""
        from aiosmtpd.smtp import AuthResult

        login = bytes(getattr(data, "login", b"") or b"").decode()
        password = bytes(getattr(data, "password", b"") or b"").decode()
        return AuthResult(success=self.dovecot.users.get(login) == password and bool(password))

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = bytes(envelope.original_content)
        with self._lock:
            self.received.append((str(envelope.mail_from or ""), list(envelope.rcpt_tos), content))

        def deliver() -> None:
            with smtplib.LMTP("127.0.0.1", self.dovecot.lmtp_port) as lmtp:
                lmtp.sendmail(envelope.mail_from or "", envelope.rcpt_tos, content)

        try:
            await asyncio.get_running_loop().run_in_executor(None, deliver)
        except smtplib.SMTPRecipientsRefused:
            return "550 no such mailbox here"
        except (OSError, smtplib.SMTPException) as exc:
            return f"451 the mail store is away: {exc}"
        return "250 OK"

    def sent_to(self, address: str) -> list[EmailMessage]:
        with self._lock:
            return [_parse(raw) for _, to, raw in self.received if address in to]

    def stop(self) -> None:
        self.controller.stop()


def _parse(raw: bytes) -> EmailMessage:
    import email

    message = email.message_from_bytes(raw, policy=default_policy)
    assert isinstance(message, EmailMessage)
    return message


class MailUser:
    """A person with a mailbox on the Dovecot: sends through the relay, reads their INBOX over IMAP."""

    def __init__(self, dovecot: Dovecot, relay: Relay, name: str) -> None:
        self.dovecot = dovecot
        self.relay = relay
        self.password = f"pw-{name}"
        self.address = dovecot.add_user(name, self.password)

    def send(
        self,
        to: str,
        subject: str,
        text: str,
        *,
        sender: str | None = None,
        reply_to: EmailMessage | None = None,
        headers: dict[str, str] | None = None,
        envelope_from: str | None = None,
        attach: tuple[str, bytes] | None = None,
    ) -> EmailMessage:
        """Send a mail (a reply to `reply_to` threads under it, as a mail client does); returns it."""
        mail = EmailMessage()
        mail["From"] = sender or self.address
        mail["To"] = to
        mail["Subject"] = subject
        mail["Message-ID"] = make_msgid(domain="client.test")
        if reply_to is not None:
            parent = str(reply_to["Message-ID"])
            mail["In-Reply-To"] = parent
            mail["References"] = f"{reply_to.get('References', '')} {parent}".strip()
        for name, value in (headers or {}).items():
            mail[name] = value
        mail.set_content(text)
        if attach is not None:
            mail.add_attachment(attach[1], maintype="application", subtype="octet-stream", filename=attach[0])
        with smtplib.SMTP("127.0.0.1", self.relay.port) as smtp:
            smtp.send_message(mail, from_addr=self.address if envelope_from is None else envelope_from)
        return mail

    def inbox(self) -> list[EmailMessage]:
        """Every mail in the INBOX, oldest first."""
        imap = imaplib.IMAP4("127.0.0.1", self.dovecot.imap_port, timeout=30)
        try:
            imap.login(self.address, self.password)
            imap.select("INBOX", readonly=True)
            _, data = imap.uid("SEARCH", "ALL")
            found = []
            for uid in data[0].split():
                _, parts = imap.uid("FETCH", uid.decode(), "(BODY.PEEK[])")
                found.extend(_parse(p[1]) for p in parts if isinstance(p, tuple))
            return found
        finally:
            imap.logout()

    def wait_for(self, count: int, timeout: float = 30) -> list[EmailMessage]:
        """The INBOX once it holds `count` mails (fails if they never come)."""
        found = wait_until(lambda: m if len(m := self.inbox()) >= count else None, timeout)
        assert found, f"expected {count} mails in {self.address}, got {len(self.inbox())}"
        return list(found)

"""A real Prosody XMPP server for the xmpp connector's tests, and a real second client (slixmpp).

Prosody (Debian's `prosody`, or the binary named by `MIBYAN_TEST_PROSODY`) runs with a config of its own
in a temp folder: its data there too, loopback only, free ports for client connections and HTTP (file
upload), a certificate for `localhost` signed by a CA the fixture makes (the connector trusts it through
`ca_file`), TLS required, MAM for users and rooms, in-band registration for making users.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import ipaddress
import os
import socket
import subprocess
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from conftest import free_port, wait_until

_T = TypeVar("_T")
PROSODY = os.environ.get("MIBYAN_TEST_PROSODY", "/usr/bin/prosody")
DOMAIN = "localhost"
ROOMS = f"conference.{DOMAIN}"


def missing_reason() -> str | None:
    """Why the Prosody tests cannot run here, or None."""
    if not Path(PROSODY).exists():
        return f"no Prosody: {PROSODY} is missing (.ci/run installs it; or set MIBYAN_TEST_PROSODY)"
    try:
        import cryptography  # noqa: F401
        import slixmpp  # noqa: F401
    except ImportError as exc:
        return f"the xmpp test client or connector library is missing: {exc}"
    return None


def make_certificates(folder: Path) -> Path:
    """A CA (`ca.pem`, returned) and a key and certificate for the server's names signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mibyan test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(*[False] * 5, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in (DOMAIN, ROOMS, f"upload.{DOMAIN}")]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))  # servers the tests reach by address
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DOMAIN)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.crt").write_bytes(certificate.public_bytes(pem))
    (folder / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "ca.pem"


class Prosody:
    """One server process; `restart` keeps its data, ports and certificate."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.http_port = free_port()
        self.ca_file = make_certificates(folder)
        (folder / "data").mkdir()
        self.config = folder / "prosody.cfg.lua"
        self.config.write_text(self._config())
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _config(self) -> str:
        d = self.folder
        return f"""
-- as root (a container's CI), Prosody refuses to start unless told: it is only ever on loopback here
run_as_root = true
pidfile = "{d}/prosody.pid"
data_path = "{d}/data"
log = {{ info = "{d}/prosody.log" }}
interfaces = {{ "127.0.0.1" }}
local_interfaces = {{ "127.0.0.1" }}
c2s_ports = {{ {self.port} }}
c2s_direct_tls_ports = {{ }}
s2s_ports = {{ }}
http_ports = {{ {self.http_port} }}
http_interfaces = {{ "127.0.0.1" }}
https_ports = {{ }}
http_external_url = "http://127.0.0.1:{self.http_port}/"
-- the upload slots' URLs name 127.0.0.1, not upload.localhost: that host's requests are the upload's
http_default_host = "upload.{DOMAIN}"
modules_enabled = {{
    "roster"; "saslauth"; "tls"; "disco"; "carbons"; "mam"; "smacks"; "ping"; "register";
    "dialback";
}}
modules_disabled = {{ "s2s" }}
allow_registration = true
min_seconds_between_registrations = 0
c2s_require_encryption = true
authentication = "internal_hashed"
storage = "internal"
archive_expires_after = "never"
default_archive_policy = true
ssl = {{ certificate = "{d}/server.crt"; key = "{d}/server.key"; }}
VirtualHost "{DOMAIN}"
Component "{ROOMS}" "muc"
    modules_enabled = {{ "muc_mam" }}
    muc_log_by_default = true
    muc_log_all_rooms = true
    restrict_room_creation = false
    muc_room_locking = false
    muc_room_default_whois = "anyone"
Component "upload.{DOMAIN}" "http_file_share"
"""

    def start(self) -> None:
        out = (self.folder / "prosody.out").open("ab")
        command = [PROSODY, "--config", str(self.config), "-F"]
        self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=self.folder)
        process = self.process
        if not wait_until(lambda: process.poll() is not None or self._listening(), timeout=30):
            raise RuntimeError("Prosody did not listen within 30 s")
        if process.poll() is not None:
            said = (self.folder / "prosody.out").read_text()[-3000:]
            raise RuntimeError(f"Prosody exited at start:\n{said}")

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def register(self, name: str, password: str) -> str:
        """A new account (prosodyctl, on the server's own config); returns its JID."""
        subprocess.run(
            ["prosodyctl", "--config", str(self.config), "register", name, DOMAIN, password],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return f"{name}@{DOMAIN}"


def _trust(client: Any, ca_file: Path) -> None:
    client.ca_certs = str(ca_file)
    client.enable_direct_tls = False
    client.enable_starttls = True
    client.enable_plaintext = False


class User:
    """A person on the server, a slixmpp client on a loop of its own (the tests are synchronous)."""

    def __init__(self, prosody: Prosody, name: str, password: str | None = None) -> None:
        self.prosody = prosody
        self.password = password or f"pw-{name}"
        self.jid = prosody.register(name, self.password)
        self.nick = name
        self.received: list[Any] = []  # every message stanza with a body, as it arrived
        self.states: list[tuple[str, str]] = []  # (from, chat state) as they arrived
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self._ready = threading.Event()
        self.client = self.run(self._connect())  # made on its loop: slixmpp keeps the loop it was made on
        assert self._ready.wait(30), f"{self.jid} did not connect"

    async def _connect(self) -> Any:
        from slixmpp import ClientXMPP

        client = ClientXMPP(self.jid, self.password)
        _trust(client, self.prosody.ca_file)
        for plugin in ("xep_0030", "xep_0045", "xep_0085", "xep_0199", "xep_0359", "xep_0066", "xep_0363"):
            client.register_plugin(plugin)
        client.add_event_handler("message", self._message)
        client.add_event_handler("chatstate", self._state)
        client.add_event_handler("session_start", self._started)
        client.connect("127.0.0.1", self.prosody.port)
        return client

    async def _started(self, _event: Any) -> None:
        self.client.send_presence()
        await self.client.get_roster()
        self._ready.set()

    def _message(self, stanza: Any) -> None:
        if stanza["body"]:
            self.received.append(stanza)

    def _state(self, stanza: Any) -> None:
        self.states.append((str(stanza["from"].bare), str(stanza["chat_state"])))

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=60)

    def send(self, to: str, text: str, *, group: bool = False) -> str:
        """A message to a JID (or a room, `group`); returns its id."""

        async def go() -> str:
            message = self.client.make_message(mto=to, mbody=text, mtype="groupchat" if group else "chat")
            message.send()
            return str(message["id"])

        return self.run(go())

    def send_file(self, to: str, name: str, data: bytes) -> str:
        """Upload `data` over HTTP upload (XEP-0363) and send its URL (with jabber:x:oob)."""

        async def go() -> str:
            url = await self.client["xep_0363"].upload_file(
                Path(name), size=len(data), input_file=io.BytesIO(data), content_type="text/plain"
            )
            message = self.client.make_message(mto=to, mbody=url, mtype="chat")
            message["oob"]["url"] = url
            message.send()
            return str(message["id"])

        return self.run(go())

    def join(self, room: str) -> None:
        async def go() -> None:
            await self.client["xep_0045"].join_muc_wait(room, self.nick, maxstanzas=0, timeout=30)

        self.run(go())

    def texts(self, sender: str) -> list[str]:
        """The bodies of the messages from `sender` (a bare JID, or `room/nick`), in arrival order."""
        found = []
        for stanza in list(self.received):
            who = stanza["from"]
            if str(who.bare) == sender or str(who) == sender:
                found.append(str(stanza["body"]))
        return found

    def close(self) -> None:
        self.run(self._disconnect())
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _disconnect(self) -> None:
        self.client.disconnect()

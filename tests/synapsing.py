"""A real Synapse homeserver for the matrix connector's tests, and a real second client (matrix-nio).

Synapse runs from its own venv (`/opt/synapse-venv`, or the python named by `MIBYAN_TEST_SYNAPSE`) on a
free loopback port with SQLite in a temp folder; users are made through its shared-secret admin API.
Its rate limits are the defaults; `Synapse.exempt` lifts them for one user (the admin override API) where
a test is about something else.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from conftest import free_port, wait_until

_T = TypeVar("_T")
SYNAPSE_PYTHON = os.environ.get("MIBYAN_TEST_SYNAPSE", "/opt/synapse-venv/bin/python")


def missing_reason() -> str | None:
    """Why the Synapse tests cannot run here, or None."""
    if not Path(SYNAPSE_PYTHON).exists():
        return f"no Synapse: {SYNAPSE_PYTHON} is missing (.ci/run installs it; or set MIBYAN_TEST_SYNAPSE)"
    try:
        import mautrix  # noqa: F401
        import nio  # noqa: F401
    except ImportError as exc:
        return f"the matrix test client or connector library is missing: {exc}"
    return None


class Synapse:
    """One homeserver process; `restart` keeps its database, port and keys."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_hex(16)
        self.config = folder / "homeserver.yaml"
        self.config.write_text(self._config())
        # the signing key as `--generate-keys` writes it, without a second start of Synapse to make it
        seed = base64.b64encode(os.urandom(32)).decode().rstrip("=")
        (folder / "localhost.signing.key").write_text(f"ed25519 a_test {seed}\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()
        self.admin = self.register("admin", admin=True)

    def _config(self) -> str:
        d = self.folder
        lines = {
            "server_name": "localhost",
            "pid_file": str(d / "homeserver.pid"),
            "listeners": [
                {
                    "bind_addresses": ["127.0.0.1"],
                    "port": self.port,
                    "resources": [{"names": ["client"], "compress": False}],
                    "tls": False,
                    "type": "http",
                }
            ],
            "database": {"name": "sqlite3", "args": {"database": str(d / "homeserver.db")}},
            "media_store_path": str(d / "media_store"),
            "registration_shared_secret": self.secret,
            "report_stats": False,
            "macaroon_secret_key": secrets.token_hex(16),
            "form_secret": secrets.token_hex(16),
            "signing_key_path": str(d / "localhost.signing.key"),
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "bcrypt_rounds": 4,  # users are made and log in often here; their passwords guard nothing
            # every gateway a test starts logs in from 127.0.0.1: the default (3 logins, then one per
            # 6 s) would make the tests wait on each other; message limits stay the defaults
            "rc_login": {
                "address": {"per_second": 100, "burst_count": 1000},
                "account": {"per_second": 100, "burst_count": 1000},
            },
        }
        return json.dumps(lines)  # YAML is a superset of JSON

    def start(self) -> None:
        log = (self.folder / "synapse.out").open("ab")
        self.process = subprocess.Popen(
            [SYNAPSE_PYTHON, "-m", "synapse.app.homeserver", "-c", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
        )
        process = self.process
        if not wait_until(lambda: process.poll() is not None or self._healthy(), timeout=60):
            raise RuntimeError("Synapse did not answer /health within 60 s")
        if process.poll() is not None:
            said = (self.folder / "synapse.out").read_text()[-3000:]
            raise RuntimeError(f"Synapse exited at start:\n{said}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    def register(self, name: str, password: str | None = None, admin: bool = False) -> str:
        """A new user through the shared-secret admin API; returns its access token."""
        password = password or f"pw-{name}"
        nonce = self.request("GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
        role = b"admin" if admin else b"notadmin"
        mac.update(b"\x00".join([nonce.encode(), name.encode(), password.encode(), role]))
        body = {"nonce": nonce, "username": name, "password": password, "admin": admin}
        body["mac"] = mac.hexdigest()
        return str(self.request("POST", "/_synapse/admin/v1/register", body)["access_token"])

    def exempt(self, user_id: str) -> None:
        """Lift the message rate limit for one user (admin API): for tests about something else."""
        path = f"/_synapse/admin/v1/users/{urllib.parse.quote(user_id)}/override_ratelimit"
        self.request("POST", path, {"messages_per_second": 0, "burst_count": 0}, token=self.admin)


class User:
    """A person on the homeserver, through matrix-nio on a loop of its own (the tests are synchronous)."""

    def __init__(self, synapse: Synapse, name: str) -> None:
        from nio import AsyncClient

        self.synapse = synapse
        self.user_id = f"@{name}:localhost"
        token = synapse.register(name)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self.client = AsyncClient(synapse.url, self.user_id)
        self.client.access_token = token
        self.client.user_id = self.user_id
        self.client.device_id = "TESTS"

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=60)

    def room(self, *invite: str, direct: bool = False, name: str = "room", encrypted: bool = False) -> str:
        from nio import RoomCreateResponse

        state = [
            {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}
        ]
        created = self.client.room_create(
            name=name, invite=list(invite), is_direct=direct, initial_state=state if encrypted else ()
        )
        answer = self.run(created)
        assert isinstance(answer, RoomCreateResponse), answer
        return str(answer.room_id)

    def join(self, room_id: str) -> None:
        self.run(self.client.join(room_id))

    def invite(self, room_id: str, user_id: str) -> None:
        self.run(self.client.room_invite(room_id, user_id))

    def send(self, room_id: str, text: str, *, thread: str | None = None, mention: str | None = None) -> str:
        from nio import RoomSendResponse

        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if thread is not None:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread}
        if mention is not None:
            content["m.mentions"] = {"user_ids": [mention]}
        answer = self.run(self.client.room_send(room_id, "m.room.message", content))
        assert isinstance(answer, RoomSendResponse), answer
        return str(answer.event_id)

    def send_file(self, room_id: str, name: str, data: bytes, *, caption: str | None = None) -> str:
        """Upload `data` and send it as an `m.file` named `name` (with `caption` as its body, if given)."""
        import io

        from nio import RoomSendResponse, UploadResponse

        uploaded, _keys = self.run(
            self.client.upload(io.BytesIO(data), "application/octet-stream", name, filesize=len(data))
        )
        assert isinstance(uploaded, UploadResponse), uploaded
        content: dict[str, Any] = {"msgtype": "m.file", "body": caption or name, "url": uploaded.content_uri}
        content.update({"filename": name} if caption else {})
        content["info"] = {"size": len(data), "mimetype": "application/octet-stream"}
        answer = self.run(self.client.room_send(room_id, "m.room.message", content))
        assert isinstance(answer, RoomSendResponse), answer
        return str(answer.event_id)

    def messages(self, room_id: str, sender: str) -> list[dict[str, Any]]:
        """Every m.room.message `sender` sent in the room, oldest first (the event's source dicts)."""
        from nio import RoomMessagesResponse

        found: list[dict[str, Any]] = []
        token = ""
        for _ in range(50):
            answer = self.run(self.client.room_messages(room_id, start=token, limit=100))
            assert isinstance(answer, RoomMessagesResponse), answer
            for event in answer.chunk:
                source = event.source
                if source.get("type") == "m.room.message" and source.get("sender") == sender:
                    found.append(source)
            if not answer.chunk or not answer.end or answer.end == token:
                break
            token = answer.end
        return list(reversed(found))

    def close(self) -> None:
        self.run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)


def joined(user: User, room_id: str, member: str) -> bool:
    """Whether `member` has joined the room, as `user` sees it."""
    from nio import JoinedMembersResponse

    answer = user.run(user.client.joined_members(room_id))
    return isinstance(answer, JoinedMembersResponse) and any(m.user_id == member for m in answer.members)


def membership(user: User, room_id: str, member: str) -> str | None:
    """`member`'s membership of the room (join, invite, leave), as `user` sees it."""
    from nio import RoomGetStateEventResponse

    answer = user.run(user.client.room_get_state_event(room_id, "m.room.member", member))
    return str(answer.content.get("membership")) if isinstance(answer, RoomGetStateEventResponse) else None


def typing(user: User, room_id: str, member: str) -> bool:
    """Whether `user`'s latest sync shows `member` typing in the room."""
    user.run(user.client.sync(timeout=0))
    room = user.client.rooms.get(room_id)
    return room is not None and member in room.typing_users

"""A real PostgreSQL for the tests marked `postgres`: one cluster per test session, a database per test.

`MIBYAN_TEST_PG_DSN` (a superuser's postgresql:// URL) names a server to use instead. Otherwise the
PostgreSQL binaries are found (/usr/local/bin, `pg_config --bindir`, Debian's /usr/lib/postgresql/NN/bin)
and a throwaway cluster is started on a loopback port, as user `nobody` when the tests run as root
(initdb refuses root). Under xdist the workers share one cluster: the first to take the file lock starts
it, each worker counts itself in, and the last one out stops it. Skipped, with the reason, when there is
neither a DSN nor the binaries.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bindir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres, or None."""
    candidates = [Path("/usr/local/bin")]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in BINARIES):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_cluster_user(argv: list[str]) -> list[str]:
    """`argv` run as nobody when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv]


def _start_cluster(folder: Path, bindir: Path) -> str:
    data = folder / "data"
    if os.geteuid() == 0:
        folder.chmod(0o755)
        os.chown(folder, 65534, 65534)
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    subprocess.run(
        _as_cluster_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-N",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ]
        ),
        check=True,
        capture_output=True,
        env=env,
        cwd=folder,
    )
    port = _free_port()
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' -c fsync=off"
        " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    subprocess.run(
        _as_cluster_user(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-o", options, "-w", "start"]
        ),
        check=True,
        capture_output=True,
        env=env,
        cwd=folder,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _stop_cluster(folder: Path, bindir: Path) -> None:
    subprocess.run(
        _as_cluster_user([str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "stop"]),
        capture_output=True,
        cwd=folder,
    )
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def shared_cluster(run_id: str) -> Iterator[str]:
    """The superuser DSN of the test session's cluster, started by whichever worker comes first."""
    if os.environ.get("MIBYAN_TEST_PG_DSN"):
        yield os.environ["MIBYAN_TEST_PG_DSN"]
        return
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl, postgres) and no MIBYAN_TEST_PG_DSN")
    base = Path(tempfile.gettempdir())
    folder = base / f"mibyan-pg-{run_id}"
    state = base / f"mibyan-pg-{run_id}.json"
    with _locked(base / f"mibyan-pg-{run_id}.lock"):
        shared = json.loads(state.read_text()) if state.exists() else None
        if shared is None:
            folder.mkdir()
            shared = {"dsn": _start_cluster(folder, bindir), "users": 0}
        shared["users"] += 1
        state.write_text(json.dumps(shared))
    try:
        yield str(shared["dsn"])
    finally:
        with _locked(base / f"mibyan-pg-{run_id}.lock"):
            shared = json.loads(state.read_text())
            shared["users"] -= 1
            if shared["users"] == 0:
                _stop_cluster(folder, bindir)
                state.unlink()
                (base / f"mibyan-pg-{run_id}.lock").unlink()
            else:
                state.write_text(json.dumps(shared))


def database_url(admin_dsn: str, name: str) -> str:
    """The DSN of database `name` on the server `admin_dsn` reaches."""
    head, _, _ = admin_dsn.rpartition("/")
    return f"{head}/{name}"


@contextlib.contextmanager
def fresh_database(admin_dsn: str) -> Iterator[str]:
    """A new empty database for one test (dropped after it), as a postgresql:// URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_dsn, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'")
    try:
        yield database_url(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as db:
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

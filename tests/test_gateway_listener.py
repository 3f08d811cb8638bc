"""What the gateway's HTTP listener refuses to a hostile client: weak tokens, guessing, slow requests."""

from __future__ import annotations

import http.client
import os
import resource
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, wait_until
from gatewaying import TOKEN, RunningGateway, write_config

from mibyan.gateway.connectors.throttle import AuthThrottle, peer_of

LOCAL = {"local": "http://127.0.0.1:9/v1"}
MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "m"}
SLOW = {"header_timeout": 0.3, "body_timeout": 0.3, "auth_failures": 3, "auth_block": 0.2}
SPARE_FILES = 30


def check(home: Path, host: str, token: str) -> Any:
    connectors = [{"name": "api", "kind": "http", "host": host}]
    write_config(home, LOCAL, [MEEPA], connectors=connectors)
    return run_cli("gateway", "--check", home=home, env={"MIBYAN_GATEWAY_TOKEN": token})


@pytest.mark.parametrize(
    ("host", "token", "named"),
    [
        ("0.0.0.0", "x", "has 1 character(s); use at least 16"),
        ("0.0.0.0", "fifteen-chars-x", "has 15 character(s)"),
        ("0.0.0.0", "   ", "MIBYAN_GATEWAY_TOKEN is blank"),
        ("127.0.0.1", " \t ", "MIBYAN_GATEWAY_TOKEN is blank"),
    ],
)
def test_a_weak_or_blank_token_is_one_line_and_exit_2(home: Path, host: str, token: str, named: str) -> None:
    done = check(home, host, token)

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr


@pytest.mark.parametrize(("host", "token"), [("0.0.0.0", "a" * 16), ("127.0.0.1", "x")])
def test_a_long_token_off_loopback_and_any_token_on_it_check_out(home: Path, host: str, token: str) -> None:
    assert check(home, host, token).returncode == 0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """One gateway with test-short timeouts, shared (each test makes its own connections), that may
    open only SPARE_FILES more files and 10 connections."""
    home = tmp_path_factory.mktemp("home")
    connector = {"name": "api", "kind": "http", "port": 0, "max_connections": 10, **SLOW}
    write_config(home, LOCAL, [MEEPA], connectors=[connector])
    with RunningGateway(home) as running:
        pid = running.process.pid
        limit = len(os.listdir(f"/proc/{pid}/fd")) + SPARE_FILES
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        yield running


def request(gateway: RunningGateway, path: str, token: str | None = None) -> http.client.HTTPResponse:
    url = urllib.parse.urlsplit(gateway.url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def raw(gateway: RunningGateway, data: bytes) -> socket.socket:
    url = urllib.parse.urlsplit(gateway.url)
    sock = socket.create_connection((url.hostname or "", url.port or 0), timeout=30)
    sock.sendall(data)
    return sock


def everything_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


def test_a_peer_guessing_the_token_is_answered_429_then_served_after_the_block(
    gateway: RunningGateway,
) -> None:
    statuses = [request(gateway, "/v1/models", "wrong").status for _ in range(3)]
    blocked = request(gateway, "/v1/models", "wrong")
    right_during_the_block = request(gateway, "/v1/models", TOKEN)

    assert statuses == [401, 401, 401]
    assert blocked.status == 429 and blocked.headers["Retry-After"] == "1"
    assert right_during_the_block.status == 429  # during a block a right guess tells nothing
    assert request(gateway, "/health").status == 200
    wait_until(lambda: request(gateway, "/v1/models", TOKEN).status == 200)


def test_each_block_of_a_peer_is_twice_as_long_and_a_right_token_forgets_it() -> None:
    now = [0.0]
    throttle = AuthThrottle(failures=2, block=10, clock=lambda: now[0])

    throttle.failed("1.2.3.4")
    assert throttle.retry_after("1.2.3.4") is None
    throttle.failed("1.2.3.4")
    first = throttle.retry_after("1.2.3.4")
    assert throttle.retry_after("5.6.7.8") is None
    now[0] += 10
    throttle.failed("1.2.3.4")
    throttle.failed("1.2.3.4")
    second = throttle.retry_after("1.2.3.4")
    now[0] += 20
    throttle.succeeded("1.2.3.4")
    throttle.failed("1.2.3.4")
    throttle.failed("1.2.3.4")

    assert (first, second, throttle.retry_after("1.2.3.4")) == (10, 20, 10)


def test_an_ipv6_peer_is_counted_by_its_64_and_a_mapped_ipv4_as_the_ipv4() -> None:
    assert peer_of("2001:db8::1") == peer_of("2001:db8::ffff:2") == "2001:db8::/64"
    assert peer_of("::ffff:10.0.0.1") == "10.0.0.1"


def test_a_half_sent_body_is_answered_408_after_the_body_timeout(gateway: RunningGateway) -> None:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{"
    )
    reply = everything_until_closed(raw(gateway, head.encode()))

    assert reply.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in reply


def test_headers_that_trickle_past_the_header_timeout_are_answered_408(gateway: RunningGateway) -> None:
    reply = everything_until_closed(raw(gateway, b"GET /health HTTP/1.1\r\nHos"))

    assert reply.startswith(b"HTTP/1.1 408 ")


def test_many_trickling_connections_do_not_stop_health_where_few_files_may_open(
    gateway: RunningGateway,
) -> None:
    tricklers: list[socket.socket] = []
    try:
        for _ in range(2 * SPARE_FILES // 5):
            # five at a time, each group taken in (and answered 200) before the next is opened
            tricklers += [raw(gateway, b"GET /health HTTP/1.1\r\nX-A: ") for _ in range(5)]
            assert request(gateway, "/health").status == 200
    finally:
        for sock in tricklers:
            sock.close()

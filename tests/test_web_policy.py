"""web_fetch refuses loopback, private and metadata addresses, however they are spelled or reached."""

from __future__ import annotations

import contextlib
import ipaddress
import select
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest
from loopback import Reply, ScriptedServer

from mibyan.core.errors import ToolError
from mibyan.tools.web_policy import address_refusal, checked_addresses
from mibyan.tools.web_tools import fetch_page


class Site:
    """A loopback web server that records the requests it sees; `redirects` maps a path to a Location."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.redirects: dict[str, str] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.seen.append((self.path, self.headers.get("Host", "")))
                if self.path == "/drip":  # a byte at a time, each well within a read's timeout
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    hangup = select.poll()  # the client giving up ends the drip
                    hangup.register(self.connection, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                    with contextlib.suppress(OSError):
                        for _ in range(100):
                            self.wfile.write(b"x")
                            self.wfile.flush()
                            if hangup.poll(100):  # the next byte in 0.1 s, unless the client is gone
                                break
                    return
                if self.path in site.redirects:
                    self.send_response(302)
                    self.send_header("Location", site.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"<html><body><p>internal admin page</p></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    running = Site()
    yield running
    running.close()


def results(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("0x7f000001", "a loopback address"),
        ("2130706433", "a loopback address"),
        ("127.1", "a loopback address"),
        ("localhost", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "127.0.0.1 in IPv6 form, a loopback address"),
        ("64:ff9b::7f00:1", "127.0.0.1 in IPv6 form, a loopback address"),
        ("2002:7f00:1::", "127.0.0.1 in IPv6 form, a loopback address"),
        ("0.0.0.0", "the unspecified address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd12::1", "a private address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a public address"),
    ],
)
def test_hostile_spellings_resolve_to_a_refusal_that_says_why(host: str, why: str) -> None:
    with pytest.raises(ToolError, match="refused: ") as refused:
        checked_addresses(host, 80, allow_private=False)
    assert f"{why}; set web.allow_private: true to allow it" in str(refused.value)


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "2a00:1450:4001::200e"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), allow_private=False) is None


@pytest.mark.parametrize(
    "host",
    ["169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254", "metadata.google.internal", "METADATA."],
)
def test_cloud_metadata_is_refused_even_when_private_addresses_are_allowed(host: str) -> None:
    with pytest.raises(ToolError, match=r"cloud metadata .*mibyan never fetches it"):
        checked_addresses(host, 80, allow_private=True)


def test_the_model_cannot_fetch_a_loopback_server_in_any_spelling(
    server: ScriptedServer, make_agent, site: Site
) -> None:
    urls = [
        f"http://{host}:{site.port}/"
        for host in ("127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]")
    ]
    server.add(Reply(tool_calls=[("web_fetch", {"url": url}) for url in urls]), Reply(text="ok"))
    found = results(make_agent().run_conversation("look around"))
    assert all(text.startswith("error: refused: ") and "loopback" in text for text in found), found
    assert site.seen == []


def test_with_allow_private_the_model_fetches_it_by_the_checked_address(
    server: ScriptedServer, make_agent, site: Site, home: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nweb: {allow_private: true}\n")
    server.add(
        Reply(tool_calls=[("web_fetch", {"url": f"http://localhost:{site.port}/admin"})]), Reply(text="ok")
    )
    found = results(make_agent().run_conversation("look"))
    assert found[0].startswith("HTTP 200") and "internal admin page" in found[0]
    assert site.seen == [("/admin", f"localhost:{site.port}")]


def test_every_redirect_hop_is_judged(server: ScriptedServer, make_agent, site: Site, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nweb: {allow_private: true}\n")
    site.redirects = {"/a": "/b", "/b": "http://169.254.169.254/latest/meta-data/"}
    server.add(
        Reply(tool_calls=[("web_fetch", {"url": f"http://127.0.0.1:{site.port}/a"})]), Reply(text="ok")
    )
    found = results(make_agent().run_conversation("look"))
    assert found[0].startswith("error: refused: 169.254.169.254 is a cloud metadata address")
    assert [path for path, _ in site.seen] == ["/a", "/b"]


def test_a_public_page_redirecting_to_loopback_is_refused_before_loopback_is_reached(site: Site) -> None:
    asked: list[str] = []

    def public_internet(request: httpx2.Request) -> httpx2.Response:
        asked.append(str(request.url))
        return httpx2.Response(302, headers={"Location": f"http://127.0.0.1:{site.port}/"})

    with pytest.raises(ToolError, match=r"refused: 127\.0\.0\.1 is a loopback address"):
        fetch_page(
            "http://93.184.216.34/start",
            timeout=5,
            allow_private=False,
            transport=httpx2.MockTransport(public_internet),
        )
    assert asked == ["http://93.184.216.34/start"] and site.seen == []


def test_the_timeout_bounds_the_whole_fetch_of_a_page_that_drips(site: Site) -> None:
    # each byte comes well within a read's timeout, so only a deadline over the whole fetch ends it
    # (the page takes 10 s to arrive); the refusal names that deadline
    with pytest.raises(ToolError, match="no complete reply within 1 s"):
        fetch_page(f"http://127.0.0.1:{site.port}/drip", timeout=1, allow_private=True)


def test_redirects_stop_after_five_hops(site: Site) -> None:
    site.redirects = {f"/{i}": f"/{i + 1}" for i in range(10)}
    with pytest.raises(ToolError, match="more than 5 redirects"):
        fetch_page(f"http://127.0.0.1:{site.port}/0", timeout=5, allow_private=True)
    assert len(site.seen) == 6


def test_the_request_goes_to_the_checked_address_and_keeps_the_name() -> None:
    sent: list[httpx2.Request] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, text="fine", headers={"Content-Type": "text/plain"})

    page = fetch_page(
        "http://localhost:8080/x", timeout=5, allow_private=True, transport=httpx2.MockTransport(record)
    )
    assert page.startswith("HTTP 200 http://localhost:8080/x")
    assert sent[0].url.host in ("127.0.0.1", "::1") and sent[0].headers["Host"] == "localhost:8080"
    assert sent[0].extensions["sni_hostname"] == "localhost"

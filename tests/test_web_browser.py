"""The viewer in a real browser: Chromium (Debian's headless shell) driven by Playwright, against a real
`mibyan web` process over a database of real sessions and 100,000 more messages."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from loopback import ScriptedServer
from webbing import SECRET_WORD, XSS, Sessions, fill_messages, make_sessions

from agent_state import SessionStore

CHROMIUM = Path("/usr/bin/chromium-headless-shell")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Sessions, str]:
    path = tmp_path_factory.mktemp("browser") / "home"
    path.mkdir(mode=0o700)
    (path / "config.yaml").write_text("agent:\n  api_max_retries: 0\n")
    with ScriptedServer() as server:
        sessions = make_sessions(path, server)
    bulk = fill_messages(path, total=100_000, sessions=50, secret_at=(7, 1999))
    return path, sessions, bulk


def _first_line(process: subprocess.Popen[str], timeout: float = 30) -> str:
    """The process's first line of output, waiting at most `timeout` seconds for it."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    return lines.get(timeout=timeout)


@pytest.fixture(scope="module")
def address(home: tuple[Path, Sessions, str]) -> Iterator[str]:
    environment = {**os.environ, "MIBYAN_HOME": str(home[0]), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "mibyan.cli.main", "web", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        line = _first_line(process)
        assert line.startswith("mibyan web: http://127.0.0.1:") and "/?token=" in line, line
        yield line.split()[-1]
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is missing")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield chromium
        chromium.close()


def test_browse_search_unfold_and_watch_a_session_in_a_real_browser(
    home: tuple[Path, Sessions, str], address: str, browser: Any, tmp_path: Path
) -> None:
    path, sessions, bulk = home
    origin = address.split("/?")[0]
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    complaints: list[str] = []  # a refused inline script or style, a failed load
    page.on("console", lambda message: message.type == "error" and complaints.append(message.text))
    shots = Path(os.environ.get("MIBYAN_TEST_ARTIFACTS") or tmp_path) / "screenshots"

    page.goto(address)
    assert page.url == f"{origin}/"  # the token went into the cookie, out of the address
    sources = page.locator("table.sessions tbody td:nth-child(2)").all_inner_texts()
    assert {"cli", "gateway", "subagent"} <= set(sources)
    assert page.locator("nav.pages a", has_text="older").count() == 1  # 54 sessions: a second page
    page.screenshot(path=shots / "list.png")

    page.fill("input[name=q]", SECRET_WORD)
    page.press("input[name=q]", "Enter")
    hits = page.locator("ol.hits li")
    assert hits.count() == 1 and hits.locator("mark").inner_text() == SECRET_WORD
    hits.locator("a.hit").click()
    page.wait_for_url(f"{origin}/s/{bulk}?page=0#m1999")
    assert page.locator("#m1999").is_visible() and SECRET_WORD in page.locator("#m1999").inner_text()
    page.screenshot(path=shots / "found.png")

    page.goto(f"{origin}/s/{sessions.main}")
    call = page.locator("details.call", has_text="rm -rf /").first
    assert not call.locator(".result").is_visible()
    call.locator("summary").click()
    assert call.locator(".result").is_visible() and "mibyan never runs this" in call.inner_text()
    assert page.get_by_text(f"child report {XSS}").count() >= 1  # the stored <script> is text
    page.screenshot(path=shots / "transcript.png", full_page=True)

    delegate = page.locator("details.call", has_text="delegate_task").first
    delegate.locator("summary").first.click()
    assert delegate.locator(f'a[href="/s/{sessions.subagent}"]').first.is_visible()  # nested under its call
    page.locator(f'.boundary a[href="/s/{sessions.child}"]').click()  # the compaction's lineage
    page.wait_for_url(f"{origin}/s/{sessions.child}")
    assert page.locator(f'a[href="/s/{sessions.main}"]').count() >= 1
    page.wait_for_selector("#live-status:has-text('live')")
    with SessionStore.open(path) as store:
        store.append_message(sessions.child, {"role": "user", "content": f"said while you watch {XSS}"})
    arrived = page.locator("li.msg", has_text="said while you watch")
    arrived.wait_for(timeout=15_000)
    assert "1 new since this page was drawn" in page.locator("#live-status").inner_text()  # totals: as drawn
    arrived.scroll_into_view_if_needed()
    page.screenshot(path=shots / "live.png")
    assert dialogs == [] and complaints == []

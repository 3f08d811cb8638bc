"""The session viewer's routes, over sessions real agents wrote, through Starlette's TestClient."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import ScriptedServer
from starlette.testclient import TestClient
from webbing import ESC, HOSTILE_MODEL, XSS, Sessions, make_sessions

from agent_state import SessionStore
from mibyan.core.sanitize import visible
from mibyan.web.app import create_app
from mibyan.web.guard import CONTENT_SECURITY_POLICY
from mibyan.web.text import markdown_html, text_html

TOKEN = "test-web-token"
ORIGIN = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Sessions]:
    home = tmp_path_factory.mktemp("web") / "home"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("agent:\n  api_max_retries: 0\n")
    with ScriptedServer() as server:
        return home, make_sessions(home, server)


@pytest.fixture(scope="module")
def sessions(written: tuple[Path, Sessions]) -> Sessions:
    return written[1]


@pytest.fixture(scope="module")
def client(written: tuple[Path, Sessions]) -> Iterator[TestClient]:
    with SessionStore(written[0] / "state.db", read_only=True) as store:
        app = create_app(store, token=TOKEN, cookie="mibyan_web_8765", poll_interval=0.01)
        with TestClient(app, base_url=ORIGIN) as browser:
            assert browser.get(f"/?token={TOKEN}").status_code == 200  # the cookie from here on
            yield browser


def test_a_request_without_the_token_or_from_a_foreign_host_is_refused(
    client: TestClient, sessions: Sessions
) -> None:
    stranger = TestClient(client.app, base_url=ORIGIN)
    for path in ("/", "/static/web.js", f"/s/{sessions.main}/export.jsonl", f"/s/{sessions.main}/live"):
        refused = stranger.get(path)
        assert refused.status_code == 403, path
        assert refused.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert stranger.get("/?token=wrong").status_code == 403

    # DNS rebinding: the page of another site, its name pointed at 127.0.0.1, sends its own Host
    for host in ("attacker.example:8765", "127.0.0.1.attacker.example", "127.0.0.1:80@attacker.example", ""):
        assert client.get("/", headers={"Host": host}).status_code == 403, host
    for host in ("localhost:8765", "[::1]:8765", "127.0.0.2", "[::ffff:127.0.0.1]:8765"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host

    # the token in the address becomes a cookie the page's script cannot read, and leaves the address
    entry = stranger.get(f"{ORIGIN}//attacker.example/?token={TOKEN}&source=cli", follow_redirects=False)
    assert entry.status_code == 303
    assert entry.headers["location"] == "/attacker.example/?source=cli"  # never to another site
    assert entry.headers["set-cookie"] == f"mibyan_web_8765={TOKEN}; HttpOnly; SameSite=Strict; Path=/"
    page = client.get("/")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY


def test_the_list_shows_every_source_newest_first_escaped_and_filters_by_source(
    client: TestClient, written: tuple[Path, Sessions], sessions: Sessions
) -> None:
    page = client.get("/").text
    with SessionStore(written[0] / "state.db", read_only=True) as store:
        newest_first = [row["id"] for row in sorted(store.list_sessions(), key=lambda r: -r["updated_at"])]
    assert re.findall(r'<td><a href="/s/([^"]+)">', page) == newest_first
    assert f'href="/s/{sessions.subagent}"' in page
    assert "<script>" not in page.replace('<script src="/static/web.js" defer></script>', "")
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page  # the title, as text
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in page and HOSTILE_MODEL not in page
    assert "meepa/api/&lt;b&gt;alice&lt;/b&gt;" in page  # the channel

    only = client.get("/?source=gateway").text
    assert f"/s/{sessions.gateway}" in only and f"/s/{sessions.main}" not in only


def test_a_transcript_shows_stored_markup_and_escape_sequences_as_text(
    client: TestClient, sessions: Sessions
) -> None:
    page = client.get(f"/s/{sessions.main}").text
    assert page.count("<script") == 1  # the viewer's own, from /static
    assert "\x1b" not in page and "\x07" not in page
    assert '<span class="ctl">\\x1b</span>[2J<span class="ctl">\\x1b</span>]0;pwned' in page
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page
    # Markdown: a javascript: link stays text, a web link is a link, raw HTML is text
    assert "javascript:" not in re.sub(r"\[click\]\(javascript:alert\(1\)\)", "", page)
    assert '<a href="https://example.com/d" rel="noopener noreferrer nofollow">docs</a>' in page
    assert '<details class="reasoning" open><summary>reasoning</summary>' in page
    assert ESC not in page


def test_a_transcript_folds_calls_marks_refusals_and_shows_lineage_and_subagents(
    client: TestClient, sessions: Sessions
) -> None:
    page = client.get(f"/s/{sessions.main}").text
    calls = re.findall(r'<details class="call[^"]*" data-call="[^"]+">.*?</details>', page, flags=re.S)
    assert any("rm -rf /" in call and 'class="badge refused"' in call for call in calls)
    assert any(
        "rm -r ./no-such-folder" in call
        and '<span class="badge approved" title="approved by user (once)">' in call
        for call in calls
    )
    delegate = page[page.index('<details class="call delegate"') :]
    nested = delegate[: delegate.index('<div class="boundary">')]
    assert f'subagent session <a href="/s/{sessions.subagent}">' in nested
    assert "child report &lt;script&gt;" in nested  # the subagent's own messages, under its call
    assert f'continues in session <a href="/s/{sessions.child}">' in page  # the compaction boundary
    # a bar per model call (the history it began with made none), each a link to the reply it became
    bars = re.findall(r'<a href="\?page=0#m(\d+)"><g class="call">', page)
    replies = re.findall(r'<li class="msg assistant" id="m(\d+)"', page)[-3:]
    assert bars == replies

    child = client.get(f"/s/{sessions.child}").text
    assert f'this session continues <a href="/s/{sessions.main}">' in child
    subagent = client.get(f"/s/{sessions.subagent}").text
    assert f'Subagent session of <a href="/s/{sessions.main}">' in subagent

    gateway = client.get(f"/s/{sessions.gateway}").text
    cut = gateway[gateway.index('data-call="call_cut"') :]
    assert 'class="badge interrupted"' in cut[: cut.index("</details>")]
    assert client.get("/s/no-such-session").status_code == 404


def test_search_highlights_matches_in_escaped_text_and_links_to_the_message(
    client: TestClient, sessions: Sessions
) -> None:
    found = client.get("/search", params={"q": "owned"}).text
    assert "&lt;script&gt;alert(&#39;<mark>owned</mark>&#39;)&lt;/script&gt;" in found
    links = re.findall(r'href="/s/([^"?]+)\?page=0#m(\d+)"', found)
    assert (sessions.subagent, "3") in links
    target = client.get(f"/s/{sessions.subagent}?page=0").text
    assert 'id="m3"' in target
    # the stored text's own brackets stay text: what FTS5 marks matches with is random per search
    assert "[<mark>click</mark>](javascript:alert(1))" in client.get("/search", params={"q": "click"}).text
    assert "Type words to search for" in client.get("/search", params={"q": "!!!"}).text


def test_exports_are_the_stored_messages_and_name_only_the_session(
    client: TestClient, written: tuple[Path, Sessions], sessions: Sessions
) -> None:
    jsonl = client.get(f"/s/{sessions.main}/export.jsonl")
    assert jsonl.headers["content-disposition"] == f'attachment; filename="mibyan-{sessions.main}.jsonl"'
    with SessionStore(written[0] / "state.db", read_only=True) as store:
        stored = store.load_messages(sessions.main)
    assert [json.loads(line) for line in jsonl.text.splitlines()] == stored
    markdown = client.get(f"/s/{sessions.main}/export.md").text
    assert markdown.startswith("# step 0: <script>alert('owned')</script>") and "\x1b" not in markdown
    for bad in ("/s/..%2F..%2Fetc%2Fpasswd/export.md", f"/s/{sessions.main}/export.html"):
        assert client.get(bad).status_code == 404


def test_the_live_stream_sends_what_is_stored_after_the_page_was_drawn(
    client: TestClient, written: tuple[Path, Sessions], sessions: Sessions
) -> None:
    page = client.get(f"/s/{sessions.child}").text
    (live,) = re.findall(r'data-live="([^"]+)"', page)
    received: list[tuple[str, dict[str, str]]] = []
    subagent = {"parent_id": sessions.child, "source": "subagent", "title": "Task: help"}
    with SessionStore.open(written[0]) as store, client.stream("GET", live.replace("&amp;", "&")) as stream:
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("retry:"):  # listening: what is stored from now on is news
                store.append_message(sessions.child, {"role": "user", "content": f"late {XSS}"})
            elif line.startswith(": still here"):
                break  # 15 s without news: what was stored did not come
            elif line.startswith("event:"):
                kind = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                received.append((kind, json.loads(line.removeprefix("data:"))))
                if kind != "message":
                    break
                # a subagent starts working for the session
                store.append_message("sub-live", {"role": "user", "content": "Task: help"}, create=subagent)
    (message, fragment), (grown, nested) = received
    assert message == "message" and 'class="msg user"' in fragment["html"]
    assert "late &lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in fragment["html"]
    assert grown == "subagent" and nested["session"] == "sub-live"
    assert (
        '<details class="subagent" data-session="sub-live">' in nested["html"]
        and "Task: help" in nested["html"]
    )


def test_a_compacted_session_being_watched_points_to_where_it_went_on(
    client: TestClient, written: tuple[Path, Sessions], sessions: Sessions
) -> None:
    page = client.get(f"/s/{sessions.main}").text
    assert "data-live" not in page  # drawn after it was compacted: it will not grow
    with SessionStore(written[0] / "state.db", read_only=True) as store:
        (last,) = store.query(
            "SELECT seq, id FROM messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1", (sessions.main,)
        )
    # a page drawn before the compaction, still watching
    with client.stream("GET", f"/s/{sessions.main}/live?seq={last['seq']}&id={last['id']}") as stream:
        lines = list(stream.iter_lines())  # the stream ends: the session will not grow any more
    assert "event: continued" in lines
    data = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
    assert f'<a href="/s/{sessions.child}">' in data["html"]


def test_a_long_transcript_is_paged_and_search_links_to_the_page_of_the_message(
    written: tuple[Path, Sessions], sessions: Sessions
) -> None:
    with SessionStore(written[0] / "state.db", read_only=True) as store:
        app = create_app(store, token=TOKEN, cookie="paged", page_size=10)
        with TestClient(app, base_url=ORIGIN) as paged:
            paged.get(f"/?token={TOKEN}")
            last = paged.get(f"/s/{sessions.main}").text
            assert 'id="m30"' in last and 'id="m29"' not in last  # the newest page first
            second = paged.get(f"/s/{sessions.main}?page=1").text
            shown = {int(n) for n in re.findall(r'<li class="msg [^"]*" id="m(\d+)"', second)}
            assert min(shown) >= 10 and max(shown) <= 19 and f"/s/{sessions.main}?page=3" in second
            found = paged.get("/search", params={"q": "owned"}).text
            for seq in re.findall(rf'href="/s/{sessions.main}\?page=(\d+)#m(\d+)"', found):
                assert int(seq[0]) == int(seq[1]) // 10
            assert f"/s/{sessions.main}?page=3#m30" in found


_FRAGMENTS = [
    "<script>", "</script>", "<img src=x onerror=alert(1)>", "<a href='javascript:alert(1)'>", "[a](", "](",
    ")", "javascript:", "JaVa\tScRiPt:", " vbscript:", "data:text/html,", "&#x09;", "&colon;", "&#106;", "<",
    ">", '"', "'", "`", "```", "**", "![x](", "<javascript:alert(1)>", "[r]: ", "[r]", "\n", "\n\n", "|",
    "---", "\\", "%0a", "\x1b[2J", "\x07", "\u202e", "\x00", "http://x/", "mailto:a@b", "# ", "> ", "1. ",
    "    ", "[a](ftp://x/)", "<tel:123>", "[a](javascript:alert(1))", "[r]: file:///etc/passwd",
]  # fmt: skip
_TAGS = {"p", "em", "strong", "code", "pre", "a", "ul", "ol", "li", "blockquote", "hr", "br", "s", "span"}
_TAGS |= {"table", "thead", "tbody", "tr", "th", "td", "h1", "h2", "h3", "h4", "h5", "h6"}


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=5), max_size=24).map("".join))
def test_stored_text_becomes_inert_html_whatever_it_holds(stored: str) -> None:
    plain, answer = str(text_html(stored)), str(markdown_html(stored))
    assert visible(plain) == plain and visible(answer) == answer  # no control character reaches the page
    elements = _Elements()
    elements.feed(plain)
    assert all(tag == "span" and attrs == {"class": "ctl"} for tag, attrs in elements.found)
    elements = _Elements()
    elements.feed(answer)
    for tag, attrs in elements.found:
        assert tag in _TAGS, tag
        assert set(attrs) <= {"href", "rel", "class", "title", "start", "style"}, attrs
        assert attrs.get("style") in (None, "text-align:left", "text-align:center", "text-align:right")
        href = re.sub(r"[\x00-\x20]", "", attrs.get("href") or "").lower()  # as a browser reads it
        scheme = re.match(r"([a-z][a-z0-9+.-]*):", href)
        assert scheme is None or scheme.group(1) in ("http", "https", "mailto"), attrs["href"]


def test_mibyan_web_refuses_an_address_other_machines_reach_and_a_home_without_sessions(
    tmp_path: Path,
) -> None:
    for host in ("0.0.0.0", "::ffff:10.0.0.1"):
        outside = run_cli("web", "--host", host, home=tmp_path)
        assert outside.returncode == 2 and outside.stdout == ""
        assert outside.stderr.count("\n") == 1 and "reachable from other machines" in outside.stderr
    mapped = run_cli("web", "--host", "::ffff:127.0.0.1", home=tmp_path)
    assert mapped.returncode == 1 and mapped.stderr.startswith("mibyan: no sessions yet")  # host taken
    empty = run_cli("web", home=tmp_path)
    no_sessions = f"mibyan: no sessions yet ({tmp_path}/state.db): start one with 'mibyan chat'\n"
    assert (empty.returncode, empty.stderr) == (1, no_sessions)

"""The built-in tools, called through model_tools.handle_function_call as the executor would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from model_tools import handle_function_call as call


def test_read_file_numbers_lines_and_pages(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = call("read_file", {"path": str(target), "offset": 3, "limit": 2})
    assert out.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "6 more lines" in out


def test_read_file_refuses_binary_and_missing_files(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00\x01\x02" * 100)
    assert "binary file (300 bytes)" in call("read_file", {"path": str(blob)})
    assert call("read_file", {"path": str(tmp_path / "nope")}).startswith("error: no such file")


def test_write_file_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "f.txt"
    assert "wrote 5 bytes" in call("write_file", {"path": str(target), "content": "hello"})
    assert target.read_text() == "hello"


def test_patch_needs_exactly_one_match(tmp_path: Path) -> None:
    target = tmp_path / "m.py"
    target.write_text("x = 1\ny = 1\n")
    assert "appears 0 times" not in call("patch", {"path": str(target), "old": "x = 1", "new": "x = 2"})
    assert target.read_text() == "x = 2\ny = 1\n"
    assert "does not appear" in call("patch", {"path": str(target), "old": "z = 9", "new": "z = 0"})
    target.write_text("a\na\n")
    assert "appears 2 times" in call("patch", {"path": str(target), "old": "a", "new": "b"})
    assert target.read_text() == "a\na\n"


def test_search_files_by_content_and_by_name(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("def main():\n    return 42\n")
    (tmp_path / "src" / "notes.md").write_text("main ideas\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("def main(): hidden\n")
    found = call("search_files", {"pattern": r"def \w+", "path": str(tmp_path)})
    assert "app.py:1:def main():" in found and ".git" not in found
    names = call("search_files", {"glob": "*.md", "path": str(tmp_path)})
    assert names.strip().endswith("notes.md")
    assert "invalid regular expression" in call("search_files", {"pattern": "(", "path": str(tmp_path)})


def test_list_directory_marks_folders(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    assert call("list_directory", {"path": str(tmp_path)}).splitlines() == ["dir/", "file"]


def test_terminal_reports_exit_code_and_times_out(tmp_path: Path) -> None:
    lines = call("terminal", {"command": "echo out; echo err >&2; exit 4"}).splitlines()
    assert lines[:2] == ["out", "err"] and lines[2].startswith("[exit code 4 ·")
    slow = call("terminal", {"command": "echo started; sleep 10", "timeout": 1})
    assert "started" in slow and "timed out after 1 s" in slow


@pytest.fixture
def web_page() -> Iterator[str]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                b"<html><head><title>t</title><script>var secret=1;</script></head>"
                b"<body><h1>Hello</h1><p>World &amp; friends</p></body></html>"
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_web_fetch_reduces_html_to_text(web_page: str) -> None:
    from mibyan.tools.web_tools import fetch_page

    out = fetch_page(web_page, timeout=5, allow_private=True)  # the page is on loopback
    assert out.startswith("HTTP 200")
    assert "Hello" in out and "World & friends" in out and "secret" not in out


def test_web_fetch_takes_only_http_addresses() -> None:
    assert "only http:// and https://" in call("web_fetch", {"url": "file:///etc/passwd"})

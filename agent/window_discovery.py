"""The context window of a model mibyan does not know, asked of the server that runs it.

OpenAI-compatible servers list their models at `GET {base_url}/models`, and many say there how long a
context the model takes: vLLM `max_model_len`, llama.cpp `meta.n_ctx` / `meta.n_ctx_train`, LM Studio
`max_context_length`, OpenRouter `context_length`. The answer is asked once per base URL and model,
ever: it is kept in `$MIBYAN_HOME/cache/context_windows.json` (0600), a server that does not say
included, so only the very first run against a new model waits for the listing (2 s at most).
The same listing tells whether the server is llama.cpp's (its models are `owned_by: llamacpp`; so does
the `Server` header of its answers), which is kept beside it (`<base_url>|server`): a streamed call to it
asks for its prompt progress.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from mibyan.config.paths import write_private

log = logging.getLogger("mibyan.window")

LISTING_TIMEOUT = 2.0
_WINDOW_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")
_META_KEYS = ("n_ctx", "n_ctx_train")  # llama.cpp: the server's own setting first, then the model's
_WRITING = threading.Lock()  # one writer of the cache at a time in this process (agents warm at once)


def window_in_listing(listing: Any, model: str) -> int | None:
    """The context window a `/models` listing gives `model`, if it gives one."""
    entries = listing.get("data") if isinstance(listing, dict) else listing
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    chosen = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in chosen:
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        top = entry.get("top_provider") if isinstance(entry.get("top_provider"), dict) else {}
        candidates = [entry.get(k) for k in _WINDOW_KEYS] + [meta.get(k) for k in _META_KEYS]
        for value in [*candidates, top.get("context_length")]:
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def server_in_listing(listing: Any) -> str | None:
    """Which server a `/models` listing comes from, where it says: "llama.cpp", else None."""
    entries = listing.get("data") if isinstance(listing, dict) else listing
    if not isinstance(entries, list):
        return None
    owners = {e.get("owned_by") for e in entries if isinstance(e, dict)}
    return "llama.cpp" if "llamacpp" in owners else None


class WindowCache:
    """What servers said about their models' windows, by `base_url|model` (None when they said nothing),
    and which servers they are, by `base_url|server`."""

    def __init__(self, home: Path) -> None:
        self.path = home / "cache" / "context_windows.json"
        self._answers = self._read()

    def known(self, key: str) -> bool:
        return key in self._answers

    def get(self, key: str) -> int | None:
        value = self._answers.get(key)
        return value if isinstance(value, int) else None

    def server(self, base_url: str) -> str | None:
        value = self._answers.get(f"{base_url}|server")
        return value if isinstance(value, str) else None

    def remember(self, key: str, window: int | str | None) -> None:
        with _WRITING:  # what another agent of this process kept since this one read the file stays
            self._answers = {**self._answers, **self._read(), key: window}
            self._write()

    def _read(self) -> dict[str, int | str | None]:
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        return loaded if isinstance(loaded, dict) else {}

    def _write(self) -> None:
        data = json.dumps(self._answers, indent=1, sort_keys=True)
        try:
            write_private(self.path, data.encode())
        except OSError as exc:  # a read-only home: asked again next time, which is only slower
            log.info("context window not cached: %s", exc)


def discover_window(
    home: Path, *, base_url: str, model: str, api_key: str, cache: WindowCache | None = None
) -> int | None:
    """The window the server at `base_url` reports for `model`, asked once ever; None if it says nothing.

    `cache`: the home's cache as the caller has read it already (else it is read here).
    """
    cache = WindowCache(home) if cache is None else cache
    key = f"{base_url}|{model}"
    if cache.known(key):
        return cache.get(key)
    import httpx2

    from mibyan.core.http_transport import shared_ssl_context

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx2.get(
            base_url.rstrip("/") + "/models",
            headers=headers,
            timeout=LISTING_TIMEOUT,
            verify=shared_ssl_context(),  # the model calls' TLS context (built once: about 20 ms)
        )
    except httpx2.TimeoutException:
        cache.remember(key, None)  # too slow to ask: do not make every start wait for it
        return None
    except httpx2.HTTPError as exc:  # down for now: ask again next time
        log.info("could not list the models of %s: %s", base_url, exc)
        return None
    window = None
    if response.status_code == 200:
        try:
            listing = response.json()
        except ValueError:
            listing = None
        window = window_in_listing(listing, model)
        server = server_in_listing(listing)
        if server is not None:
            cache.remember(f"{base_url}|server", server)
    cache.remember(key, window)
    return window


def remember_llama_cpp(home: Path, base_url: str) -> None:
    """The server at `base_url` said it is llama.cpp's (its `Server` header): kept for the next runs."""
    cache = WindowCache(home)
    if cache.server(base_url) != "llama.cpp":
        cache.remember(f"{base_url}|server", "llama.cpp")

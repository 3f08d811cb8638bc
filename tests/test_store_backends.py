"""The store's repositories give the same answers on SQLite and on PostgreSQL (DESIGN §16).

Each test runs on both backends; the PostgreSQL half carries the `postgres` marker (`pytest -m postgres`,
a real server tests/pging.py starts). Full-text search is checked on one shared fixture: the same hits
for the same words on both. What still differs between the two engines, and is not asserted here:
- rank: SQLite's is bm25 (lower is better), PostgreSQL's is minus ts_rank; the order of hits of equal
  rank is the engine's own;
- snippets: PostgreSQL's are made in Python the way FTS5's snippet() makes them (store/postgres.py);
  they differ only where a phrase (`a_b`) is cut by the edge of a snippet of a long message;
- PostgreSQL indexes the first 200,000 characters of a message, SQLite all of it;
- PostgreSQL text cannot hold the character NUL (nothing mibyan stores has one: JSON escapes it);
- words of underscores only (`_`) are a query on SQLite (it matches nothing), none on PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from agent_state import SessionStore, StoreError, store_url

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        opened = SessionStore(tmp_path / "state.db")
    else:
        opened = SessionStore.at_url(request.getfixturevalue("pg_url"))
    with opened:
        yield opened


#: The shared search fixture: session id -> its messages (user, assistant, user, ...).
CORPUS = {
    "s-cafe": ["Deploy the café menu to staging_box", "Deployed."],
    "s-path": ["Where is the config?", "The config lives at /etc/mibyan/config.yaml"],
    "s-naive": ["Résumé of the naïve approach"],
    "s-stage": ["pg-stage-3 is the staging server", "version 3.5 released"],
    "s-other": ["nothing relevant here"],
}

#: Words -> the (session, seq) hits both engines give.
SEARCHES = {
    "cafe": {("s-cafe", 0)},
    "CAFÉ": {("s-cafe", 0)},
    "staging": {("s-cafe", 0), ("s-stage", 0)},
    "stag": {("s-cafe", 0), ("s-stage", 0)},
    "box": {("s-cafe", 0)},
    "staging_box": {("s-cafe", 0)},
    "box staging": {("s-cafe", 0)},
    "mibyan yaml": {("s-path", 1)},
    "etc/mibyan": {("s-path", 1)},
    "config": {("s-path", 0), ("s-path", 1)},
    "resume naive": {("s-naive", 0)},
    "NAÏVE": {("s-naive", 0)},
    "pg stage 3": {("s-stage", 0)},
    "3": {("s-stage", 0), ("s-stage", 1)},
    "3.5": {("s-stage", 1)},
    "deploy": {("s-cafe", 0), ("s-cafe", 1)},
    "zzz": set(),
}


def _fill(store: SessionStore) -> None:
    for session_id, texts in CORPUS.items():
        for i, text in enumerate(texts):
            role = "user" if i % 2 == 0 else "assistant"
            create = {"title": session_id, "source": "cli"} if i == 0 else None
            store.messages.append(session_id, {"role": role, "content": text}, create=create)  # type: ignore[typeddict-item]


def test_search_gives_the_same_hits_on_the_shared_fixture(store: SessionStore) -> None:
    _fill(store)
    for words, expected in SEARCHES.items():
        hits = {(hit["session_id"], hit["seq"]) for hit in store.search(words)}
        assert hits == expected, words
    assert store.search.words_query("... / -") == ""
    assert store.search("...") == []
    assert [h["seq"] for h in store.search("staging", role="user", session_ids=["s-stage"])] == [0]
    assert store.search("staging", since=4e9) == []
    (hit,) = store.search("staging", session_ids=["s-stage"])
    assert hit["snippet"] == "pg-stage-3 is the [staging] server"
    assert hit["title"] == "s-stage" and hit["source"] == "cli" and hit["role"] == "user"
    assert [h["snippet"] for h in store.search("cafe")] == ["Deploy the [café] menu to staging_box"]
    assert [h["snippet"] for h in store.search("staging_box")] == ["Deploy the café menu to [staging_box]"]
    assert [h["snippet"] for h in store.search("etc/mibyan", marks=("<b>", "</b>"))] == [
        "The config lives at /<b>etc</b>/<b>mibyan</b>/config.yaml"
    ]


def test_a_long_message_s_snippet_is_the_same_twelve_words(store: SessionStore) -> None:
    words = " ".join(f"word{i}" for i in range(30))
    text = f"{words}. Then the staging box is here, with more words after it"
    store.messages.append("s1", {"role": "user", "content": text}, create={"source": "cli"})
    (hit,) = store.search("staging box")
    assert hit["snippet"] == "…Then the [staging] [box] is here, with more words after it"


def test_facts_are_found_by_shared_words_and_kept_to_their_owner(store: SessionStore) -> None:
    store.facts.add("Staging lives on pg-stage-3.")
    store.facts.add("The café opens at nine.", owner="agent-a")
    assert store.facts.relevant("where is staging?") == ["Staging lives on pg-stage-3."]
    assert store.facts.relevant("which cafe opens") == []
    assert store.facts.relevant("which cafe opens", owner="agent-a") == ["The café opens at nine."]
    assert store.facts.relevant("a b") == []


def test_provider_replay_data_is_kept_byte_for_byte(store: SessionStore) -> None:
    data = {"z": 1, "a": [1.0, 1e-7, 2**63], "sig": 'é\\"\u2028\n\t', "nested": {"b": None, "a": "x"}}
    store.messages.append(
        "s1",
        {"role": "assistant", "content": "ok", "provider_data": data},  # type: ignore[typeddict-unknown-key]
        create={"source": "cli"},
    )
    (row,) = store.query("SELECT provider_data FROM messages WHERE session_id = ?", ("s1",))
    assert row["provider_data"] == json.dumps(data, ensure_ascii=False)
    assert store.load_messages("s1")[0]["provider_data"] == data  # type: ignore[typeddict-item]


def test_sessions_lineage_todos_and_events_round_trip(store: SessionStore) -> None:
    parent = {"title": "Parent", "source": "cli"}
    store.messages.append("p1", {"role": "user", "content": "hi"}, create=parent)
    store.sessions.create("c1", parent_id="p1", source="cli", title="Child")
    store.events.record("c1", "compressed", "from p1")
    store.sessions.create("sub_1", parent_id="p1", source="subagent")
    assert store.sessions.resolve_id("p") == "p1"
    with pytest.raises(StoreError, match="ambiguous"):
        store.sessions.resolve_id("")
    assert store.sessions.resolve_id("sub_") == "sub_1"
    with pytest.raises(StoreError, match="no session"):
        store.sessions.resolve_id("s%")
    assert [(c["id"], c["compacted"]) for c in store.lineage.children("p1")] == [("c1", 1), ("sub_1", 0)]
    assert store.lineage.newest_descendant("p1") == "c1"
    assert store.lineage.ancestry("c1") == ["p1", "c1"]
    assert sorted(store.lineage.descendants("p1")) == ["c1", "p1", "sub_1"]
    assert store.sessions.sources() == ["cli", "subagent"]
    store.todos.save("p1", [{"text": "one", "status": "done"}, {"text": "two", "status": "pending"}])
    assert store.todos.get("p1") == [
        {"id": 1, "text": "one", "status": "done"},
        {"id": 2, "text": "two", "status": "pending"},
    ]
    store.events.record_model_call("p1", "m", {"input_tokens": 5, "output_tokens": 2})
    (call,) = store.events.model_calls("p1")
    assert (call["seq"], call["input_tokens"], call["output_tokens"]) == (1, 5, 2)
    store.sessions.add_usage("p1", 5, 2)
    store.sessions.end("p1", "done")
    row = store.sessions.get("p1")
    assert row is not None
    assert (row["message_count"], row["input_tokens"], row["end_reason"]) == (1, 5, "done")
    store.messages.replace("p1", [{"role": "user", "content": "again"}])
    assert store.load_messages("p1") == [{"role": "user", "content": "again"}]
    assert sorted(store.sessions.delete("p1")) == ["c1", "p1", "sub_1"]
    assert store.list_sessions() == []


def test_the_gateway_ledger_records_once_and_forgets_what_is_finished(store: SessionStore) -> None:
    row, new = store.ledger.record_inbound("a/http/x", "key-1", '{"text": "hi"}')
    again, new_again = store.ledger.record_inbound("a/http/x", "key-1", '{"text": "hi"}')
    assert (new, new_again, again["id"]) == (True, False, row["id"])
    store.ledger.mark_running(row["id"], "s1", 0)
    assert [r["id"] for r in store.ledger.unfinished()] == [row["id"]]
    store.ledger.record_reply(row["id"], "a/http/x", '{"text": "hello"}')
    store.ledger.record_reply(row["id"], "a/http/x", '{"text": "other"}')
    assert store.ledger.reply(row["id"])["reply"] == '{"text": "hello"}'  # type: ignore[index]
    assert [r["inbox_id"] for r in store.ledger.undelivered(0, 4e9)] == [row["id"]]
    store.ledger.mark_sent(row["id"])
    assert store.ledger.forget_finished(4e9) == 1
    assert store.ledger.inbound(row["id"]) is None
    store.sessions.create("s1", source="gateway", channel="a/http/x")
    assert (store.channels.first_session("a/http/x"), store.channels.count()) == ("s1", 1)
    assert store.channels.release("a/http/x") == 1


def test_an_unknown_store_url_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("store:\n  url: mysql://db/x\n")
    with pytest.raises(StoreError, match=r"store.url: 'mysql://db/x' is not a postgresql:// URL"):
        SessionStore.open(tmp_path)
    assert store_url(tmp_path, {"MIBYAN_STORE_URL": "postgresql://h/db"}) == "postgresql://h/db"
    (tmp_path / "config.yaml").write_text("agent:\n  api_max_retries: 0\n")
    assert store_url(tmp_path, {}) is None


@pytest.mark.postgres
def test_the_store_url_in_the_home_config_opens_postgresql(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "config.yaml").write_text(f"store:\n  url: {pg_url}\n")
    with SessionStore.open(tmp_path) as store:
        store.sessions.create("s1", source="cli")
    with SessionStore.at_url(pg_url) as store:
        assert [s["id"] for s in store.list_sessions()] == ["s1"]
    assert not (tmp_path / "state.db").exists()


@pytest.mark.postgres
def test_an_unreachable_server_is_one_clear_error_without_the_password(pg_url: str) -> None:
    with pytest.raises(StoreError) as caught:
        SessionStore.at_url("postgresql://mibyan:s3cret@127.0.0.1:1/mibyan?connect_timeout=2")
    assert "s3cret" not in str(caught.value)
    assert str(caught.value).startswith("postgresql://mibyan@127.0.0.1:1/mibyan")


_OPEN = """
import sys
from agent_state import SessionStore
sys.stdin.readline()
SessionStore.at_url(sys.argv[1]).close()
print("opened")
"""


@pytest.mark.postgres
def test_three_processes_starting_at_once_on_an_empty_database_migrate_it_once(pg_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, pg_url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:  # all three are started before any opens the store
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [proc.communicate(timeout=60) for proc in procs]
    assert [(proc.returncode, out, err) for proc, (out, err) in zip(procs, results, strict=True)] == [
        (0, "opened\n", "")
    ] * 3
    from mibyan.store.postgres_schema import MIGRATIONS

    with SessionStore.at_url(pg_url) as store:
        names = [row["name"] for row in store.query("SELECT name FROM _mibyan_migrations ORDER BY name")]
    assert names == sorted(step.__name__ for step in MIGRATIONS)


@pytest.mark.postgres
def test_a_channel_lease_is_claimed_by_one_and_fences_the_writes_of_a_lost_holder(pg_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from mibyan.store.database import LeaseLost

    with SessionStore.at_url(pg_url) as store:
        leases = store.leases
        assert leases is not None
        # every holder is marked alive while it lives, as a gateway is (else its lease reads as left)
        alive = {owner: store.database.hold_alive(owner) for owner in [*(f"gw{i}" for i in range(8)), "next"]}
        with ThreadPoolExecutor(8) as pool:  # eight claims at once: one lease between them
            epochs = list(pool.map(lambda i: leases.claim("a/http/team", f"gw{i}", 60), range(8)))
        assert [e for e in epochs if e is not None] == [1]
        winner = f"gw{epochs.index(1)}"
        assert leases.claim("a/http/team", "late", 60) is None
        with store.fenced("a/http/team", winner, 1):
            store.messages.append("s1", {"role": "user", "content": "mine"}, create={"source": "gateway"})
        leases.release("a/http/team", winner, 1)
        assert leases.claim("a/http/team", "next", 60) == 2  # the epoch rises at every claim
        with store.fenced("a/http/team", winner, 1), pytest.raises(LeaseLost, match="took this channel over"):
            store.messages.append("s1", {"role": "assistant", "content": "too late"})
        assert store.load_messages("s1") == [{"role": "user", "content": "mine"}]
        assert not leases.renew("a/http/team", winner, 1, 60) and leases.renew("a/http/team", "next", 2, 60)
        assert leases.claim("a/http/team", "late", 60) is None  # held for a minute more by a live holder
        alive.pop("next").close()  # its process gone: its lease is free at once, its messages left
        assert leases.claim("a/http/team", "late", 60) == 3
        for mark in alive.values():
            mark.close()

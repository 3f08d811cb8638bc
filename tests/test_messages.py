"""The message rules: what a valid history is, and how a broken one is mended."""

from __future__ import annotations

import pytest

from mibyan.agent.messages import (
    INTERRUPTED_RESULT,
    History,
    HistoryError,
    assistant_message,
    repair_history,
    tool_message,
    user_message,
)


def call(call_id: str, name: str = "t") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_a_valid_history_needs_no_repair() -> None:
    history = [
        user_message("q"),
        assistant_message(None, tool_calls=[call("a"), call("b")]),
        tool_message("a", "1"),
        tool_message("b", "2"),
        assistant_message("done"),
    ]
    fixed, notes = repair_history(history)
    assert notes == [] and fixed == history


def test_missing_tool_results_get_a_synthetic_interrupted_result() -> None:
    history = [
        user_message("q"),
        assistant_message(None, tool_calls=[call("a"), call("b")]),
        tool_message("a", "1"),
        user_message("next"),
    ]
    fixed, notes = repair_history(history)
    assert [m.get("tool_call_id") for m in fixed if m["role"] == "tool"] == ["a", "b"]
    assert fixed[3]["content"] == INTERRUPTED_RESULT
    assert len(notes) == 1


def test_results_are_put_in_the_order_of_their_calls() -> None:
    history = [
        user_message("q"),
        assistant_message(None, tool_calls=[call("a"), call("b")]),
        tool_message("b", "2"),
        tool_message("a", "1"),
    ]
    fixed, notes = repair_history(history)
    assert [m["tool_call_id"] for m in fixed[2:]] == ["a", "b"]
    assert notes


def test_two_user_messages_in_a_row_keep_both_with_a_placeholder_between() -> None:
    fixed, notes = repair_history([user_message("one"), user_message("two")])
    assert [m["role"] for m in fixed] == ["user", "assistant", "user"]
    assert [fixed[0]["content"], fixed[2]["content"]] == ["one", "two"]
    assert notes


def test_an_orphan_tool_result_is_left_out_and_reported() -> None:
    fixed, notes = repair_history([user_message("q"), tool_message("zzz", "?"), assistant_message("a")])
    assert [m["role"] for m in fixed] == ["user", "assistant"]
    assert "zzz" in notes[0]


def test_live_appends_that_break_the_rules_raise() -> None:
    history = History()
    history.append(user_message("q"))
    with pytest.raises(HistoryError):
        history.append(user_message("again"))
    history.append(assistant_message(None, tool_calls=[call("a")]))
    with pytest.raises(HistoryError):
        history.append(assistant_message("too soon"))
    with pytest.raises(HistoryError):
        history.append(tool_message("other", "x"))
    history.append(tool_message("a", "ok"))
    history.append(assistant_message("done"))


class RecordingSink:
    def __init__(self) -> None:
        self.appended: list[dict] = []
        self.replaced: list[list[dict]] = []

    def append_message(self, message: dict) -> None:
        self.appended.append(message)

    def replace_messages(self, messages: list[dict]) -> None:
        self.replaced.append(list(messages))


def test_a_turn_after_an_interrupted_tool_round_closes_it_first_and_persists_each_message() -> None:
    sink = RecordingSink()
    history = History([user_message("q"), assistant_message(None, tool_calls=[call("a")])], sink=sink)

    notes = history.start_turn("next question")

    assert [m["role"] for m in history.messages] == ["user", "assistant", "tool", "user"]
    assert history.messages[2]["content"] == INTERRUPTED_RESULT
    assert notes
    assert [m["role"] for m in sink.appended] == ["tool", "user"]
    assert sink.replaced == []

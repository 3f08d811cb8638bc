"""The protocol's stdio boundary, with hostile input: what is written is always one line of plain ASCII
JSON, and every line read is either a JSON-RPC message or answered with a JSON-RPC error."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mibyan.editors.stdio import check_message, encode

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(text=st.text(), extra=st.dictionaries(st.text(max_size=8), _JSON, max_size=3))
def test_whatever_the_model_wrote_goes_out_as_one_line_of_ascii_without_control_characters(
    text: str, extra: dict[str, object]
) -> None:
    message = {"jsonrpc": "2.0", "method": "session/update", "params": {"text": text, **extra}}
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert all(0x20 <= byte < 0x7F for byte in line[:-1])
    assert json.loads(line)["params"]["text"] == text


@given(line=st.binary() | _JSON.map(lambda value: json.dumps(value).encode()))
def test_every_line_read_is_a_message_or_gets_an_error_response(line: bytes) -> None:
    message, error = check_message(line)
    assert (message is None) != (error is None)
    if error is not None:
        assert error["jsonrpc"] == "2.0" and error["error"]["code"] in (-32700, -32600)
        assert error["id"] is None or isinstance(error["id"], str | int)
        encode(error)
    else:
        assert isinstance(message, dict)
        assert isinstance(message.get("method"), str) or "result" in message or "error" in message

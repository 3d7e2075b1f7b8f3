"""How a reply ended, decided once (daemon/protocol/reply_end.py), and the parser mode every API
responder reads (`OutputParser(whole_calls=True)`): a call's events only once its invoke closed."""

from __future__ import annotations

import json

import pytest

from cairn.actors.engine.messages import Done, Usage
from cairn.daemon.protocol.reply_end import ReplyEnd, end_reply, reply_end
from cairn.daemon.protocol.dsv4.output import OutputParser

D = "｜DSML｜"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "limit": {"type": "integer"}}}}}]
CALL = (f"<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">a.txt</{D}parameter>\n"
        f"<{D}parameter name=\"limit\" string=\"false\">10</{D}parameter>\n</{D}invoke>\n")
WHOLE = f"Reading.\n\n<{D}tool_calls>\n{CALL}</{D}tool_calls>"
# the second call cut off inside its parameter (max_tokens, a stop string or the end-of-sequence token)
CUT = f"Reading.\n\n<{D}tool_calls>\n{CALL}<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">b.t"
MALFORMED = f"Reading.\n\n<{D}tool_calls>\n{CALL}<{D}invoke name=\"read\">\n<{D}bogus>"


def ended(text: str, done: Done, step: int = 1):
    p = OutputParser(thinking=False, tools=TOOLS, whole_calls=True)
    events = []
    for i in range(0, len(text), step):
        events += p.feed(text[i:i + step])
    more, end = end_reply(p, done)
    return events + more, end


def _done(finish="stop", stop_sequence=None) -> Done:
    return Done(finish, Usage(1, 1, 0), stop_sequence=stop_sequence)


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_whole_calls_emit_a_call_only_when_it_closed_in_one_piece(step):
    events, end = ended(WHOLE, _done(), step)
    calls = [(e.kind, e.index) for e in events if e.kind.startswith("tool")]
    assert calls == [("tool_start", 0), ("tool_args", 0)]
    (args,) = [e.text for e in events if e.kind == "tool_args"]
    assert json.loads(args) == {"path": "a.txt", "limit": 10} and args == end.tool_calls[0].arguments
    assert end == ReplyEnd("tool_calls", end.tool_calls) and len(end.tool_calls) == 1


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_a_call_cut_off_is_never_emitted_and_the_closed_one_before_it_is(step):
    events, end = ended(CUT, _done("length"), step)
    assert [(e.kind, e.index) for e in events if e.kind.startswith("tool")] == [("tool_start", 0), ("tool_args", 0)]
    assert "".join(e.text for e in events if e.kind == "content") == "Reading."
    assert (end.finish, end.dropped, end.cut_off, len(end.tool_calls)) == ("length", "length", True, 1)


def test_a_malformed_call_is_never_emitted_its_text_is_content():
    events, end = ended(MALFORMED, _done())
    assert [e.kind for e in events if e.kind.startswith("tool")] == ["tool_start", "tool_args"]   # the first call
    assert f"<{D}bogus>" in "".join(e.text for e in events if e.kind == "content")
    assert (end.finish, end.dropped, len(end.tool_calls)) == ("stop", "malformed", 1)


@pytest.mark.parametrize("text, done, want", [
    ("Hello", _done(), ReplyEnd("stop")),
    ("Hello", _done("length"), ReplyEnd("length")),
    ("Hello", _done(stop_sequence="END"), ReplyEnd("stop_sequence", stop_sequence="END")),
    # closed calls: tool_calls, unless the token limit cut the reply after them
    (WHOLE, _done(), "tool_calls"),
    (WHOLE, _done(stop_sequence="END"), "tool_calls"),
    (WHOLE[:-5], _done("length"), "length"),          # the block's end cut off, every call closed
    # a call dropped: never tool_calls, whatever closed before it
    (CUT, _done("length"), ("length", "length")),
    (CUT, _done(stop_sequence="b.t"), ("stop_sequence", "stop_sequence")),
    (CUT, _done(), ("stop", "stop")),
])
def test_the_finish_and_what_was_dropped(text, done, want):
    _, end = ended(text, done, step=10_000)
    if isinstance(want, ReplyEnd):
        assert end == want
    elif isinstance(want, tuple):
        assert (end.finish, end.dropped) == want and end.stop_sequence == (
            "b.t" if want[0] == "stop_sequence" else None)
    else:
        assert end.finish == want and end.dropped is None and end.stop_sequence is None
    assert end.cut_off == (end.finish == "length")


def test_reply_end_reads_only_the_parsed_result():
    p = OutputParser(thinking=False, tools=TOOLS)
    p.feed(CUT)
    p.finish()
    assert reply_end("length", None, p.result).finish == "length"
    assert reply_end("stop", None, p.result).finish == "stop"

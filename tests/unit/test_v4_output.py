"""What the model writes -> reasoning, content, tool calls (daemon/protocol/v4_output.py)."""

from __future__ import annotations

import json

import pytest

from cairn.daemon.protocol.dsv4.output import OutputParser, parse_all

D = "｜DSML｜"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "limit": {"type": "integer"}, "flags": {"type": "array"},
    "note": {"type": "string"}}}}}]
BLOCK = (f"\n\n<{D}tool_calls>\n<{D}invoke name=\"read\">\n"
         f"<{D}parameter name=\"path\" string=\"true\">a \"b\".txt</{D}parameter>\n"
         f"<{D}parameter name=\"limit\" string=\"false\">10</{D}parameter>\n"
         f"<{D}parameter name=\"flags\" string=\"false\">[1, \"x\"]</{D}parameter>\n"
         f"<{D}parameter name=\"note\" string=\"false\">plain</{D}parameter>\n"
         f"</{D}invoke>\n<{D}invoke name=\"read\">\n\n</{D}invoke>\n</{D}tool_calls>")


def stream(text: str, *, thinking: bool, tools=TOOLS, step: int = 1):
    """Feed the text in pieces of `step` characters; collect the events."""
    p = OutputParser(thinking=thinking, tools=tools)
    events = []
    for i in range(0, len(text), step):
        events += p.feed(text[i:i + step])
    return p, events + p.finish()


def test_reasoning_goes_to_reasoning_until_end_think():
    r = parse_all("let me think</think>The answer.", thinking=True, tools=None)
    assert (r.reasoning, r.content, r.tool_calls) == ("let me think", "The answer.", [])


def test_chat_mode_output_is_all_content():
    r = parse_all("plain </think> text", thinking=False, tools=None)
    assert (r.reasoning, r.content) == ("", "plain </think> text")


def test_unclosed_reasoning_stays_reasoning():
    assert parse_all("still thinking", thinking=True, tools=None).reasoning == "still thinking"


def test_dsml_tool_calls_become_typed_json_arguments():
    r = parse_all("hmm</think>Reading." + BLOCK, thinking=True, tools=TOOLS)
    assert r.content == "Reading." and r.warnings == []
    assert [c.name for c in r.tool_calls] == ["read", "read"]
    assert json.loads(r.tool_calls[0].arguments) == {"path": 'a "b".txt', "limit": 10, "flags": [1, "x"],
                                                      "note": "plain"}   # string-typed by the schema
    assert r.tool_calls[1].arguments == "{}"
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in r.tool_calls)


def test_a_string_true_value_for_an_integer_parameter_is_typed_by_the_schema():
    text = f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"limit\" string=\"true\">7</{D}parameter>" \
           f"\n</{D}invoke>\n</{D}tool_calls>"
    assert json.loads(parse_all(text, thinking=False, tools=TOOLS).tool_calls[0].arguments) == {"limit": 7}


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_streamed_pieces_add_up_to_the_whole_reply(step):
    text = "r1 </thin</think>Reading the file  " + BLOCK
    whole = parse_all(text, thinking=True, tools=TOOLS)
    p, events = stream(text, thinking=True, step=step)
    assert "".join(e.text for e in events if e.kind == "reasoning") == whole.reasoning == "r1 </thin"
    assert "".join(e.text for e in events if e.kind == "content") == whole.content == "Reading the file"
    for i, call in enumerate(whole.tool_calls):
        starts = [e for e in events if e.kind == "tool_start" and e.index == i]
        assert len(starts) == 1 and starts[0].name == call.name
        assert "".join(e.text for e in events if e.kind == "tool_args" and e.index == i) == call.arguments


def test_partial_tag_is_held_back_until_decided():
    p = OutputParser(thinking=True, tools=TOOLS)
    assert [e.text for e in p.feed("abc</thi")] == ["abc"]       # "</thi" might be "</think>"
    assert p.feed("nk>") == []
    assert [e.text for e in p.feed("x <｜DS")] == ["x"]           # " <｜DS" might open a block
    assert [e.text for e in p.feed("yz")] == [" <｜DSyz"]         # it did not


def test_tool_call_id_and_name_come_in_one_event_then_argument_fragments():
    _, events = stream(BLOCK, thinking=False, step=5)
    kinds = [e.kind for e in events]
    assert kinds[0] == "tool_start" and events[0].name == "read" and events[0].id
    assert kinds[1:5] == ["tool_args"] * 4 and events[1].text.startswith("{")


def test_a_malformed_block_is_returned_as_content_with_a_warning():
    text = f"Sure.\n\n<{D}tool_calls>\n<{D}bogus>oops</{D}tool_calls>"
    r = parse_all(text, thinking=False, tools=TOOLS)
    assert r.tool_calls == [] and r.warnings and "malformed" in r.warnings[0]
    assert r.content == text                                  # all of it, whitespace included


def test_a_call_cut_off_by_the_end_of_the_output_is_dropped_and_its_text_is_not_content():
    """max_tokens inside the second call's parameters: the closed call stays, the open one is no call
    (no closing `}`, no missing-argument call to run) and no raw DSML is left in the content."""
    second = BLOCK.index(f"</{D}invoke>") + len(f"</{D}invoke>\n")
    text = "Reading." + BLOCK[:second] + f"<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">b.t"
    for step in (1, 3, 1000):
        p, events = stream(text, thinking=False, step=step)
        r = p.result
        assert [c.name for c in r.tool_calls] == ["read"] and r.dropped_call
        assert json.loads(r.tool_calls[0].arguments)["path"] == 'a "b".txt'
        assert r.content == "Reading." and D not in r.content
        assert "cut off" in r.warnings[0]


@pytest.mark.parametrize("cut", [f"<{D}tool_ca", f"<{D}tool_calls>\n<{D}invoke name=\"re",
                                 f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" str"])
def test_output_ending_inside_the_block_header_leaves_only_the_content_before_it(cut):
    r = parse_all("Sure.\n\n" + cut, thinking=False, tools=TOOLS)
    assert (r.content, r.tool_calls) == ("Sure.", [])
    assert r.dropped_call == ("invoke name=\"read\">" in cut)


def test_without_tools_dsml_text_is_content():
    r = parse_all("x" + BLOCK, thinking=False, tools=None)
    assert r.content == "x" + BLOCK and r.tool_calls == []


def test_a_parameter_value_nested_past_the_parser_is_kept_as_text():
    """A model that writes 100,000 `[` in a non-string parameter: the value is kept as a string, not a crash."""
    deep = "[" * 100_000
    text = f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"flags\" string=\"false\">{deep}" \
           f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>"
    assert json.loads(parse_all(text, thinking=False, tools=TOOLS).tool_calls[0].arguments) == {"flags": deep}


def _one_param_call(value: str) -> str:
    return (f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">{value}"
            f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>")


def _scanned_token_by_token(text: str, step: int = 3) -> tuple[int, OutputParser]:
    p, events = stream(text, thinking=False, step=step)
    return p.scanned, p


def test_a_long_parameter_fed_token_by_token_is_scanned_in_linear_work():
    """The parser looks at each character a bounded number of times: an 80 KB parameter costs about
    four times a 20 KB one (a rescan of the buffer on every feed would make it sixteen)."""
    small, p20 = _scanned_token_by_token(_one_param_call('line "x" = 1\n' * 1540))     # ~20 KB
    large, p80 = _scanned_token_by_token(_one_param_call('line "x" = 1\n' * 6160))     # ~80 KB
    assert json.loads(p80.result.tool_calls[0].arguments)["path"] == 'line "x" = 1\n' * 6160
    assert large / small < 4.5
    n = len(_one_param_call('line "x" = 1\n' * 6160))
    assert large < 4 * n            # a few looks per character, not one per feed


def test_a_string_parameter_streams_as_it_arrives_json_escaped():
    p = OutputParser(thinking=False, tools=TOOLS)
    head = f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">"
    events = p.feed(head + 'a "quoted"\nfile')
    args = [e.text for e in events if e.kind == "tool_args"]
    assert "".join(args) == '{"path": "a \\"quoted\\"\\nfile'    # the value so far, before its end tag
    events = p.feed(f".txt</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>") + p.finish()
    args += [e.text for e in events if e.kind == "tool_args"]
    assert json.loads("".join(args)) == {"path": 'a "quoted"\nfile.txt'}
    assert "".join(args) == p.result.tool_calls[0].arguments


def test_the_end_tag_split_across_feeds_is_held_back_not_streamed():
    p = OutputParser(thinking=False, tools=TOOLS)
    p.feed(f"<{D}tool_calls>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">ab")
    events = p.feed(f"c</{D}param")
    assert [e.text for e in events] == ["c"]                  # "</｜DSML｜param" may be the end tag
    events = p.feed(f"eter>\n</{D}invoke>")
    assert "".join(e.text for e in events) == '"}'

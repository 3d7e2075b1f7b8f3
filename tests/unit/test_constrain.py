"""Grammar constraints with llguidance (daemon/protocol/constrain.py, daemon/protocol/agent_protocol.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cairn.daemon.protocol.agent_protocol import AgentProtocol
from cairn.daemon.protocol.dsv4.grammar import Dsv4Grammars as Grammars
from cairn.daemon.protocol.dsv4.encoding import ChatOptions
from cairn.daemon.api.schemas import APIError, parse_chat
from cairn.daemon.protocol.tokenizer import TextTokenizer
from cairn.daemon.protocol.dsv4.output import parse_all

READ = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {
    "path": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0, "maximum": 50},
    "deep": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]},
                                          "maxItems": 2},
    "mode": {"type": "string", "enum": ["r", "w"]}, "note": {"type": "string"}},
    "required": ["path", "n", "deep", "tags", "mode"]}}}
OTHER = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tok(tiny_md):
    return TextTokenizer.from_model_dir(tiny_md)


@pytest.fixture(scope="module")
def grammars(tiny_md, tok):
    return Grammars.from_model_dir(tiny_md, tok)


def walk(constraint, tok, seed: int, steps: int = 2000) -> str:
    """Sample uniformly among the tokens the mask allows until the end: any path must be valid."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        t = int(rng.choice(np.flatnonzero(constraint.allowed())))
        if t == tok.eos_id:
            return tok.decode(out)
        constraint.accept(t)
        out.append(t)
    raise AssertionError("the grammar never ended")


@pytest.mark.parametrize("seed", range(4))
def test_every_path_of_a_forced_call_is_a_schema_valid_call(grammars, tok, seed):
    g = grammars.grammar_for(json_schema=None, tool_choice={"type": "function", "function": {"name": "read"}},
                             tools=[OTHER, READ])
    text = walk(grammars.constraint(g, thinking=False), tok, seed)
    r = parse_all(text, thinking=False, tools=[OTHER, READ])
    assert r.warnings == [] and r.content == "" and [c.name for c in r.tool_calls] == ["read"]
    args = json.loads(r.tool_calls[0].arguments)
    assert set(args) == {"path", "n", "deep", "tags", "mode"}
    assert isinstance(args["path"], str) and len(args["path"]) <= 6 and "<" not in args["path"]
    assert 0 <= args["n"] <= 50 and isinstance(args["deep"], bool) and args["mode"] in ("r", "w")
    assert len(args["tags"]) <= 2 and set(args["tags"]) <= {"a", "b"}


@pytest.mark.parametrize("seed", range(3))
def test_every_path_of_a_json_schema_reply_validates(grammars, tok, seed):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "k": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 9}},
              "required": ["ok", "k"], "additionalProperties": False}
    text = walk(grammars.constraint(grammars.grammar_for(json_schema=schema, tool_choice="auto", tools=None),
                                    thinking=False), tok, seed)
    value = json.loads(text)
    assert set(value) == {"ok", "k"} and isinstance(value["ok"], bool) and 1 <= value["k"] <= 9


def test_json_object_starts_with_a_brace(grammars, tok):
    c = grammars.constraint(grammars.grammar_for(json_schema={}, tool_choice="auto", tools=None), thinking=False)
    first = np.flatnonzero(c.allowed())
    assert first.size and all(tok.token_bytes(int(t)).startswith(b"{") for t in first)


def test_in_thinking_mode_the_mask_starts_after_end_think(grammars, tok):
    c = grammars.constraint(grammars.grammar_for(json_schema={}, tool_choice="auto", tools=None), thinking=True)
    for t in tok.encode("free reasoning"):
        free = c.allowed()
        # the reasoning is free text, but it cannot end the reply: the constrained answer must come
        assert free.sum() == free.size - 1 and not free[tok.eos_id]
        c.accept(t)
    assert c.allowed_prefix([*tok.encode("more"), tok.eos_id, 5]) == len(tok.encode("more"))
    c.accept(tok.token_to_id("</think>"))
    assert not c.allowed()[tok.encode("x")[0]] and not c.allowed()[tok.eos_id]


def _protocol(tok, tiny_md):
    class Log:
        def __init__(self):
            self.warnings = []

        def info(self, *a, **k):
            pass

        def warning(self, event, **k):
            self.warnings.append((event, k))
    return AgentProtocol(tok, int(tiny_md.config["vocab_size"]), Log())


def test_agent_protocol_builds_constraints_only_when_asked(tok, tiny_md):
    ap = _protocol(tok, tiny_md)
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert ap.constraint(parse_chat({**base, "tools": [READ]}), ChatOptions()) is None
    assert ap.constraint(parse_chat({**base, "tools": [READ], "tool_choice": "required"}), ChatOptions()) is not None
    assert ap.constraint(parse_chat({**base, "response_format": {"type": "json_object"}}), ChatOptions()) is not None


def test_a_schema_the_grammar_cannot_take_is_a_400_naming_response_format(tok, tiny_md):
    ap = _protocol(tok, tiny_md)
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "x", "schema": {"type": "wizard"}}}})
    with pytest.raises(APIError) as e:
        ap.constraint(req, ChatOptions())
    assert e.value.status == 400 and e.value.param == "response_format"


def test_too_many_tools_for_the_grammar_is_a_400_without_the_panic_text(tok, tiny_md):
    """10k tools under tool_choice "required": llguidance panics (too many grammar symbols); the
    client gets a short 400, the log gets the library's text."""
    ap = _protocol(tok, tiny_md)
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}} for i in range(10_000)]
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools,
                      "tool_choice": "required"})
    with pytest.raises(APIError) as e:
        ap.constraint(req, ChatOptions())
    msg = e.value.message
    assert e.value.status == 400 and e.value.param == "tool_choice"
    assert "could not be compiled into a constraint" in msg and len(msg) < 300
    assert "panic" not in msg.lower() and "backtrace" not in msg.lower()
    (event, kw), = ap.log.warnings
    assert event == "grammar_compile_failed" and "panic" in kw["detail"]


def test_tokens_past_a_finished_grammar_are_ignored_not_an_error(grammars, tok):
    # with ignore_eos a reply may go on after the grammar is complete: only EOS stays allowed
    c = grammars.constraint(grammars.grammar_for(json_schema={"type": "boolean"}, tool_choice="auto", tools=None),
                            thinking=False)
    for t in tok.encode("true"):
        c.accept(t)
    assert np.flatnonzero(c.allowed()).tolist() == [tok.eos_id]
    c.accept(tok.eos_id)
    c.accept(tok.eos_id)
    assert np.flatnonzero(c.allowed()).tolist() == [tok.eos_id]


def test_parallel_tool_calls_false_allows_exactly_one_call(grammars):
    many = grammars.dsml_lark([OTHER, READ], None)
    one = grammars.dsml_lark([OTHER, READ], None, single=True)
    assert 'invoke ("\\n" invoke)*' in many and 'invoke ("\\n" invoke)*' not in one
    ap_req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [OTHER, READ],
                         "tool_choice": "required", "parallel_tool_calls": False})
    assert ap_req.parallel_tool_calls is False


@pytest.mark.parametrize("seed", range(3))
def test_required_without_parallel_calls_makes_one_call_on_every_path(grammars, tok, seed):
    g = grammars.grammar_for(json_schema=None, tool_choice="required", tools=[OTHER, READ], parallel=False)
    r = parse_all(walk(grammars.constraint(g, thinking=False), tok, seed), thinking=False, tools=[OTHER, READ])
    assert r.warnings == [] and len(r.tool_calls) == 1


def test_forced_text_is_tokenized_canonically(grammars, tok):
    # Where the grammar dictates the text, llguidance's mask allows only the tokenizer's own
    # tokenization of it (not one of the byte-wise equivalent ones), whatever the sampler (here a
    # uniform one): the model sees in-distribution tokens, and the next turn's re-rendered history
    # matches what was generated. A property of the library this module relies on.
    head = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read">\n<｜DSML｜parameter name="path" string="true">'
    want = tok.encode(head)
    c = grammars.constraint(grammars.grammar_for(json_schema=None, tool_choice={"function": {"name": "read"}},
                                                 tools=[OTHER, READ]), thinking=False)
    rng = np.random.default_rng(0)
    got = []
    for _ in want:
        t = int(rng.choice(np.flatnonzero(c.allowed())))
        c.accept(t)
        got.append(t)
    assert got == want


def test_ignored_field_names_are_logged_once_each_and_remembered_up_to_a_bound(tok, tiny_md):
    from cairn.daemon.protocol import agent_protocol

    logged = []

    class Log:
        def info(self, event, **kw):
            logged.append(kw["field"])

    ap = agent_protocol.AgentProtocol(tok, 512, Log())
    ap.note_ignored(("a", "b"))
    ap.note_ignored(("a", "c"))
    assert logged == ["a", "b", "c"]
    ap.note_ignored(tuple(f"x{i}" for i in range(1000)))
    assert len(ap._logged) == agent_protocol.MAX_LOGGED_FIELDS


def test_a_refused_token_error_carries_no_library_backtrace():
    from cairn.daemon.protocol.constrain import Constraint

    class PanickedMatcher:
        def consume_token(self, t):
            return False

        def get_error(self):
            return "panic: index out of bounds\n<backtrace>\n   0: <unknown>\n   1: <unknown>"

    with pytest.raises(ValueError) as e:
        Constraint(PanickedMatcher(), 8, None).accept(3)
    assert "token 3 refused" in str(e.value) and "backtrace" not in str(e.value) and "panic" not in str(e.value)

"""Hostile request bodies get a 400 naming the field (issue 22, item 5), never a 500: deep nesting,
lone surrogates, NaN/Infinity, integers past 64 bits, malformed tool schemas."""

from __future__ import annotations

import json

import pytest

from cairn.daemon.api.schemas import APIError, parse_chat, parse_completion, parse_json_body

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
CMPL = {"model": "tiny", "prompt": "hello"}


def _err(raw: bytes, parse=parse_chat) -> APIError:
    with pytest.raises(APIError) as ei:
        parse(parse_json_body(raw))
    assert ei.value.status == 400
    return ei.value


def _body(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a": ' * 100_000, b'{"model": "tiny", "x": ' + b"[" * 100_000])
def test_deep_nesting_is_a_400(raw):
    e = _err(raw)
    assert e.code == "invalid_json" and "nested too deeply" in e.message


def test_nesting_the_parser_takes_but_past_the_limit_names_where():
    e = _err(b'{"model": "tiny", "metadata": ' + b"[" * 200 + b"]" * 200 + b"}")
    assert e.code == "invalid_json" and e.param.startswith("metadata[0][0]") and "at most 64" in e.message


def test_nesting_within_the_limit_parses_and_brackets_in_strings_do_not_count():
    parse_chat(parse_json_body(_body({**CHAT, "metadata": {"s": "[" * 10_000}, "x": [[[[1]]]]})))


@pytest.mark.parametrize("field,body", [
    ("messages[0].content", {**CHAT, "messages": [{"role": "user", "content": "a\ud800b"}]}),
    ("prompt", {**CMPL, "prompt": "\udfff"}),
    ("stop[1]", {**CMPL, "stop": ["ok", "x\ud83d"]}),
])
def test_lone_surrogate_names_the_field(field, body):
    raw = _body(body)            # json.dumps writes the surrogate as the escape \ud800, valid JSON
    assert b"\\ud" in raw
    e = _err(raw, parse_completion if "prompt" in body else parse_chat)
    assert e.param == field and field in e.message and "surrogate" in e.message


def test_a_surrogate_pair_is_a_character_and_passes():
    req = parse_chat(parse_json_body(b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'))
    assert req.messages[0]["content"] == "\U0001F600"


@pytest.mark.parametrize("field,literal", [
    ("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "NaN"), ("frequency_penalty", "-Infinity"),
    ("presence_penalty", "NaN"), ("temperature", "1e999"),
])
def test_non_finite_numbers_are_refused(field, literal):
    e = _err(b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "%s": %s}'
             % (field.encode(), literal.encode()))
    assert e.param == field and field in e.message and "finite" in e.message


def test_non_finite_logit_bias_value_names_its_key():
    e = _err(b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": NaN}}')
    assert e.param == "logit_bias.5"


@pytest.mark.parametrize("field,body", [
    ("max_tokens", b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"),
    ("seed", b'{"model": "tiny", "prompt": "x", "seed": ' + b"9" * 5000 + b"}"),
    ("prompt[1]", b'{"model": "tiny", "prompt": [1, ' + b"9" * 5000 + b"]}"),
])
def test_huge_integers_are_a_400(field, body):
    e = _err(body, parse_completion)
    assert "integer" in e.message      # past 4300 digits Python cannot even read it: a body-level 400
    e = _err(body.replace(b"9" * 5000, b"9" * 100), parse_completion)
    assert e.param == field and "bits" in e.message


def test_huge_logit_bias_key_is_a_400():
    e = _err(_body({**CHAT, "logit_bias": {"9" * 5000: 1}}))
    assert e.param == "logit_bias" and len(e.message) < 300


def test_seed_of_64_bits_still_passes():
    assert parse_completion(parse_json_body(_body({**CMPL, "seed": 2**64 - 1}))).common.seed == 2**64 - 1


def _tool(fn) -> dict:
    return {"type": "function", "function": fn}


@pytest.mark.parametrize("field,tools,choice", [
    ("tools[0].function", [{"type": "function", "function": [1]}], {"type": "function", "function": {"name": "f"}}),
    ("tools[1].function", [_tool({"name": "g"}), {"type": "function", "function": "f"}], "required"),
    ("tools[0].function.parameters.required[1]",
     [_tool({"name": "f", "parameters": {"type": "object", "properties": {"a": {}}, "required": ["a", 3]}})],
     "required"),
    ("tools[0].function.parameters.properties",
     [_tool({"name": "f", "parameters": {"type": "object", "properties": ["a"]}})], "auto"),
    ("tools[0].function.parameters.required",
     [_tool({"name": "f", "parameters": {"type": "object", "properties": {"a": {}}, "required": "a"}})], "auto"),
    ("tools[0].function.parameters.properties.a",
     [_tool({"name": "f", "parameters": {"type": "object", "properties": {"a": 5}}})], "required"),
])
def test_malformed_tool_schemas_name_the_path(field, tools, choice):
    e = _err(_body({**CHAT, "tools": tools, "tool_choice": choice}))
    assert e.param == field and e.message.startswith(field + ":")

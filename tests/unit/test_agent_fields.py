"""Request fields coding agents send (daemon/api/schemas.py) and the sampler's penalties
(actors/decoding/penalties.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cairn.actors.engine.messages import Sampling
from cairn.actors.decoding.penalties import Penalties, Shaper
from cairn.daemon.api.schemas import APIError, parse_chat, parse_completion

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
READ = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}


def test_fields_agents_send_are_accepted():
    req = parse_chat({**BASE, "parallel_tool_calls": False, "stream_options": {"include_usage": True},
                      "verbosity": "low", "chat_template_kwargs": {"thinking": True},
                      "thinking": {"type": "enabled"}, "reasoning_effort": "max",
                      "presence_penalty": 0.5, "frequency_penalty": -0.25, "logit_bias": {"5": -100, "7": 2.5},
                      "tools": [READ], "tool_choice": "required",
                      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}})
    c = req.common
    assert (c.presence_penalty, c.frequency_penalty, c.logit_bias) == (0.5, -0.25, ((5, -100.0), (7, 2.5)))
    assert req.thinking == {"type": "enabled"} and req.template_kwargs == {"thinking": True}
    assert req.reasoning_effort == "max" and req.tool_choice == "required" and req.json_schema == {}


def test_other_servers_fields_close_to_known_names_are_not_typos():
    req = parse_chat({**BASE, "models": ["a", "b"], "reasoning_format": "deepseek"})
    assert req.common.ignored == ("models", "reasoning_format")


def test_unknown_fields_are_accepted_and_reported():
    req = parse_chat({**BASE, "provider": {"order": ["x"]}, "transforms": [], "top_a": 0})
    assert req.common.ignored == ("provider", "top_a", "transforms")
    assert parse_completion({"model": "m", "prompt": "x", "mirostat": 2}).common.ignored == ("mirostat",)


@pytest.mark.parametrize("typo,known", [("max_token", "max_tokens"), ("temprature", "temperature"),
                                        ("stream_option", "stream_options"), ("reasoning_efort", "reasoning_effort")])
def test_a_close_typo_of_a_known_field_is_refused_naming_both(typo, known):
    with pytest.raises(APIError) as e:
        parse_chat({**BASE, typo: 1})
    assert e.value.param == typo and f"did you mean {known!r}" in e.value.message


@pytest.mark.parametrize("body,param", [
    ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"logit_bias": {"a": 1}}, "logit_bias"), ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"), ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tools": [READ], "tool_choice": {"type": "function", "function": {"name": "write"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"), ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
])
def test_bad_values_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        parse_chat({**BASE, **body})
    assert e.value.status == 400 and e.value.param == param


def test_frequency_and_presence_penalties_follow_openai():
    p = Penalties(Sampling(max_tokens=1, presence_penalty=0.5, frequency_penalty=0.25), 6)
    for t in (2, 2, 4):
        p.accept(t)
    got = p.apply(np.zeros(6, dtype=np.float32))
    assert got.tolist() == [0, 0, -(2 * 0.25 + 0.5), 0, -(0.25 + 0.5), 0]


def test_logit_bias_shifts_logits_and_ignores_ids_past_the_vocabulary():
    p = Penalties(Sampling(max_tokens=1, logit_bias=((1, 100.0), (3, -100.0), (99, 5.0))), 4)
    assert p.apply(np.zeros(4, dtype=np.float32)).tolist() == [0, 100, 0, -100]


def test_shaper_leaves_the_models_logits_untouched_and_applies_a_mask():
    logits = np.array([3.0, 2.0, 1.0], dtype=np.float32)
    s = Shaper(Sampling(max_tokens=1, frequency_penalty=1.0), 3)
    s.accept(0)
    out = s.shape(logits, np.array([True, False, True]))
    assert logits.tolist() == [3.0, 2.0, 1.0]
    assert out.tolist() == [2.0, -np.inf, 1.0]


def test_stream_options_with_newer_keys_are_accepted():
    req = parse_chat({**BASE, "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert req.common.include_usage
    with pytest.raises(APIError) as e:
        parse_chat({**BASE, "stream_options": {"include_usage": "yes"}})
    assert e.value.param == "stream_options"


@pytest.mark.parametrize("parse, base", [(parse_chat, BASE), (parse_completion, {"model": "m", "prompt": "p"})])
def test_stop_strings_are_capped_in_count_and_length_naming_the_string(parse, base):
    ok = "✓" * 1024                                         # the cap counts characters, not bytes
    assert parse({**base, "stop": ["a", ok]}).common.stop == ("a", ok)
    with pytest.raises(APIError) as e:
        parse({**base, "stop": ["a", "b" * 1025]})
    assert e.value.status == 400 and e.value.param == "stop[1]"
    assert "1025 characters" in e.value.message and "at most 1024" in e.value.message
    with pytest.raises(APIError) as e:
        parse({**base, "stop": "b" * 1025})
    assert e.value.param == "stop" and "at most 1024" in e.value.message
    with pytest.raises(APIError) as e:
        parse({**base, "stop": ["a"] * 5})
    assert e.value.param == "stop" and "at most 4" in e.value.message

"""Cache diagnostics end to end (daemon/api/cache_diagnostics.py): the real kernel on the tiny model,
a real daemon, each API's turn 2 compared with turn 1 as the vendors document it.

The exact figures are checked against the prompts' ids as the daemon renders them (API._render_chat):
the first divergent token is their common prefix, and the tokens missed are turn 1's reusable prefix
(its prompt, plus its reply but the EOS when the reply table kept the reply) after it.
"""

from __future__ import annotations

import json

import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, real_loaded, request, post_ok as post

ON = {"checkpoint_min_tokens": 32}
SYSTEM = "You are a coding agent. " + " ".join(f"Rule {i}: read file_{i}.py before you change it." for i in range(12))
OPEN_PARAMS = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                                "line": {"type": "integer", "minimum": 1, "maximum": 999}},
               "required": ["path", "line"]}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)




def sse(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        lines = dict(ln.split(": ", 1) for ln in block.split("\n") if ": " in ln and not ln.startswith(":"))
        if "data" in lines and lines["data"] != "[DONE]":
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


def prompt_ids(loaded, parsed) -> list[int]:
    """The prompt's ids as the daemon renders them (no reply replayed: the divergences checked here
    come before any reply)."""
    from cairn.daemon.api.app import API
    from cairn.daemon.service.logs import get_logger

    api = API(inbox=None, tokenizer=loaded.tokenizer, renderer=loaded.renderer, model_id="tiny",
              context_length=loaded.context_length, vocab_size=int(loaded.model.vocab_size), max_tokens_default=16,
              fingerprint="f" * 16, log=get_logger())
    return list(api._render_chat(parsed, api.agent.options(parsed, api.reasoning))[0])


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def status(sock) -> dict:
    r = await request(sock, "GET", "/v1/status")
    return r.json()["cache_diagnostics"]


async def test_messages_diagnostics(loaded, tmp_path):
    from cairn.daemon.api.anthropic import parse_messages

    sock = tmp_path / "c.sock"
    tools = [{"name": "open_file", "description": "Open a file at a line", "input_schema": OPEN_PARAMS}]
    ask = [{"role": "user", "content": "Open the readme."}]
    body = {"model": "tiny", "max_tokens": 200, "temperature": 0, "system": SYSTEM, "messages": ask, "tools": tools,
            "tool_choice": {"type": "tool", "name": "open_file"}, "diagnostics": {"previous_message_id": None}}
    with trio.fail_after(240), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            t1 = await post(sock, "/v1/messages", body)
            assert t1["stop_reason"] == "tool_use" and t1["diagnostics"] is None      # a first turn: null
            turn2 = ask + [{"role": "assistant", "content": t1["content"]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": t1["content"][-1]["id"],
                                                         "content": "# Readme"}]}]
            same = {**body, "messages": turn2, "tool_choice": {"type": "auto"}, "max_tokens": 3,
                    "diagnostics": {"previous_message_id": t1["id"]}}
            t2 = await post(sock, "/v1/messages", same)
            changed = {**same, "system": SYSTEM + " Today is Monday.", "stream": True}
            r = await request(sock, "POST", "/v1/messages", changed)
            assert r.status == 200, r.body[:300]
            start = next(d for name, d in sse(r.body) if name == "message_start")["message"]
            lost = await post(sock, "/v1/messages", {**same, "diagnostics": {"previous_message_id": "msg_gone"}})
            plain = await post(sock, "/v1/messages", {k: v for k, v in same.items() if k != "diagnostics"})
            bad = await request(sock, "POST", "/v1/messages", {**same, "diagnostics": {"previous_message_id": 7}})
            st = await status(sock)
    p1 = t1["usage"]["input_tokens"] + t1["usage"]["cache_read_input_tokens"]
    reusable = p1 + t1["usage"]["output_tokens"] - 1           # the reply ended by itself: kept, but its EOS
    assert t2["diagnostics"] is None                           # nothing diverged: null, and all of it reused
    assert t2["usage"]["cache_read_input_tokens"] >= reusable
    first = common(prompt_ids(loaded, parse_messages(body)), prompt_ids(loaded, parse_messages(changed)))
    assert 0 < first < p1
    print(f"messages: turn 1 prompt {p1}, reusable {reusable}; changed system diverges at {first}")
    assert start["diagnostics"] == {"cache_miss_reason": {"type": "system_changed",
                                                          "cache_missed_input_tokens": reusable - first}}
    assert lost["diagnostics"] == {"cache_miss_reason": {"type": "previous_message_not_found"}}
    assert "diagnostics" in plain and plain["diagnostics"] is None
    assert bad.status == 400 and "diagnostics.previous_message_id" in bad.json()["error"]["message"]
    # cairn's own figures: the log line and /v1/status
    line = next(e for e in evs if e["event"] == "cache_diagnostics" and e["request_id"] == start["id"])
    assert line["reason"] == "system_changed" and line["first_divergent_token"] == first
    assert line["compared_to"] == t1["id"] and line["reusable_tokens"] == reusable and line["miss"]
    assert line["restored"]["from"] in ("checkpoint", "live_state", "none")
    recent = {e["request_id"]: e for e in st["recent"]}
    assert recent[start["id"]]["first_divergent_token"] == first
    assert recent[lost["id"]]["reason"] == "not_found"
    assert st["compared"] == 3 and st["misses"] == 2 and st["entries"] >= 4


async def test_responses_prompt_cache_diagnostics(loaded, tmp_path):
    from cairn.daemon.api.responses import parse_responses

    sock = tmp_path / "c.sock"
    ask = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in this repo?"}]}]
    body = {"model": "tiny", "instructions": SYSTEM, "input": ask, "max_output_tokens": 3, "temperature": 0}
    with trio.fail_after(240), capture_logs():
        async with daemon(loaded, sock, **ON):
            r1 = await post(sock, "/v1/responses", body)
            assert r1["prompt_cache_diagnostics"] is None                  # nothing asked: null
            more = ask + r1["output"] + [{"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": "And the tests?"}]}]
            same = {**body, "input": more, "prompt_cache_options": {"comparison_response_id": r1["id"]}}
            r2 = await post(sock, "/v1/responses", same)
            changed = {**same, "instructions": SYSTEM + " Today is Monday."}
            r3 = await post(sock, "/v1/responses", changed)
            r4 = await post(sock, "/v1/responses", {**same, "prompt_cache_options": {"comparison_response_id": "resp-x"}})
            r = await request(sock, "POST", "/v1/responses", {**same, "stream": True})
            completed = [d for name, d in sse(r.body) if name in ("response.completed", "response.incomplete")][-1]
            bad = await request(sock, "POST", "/v1/responses", {**same, "prompt_cache_options": {"ttl": "1h"}})
    p1 = r1["usage"]["input_tokens"]
    assert r2["prompt_cache_diagnostics"] == {"type": "cache_hit"}
    assert r2["usage"]["input_tokens_details"]["cached_tokens"] >= p1
    first = common(prompt_ids(loaded, parse_responses(body).chat), prompt_ids(loaded, parse_responses(changed).chat))
    d = r3["prompt_cache_diagnostics"]
    assert d["type"] == "cache_miss" and d["reason"] == "input_changed" and 0 < first < p1
    if r1["status"] == "incomplete":      # cut by max_output_tokens: the reply is not kept, the prompt is reusable
        assert d["comparison_reusable_tokens"] == p1
    assert d["cache_missed_tokens"] == d["comparison_reusable_tokens"] - first
    assert r4["prompt_cache_diagnostics"] == {"type": "comparison_response_not_found"}
    assert completed["response"]["prompt_cache_diagnostics"] == {"type": "cache_hit"}
    assert bad.status == 400 and bad.json()["error"]["param"] == "prompt_cache_options.ttl"


async def test_a_shortfall_is_logged_with_its_figures(loaded, tmp_path):
    """Chat completions ask for nothing, but a turn that extends the previous one and reuses less of
    it (checkpoints off, another conversation took the slot's live state) gets a log line and a
    /v1/status entry with the tokens lost."""
    sock = tmp_path / "c.sock"
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open the readme."}]
    body = {"model": "tiny", "messages": msgs, "max_tokens": 3, "temperature": 0}
    other = {"model": "tiny", "messages": [{"role": "user", "content": "Title this."}], "max_tokens": 2,
             "temperature": 0}
    with trio.fail_after(240), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoints=False):
            t1 = await post(sock, "/v1/chat/completions", body)
            await post(sock, "/v1/chat/completions", other)
            reply = {"role": "assistant", "content": t1["choices"][0]["message"]["content"]}
            t2 = await post(sock, "/v1/chat/completions", {**body, "messages": msgs + [
                reply, {"role": "user", "content": "And the license?"}]})
            st = await status(sock)
    p1 = t1["usage"]["prompt_tokens"]
    reused = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert reused < p1
    line = next(e for e in evs if e["event"] == "cache_diagnostics" and e["request_id"] == t2["id"])
    assert line["shortfall"] and not line["miss"] and line["reason"] is None and line["compared_to"] == t1["id"]
    assert line["first_divergent_token"] >= p1 and line["possible_tokens"] >= p1
    print(f"chat: turn 1 prompt {p1}; turn 2 reused {reused}, lost {line['tokens_lost']}")
    assert line["tokens_lost"] == line["possible_tokens"] - reused and line["restored"]["from"] != "checkpoint"
    assert st["shortfalls"] == 1 and st["recent"][-1]["request_id"] == t2["id"] and st["compared"] == 0

"""POST /v1/messages end to end with Anthropic's own client (the `anthropic` SDK): the real kernel on
the tiny (random-weight) model, a real daemon on a Unix socket (TCP for the key checks).

Random weights never choose a tool call by themselves: where a test needs one, tool_choice forces it
(the grammar constraint). The Claude Code test sends a request shaped as Claude Code sends it (its
public docs and traffic): several system blocks with cache_control, tools with input_schema,
metadata.user_id, a thinking budget, the beta headers, streamed, then the next turn.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, real_loaded

OPEN_FILE = {"name": "open_file", "description": "Open a file at a line", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                     "line": {"type": "integer", "minimum": 1, "maximum": 999}},
    "required": ["path", "line"]}}
LIST_DIR = {"name": "list_dir", "description": "List a directory", "input_schema": {
    "type": "object", "properties": {"depth": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["depth"]}}
TOOLS = [LIST_DIR, OPEN_FILE]
SYSTEM = "You are a coding agent."
ASK = [{"role": "user", "content": "Open the readme."}]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


def _client(sock, **kw):
    import anthropic
    import httpx2     # the anthropic SDK's own HTTP library (an httpx fork): its client, over the socket

    return anthropic.Anthropic(base_url="http://localhost", api_key="unused", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.HTTPTransport(uds=str(sock))), **kw)


def _valid(value: dict, schema: dict) -> None:
    assert set(value) == set(schema["required"]), value
    for k, v in value.items():
        s = schema["properties"][k]
        if s["type"] == "string":
            assert isinstance(v, str) and len(v) <= s["maxLength"]
        else:
            assert isinstance(v, int) and s["minimum"] <= v <= s["maximum"]


def _prompt(usage) -> int:
    """The whole prompt, as Anthropic counts it."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def _blocks(message) -> list[dict]:
    """A reply's content as a client sends it back in the next turn."""
    return [b.model_dump(exclude_none=True) for b in message.content]


async def test_forced_tool_call_round_trip_streamed_and_not(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    kw = dict(model="tiny", max_tokens=300, extra_body={"temperature": 0}, system=SYSTEM, messages=ASK, tools=TOOLS,
              tool_choice={"type": "tool", "name": "open_file"})
    with trio.fail_after(180), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = _client(sock)
                full = c.messages.create(**kw)
                raw = list(c.messages.create(**kw, stream=True))
                with c.messages.stream(**kw) as s:
                    streamed = s.get_final_message()
                turn2 = c.messages.create(**{**kw, "tool_choice": {"type": "auto"}, "max_tokens": 6, "messages": ASK + [
                    {"role": "assistant", "content": _blocks(full)},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": full.content[-1].id,
                                                  "content": "# Readme\nHello."}]}]})
                return full, raw, streamed, turn2

            full, raw, streamed, turn2 = await trio.to_thread.run_sync(use_client)
    assert full.type == "message" and full.role == "assistant" and full.model == "tiny"
    assert full.id.startswith("msg_") and full.stop_reason == "tool_use" and full.stop_sequence is None
    (call,) = [b for b in full.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "open_file"
    _valid(call.input, OPEN_FILE["input_schema"])
    # the stream: Anthropic's event order, and blocks that add up to the same call
    types = [e.type for e in raw]        # the SDK drops `ping` (the raw order is checked in the Claude Code test)
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types[1:-2] == ["content_block_start"] + ["content_block_delta"] * (len(types) - 5) + ["content_block_stop"]
    assert raw[1].content_block.type == "tool_use" and raw[1].content_block.name == "open_file"
    assert json.loads("".join(e.delta.partial_json for e in raw[2:-3])) == call.input
    assert raw[-2].delta.stop_reason == "tool_use" and raw[-2].usage.output_tokens == full.usage.output_tokens
    (scall,) = [b for b in streamed.content if b.type == "tool_use"]
    assert (scall.name, scall.input) == (call.name, call.input) and streamed.stop_reason == "tool_use"
    # usage: the repeated request read its prompt from the cache; the tool result's turn read all of it
    assert full.usage.cache_creation_input_tokens == 0 and full.usage.output_tokens >= 1
    assert _prompt(streamed.usage) == _prompt(full.usage) and streamed.usage.cache_read_input_tokens > 0
    assert turn2.usage.cache_read_input_tokens >= _prompt(full.usage), (full.usage, turn2.usage)
    assert turn2.stop_reason in ("end_turn", "max_tokens")


async def test_a_tool_call_cut_off_by_max_tokens_is_no_tool_use_streamed_or_not(loaded, tmp_path):
    """The forced call, with max_tokens half of what it takes: the reply ends inside the call, which
    is never a tool_use block (no partial input), and stop_reason is max_tokens."""
    sock = tmp_path / "c.sock"
    kw = dict(model="tiny", extra_body={"temperature": 0}, system=SYSTEM, messages=ASK, tools=TOOLS,
              tool_choice={"type": "tool", "name": "open_file"})
    with trio.fail_after(180), capture_logs() as logs:
        async with daemon(loaded, sock):
            def use_client():
                c = _client(sock)
                full = c.messages.create(**kw, max_tokens=300)
                half = full.usage.output_tokens // 2
                return full, c.messages.create(**kw, max_tokens=half), \
                    list(c.messages.create(**kw, max_tokens=half, stream=True))

            full, cut, raw = await trio.to_thread.run_sync(use_client)
    assert full.stop_reason == "tool_use"
    assert cut.stop_reason == "max_tokens" and not [b for b in cut.content if b.type == "tool_use"]
    assert raw[-2].delta.stop_reason == "max_tokens"
    assert not [e for e in raw if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert not [e for e in raw if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    # the cut was inside the call (so there was a call to hold back), for both replies
    assert sum("cut off" in e.get("problem", "") for e in logs if e["event"] == "model_output_malformed") == 2


async def test_thinking_blocks_streamed_and_not(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    kw = dict(model="tiny", max_tokens=1025, extra_body={"temperature": 0}, system=SYSTEM, messages=ASK,
              thinking={"type": "enabled", "budget_tokens": 1024})
    with trio.fail_after(240), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = _client(sock)
                full = c.messages.create(**kw)
                raw = list(c.messages.create(**kw, stream=True))
                return full, raw

            full, raw = await trio.to_thread.run_sync(use_client)
    think = full.content[0]
    assert think.type == "thinking" and think.thinking and think.signature.startswith("cairn.")
    deltas = [e.delta for e in raw if e.type == "content_block_delta"]
    assert raw[1].type == "content_block_start" and raw[1].content_block.type == "thinking"
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == think.thinking
    assert [d.signature for d in deltas if d.type == "signature_delta"] == [think.signature]
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    assert text == "".join(b.text for b in full.content if b.type == "text")
    assert raw[-2].delta.stop_reason == full.stop_reason


async def test_stop_sequences_end_the_reply_and_say_which(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    kw = dict(model="tiny", max_tokens=16, extra_body={"temperature": 0}, messages=ASK, thinking={"type": "disabled"})
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = _client(sock)
                free = c.messages.create(**kw)
                text = free.content[0].text
                stop = text[6:9]
                return text, stop, c.messages.create(**kw, stop_sequences=[stop]), \
                    list(c.messages.create(**kw, stop_sequences=[stop], stream=True))

            text, stop, stopped, raw = await trio.to_thread.run_sync(use_client)
    assert len(stop) == 3
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert "".join(b.text for b in stopped.content) == text[:text.index(stop)]
    assert (raw[-2].delta.stop_reason, raw[-2].delta.stop_sequence) == ("stop_sequence", stop)


async def test_count_tokens_and_errors_in_anthropics_shape(loaded, tmp_path):
    import anthropic

    sock = tmp_path / "c.sock"
    kw = dict(model="tiny", system=SYSTEM, messages=ASK, tools=TOOLS)
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = _client(sock)
                counted = c.messages.count_tokens(**kw)
                reply = c.messages.create(**kw, max_tokens=2)
                # as Claude Code sends it: the billing header, a system turn inside messages, adaptive
                # thinking with omitted display, effort and context_management: counted as rendered
                cc = dict(model="tiny", tools=TOOLS, system=[
                    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli;"},
                    {"type": "text", "text": SYSTEM}],
                    messages=[*ASK, {"role": "system", "content": "# Environment\n - cwd: /src"}],
                    thinking={"type": "adaptive", "display": "omitted"},
                    extra_body={"output_config": {"effort": "high"},
                                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
                counted_cc = c.messages.count_tokens(**cc)
                reply_cc = c.messages.create(**cc, max_tokens=2)
                errors = []
                for bad in ({"messages": [{"role": "user", "content": [
                                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                             "data": "iVBORw0KGgo="}}]}]},
                            {"model": "claude-sonnet-4-5"},
                            {"tool_choice": {"type": "tool", "name": "rm_rf"}},
                            {"max_tokens": 70000}):
                    try:
                        # timeout: else the SDK refuses a large max_tokens unstreamed before sending it
                        c.messages.create(**{**kw, "max_tokens": 2, **bad}, timeout=60)
                    except anthropic.APIStatusError as e:
                        errors.append(e)
                return counted, reply, counted_cc, reply_cc, errors

            counted, reply, counted_cc, reply_cc, errors = await trio.to_thread.run_sync(use_client)
    assert counted.input_tokens == _prompt(reply.usage) > 0
    assert counted_cc.input_tokens == _prompt(reply_cc.usage) > counted.input_tokens
    image, model, choice, too_long = errors
    assert isinstance(image, anthropic.BadRequestError) and image.body["type"] == "error"
    assert image.body["error"]["type"] == "invalid_request_error"
    assert image.body["error"]["message"].startswith("messages[0].content[0].type: 'image' blocks are not supported")
    assert isinstance(model, anthropic.NotFoundError) and model.body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-4-5" in model.body["error"]["message"]
    assert isinstance(choice, anthropic.BadRequestError) and "tool_choice.name" in choice.body["error"]["message"]
    assert too_long.status_code == 400 and "exceed context limit" in too_long.body["error"]["message"]


def _claude_code_request() -> dict:
    """A first turn as Claude Code sends it (shortened texts, same structure)."""
    hexid = "3f" * 32
    return {
        "model": "tiny",
        "max_tokens": 1100,
        "stream": True,
        "metadata": {"user_id": f"user_{hexid}_account__session_0b6a3b5e-7c1f-4a55-9b0e-2a1d7f3c9e11"},
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "\nYou are an interactive CLI tool that helps users with software engineering "
                                     "tasks. Use the instructions below and the tools available to you to assist "
                                     "the user.\n\n# Tone and style\nBe concise, direct, and to the point.\n\n"
                                     "# Following conventions\nMimic the code style of the files you edit.\n\n"
                                     "<env>\nWorking directory: /home/dev/project\nIs directory a git repo: Yes\n"
                                     "Platform: linux\n</env>",
             "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {"name": "Bash", "description": "Executes a given bash command in a persistent shell session.",
             "input_schema": {"type": "object", "properties": {
                 "command": {"type": "string", "description": "The command to execute"},
                 "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
                 "description": {"type": "string", "description": "Clear, concise description of the command"}},
                 "required": ["command"], "additionalProperties": False,
                 "$schema": "http://json-schema.org/draft-07/schema#"}},
            {"name": "Read", "description": "Reads a file from the local filesystem.",
             "input_schema": {"type": "object", "properties": {
                 "file_path": {"type": "string", "description": "The absolute path to the file to read"},
                 "offset": {"type": "number"}, "limit": {"type": "number"}},
                 "required": ["file_path"], "additionalProperties": False,
                 "$schema": "http://json-schema.org/draft-07/schema#"}},
            {"name": "Edit", "description": "Performs exact string replacements in files.",
             "input_schema": {"type": "object", "properties": {
                 "file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"},
                 "replace_all": {"type": "boolean", "default": False}},
                 "required": ["file_path", "old_string", "new_string"], "additionalProperties": False,
                 "$schema": "http://json-schema.org/draft-07/schema#"}},
            {"name": "TodoWrite", "description": "Create and manage a structured task list.",
             "input_schema": {"type": "object", "properties": {"todos": {"type": "array", "items": {
                 "type": "object", "properties": {
                     "content": {"type": "string", "minLength": 1},
                     "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                     "id": {"type": "string"}}, "required": ["content", "status", "id"],
                 "additionalProperties": False}}}, "required": ["todos"], "additionalProperties": False,
                 "$schema": "http://json-schema.org/draft-07/schema#"},
             "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the "
                                     "following context:\n# important-instruction-reminders\nDo what has been asked; "
                                     "nothing more, nothing less.\n</system-reminder>\n"},
            {"type": "text", "text": "the tests in tests/test_parser.py fail, fix them",
             "cache_control": {"type": "ephemeral"}}]}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }


CLAUDE_CODE_HEADERS = {"anthropic-version": "2023-06-01", "x-app": "cli", "user-agent": "claude-cli/2.0.0 (external, cli)",
                       "anthropic-dangerous-direct-browser-access": "true",
                       "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                                         "fine-grained-tool-streaming-2025-05-14"}


async def test_a_claude_code_request_and_its_next_turn_reuse_the_prompt(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    first = _claude_code_request()
    with trio.fail_after(300), capture_logs():
        async with daemon(loaded, sock):
            def turn(body):
                # POST /v1/messages?beta=true with the beta headers, as Claude Code does
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=240) as h:
                    r = h.post("http://localhost/v1/messages", params={"beta": "true"}, json=body,
                               headers=CLAUDE_CODE_HEADERS)
                return r

            def both():
                r1 = turn(first)
                c = _client(sock)
                with c.messages.stream(**{k: v for k, v in first.items() if k != "stream"},
                                       extra_headers=CLAUDE_CODE_HEADERS) as s:
                    m1 = s.get_final_message()
                # turn 2: the reply appended (its blocks as sent back, thinking and signature included)
                # and the next user message; Claude Code moves its cache breakpoint to the newest message
                msgs = [{"role": "user", "content": [{k: v for k, v in b.items() if k != "cache_control"}
                                                     for b in first["messages"][0]["content"]]},
                        {"role": "assistant", "content": _blocks(m1)},
                        {"role": "user", "content": [{"type": "text", "text": "now run them",
                                                      "cache_control": {"type": "ephemeral"}}]}]
                with c.messages.stream(**{k: v for k, v in first.items() if k not in ("stream", "messages")},
                                       messages=msgs, extra_headers=CLAUDE_CODE_HEADERS) as s:
                    m2 = s.get_final_message()
                return r1, m1, m2

            r1, m1, m2 = await trio.to_thread.run_sync(both)
    assert r1.status_code == 200, r1.text[:500]
    assert r1.headers["content-type"].startswith("text/event-stream")
    names = [ln[7:] for ln in r1.text.split("\n") if ln.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert m1.content[0].type == "thinking" and m1.content[0].thinking
    p1 = _prompt(m1.usage)
    assert m2.usage.cache_read_input_tokens >= 0.9 * p1, (m1.usage, m2.usage)
    assert _prompt(m2.usage) > p1 + m1.usage.output_tokens - 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_tcp_key_by_x_api_key_or_bearer(tiny_model_dir, tmp_path):
    import anthropic

    key = "sekrit-key"
    sock, port = tmp_path / "c.sock", _free_port()
    kw = dict(model="tiny", max_tokens=2, messages=ASK)
    with trio.fail_after(60), capture_logs():
        async with daemon(fake_loaded(tiny_model_dir), sock, tcp=f"127.0.0.1:{port}", api_key=key):
            def use_clients():
                base = f"http://127.0.0.1:{port}"
                by_key = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0).messages.create(**kw)
                by_token = anthropic.Anthropic(base_url=base, api_key=None, auth_token=key,
                                               max_retries=0).messages.create(**kw)
                try:
                    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(**kw)
                except anthropic.AuthenticationError as e:
                    return by_key, by_token, e

            by_key, by_token, wrong = await trio.to_thread.run_sync(use_clients)
    assert by_key.type == by_token.type == "message"
    assert wrong.status_code == 401 and wrong.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in wrong.body["error"]["message"]

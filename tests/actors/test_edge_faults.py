"""The HTTP edge with the fake kernel (tests/fake_kernel.py): refused requests are logged, a chat is
tokenized once, prompts that cannot fit are refused by their size before tokenizing, a trailing
assistant message is continued, and a long prefill progresses across a client's retries."""

from __future__ import annotations

import pytest
import trio
from structlog.testing import capture_logs

from cairn.daemon.protocol.dsv4.encoding import ChatOptions
from daemon_harness import daemon, fake_loaded, request

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_a_refused_request_leaves_one_info_line_with_the_reason_and_not_the_body(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    secret = "do-not-log-this-text"
    with trio.fail_after(30), capture_logs() as logs:
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/chat/completions",
                              {**CHAT, "messages": [{"role": "user", "content": secret}], "temperature": 3})
    assert r.status == 400
    (line,) = [e for e in logs if e["event"] == "request_rejected"]
    assert line["log_level"] == "info" and line["status"] == 400 and line["param"] == "temperature"
    assert line["code"] == r.json()["error"]["code"] and line["message"] == r.json()["error"]["message"]
    assert line["path"] == "/v1/chat/completions"
    assert not any(secret in repr(e) for e in logs)


class CountingTokenizer:
    """The daemon's tokenizer, counting the characters each whole-text tokenization was given."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def encode(self, text, *content):
        self.calls.append(("encode", len(text)))
        return self._tok.encode(text, *content)

    def encode_with_offsets(self, text, *content):
        self.calls.append(("encode_with_offsets", len(text)))
        return self._tok.encode_with_offsets(text, *content)

    def boundary_for_byte_offset(self, text, byte_offset):      # tokenizes `text` whole
        self.calls.append(("boundary_for_byte_offset", len(text)))
        return self._tok.boundary_for_byte_offset(text, byte_offset)


def _counting(tiny_model_dir, **kw):
    loaded = fake_loaded(tiny_model_dir, **kw)
    loaded.tokenizer = CountingTokenizer(loaded.tokenizer)
    return loaded


async def test_a_chat_prompt_is_tokenized_once(tiny_model_dir, tmp_path):
    """System prefix (checkpoint hint) and, in thinking mode, the turn's end: found from the one
    tokenization's offsets; only the short system prefix is tokenized again (to check it is a boundary)."""
    loaded = _counting(tiny_model_dir)
    sock = tmp_path / "c.sock"
    system, user = "You are terse. " * 20, "explain this " * 2000
    body = {**CHAT, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "reasoning_effort": "high"}
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/chat/completions", body)
    assert r.status == 200
    whole = [n for _, n in loaded.tokenizer.calls if n >= len(user)]
    assert len(whole) == 1                     # was 2: encode, then encode_with_offsets for the boundary
    assert sum(n for _, n in loaded.tokenizer.calls) < len(user) + 4 * len(system) + 2000


async def test_a_prompt_too_large_for_the_context_is_refused_by_its_size_before_tokenizing(tiny_model_dir, tmp_path):
    loaded = _counting(tiny_model_dir)
    tok = loaded.tokenizer
    limit = loaded.context_length * tok.max_token_bytes
    sock = tmp_path / "c.sock"
    big = "a" * (limit + 1)
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            chat = await request(sock, "POST", "/v1/chat/completions",
                                 {**CHAT, "messages": [{"role": "user", "content": big}]})
            cmpl = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": big, "max_tokens": 1})
            resp = await request(sock, "POST", "/v1/responses", {"model": "tiny", "input": big})
            health = await request(sock, "GET", "/health")
    for r, param in ((chat, "messages"), (cmpl, "prompt"), (resp, "input")):
        assert r.json()["error"]["message"].startswith(param + ":")
        err = r.json()["error"]
        assert r.status == 400 and err["code"] == "context_length_exceeded" and err["param"] == param
        assert f"at most {limit} bytes" in err["message"] and str(loaded.context_length) in err["message"]
    assert tok.calls == []                          # neither prompt was tokenized
    assert health.status == 200


def test_the_size_bound_is_the_longest_token_in_bytes(tiny_model_dir):
    loaded = fake_loaded(tiny_model_dir)
    tok = loaded.tokenizer
    assert tok.max_token_bytes == max(len(tok.token_bytes(i)) for i in range(tok.vocab_size))
    # the bound holds: no text of n bytes is fewer than n / max_token_bytes tokens
    text = "".join(tok.token_bytes(i).decode("utf-8", "ignore") for i in range(tok.vocab_size))
    assert len(tok.encode(text)) * tok.max_token_bytes >= len(text.encode())


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_a_long_prefill_progresses_across_a_client_that_gives_up_and_retries(tiny_model_dir, tmp_path,
                                                                                   endpoint):
    """Claude Code drops a stream after a spell without data and sends the request again. Each try
    goes on from where the cancelled one stopped (docs/prefill.md, "Resume"): the tries add up to
    the prompt, with at most one chunk per cancelled try computed twice. Work is counted in prefill
    tokens the kernel computed (fake_kernel's calls), not in time; the give-up time only sets how
    many tries it takes."""
    loaded = fake_loaded(tiny_model_dir, chunk_delay=0.02)
    sock = tmp_path / "c.sock"
    chunk, prompt = 16, [5 + (i % 200) for i in range(1200)]       # 75 chunks, ~1.5 s of prefill
    if endpoint == "/v1/completions":
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "stream": True}
    else:
        text = loaded.tokenizer.decode(prompt)
        body = {**CHAT, "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": text}],
                "max_tokens": 1, "stream": True}
        rendered = loaded.renderer.render(body["messages"])     # (the text holds control tokens' text)
        prompt = loaded.tokenizer.encode(rendered.text, rendered.content_spans)
    tries, done = 0, None
    with trio.fail_after(120), capture_logs() as logs:
        async with daemon(loaded, sock, chunk=chunk, segment=64):
            while done is None and tries < 60:
                tries += 1
                with trio.move_on_after(0.3):                       # the client's watchdog
                    done = await request(sock, "POST", endpoint, body)
    assert done is not None and done.status == 200 and done.events()[-1] == "[DONE]"
    computed = sum(n for what, n in loaded.model.calls if what == "prefill_chunk")
    plans = [e for e in logs if e["event"] == "prefill_plan"]
    assert tries >= 3 and len(plans) == tries                       # it was cut off, and every try was planned
    assert computed <= len(prompt) + (tries - 1) * chunk            # no more than a chunk redone per try
    assert [p["reused_tokens"] for p in plans][1:] == sorted(p["reused_tokens"] for p in plans[1:])
    assert plans[-1]["reused_tokens"] > 0                           # the last try went on from the others
    print(f"{endpoint}: {len(prompt)} prompt tokens, {tries} tries, {computed} tokens computed")


async def test_a_continued_assistant_message_in_thinking_mode_is_answered_as_content(tiny_model_dir, tmp_path):
    """aider's prefix continuation with reasoning on: the prompt ends inside the open assistant turn,
    past `</think>`, so what the model writes next is content (not reasoning waiting for `</think>`)."""
    loaded = fake_loaded(tiny_model_dir)
    tok = loaded.tokenizer
    messages = [{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn moon,"}]
    prompt = tok.encode(loaded.renderer.render(messages, options=ChatOptions(thinking=True, effort="high")).text)
    assert tok.decode(prompt).endswith("</think>Autumn moon,")
    loaded.model.script, loaded.model.script_after = tok.encode(" a crow"), len(prompt)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/chat/completions",
                              {**CHAT, "messages": messages, "reasoning_effort": "high",
                               "max_tokens": len(tok.encode(" a crow")), "temperature": 0})
    msg = r.json()["choices"][0]["message"]
    assert r.status == 200 and msg["content"] == " a crow" and not msg.get("reasoning_content")

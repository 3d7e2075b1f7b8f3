"""A control token the model writes that is not part of the reply format (`<｜User｜>`, BOS,
`<｜Assistant｜>`, `<｜latest_reminder｜>`, …) never reaches a client as text: every API, streamed or
not (the fake kernel writes a scripted reply)."""

from __future__ import annotations

import json

import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, request

DROPPED = ["<｜User｜>", "<｜begin▁of▁sentence｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "<｜pad｜>"]
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"model": "tiny", "messages": MESSAGES, "temperature": 0},
    "/v1/messages": {"model": "tiny", "messages": MESSAGES, "temperature": 0},
    "/v1/responses": {"model": "tiny", "input": "hi", "temperature": 0},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "temperature": 0},
}

_MAX = {path: "max_output_tokens" if path == "/v1/responses" else "max_tokens" for path in BODIES}


def _text(path: str, r, stream: bool) -> str:
    if not stream:
        j = r.json()
        if path == "/v1/chat/completions":
            return j["choices"][0]["message"]["content"]
        if path == "/v1/completions":
            return j["choices"][0]["text"]
        if path == "/v1/messages":
            return "".join(b.get("text", "") for b in j["content"])
        return "".join(c["text"] for o in j["output"] for c in o.get("content") or [] if "text" in c)
    events = [json.loads(line[6:]) for line in r.body.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    if path == "/v1/chat/completions":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    if path == "/v1/completions":
        return "".join(e["choices"][0]["text"] for e in events if e["choices"])
    if path == "/v1/messages":
        return "".join(e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta")
    return "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta")


def _prompt_tokens(path: str, r) -> int:
    u = r.json()["usage"]
    return u.get("prompt_tokens", u.get("input_tokens"))


async def test_a_reply_never_carries_a_control_tokens_text(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    tok = loaded.tokenizer
    script = tok.encode("Hi") + [tok.token_to_id(t) for t in DROPPED] + tok.encode(" there") + [tok.eos_id]
    sock = tmp_path / "c.sock"
    seen = {}
    with trio.fail_after(120), capture_logs() as logs:
        async with daemon(loaded, sock):
            for path, body in BODIES.items():
                loaded.model.script = None
                probe = await request(sock, "POST", path, {**body, _MAX[path]: 1})
                # another prompt takes the slot: the next request starts from logits computed with the script
                await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 1})
                loaded.model.script, loaded.model.script_after = script, _prompt_tokens(path, probe)
                for stream in (False, True):
                    before = len(logs)
                    r = await request(sock, "POST", path, {**body, _MAX[path]: len(script) + 2, "stream": stream})
                    assert r.status == 200, r.body
                    seen[path, stream] = _text(path, r, stream)
                    assert not any(t.encode() in r.body for t in DROPPED), (path, stream)
                    dropped = [e["token"] for e in logs[before:] if e["event"] == "reply_control_token_dropped"]
                    assert dropped == DROPPED, (path, stream)        # each one said at debug level
    assert seen == {k: "Hi there" for k in seen} and len(seen) == 8

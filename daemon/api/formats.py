"""OpenAI response shapes, field for field: chat.completion(.chunk), text_completion, usage, logprobs.

Pure: plain values in, dicts out. Token strings come from the tokenizer's bytes (invalid UTF-8
pieces of a multi-byte character are shown with U+FFFD; `bytes` carries the exact bytes).
"""

from __future__ import annotations

import codecs

from cairn.actors.engine.messages import Usage


def usage_dict(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def token_text(tok, token_id: int) -> str:
    return tok.token_bytes(token_id).decode("utf-8", errors="replace")


def chat_logprob(tok, token_id: int, logprob: float, top) -> dict:
    def one(i: int, lp: float) -> dict:
        return {"token": token_text(tok, i), "logprob": lp, "bytes": list(tok.token_bytes(i))}
    return {**one(token_id, logprob), "top_logprobs": [one(i, lp) for i, lp in top]}


def chat_message(content: str, *, reasoning: str | None = None, tool_calls: list | None = None) -> dict:
    """The assistant message: content (None when the reply is only tool calls), the reasoning as
    `reasoning_content` (DeepSeek's own API's name, the one most clients read; thinking mode only), and
    the tool calls."""
    msg = {"role": "assistant", "content": None if tool_calls and not content else content, "refusal": None}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = [tool_call(c.id, c.name, c.arguments) for c in tool_calls]
    return msg


def tool_call(call_id: str, name: str, arguments: str, index: int | None = None) -> dict:
    out = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if index is not None:
        out = {"index": index, **out}
    return out


def chat_completion(rid: str, created: int, model: str, message: dict | str, finish: str, usage: Usage,
                    logprobs: list | None, fingerprint: str) -> dict:
    if isinstance(message, str):
        message = chat_message(message)
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": message,
                     "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                     "finish_reason": finish}],
        "usage": usage_dict(usage),
    }


def chat_chunk(rid: str, created: int, model: str, delta: dict, *, finish: str | None = None,
               logprobs: list | None = None, fingerprint: str, usage: Usage | None = None,
               no_choices: bool = False, include_usage: bool = False) -> dict:
    """`include_usage` (the client's stream_options.include_usage): every chunk carries `usage`, null but
    on the final extra one, as OpenAI sends it; without it no chunk has the key at all."""
    out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
           "system_fingerprint": fingerprint, "choices": []}
    if not no_choices:
        out["choices"] = [{"index": 0, "delta": delta,
                           "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                           "finish_reason": finish}]
    if usage is not None or include_usage:
        out["usage"] = None if usage is None else usage_dict(usage)
    return out


class LegacyLogprobs:
    """Builds {tokens, token_logprobs, top_logprobs, text_offset} as tokens arrive.

    text_offset counts characters of the returned text (echoed prompt first)."""

    def __init__(self, tok, start_offset: int = 0) -> None:
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.offset = start_offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, logprob: float | None, top) -> dict:
        s = token_text(self._tok, token_id)
        self.tokens.append(s)
        self.token_logprobs.append(logprob)
        top_d = None if logprob is None else {token_text(self._tok, i): lp for i, lp in top}
        self.top_logprobs.append(top_d)
        self.text_offset.append(self.offset)
        self.offset += len(self._utf8.decode(self._tok.token_bytes(token_id)))
        return {"tokens": [s], "token_logprobs": [logprob], "top_logprobs": [top_d],
                "text_offset": [self.text_offset[-1]]}

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


def completion(rid: str, created: int, model: str, text: str, finish: str | None, usage: Usage | None,
               logprobs: dict | None, fingerprint: str, *, chunk: bool = False) -> dict:
    out = {"id": rid, "object": "text_completion", "created": created, "model": model,
           "system_fingerprint": fingerprint,
           "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}
    if not chunk or usage is not None:
        out["usage"] = None if usage is None else usage_dict(usage)
    return out

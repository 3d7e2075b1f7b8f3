"""OpenAI request shapes: JSON objects -> validated, typed requests. Errors name the field.

Pure (no trio, no kernel). Unknown top-level fields are refused unless listed as accepted-and-
ignored, so a typo (`max_token`) fails loudly instead of silently using a default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


class APIError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or {400: "invalid_request_error", 401: "authentication_error",
                             404: "invalid_request_error", 413: "invalid_request_error",
                             429: "rate_limit_error"}.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def parse_json_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_utf8") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                       code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return obj


# --- field readers ----------------------------------------------------------------------------

def _number(d: dict, key: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(key, f"expected a number, got {type(v).__name__}", "invalid_type")
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(key, f"{v} is out of range; expected {'(' if lo_open else '['}{lo}, {hi}]")
    return float(v)


def _int(d: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(key, f"expected an integer, got {type(v).__name__}", "invalid_type")
    if v < lo or (hi is not None and v > hi):
        raise bad(key, f"{v} is out of range; expected {lo}..{hi if hi is not None else ''}".rstrip("."))
    return v


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(key, f"expected true or false, got {type(v).__name__}", "invalid_type")
    return v


def _stop(d: dict) -> tuple[str, ...]:
    v = d.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        if len(v) > 4:
            raise bad("stop", f"at most 4 stop strings, got {len(v)}")
        return tuple(s for s in v if s)
    raise bad("stop", "expected a string or a list of strings", "invalid_type")


def _check_unknown(d: dict, known: set[str]) -> None:
    unknown = sorted(set(d) - known)
    if unknown:
        raise bad(unknown[0], f"unknown field (supported: {', '.join(sorted(known))})", "unknown_field")


def _only_default(d: dict, key: str, ok) -> None:
    if key in d and d[key] is not None and not ok(d[key]):
        raise bad(key, f"{d[key]!r} is not supported by this server", "unsupported_value")


_COMMON = {"model", "stream", "stream_options", "temperature", "top_p", "top_k", "seed", "stop", "n",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "user", "max_tokens",
           "ignore_eos", "metadata", "store", "service_tier"}
_CHAT = _COMMON | {"messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens", "logprobs",
                   "top_logprobs", "response_format", "reasoning_effort", "modalities", "prediction"}
_COMPLETION = _COMMON | {"prompt", "echo", "logprobs", "suffix", "best_of"}


@dataclass(frozen=True)
class CommonParams:
    model: str
    stream: bool
    include_usage: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    max_tokens: int | None          # None: the server default (bounded by the context)
    ignore_eos: bool


@dataclass(frozen=True)
class ChatRequest:
    common: CommonParams
    messages: list
    tools: list | None
    logprobs: bool
    top_logprobs: int


@dataclass(frozen=True)
class CompletionRequest:
    common: CommonParams
    prompt_text: str | None         # the prompt as given, when it was a string
    prompt_ids: list[int] | None    # the prompt as given, when it was token ids
    echo: bool
    logprobs: int | None            # None: off; 0..20


def _common(d: dict, *, max_tokens_min: int, max_tokens_key: str = "max_tokens") -> CommonParams:
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "required: a model id string (see GET /v1/models)",
                  "missing_field" if model is None else "invalid_type")
    so = d.get("stream_options")
    if so is not None and (not isinstance(so, dict) or set(so) - {"include_usage", "continuous_usage_stats"}):
        raise bad("stream_options", 'expected {"include_usage": true|false}', "invalid_type")
    _only_default(d, "n", lambda v: v == 1)
    _only_default(d, "best_of", lambda v: v == 1)
    _only_default(d, "presence_penalty", lambda v: v == 0)
    _only_default(d, "frequency_penalty", lambda v: v == 0)
    _only_default(d, "repetition_penalty", lambda v: v == 1)
    _only_default(d, "logit_bias", lambda v: v == {})
    _only_default(d, "suffix", lambda v: v == "")
    if "user" in d and d["user"] is not None and not isinstance(d["user"], str):
        raise bad("user", "expected a string", "invalid_type")
    max_tokens = _int(d, max_tokens_key, None, max_tokens_min)
    if max_tokens_key != "max_tokens" and max_tokens is None:
        max_tokens = _int(d, "max_tokens", None, max_tokens_min)
    top_k = _int(d, "top_k", 0, -1)
    seed = d.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("seed", "expected an integer", "invalid_type")
    return CommonParams(
        model=model,
        stream=_bool(d, "stream", False),
        include_usage=bool(so and so.get("include_usage")),
        temperature=_number(d, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(d, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=max(top_k, 0),
        seed=None if seed is None else seed % (1 << 64),
        stop=_stop(d),
        max_tokens=max_tokens,
        ignore_eos=_bool(d, "ignore_eos", False),
    )


def parse_chat(d: dict) -> ChatRequest:
    _check_unknown(d, _CHAT)
    common = _common(d, max_tokens_min=1, max_tokens_key="max_completion_tokens")
    messages = d.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "required: a non-empty list of messages",
                  "missing_field" if messages is None else "invalid_type")
    tools = d.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", "expected a list of tools", "invalid_type")
    rf = d.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise bad("response_format", 'only {"type": "text"} is supported', "unsupported_value")
    logprobs = _bool(d, "logprobs", False)
    top = _int(d, "top_logprobs", 0, 0, 20)
    if top and not logprobs:
        raise bad("top_logprobs", "requires logprobs: true")
    return ChatRequest(common, messages, tools or None, logprobs, top)


def parse_completion(d: dict, context_length: int | None = None) -> CompletionRequest:
    """`context_length`: token-id prompts that cannot fit are refused before their ids are looked at."""
    _check_unknown(d, _COMPLETION)
    common = _common(d, max_tokens_min=0)
    prompt = d.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                      # a batch of one
    text = ids = None
    if isinstance(prompt, list) and context_length is not None and len(prompt) >= context_length:
        raise APIError(400, f"prompt: the prompt is {len(prompt)} tokens; this model's context is "
                       f"{context_length} tokens", param="prompt", code="context_length_exceeded")
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif prompt is None:
        raise bad("prompt", "required: a string or a list of token ids", "missing_field")
    else:
        raise bad("prompt", "expected a string or a list of token ids (batches are not supported)",
                  "invalid_type")
    logprobs = _int(d, "logprobs", None, 0, 20)
    return CompletionRequest(common, text, ids, _bool(d, "echo", False), logprobs)

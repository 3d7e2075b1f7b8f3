"""OpenAI request shapes: JSON objects -> validated, typed requests. Errors name the field.

Pure (no trio, no kernel). Unknown top-level fields are accepted (agents send provider-specific
extras; the API logs each name once) unless the name is a close misspelling of a known field: a typo
(`max_token`) fails loudly instead of silently using a default.
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass, field


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
        obj = json.loads(text)   # NaN/Infinity read as floats here; _check_values refuses them
    except json.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                       code="invalid_json") from None
    except RecursionError:   # e.g. 100,000 `[`: the parser's recursion runs out first
        raise APIError(400, f"request body is nested too deeply; at most {MAX_DEPTH} levels of arrays and "
                       "objects are accepted", code="invalid_json") from None
    except ValueError as e:   # an integer past Python's digit limit (int_max_str_digits)
        raise APIError(400, f"request body has a number too long to read (over {sys.get_int_max_str_digits()} "
                       f"digits); integers may have at most {MAX_INT_BITS} bits", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    _check_values(obj)
    return obj


MAX_DEPTH = 64          # levels of nested arrays/objects; tool schemas and messages use well under 20
MAX_INT_BITS = 64       # any integer field (seed is the widest: 64 bits); larger ones overflow the engine


def _path(parts: tuple) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def _check_values(obj: dict) -> None:
    """Refuse, naming the field: nesting past MAX_DEPTH, non-finite numbers (NaN, Infinity, 1e999),
    integers wider than MAX_INT_BITS, and strings with lone surrogates (`"\\ud800"`: valid JSON, but
    no UTF-8 exists for them, so the tokenizer and every encoder downstream would fail). Scalars are
    checked in place (a 60k-id prompt costs one pass, no path per element); paths are built on error."""
    stack = [((), obj)]
    while stack:
        parts, v = stack.pop()
        if len(parts) >= MAX_DEPTH:
            # parsed, but deeper than the template renderer and the grammar compiler recurse safely
            raise APIError(400, f"request body is nested too deeply at {_path(parts)}; at most {MAX_DEPTH} "
                           "levels of arrays and objects are accepted", param=_path(parts), code="invalid_json")
        if type(v) is list and v and all(type(x) is int for x in v):   # token ids: one pass, in C
            if -_INT_LIMIT <= min(v) and max(v) <= _INT_LIMIT:
                continue
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if type(x) in (dict, list):
                stack.append((parts + (k,), x))
            elif type(x) is str:
                if not x.isascii() and _has_surrogate(x):
                    raise bad(_path(parts + (k,)), "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which "
                              "is not a character; send valid Unicode", "invalid_string")
            elif type(x) is float:
                if x != x or x in (_INF, -_INF):
                    raise bad(_path(parts + (k,)), f"{'NaN' if x != x else 'Infinity'} is not a number JSON "
                              "allows; send a finite number", "invalid_value")
            elif type(x) is int and not -_INT_LIMIT <= x <= _INT_LIMIT:
                raise bad(_path(parts + (k,)), f"an integer of {x.bit_length()} bits is too large; at most "
                          f"{MAX_INT_BITS} bits", "invalid_value")
            if type(k) is str and not k.isascii() and _has_surrogate(k):
                raise bad(_path(parts + (k,)), "the key contains a lone UTF-16 surrogate; send valid Unicode",
                          "invalid_string")


_INF = float("inf")
_INT_LIMIT = (1 << MAX_INT_BITS) - 1


def _has_surrogate(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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
        raise bad(key, f"{v} is out of range; expected an integer "
                  + (f"in [{lo}, {hi}]" if hi is not None else f"of at least {lo}") + _INT_NOTES.get(key, ""))
    return v


# What bounds a field beyond its minimum, where that depends on the request (said in the refusal).
_INT_NOTES = {k: " (and at most the context left after the prompt)"
              for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")}


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(key, f"expected true or false, got {type(v).__name__}", "invalid_type")
    return v


MAX_STOP = 4              # stop strings per request (OpenAI's limit)
MAX_STOP_CHARS = 1024     # per stop string: text that may start one is held back, so this bounds the delay


def _stop(d: dict) -> tuple[str, ...]:
    v = d.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        if len(v) > MAX_STOP_CHARS:
            raise bad("stop", f"{len(v)} characters; a stop string may have at most {MAX_STOP_CHARS}")
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        if len(v) > MAX_STOP:
            raise bad("stop", f"at most {MAX_STOP} stop strings, got {len(v)}")
        for i, s in enumerate(v):
            if len(s) > MAX_STOP_CHARS:
                raise bad(f"stop[{i}]", f"{len(s)} characters; a stop string may have at most {MAX_STOP_CHARS}")
        return tuple(s for s in v if s)
    raise bad("stop", "expected a string or a list of strings", "invalid_type")


TYPO_CUTOFF = 0.85   # difflib ratio above which an unknown name is taken for a misspelt known one


# Other servers' and routers' fields that clients send and this server ignores; some are close to a
# known name (`models` ~ `model`, `reasoning_format` ~ `reasoning_effort`) and must not read as typos.
FOREIGN_FIELDS = {"models", "reasoning_format", "provider", "transforms", "route", "usage", "include_reasoning",
                  "prompt_cache_key", "safety_identifier", "enable_thinking", "chat_template", "guided_json",
                  "guided_regex", "guided_choice", "guided_grammar", "min_p", "top_a", "typical_p", "cache_prompt"}


def _check_unknown(d: dict, known: set[str]) -> tuple[str, ...]:
    """Unknown names, accepted; a close misspelling of a known field is refused, naming both."""
    unknown = sorted(set(d) - known)
    for name in unknown:
        if name in FOREIGN_FIELDS:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=TYPO_CUTOFF)
        if close:
            raise bad(name, f"unknown field; did you mean {close[0]!r}? (supported: {', '.join(sorted(known))})",
                      "unknown_field")
    return tuple(unknown)


def _only_default(d: dict, key: str, ok) -> None:
    if key in d and d[key] is not None and not ok(d[key]):
        raise bad(key, f"{d[key]!r} is not supported by this server", "unsupported_value")


_COMMON = {"model", "stream", "stream_options", "temperature", "top_p", "top_k", "seed", "stop", "n",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "user", "max_tokens",
           "ignore_eos", "metadata", "store", "service_tier"}
_CHAT = _COMMON | {"messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens", "logprobs",
                   "top_logprobs", "response_format", "reasoning_effort", "modalities", "prediction",
                   "verbosity", "chat_template_kwargs", "thinking", "reasoning"}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias), checked against the vocabulary later
    ignored: tuple[str, ...] = ()   # unknown top-level fields, accepted (logged once per name)


@dataclass(frozen=True)
class ChatRequest:
    common: CommonParams
    messages: list
    tools: list | None
    logprobs: bool
    top_logprobs: int
    thinking: object = None               # the `thinking` field ({"type": "enabled"|"disabled"} or a bool)
    template_kwargs: dict = field(default_factory=dict)   # chat_template_kwargs
    reasoning_effort: str | None = None
    response_format: dict | None = None   # None or {"type": "json_object"} or {"type": "json_schema", ...}
    tool_choice: object = "auto"          # "none" | "auto" | "required" | {"function": {"name": ...}}
    parallel_tool_calls: bool = True      # False: a forced reply makes exactly one call
    dropped_nonces: tuple[str, ...] = ()  # where known per-request nonces were left out (protocol/nonces.py)
    # a comparison with an earlier response (api/cache_diagnostics.Ask: Anthropic's `diagnostics`,
    # OpenAI's `prompt_cache_options.comparison_response_id`), or None
    diagnostics: object = None

    @property
    def json_schema(self) -> dict | None:
        """The schema the reply must follow (json_schema), {} for any JSON object, None for free text."""
        rf = self.response_format
        if rf is None:
            return None
        return rf["json_schema"].get("schema", {}) if rf["type"] == "json_schema" else {}

    @property
    def callable_tools(self) -> list | None:
        """The tools the model may call: none under tool_choice "none" (they stay in the prompt, as
        OpenAI documents, but the call block cannot be opened and is never parsed)."""
        return None if self.tool_choice == "none" else self.tools

    @property
    def forced_tool(self) -> str | None:
        """A named tool_choice: the function that must be called."""
        tc = self.tool_choice
        return tc["function"]["name"] if isinstance(tc, dict) else None


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
    # Other keys (include_obfuscation, continuous_usage_stats, …) are accepted and ignored.
    if so is not None and (not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool)):
        raise bad("stream_options", 'expected {"include_usage": true|false}', "invalid_type")
    _only_default(d, "n", lambda v: v == 1)
    _only_default(d, "best_of", lambda v: v == 1)
    _only_default(d, "repetition_penalty", lambda v: v == 1)
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
        presence_penalty=_number(d, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(d, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(d),
    )


def _logit_bias(d: dict) -> tuple[tuple[int, float], ...]:
    v = d.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad("logit_bias", 'expected an object {"token id": bias}', "invalid_type")
    out = []
    for k, b in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad("logit_bias", f"key {k[:40]!r} is not a token id (an integer as a string)") from None
        if tid < 0:
            raise bad("logit_bias", f"token id {tid} is negative")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad("logit_bias", f"bias for {k} must be a number from -100 to 100, got {b!r}")
        out.append((tid, float(b)))
    return tuple(sorted(out))


def parse_chat(d: dict) -> ChatRequest:
    ignored = _check_unknown(d, _CHAT)
    common = _common(d, max_tokens_min=1, max_tokens_key="max_completion_tokens")
    messages = d.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "required: a non-empty list of messages",
                  "missing_field" if messages is None else "invalid_type")
    tools = _tools(d.get("tools"))
    logprobs = _bool(d, "logprobs", False)
    top = _int(d, "top_logprobs", 0, 0, 20)
    if top and not logprobs:
        raise bad("top_logprobs", "requires logprobs: true")
    parallel = _bool(d, "parallel_tool_calls", True)
    if d.get("verbosity") is not None and d["verbosity"] not in ("low", "medium", "high"):
        raise bad("verbosity", f"{d['verbosity']!r}; expected low, medium or high")
    kwargs = d.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs", "expected an object", "invalid_type")
    thinking = d.get("thinking")
    if thinking is not None and not isinstance(thinking, bool) and not (
            isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled", "auto", None)):
        raise bad("thinking", 'expected {"type": "enabled"} or {"type": "disabled"}', "invalid_type")
    effort = d.get("reasoning_effort")
    if effort is None and isinstance(d.get("reasoning"), dict):   # OpenRouter's shape: {"effort": ...}
        effort = d["reasoning"].get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad("reasoning_effort", f"{effort!r}; expected one of {', '.join(REASONING_EFFORTS)}")
    common = CommonParams(**{**common.__dict__, "ignored": ignored})
    return ChatRequest(common, messages, tools or None, logprobs, top, thinking=thinking,
                       template_kwargs=kwargs or {}, reasoning_effort=effort,
                       response_format=_response_format(d.get("response_format")),
                       tool_choice=_tool_choice(d.get("tool_choice"), tools or []), parallel_tool_calls=parallel)


def _tools(tools) -> list | None:
    """The tools' shapes, checked before tool_choice and the call grammar read them."""
    from cairn.daemon.protocol.chat import ChatTemplateError, check_tools

    try:
        check_tools(tools)
    except ChatTemplateError as e:
        where = str(e).split(":", 1)[0]
        raise APIError(400, str(e), param=where, code="invalid_type") from None
    return tools


def _response_format(rf) -> dict | None:
    if rf is None or rf == {"type": "text"}:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("response_format", 'expected {"type": "text" | "json_object" | "json_schema"}', "invalid_value")
    if rf["type"] == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise bad("response_format.json_schema",
                      'expected {"name": ..., "schema": {JSON schema}}', "invalid_value")
    return rf


def _tool_choice(tc, tools: list):
    if tc is None:
        return "auto"
    if tc in ("none", "auto", "required"):
        if tc == "required" and not tools:
            raise bad("tool_choice", '"required" needs tools')
        return tc
    name = tc.get("function", {}).get("name") if isinstance(tc, dict) and isinstance(tc.get("function"), dict) else None
    if not isinstance(name, str):
        raise bad("tool_choice", 'expected "none", "auto", "required" or {"type": "function", "function": '
                                 '{"name": ...}}', "invalid_value")
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    if name not in names:
        raise bad("tool_choice", f"function {name!r} is not among the tools ({', '.join(map(str, names)) or 'none'})")
    return tc


def parse_completion(d: dict, context_length: int | None = None) -> CompletionRequest:
    """`context_length`: token-id prompts that cannot fit are refused before their ids are looked at."""
    ignored = _check_unknown(d, _COMPLETION)
    common = _common(d, max_tokens_min=0)
    common = CommonParams(**{**common.__dict__, "ignored": ignored})
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

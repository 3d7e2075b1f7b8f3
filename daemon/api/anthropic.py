"""Anthropic Messages API requests -> the internal chat request (schemas.ChatRequest). Pure.

POST /v1/messages shares the chat pipeline: this module only translates, so a conversation sent
through the Messages API renders exactly as the same conversation sent to /v1/chat/completions
(and so shares its checkpoints). What maps to what (docs/api.md, "POST /v1/messages"):

- `system` (a string or text blocks) -> one system message; `cache_control` is accepted and
  dropped: every prefix is cached here, so the breakpoints a client moves between turns never
  change the rendered prompt. A block that is wholly a known per-request nonce (Claude Code's
  billing header; daemon/protocol/nonces.py) is left out. A `role: "system"` message inside
  `messages` (Claude Code's environment block) -> a system message at its place.
- user `text` blocks -> a user message; `tool_result` blocks -> tool messages (`is_error` prefixes
  the result with "Error: "); assistant `text` -> content, `thinking` -> reasoning_content,
  `tool_use` -> tool_calls; `redacted_thinking` is dropped (it cannot be read).
- `tools[].input_schema` -> function parameters; `tool_choice` auto / any / tool / none -> auto /
  required / a named function / none (any and tool go through the grammar constraint);
  `disable_parallel_tool_use` -> parallel_tool_calls false.
- `thinking` enabled, adaptive or between_tools -> V4's thinking mode; disabled or absent -> chat
  mode (whether to think follows this field alone). `budget_tokens` is checked as Anthropic checks
  it but not enforced: V4 has no token budget for its reasoning. `output_config.effort` ->
  reasoning_effort (V4's effort levels, which only matter in thinking mode), `output_config.format`
  (a JSON schema) -> response_format json_schema. `context_management.edits`
  `clear_thinking_20251015` is accepted and changes nothing: V4's encoding renders earlier reasoning
  by its own rule.
- `stop_sequences` -> stop; `max_tokens`, `temperature`, `top_p`, `top_k` as they are; `metadata`
  is checked and not used; the top-level `cache_control` is accepted (every prefix is cached).
- `diagnostics.previous_message_id` -> `ChatRequest.diagnostics`: this prompt compared with that
  earlier response's, answered in the reply's `diagnostics` (cache_diagnostics.py).

Refused with a 400 naming the field: images and documents (this model reads text), server tools,
a final assistant message (prefill), and anything malformed. Errors leave this module as
schemas.APIError; `error_body` gives them Anthropic's shape and status.
"""

from __future__ import annotations

from dataclasses import replace

from cairn.daemon.protocol.nonces import nonce_name

from .cache_diagnostics import Ask
from .schemas import APIError, ChatRequest, CommonParams, MAX_STOP_CHARS, _check_unknown, bad

FIELDS = {"model", "messages", "max_tokens", "system", "tools", "tool_choice", "thinking", "stop_sequences",
          "temperature", "top_p", "top_k", "metadata", "stream", "service_tier", "cache_control", "output_config",
          "context_management", "diagnostics"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control", "output_config",
                "context_management"}
THINKING_TYPES = ("enabled", "adaptive", "between_tools", "disabled")
THINKING_DISPLAYS = ("summarized", "omitted", "updates")
# context_management.edits types that leave V4's rendering as it is: V4's encoding already decides
# which earlier reasoning the prompt keeps (docs/api.md, "context_management").
CONTEXT_EDITS = ("clear_thinking_20251015",)
EFFORTS = ("low", "medium", "high", "xhigh", "max")   # output_config.effort: the chat request's reasoning_effort
MIN_THINKING_BUDGET = 1024     # Anthropic's minimum budget_tokens
MAX_STOP_SEQUENCES = 16        # each is matched on every streamed piece: a bound keeps that cheap
TOOL_CHOICES = ("auto", "any", "tool", "none")
ERROR_PREFIX = "Error: "       # how a tool_result with is_error reads to the model (V4 has no error flag)


def is_messages_path(path: str) -> bool:
    """The routes whose errors take Anthropic's shape."""
    path = path.rstrip("/")
    return path == "/v1/messages" or path.startswith("/v1/messages/")


# --- errors -----------------------------------------------------------------------------------

# Anthropic's error types by HTTP status. cairn's 503 (shutting down, cancelled) is Anthropic's 529
# overloaded_error: the server has no room now, retry.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
          413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
_STATUS = {503: 529}
# cairn's 507 (this conversation's state does not fit the memory plan) is not "overloaded": a retry
# of the same conversation fails the same way, and Claude Code retries a 529 forever. It is answered
# as Anthropic answers a prompt it cannot serve, a 400 whose message starts "prompt is too long",
# which Claude Code reads as its cue to compact the conversation.
TOO_LONG = "prompt is too long"


def error_body(e: APIError) -> tuple[int, dict]:
    """(HTTP status, body) of an error in Anthropic's shape:
    {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}."""
    if e.status == 507:
        return 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                "message": f"{TOO_LONG}: {e.message}"}}
    status = _STATUS.get(e.status, e.status)
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": e.message}}


def check_context(n_prompt: int, max_tokens: int, context: int) -> None:
    """The prompt and its reply must fit the context, refused with Anthropic's own messages (Claude
    Code reads "prompt is too long" as its cue to compact the conversation)."""
    if n_prompt >= context:
        raise APIError(400, f"{TOO_LONG}: {n_prompt} tokens > {context - 1} maximum", param="messages",
                       code="context_length_exceeded")
    if n_prompt + max_tokens > context:
        raise APIError(400, f"input length and `max_tokens` exceed context limit: {n_prompt} + {max_tokens} > "
                       f"{context}, decrease input length or `max_tokens` and try again", param="max_tokens",
                       code="context_length_exceeded")


# --- field readers ----------------------------------------------------------------------------

def _kind(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _num(d: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(key, f"expected a number, got {_kind(v)}", "invalid_type")
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(key, f"{v} is out of range; expected a number in {'(' if lo_open else '['}{lo}, {hi}]")
    return float(v)


def _int(d: dict, key: str, lo: int, where: str | None = None) -> int | None:
    v = d.get(key)
    where = where or key
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(where, f"expected an integer, got {_kind(v)}", "invalid_type")
    if v < lo:
        raise bad(where, f"{v} is too small; at least {lo}")
    return v


def _stop_sequences(v) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise bad("stop_sequences", f"expected an array of strings, got {_kind(v)}", "invalid_type")
    if len(v) > MAX_STOP_SEQUENCES:
        raise bad("stop_sequences", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(v)}")
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise bad(f"stop_sequences[{i}]", f"expected a string, got {_kind(s)}", "invalid_type")
        if len(s) > MAX_STOP_CHARS:
            raise bad(f"stop_sequences[{i}]", f"{len(s)} characters; a stop sequence may have at most "
                      f"{MAX_STOP_CHARS}")
    return tuple(s for s in v if s)


def _metadata(v) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise bad("metadata", f'expected an object such as {{"user_id": "..."}}, got {_kind(v)}', "invalid_type")
    uid = v.get("user_id")
    if uid is not None and not isinstance(uid, str):
        raise bad("metadata.user_id", f"expected a string, got {_kind(uid)}", "invalid_type")


def _text_of(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise bad(f"{where}.text", f"expected a string, got {_kind(block.get('text'))}", "invalid_type")
    return block["text"]


def _refuse_media(kind: str, where: str):
    raise bad(f"{where}.type", f"{kind!r} blocks are not supported: this model reads text only; send the "
              "content as text", "unsupported_content")


def _blocks(content, where: str) -> list[dict]:
    """A message's content as a list of block objects (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(where, f"expected a string or an array of content blocks, got {_kind(content)}", "invalid_type")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad(f"{where}[{j}]", 'expected a content block {"type": ..., ...}', "invalid_type")
    return content


# --- system, messages, tools ------------------------------------------------------------------

def _system_texts(v, where: str, dropped: list[str]) -> list[str]:
    """A system prompt (a string or text blocks) -> its texts, known per-request nonces left out
    (daemon/protocol/nonces.py): they change per conversation and would defeat the prefix cache."""
    if isinstance(v, str):
        v = [{"type": "text", "text": v}] if v else []
    if not isinstance(v, list):
        raise bad(where, f"expected a string or an array of text blocks, got {_kind(v)}", "invalid_type")
    texts = []
    for j, b in enumerate(v):
        if not isinstance(b, dict) or b.get("type") != "text":
            raise bad(f"{where}[{j}]", 'expected a text block {"type": "text", "text": ...}', "invalid_type")
        text = _text_of(b, f"{where}[{j}]")
        nonce = nonce_name(text)
        if nonce is not None:
            dropped.append(f"{where}[{j}]: {nonce}")
        else:
            texts.append(text)
    return texts


def _system(v, dropped: list[str]) -> list[dict]:
    if v is None:
        return []
    if isinstance(v, str) and nonce_name(v) is None:
        return [{"role": "system", "content": v}] if v else []
    texts = _system_texts(v, "system", dropped)
    # one system message of text parts: the V4 encoder joins them the same way on every turn
    return [{"role": "system", "content": [{"type": "text", "text": t} for t in texts]}] if texts else []


def _tool_result(b: dict, where: str) -> dict:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise bad(f"{where}.tool_use_id", "required: the id of the tool_use block this answers",
                  "missing_field" if tid is None else "invalid_type")
    content = b.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            at = f"{where}.content[{k}]"
            if not isinstance(part, dict):
                raise bad(at, 'expected a text block {"type": "text", "text": ...}', "invalid_type")
            if part.get("type") in ("image", "document"):
                _refuse_media(part["type"], at)
            if part.get("type") != "text":
                raise bad(f"{at}.type", f"{part.get('type')!r} is not supported in a tool_result; expected text")
            parts.append(_text_of(part, at))
        text = "\n\n".join(parts)
    else:
        raise bad(f"{where}.content", f"expected a string or an array of text blocks, got {_kind(content)}",
                  "invalid_type")
    is_error = b.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad(f"{where}.is_error", f"expected true or false, got {_kind(is_error)}", "invalid_type")
    return {"role": "tool", "tool_call_id": tid, "content": ERROR_PREFIX + text if is_error else text}


def _user(blocks: list[dict], where: str) -> list[dict]:
    """A user message -> user and tool messages, in the order of its blocks."""
    out, texts = [], []

    def flush():
        if texts:
            out.append({"role": "user", "content": [{"type": "text", "text": t} for t in texts]})
            texts.clear()

    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = b["type"]
        if kind == "text":
            texts.append(_text_of(b, at))
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(b, at))
        elif kind in ("image", "document"):
            _refuse_media(kind, at)
        else:
            raise bad(f"{at}.type", f"{kind!r} is not supported in a user message; expected text or tool_result")
    flush()
    return out or [{"role": "user", "content": ""}]


def _assistant(blocks: list[dict], where: str) -> dict:
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = b["type"]
        if kind == "text":
            texts.append(_text_of(b, at))
        elif kind == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise bad(f"{at}.thinking", f"expected a string, got {_kind(b.get('thinking'))}", "invalid_type")
            thoughts.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue                      # encrypted elsewhere: nothing this model can read
        elif kind == "tool_use":
            tid, name, args = b.get("id"), b.get("name"), b.get("input")
            if not isinstance(tid, str) or not tid:
                raise bad(f"{at}.id", "required: a non-empty string", "missing_field" if tid is None else "invalid_type")
            if not isinstance(name, str) or not name:
                raise bad(f"{at}.name", "required: a non-empty string",
                          "missing_field" if name is None else "invalid_type")
            if not isinstance(args, dict):
                raise bad(f"{at}.input", f"expected an object, got {_kind(args)}", "invalid_type")
            calls.append({"id": tid, "type": "function", "function": {"name": name, "arguments": args}})
        else:
            raise bad(f"{at}.type", f"{kind!r} is not supported in an assistant message; expected text, "
                      "thinking, redacted_thinking or tool_use")
    msg = {"role": "assistant", "content": [{"type": "text", "text": t} for t in texts]}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(v, dropped: list[str]) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise bad("messages", "required: a non-empty array of messages",
                  "missing_field" if v is None else "invalid_type")
    out = []
    for i, m in enumerate(v):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(at, 'expected a message {"role": ..., "content": ...}', "invalid_type")
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad(f"{at}.role", f"expected user, assistant or system, got {role!r}")
        if role == "system":
            # Claude Code sends its environment block this way, after the first user message; how V4
            # renders it: daemon/protocol/dsv4/encoding.py, docs/model-format.md ("Chat encoding")
            texts = _system_texts(m.get("content"), f"{at}.content", dropped)
            if texts:
                out.append({"role": "system", "content": [{"type": "text", "text": t} for t in texts]})
            continue
        blocks = _blocks(m.get("content"), f"{at}.content")
        out += _user(blocks, f"{at}.content") if role == "user" else [_assistant(blocks, f"{at}.content")]
    if v[-1].get("role") == "assistant":
        raise bad(f"messages[{len(v) - 1}].role", "a final assistant message (prefilling the reply) is not "
                  "supported; end the conversation with a user message", "unsupported_value")
    return out


def _tools(v) -> list[dict]:
    """Anthropic tools -> the chat request's function tools (name, description, parameters)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad("tools", f"expected an array of tools, got {_kind(v)}", "invalid_type")
    out = []
    for j, t in enumerate(v):
        at = f"tools[{j}]"
        if not isinstance(t, dict):
            raise bad(at, 'expected a tool {"name": ..., "input_schema": {...}}', "invalid_type")
        if t.get("type") not in (None, "custom"):
            raise bad(f"{at}.type", f"{t['type']!r} is a server tool; this server runs none: define it as a "
                      "custom tool with an input_schema", "unsupported_value")
        name, desc, schema = t.get("name"), t.get("description"), t.get("input_schema")
        if not isinstance(name, str) or not name:
            raise bad(f"{at}.name", "required: a non-empty string", "missing_field" if name is None else "invalid_type")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"{at}.description", f"expected a string, got {_kind(desc)}", "invalid_type")
        if not isinstance(schema, dict):
            raise bad(f"{at}.input_schema", "required: a JSON schema object",
                      "missing_field" if schema is None else "invalid_type")
        fn = {"name": name, **({"description": desc} if desc is not None else {}), "parameters": schema}
        out.append({"type": "function", "function": fn})
    from cairn.daemon.protocol.chat import ChatTemplateError, check_tools

    try:
        check_tools(out)       # the parts of a schema the call grammar reads (constrain.py)
    except ChatTemplateError as e:
        msg = str(e).replace(".function.parameters", ".input_schema").replace(".function.", ".")
        raise APIError(400, msg, param=msg.split(":", 1)[0], code="invalid_type") from None
    return out


def _tool_choice(v, tools: list[dict]) -> tuple[object, bool]:
    """-> (the chat request's tool_choice, parallel_tool_calls)."""
    if v is None:
        return "auto", True
    if not isinstance(v, dict) or v.get("type") not in TOOL_CHOICES:
        got = v.get("type") if isinstance(v, dict) else v
        raise bad("tool_choice.type" if isinstance(v, dict) else "tool_choice",
                  f"{got!r}; expected an object whose type is one of {', '.join(TOOL_CHOICES)}")
    dp = v.get("disable_parallel_tool_use")
    if dp is not None and not isinstance(dp, bool):
        raise bad("tool_choice.disable_parallel_tool_use", f"expected true or false, got {_kind(dp)}", "invalid_type")
    parallel = not dp
    kind = v["type"]
    if kind in ("any", "tool") and not tools:
        raise bad("tool_choice.type", f"{kind!r} needs tools; the request has none")
    if kind == "tool":
        name = v.get("name")
        names = [t["function"]["name"] for t in tools]
        if not isinstance(name, str):
            raise bad("tool_choice.name", "required with type tool: the name of the tool to call",
                      "missing_field" if name is None else "invalid_type")
        if name not in names:
            raise bad("tool_choice.name", f"{name!r} is not among the tools ({', '.join(names)})")
        return {"type": "function", "function": {"name": name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _thinking(v, max_tokens: int | None):
    """-> the chat request's `thinking` field. Whether to think follows this field alone: enabled,
    adaptive and between_tools think; disabled or no field is chat mode (Anthropic's own default);
    `output_config.effort` only sets how hard V4 thinks when it does."""
    if v is None:
        return {"type": "disabled"}
    if not isinstance(v, dict) or v.get("type") not in THINKING_TYPES:
        got = v.get("type") if isinstance(v, dict) else v
        raise bad("thinking.type" if isinstance(v, dict) else "thinking",
                  f'{got!r}; expected {{"type": "enabled", "budget_tokens": N}} or a type among '
                  f'{", ".join(THINKING_TYPES)}')
    if v.get("display") not in (None, *THINKING_DISPLAYS):
        raise bad("thinking.display", f"{v['display']!r}; expected one of {', '.join(THINKING_DISPLAYS)}")
    if v["type"] == "disabled":
        return {"type": "disabled"}
    if v["type"] == "enabled":
        budget = _int(v, "budget_tokens", MIN_THINKING_BUDGET, "thinking.budget_tokens")
        if budget is None:
            raise bad("thinking.budget_tokens", f"required with type enabled: an integer of at least "
                      f"{MIN_THINKING_BUDGET}", "missing_field")
        if max_tokens is not None and budget >= max_tokens:
            raise bad("thinking.budget_tokens", f"{budget} must be less than max_tokens ({max_tokens})")
    # display "omitted" (Claude Code's): thinking blocks are sent without their text (anthropic_reply.py)
    return {"type": "enabled", **({"display": "omitted"} if v.get("display") == "omitted" else {})}


def _context_management(v) -> None:
    """Checked, and changes nothing: the only edit accepted, clearing earlier turns' thinking, is
    what V4's encoding does on its own (it renders past reasoning by its own rule, so the prompt of
    the next turn keeps matching the last)."""
    if v is None:
        return
    if not isinstance(v, dict):
        raise bad("context_management", f"expected an object, got {_kind(v)}", "invalid_type")
    edits = v.get("edits", [])
    if not isinstance(edits, list):
        raise bad("context_management.edits", f"expected an array of edits, got {_kind(edits)}", "invalid_type")
    for j, e in enumerate(edits):
        kind = e.get("type") if isinstance(e, dict) else None
        if kind not in CONTEXT_EDITS:
            raise bad(f"context_management.edits[{j}].type", f"{kind!r} is not supported; expected "
                      f"{' or '.join(CONTEXT_EDITS)} (cairn keeps every tool result in the prompt)",
                      "unsupported_value")


# --- requests ---------------------------------------------------------------------------------

def _output_config(v) -> tuple[str | None, dict | None]:
    """-> (reasoning_effort, response_format)."""
    if v is None:
        return None, None
    if not isinstance(v, dict):
        raise bad("output_config", f"expected an object, got {_kind(v)}", "invalid_type")
    effort = v.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad("output_config.effort", f"{effort!r}; expected one of {', '.join(EFFORTS)}")
    fmt = v.get("format")
    if fmt is None:
        return effort, None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad("output_config.format", 'expected {"type": "json_schema", "schema": {JSON schema}}')
    return effort, {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _model(d: dict) -> str:
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "required: a model id string (see GET /v1/models)",
                  "missing_field" if model is None else "invalid_type")
    return model


def _request(d: dict, *, known: set[str], max_tokens: int | None, stream: bool) -> ChatRequest:
    ignored = _check_unknown(d, known)
    dropped: list[str] = []
    messages = _system(d.get("system"), dropped) + _messages(d.get("messages"), dropped)
    _context_management(d.get("context_management"))
    tools = _tools(d.get("tools"))
    tool_choice, parallel = _tool_choice(d.get("tool_choice"), tools)
    thinking = _thinking(d.get("thinking"), max_tokens)
    top_k = _int(d, "top_k", 0)
    effort, response_format = _output_config(d.get("output_config"))
    common = CommonParams(model=_model(d), stream=stream, include_usage=False,
                          temperature=_num(d, "temperature", 1.0, 0.0, 1.0),
                          top_p=_num(d, "top_p", 1.0, 0.0, 1.0, lo_open=True), top_k=top_k or 0, seed=None,
                          stop=_stop_sequences(d.get("stop_sequences")), max_tokens=max_tokens, ignore_eos=False,
                          ignored=ignored)
    return ChatRequest(common, messages, tools or None, logprobs=False, top_logprobs=0, thinking=thinking,
                       reasoning_effort=effort, response_format=response_format, tool_choice=tool_choice,
                       parallel_tool_calls=parallel, dropped_nonces=tuple(dropped))


def parse_messages(d: dict) -> ChatRequest:
    """A POST /v1/messages body -> the chat request; max_tokens is required, as Anthropic requires it."""
    _check_unknown(d, FIELDS)      # a misspelt field first: `max_token` says so, not "max_tokens: required"
    _metadata(d.get("metadata"))
    if d.get("stream") is not None and not isinstance(d["stream"], bool):
        raise bad("stream", f"expected true or false, got {_kind(d['stream'])}", "invalid_type")
    max_tokens = _int(d, "max_tokens", 1)
    if max_tokens is None:
        raise bad("max_tokens", "required: the most tokens the reply may have (an integer of at least 1)",
                  "missing_field")
    req = _request(d, known=FIELDS, max_tokens=max_tokens, stream=bool(d.get("stream")))
    return replace(req, diagnostics=_diagnostics(d.get("diagnostics")))


def _diagnostics(v) -> Ask | None:
    """`diagnostics: {"previous_message_id": "msg_…" | null}`: compare this prompt with that earlier
    response's (api/cache_diagnostics.py); null on a first turn opts in with nothing to compare."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("diagnostics", f'expected an object {{"previous_message_id": ...}}, got {_kind(v)}', "invalid_type")
    if "previous_message_id" not in v:
        raise bad("diagnostics.previous_message_id", "required: the id of an earlier response to compare with "
                  "(msg_…), or null on a first turn", "missing_field")
    pid = v["previous_message_id"]
    if pid is not None and (not isinstance(pid, str) or not pid):
        raise bad("diagnostics.previous_message_id", f"expected a message id string or null, got {_kind(pid)}"
                  + (" (empty)" if pid == "" else ""), "invalid_type")
    return Ask("anthropic", pid)


def parse_count_tokens(d: dict) -> ChatRequest:
    """A POST /v1/messages/count_tokens body: the same conversation fields, no reply settings."""
    return _request(d, known=COUNT_FIELDS, max_tokens=None, stream=False)

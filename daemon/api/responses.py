"""OpenAI Responses API requests (`POST /v1/responses`) -> the internal chat request. Pure.

The Responses API is a different spelling of the same conversation, so it is translated into the
`ChatRequest` the Chat Completions path uses (schemas.parse_chat) and everything after that —
rendering, the engine, the output parser — is shared. Only the reply is shaped differently
(responses_reply.py). Errors name the Responses field (`input[3].call_id`, `text.format`).

Mapping: `instructions` -> a leading system message; message items -> messages (`developer` stays
the system role's alias); a reasoning item -> the next assistant turn's reasoning; `function_call`
items -> that assistant turn's tool_calls; `function_call_output` -> tool messages; `reasoning.effort`
-> the mode (as `reasoning_effort`); `text.format` -> response_format; `max_output_tokens` -> max_tokens;
`prompt_cache_options.comparison_response_id` -> `ChatRequest.diagnostics` (prompt_cache_diagnostics in
the reply, cache_diagnostics.py).

State: nothing is kept. `store: false` is what agents send; `store: true` is accepted and the reply
says `"store": false`. `previous_response_id`, `conversation` and `item_reference` items get a 400
saying so. Reasoning comes back to us as the client re-sends it: its `content`, or the
`encrypted_content` this server gave (not encrypted: the reasoning text in base64, tagged, so the
next turn re-renders it byte for byte), or else its `summary` (which this server fills with the
reasoning itself when a summary is asked for).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from cairn.daemon.protocol.chat import ChatTemplateError, check_messages

from .cache_diagnostics import Ask
from .schemas import (FOREIGN_FIELDS, REASONING_EFFORTS, APIError, ChatRequest, _check_unknown, _int, bad,
                      parse_chat)

# A reasoning item's `encrypted_content` as this server writes it (see the module docstring).
ENCRYPTED_PREFIX = "cairn-reasoning-v1:"

_KNOWN = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning",
          "max_output_tokens", "text", "stream", "stream_options", "store", "include", "metadata", "temperature",
          "top_p", "user", "previous_response_id", "truncation", "service_tier", "prompt_cache_key",
          "prompt_cache_retention", "safety_identifier", "background", "conversation", "prompt",
          "max_tool_calls", "top_logprobs", "client_metadata", "prompt_cache_options",
          "seed", "top_k"}                     # cairn's extras, as on /v1/chat/completions
# Known fields with nothing to do here: accepted, and named once in the log (as unknown ones are).
ACCEPTED_IGNORED = ("client_metadata", "max_tool_calls", "prompt_cache_key", "prompt_cache_retention",
                    "safety_identifier", "service_tier")
SUMMARY_MODES = ("auto", "concise", "detailed")
# Tools run by OpenAI's servers (or the client's own built-ins): nothing here can run them, so they
# are left out of the prompt, said once in the log; the function tools work.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                "computer", "computer_use_preview", "mcp", "local_shell", "shell", "apply_patch", "custom",
                "tool_search", "namespace")


@dataclass(frozen=True)
class ResponsesRequest:
    """The chat request the engine runs, and what the reply echoes back in its `response` object."""
    chat: ChatRequest
    instructions: str | None = None
    summary: str | None = None                 # reasoning.summary: auto | concise | detailed, or None
    effort: str | None = None                  # reasoning.effort as sent
    include_encrypted: bool = False            # include has "reasoning.encrypted_content"
    tools: list = field(default_factory=list)  # the function tools, in the Responses shape
    tool_choice: object = "auto"               # as sent (Responses shape)
    text: dict = field(default_factory=lambda: {"format": {"type": "text"}})
    max_output_tokens: int | None = None
    metadata: dict = field(default_factory=dict)
    user: str | None = None
    dropped_tools: tuple[str, ...] = ()        # hosted tool types left out (logged once each)


def parse_responses(d: dict) -> ResponsesRequest:
    ignored = _check_unknown(d, _KNOWN)
    _refuse_state(d)
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "required: a model id string (see GET /v1/models)",
                  "missing_field" if model is None else "invalid_type")
    instructions = d.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", "expected a string", "invalid_type")
    messages, where = _messages(d.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
        where = ["instructions"] + [(w[0] + 1, *w[1:]) if isinstance(w, tuple) else w for w in where]
    tools, chat_tools, dropped = _tools(d.get("tools"))
    tool_choice = d.get("tool_choice")
    effort, summary = _reasoning(d.get("reasoning"))
    text, response_format, verbosity = _text(d.get("text"))
    max_out = _int(d, "max_output_tokens", None, 1)
    include = _include(d.get("include"))
    for key in ("metadata", "client_metadata"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise bad(key, "expected an object of string keys and values", "invalid_type")
    if d.get("truncation") not in (None, "disabled"):
        raise bad("truncation", f"{d['truncation']!r} is not supported; the input is never truncated here "
                  '(a prompt over the context gets a 400): send "disabled" or leave it out', "unsupported_value")
    if d.get("top_logprobs") not in (None, 0):
        raise bad("top_logprobs", "log-probabilities are not offered on /v1/responses (use /v1/chat/completions "
                  "with logprobs)", "unsupported_value")
    ask, cache_ignored = _prompt_cache_options(d.get("prompt_cache_options"))
    so = d.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("stream_options", "expected an object", "invalid_type")

    chat = {"model": model, "messages": messages, "stream": d.get("stream"), "temperature": d.get("temperature"),
            "top_p": d.get("top_p"), "seed": d.get("seed"), "top_k": d.get("top_k"), "user": d.get("user"),
            "max_tokens": max_out, "parallel_tool_calls": d.get("parallel_tool_calls"),
            "reasoning_effort": effort, "response_format": response_format, "verbosity": verbosity}
    if chat_tools:
        chat["tools"] = chat_tools
    if tool_choice is not None:
        chat["tool_choice"] = _tool_choice(tool_choice)
    try:
        req = parse_chat({k: v for k, v in chat.items() if v is not None})
        check_messages(messages)      # the renderer's checks, said here in the input's own field names
    except APIError as e:
        raise _renamed(e, where) from None
    except ChatTemplateError as e:
        field_, _, rest = str(e).partition(":")
        raise _renamed(APIError(400, str(e), param=field_, code="invalid_value"), where) from None
    ignored += tuple(k for k in ACCEPTED_IGNORED if d.get(k) is not None)
    ignored += ("store",) if d.get("store") else ()          # true: accepted, but nothing is kept
    ignored += tuple(f"include={x}" for x in include if x != "reasoning.encrypted_content") + cache_ignored
    req = ChatRequest(**{**req.__dict__, "diagnostics": ask,
                         "common": type(req.common)(**{**req.common.__dict__, "ignored": ignored})})
    return ResponsesRequest(
        chat=req, instructions=instructions, summary=summary, effort=effort,
        include_encrypted="reasoning.encrypted_content" in include, tools=tools,
        tool_choice="auto" if tool_choice is None else tool_choice, text=text, max_output_tokens=max_out,
        metadata=d.get("metadata") or {}, user=d.get("user"), dropped_tools=dropped)


def _refuse_state(d: dict) -> None:
    if d.get("previous_response_id") is not None:
        raise bad("previous_response_id", "this server keeps no responses (it is stateless); send the whole "
                  "conversation in `input`, with the previous output items, and `store: false`",
                  "unsupported_value")
    if d.get("conversation") is not None:
        raise bad("conversation", "this server keeps no conversations; send the whole conversation in `input`",
                  "unsupported_value")
    if d.get("prompt") is not None:
        raise bad("prompt", "stored prompt templates are not offered; send `instructions` and `input`",
                  "unsupported_value")
    if d.get("background") not in (None, False):
        raise bad("background", "background responses are not offered (nothing is stored to poll); "
                  "use stream: true for long replies", "unsupported_value")


# --- input ------------------------------------------------------------------------------------

def _messages(inp) -> tuple[list[dict], list]:
    """Input items -> chat messages, and where each came from: the input field of each message (a
    string, in order) and of each tool call ((message index, call index, field)); errors from the
    chat checks are renamed to these."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}], ["input"]
    if not isinstance(inp, list) or not inp:
        raise bad("input", "required: a string, or a non-empty list of input items",
                  "missing_field" if inp is None else "invalid_type")
    out: list[dict] = []
    where: list = []
    turn: dict | None = None     # the assistant message that function_call items join
    for i, item in enumerate(inp):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(at, "expected an input item object (message, function_call, function_call_output, "
                      "reasoning)", "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"{at}.role", f"expected user, system, developer or assistant, got {role!r}")
            content = _content(item.get("content"), f"{at}.content", assistant=role == "assistant")
            if role == "assistant":
                if turn is not None and turn["content"] is None and not turn["tool_calls"]:
                    turn["content"] = content          # after its reasoning item
                    continue
                turn = {"role": "assistant", "content": content, "tool_calls": []}
                out.append(turn)
            else:
                turn = None
                out.append({"role": role, "content": content})
            where.append(at)
        elif kind == "reasoning":
            turn = {"role": "assistant", "content": None, "tool_calls": [], "reasoning_content": _reasoning_text(item, at)}
            out.append(turn)
            where.append(at)
        elif kind == "function_call":
            call = _function_call(item, at)
            if turn is None:
                turn = {"role": "assistant", "content": None, "tool_calls": []}
                out.append(turn)
                where.append(at)
            turn["tool_calls"].append(call)
            where.append((len(out) - 1, len(turn["tool_calls"]) - 1, at))   # names errors in this call
        elif kind == "function_call_output":
            cid = item.get("call_id")
            if not isinstance(cid, str) or not cid:
                raise bad(f"{at}.call_id", "required: the call_id of the function_call it answers",
                          "missing_field" if cid is None else "invalid_type")
            turn = None
            out.append({"role": "tool", "tool_call_id": cid, "content": _output(item.get("output"), f"{at}.output")})
            where.append(at)
        elif kind == "item_reference":
            raise bad(f"{at}.type", "item_reference needs stored responses, and this server keeps none; send the "
                      "item itself", "unsupported_value")
        else:
            raise bad(f"{at}.type", f"{kind!r} is not supported; expected message, function_call, "
                      "function_call_output or reasoning", "unsupported_value")
    for m in out:   # an assistant turn of tool calls only has no content; the chat shape says None
        if m["role"] == "assistant" and not m["tool_calls"]:
            del m["tool_calls"]
    return out, where


_TEXT_PARTS = {"input_text", "output_text", "text"}


def _content(content, at: str, *, assistant: bool):
    """A message's content -> a string or chat text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(at, "expected a string or a list of content parts", "invalid_type")
    parts = []
    for j, p in enumerate(content):
        if not isinstance(p, dict):
            raise bad(f"{at}[{j}]", 'expected a content part {"type": "input_text", "text": ...}', "invalid_type")
        kind = p.get("type")
        if kind == "refusal" and assistant:
            text = p.get("refusal")
        elif kind in _TEXT_PARTS:
            text = p.get("text")
        else:
            raise bad(f"{at}[{j}].type", f"{kind!r} is not supported (this model reads text only: "
                      "input_text, output_text)", "unsupported_value")
        if not isinstance(text, str):
            raise bad(f"{at}[{j}].text", "expected a string", "invalid_type")
        parts.append({"type": "text", "text": text})
    return parts


def _output(output, at: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        texts = []
        for j, p in enumerate(output):
            if not isinstance(p, dict) or p.get("type") not in _TEXT_PARTS:
                kind = p.get("type") if isinstance(p, dict) else None
                raise bad(f"{at}[{j}]", f"{kind!r} is not supported; a tool's output is text (a string or "
                          "input_text parts)", "unsupported_value")
            if not isinstance(p.get("text"), str):
                raise bad(f"{at}[{j}].text", "expected a string", "invalid_type")
            texts.append(p["text"])
        return "\n".join(texts)
    raise bad(at, "required: the tool's output as a string or a list of input_text parts",
              "missing_field" if output is None else "invalid_type")


def _function_call(item: dict, at: str) -> dict:
    for key in ("call_id", "name"):
        v = item.get(key)
        if not isinstance(v, str) or not v:
            raise bad(f"{at}.{key}", "required: a non-empty string", "missing_field" if v is None else "invalid_type")
    args = item.get("arguments", "{}")
    if not isinstance(args, str):
        raise bad(f"{at}.arguments", "expected the arguments as a JSON string", "invalid_type")
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": args}}


def _reasoning_text(item: dict, at: str) -> str:
    """What the model thought: its reasoning_text parts, else this server's encrypted_content, else
    the summary. Another server's encrypted_content means nothing here and is passed over."""
    parts = item.get("content")
    if parts is not None:
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                  for p in parts):
            raise bad(f"{at}.content", 'expected a list of {"type": "reasoning_text", "text": ...}', "invalid_type")
        if parts:
            return "".join(p["text"] for p in parts)
    enc = item.get("encrypted_content")
    if enc is not None and not isinstance(enc, str):
        raise bad(f"{at}.encrypted_content", "expected a string", "invalid_type")
    if enc and enc.startswith(ENCRYPTED_PREFIX):
        try:
            return base64.b64decode(enc[len(ENCRYPTED_PREFIX):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise bad(f"{at}.encrypted_content", "damaged: it carries this server's tag but not the base64 "
                      "UTF-8 text it wrote; send the item back unchanged") from None
    summary = item.get("summary", [])
    if not isinstance(summary, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                for p in summary):
        raise bad(f"{at}.summary", 'expected a list of {"type": "summary_text", "text": ...}', "invalid_type")
    return "\n\n".join(p["text"] for p in summary)


def encrypt_reasoning(text: str) -> str:
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


# --- the other fields -------------------------------------------------------------------------

def _tools(tools) -> tuple[list, list, tuple[str, ...]]:
    """(function tools as sent, the same in the chat shape, hosted tool types left out)."""
    if tools is None:
        return [], [], ()
    if not isinstance(tools, list):
        raise bad("tools", "expected a list of tools", "invalid_type")
    kept, chat, dropped = [], [], []
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad(f"tools[{j}]", 'expected a tool object {"type": "function", "name": ..., "parameters": ...}',
                      "invalid_type")
        kind = t.get("type")
        if kind in HOSTED_TOOLS:
            dropped.append(kind)
            continue
        if kind != "function":
            raise bad(f"tools[{j}].type", f"{kind!r} is not a tool type this server knows; function tools "
                      f"are supported (hosted ones — {', '.join(HOSTED_TOOLS)} — are left out)")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"tools[{j}].name", "required: a non-empty string", "missing_field" if name is None
                      else "invalid_type")
        if t.get("description") is not None and not isinstance(t["description"], str):
            raise bad(f"tools[{j}].description", "expected a string", "invalid_type")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{j}].parameters", "expected a JSON schema object", "invalid_type")
        fn = {"name": name}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        if params is not None:
            fn["parameters"] = params
        kept.append(t)
        chat.append({"type": "function", "function": fn})
    return kept, chat, tuple(dict.fromkeys(dropped))


def _tool_choice(tc):
    if tc in ("none", "auto", "required"):
        return tc
    if isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    raise bad("tool_choice", 'expected "none", "auto", "required" or {"type": "function", "name": ...}')


def _reasoning(r) -> tuple[str | None, str | None]:
    if r is None:
        return None, None
    if not isinstance(r, dict):
        raise bad("reasoning", 'expected an object {"effort": ..., "summary": ...}', "invalid_type")
    effort = r.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad("reasoning.effort", f"{effort!r}; expected one of {', '.join(REASONING_EFFORTS)}")
    summary = r.get("summary", r.get("generate_summary"))
    if summary is not None and summary not in SUMMARY_MODES:
        raise bad("reasoning.summary", f"{summary!r}; expected one of {', '.join(SUMMARY_MODES)}")
    return effort, summary


def _text(t) -> tuple[dict, dict | None, str | None]:
    """(the text config to echo, the chat response_format, verbosity)."""
    if t is None:
        return {"format": {"type": "text"}}, None, None
    if not isinstance(t, dict):
        raise bad("text", 'expected an object {"format": {...}}', "invalid_type")
    fmt = t.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("text.format", 'expected {"type": "text" | "json_object" | "json_schema"}')
    rf = None
    if fmt["type"] == "json_object":
        rf = {"type": "json_object"}
    elif fmt["type"] == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad("text.format.schema", "required: the JSON schema object the reply must follow",
                      "missing_field" if schema is None else "invalid_type")
        rf = {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response", "schema": schema}}
    verbosity = t.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise bad("text.verbosity", f"{verbosity!r}; expected low, medium or high")
    return {**t, "format": fmt}, rf, verbosity


def _prompt_cache_options(v) -> tuple[Ask | None, tuple[str, ...]]:
    """(the comparison asked for, the options accepted with nothing to do: every prefix is cached here,
    so `mode` and `ttl` change nothing). `comparison_response_id` -> prompt_cache_diagnostics in the
    reply (api/cache_diagnostics.py)."""
    if v is None:
        return None, ()
    if not isinstance(v, dict):
        raise bad("prompt_cache_options", 'expected an object {"comparison_response_id": ..., "mode": ..., '
                  '"ttl": ...}', "invalid_type")
    if v.get("mode") not in (None, "implicit", "explicit"):
        raise bad("prompt_cache_options.mode", f"{v['mode']!r}; expected implicit or explicit")
    if v.get("ttl") not in (None, "30m"):
        raise bad("prompt_cache_options.ttl", f'{v["ttl"]!r}; expected "30m"')
    ignored = tuple(f"prompt_cache_options.{k}" for k in ("mode", "ttl") if v.get(k) is not None)
    cid = v.get("comparison_response_id")
    if cid is None:
        return None, ignored
    if not isinstance(cid, str) or not cid:
        raise bad("prompt_cache_options.comparison_response_id", "expected the id of an earlier response "
                  "(resp-…)", "invalid_type")
    return Ask("openai", cid), ignored


def _include(inc) -> list[str]:
    if inc is None:
        return []
    if not isinstance(inc, list) or not all(isinstance(x, str) for x in inc):
        raise bad("include", "expected a list of strings", "invalid_type")
    return inc


# chat field -> the Responses field it was built from
_RENAMES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
            "response_format": "text.format", "reasoning_effort": "reasoning.effort", "verbosity": "text.verbosity"}


def as_responses_error(e: APIError) -> APIError:
    """An error of the chat path (rendering, the grammar) in the Responses request's field names."""
    return _renamed(e, [])


def _renamed(e: APIError, where: list) -> APIError:
    """A parse_chat error, said in the Responses request's own field names."""
    param, msg = e.param or "", e.message
    new = _RENAMES.get(param, param)
    if param.startswith("messages["):
        k = int(param[len("messages["):param.index("]")])
        rest = param[param.index("]") + 1:]
        msgs = [w for w in where if isinstance(w, str)]
        new = (msgs[k] if k < len(msgs) else "input") + rest
        if rest.startswith(".tool_calls["):
            j = int(rest[len(".tool_calls["):rest.index("]")])
            tail = rest[rest.index("]") + 1:].replace(".function.", ".", 1)
            new = next((at for w in where if isinstance(w, tuple) and w[:2] == (k, j) for at in [w[2]]), "input") + tail
    elif param.startswith("tools[") and ".function" in param:   # the chat shape nests what Responses does not
        new = param.replace(".function", "", 1)
    if new != param and msg.startswith(param):
        msg = new + msg[len(param):]
    return APIError(e.status, msg, param=new or None, code=e.code)

"""Chat messages -> prompt text, with the model's own jinja2 chat template.

Design notes:
- The environment follows Hugging Face's conventions so published templates render unchanged:
  ImmutableSandboxedEnvironment, trim_blocks + lstrip_blocks, loopcontrols, `raise_exception`,
  a `tojson` that keeps non-ASCII, and `bos_token` / `eos_token` / `add_generation_prompt` /
  `tools` in the context.
- Messages are checked before rendering; each error names the offending field
  (`messages[2].content: ...`) and is a `ChatTemplateError`, which the API answers with 400. So is
  a template's own `raise_exception(...)`.
- The system prefix (BOS + leading system messages + tool definitions) is shared by every turn
  of an agent session, so it is worth a checkpoint of its own. Rather than knowing the template,
  we render only the leading system messages (with the tools, no generation prompt) and keep its
  length when it is a byte prefix of the full render; otherwise there is no usable prefix (None).
- A template cannot tell the request's text from its own structure: control tokens' text in the
  request is masked before it runs and put back after, as content spans (`_Masks`), so it is
  tokenized as text while the template's own special tokens stay control tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .dsv4.encoding import SPECIAL_TOKENS

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer name for the system role (Codex and the openai SDK send it). It is the system role
# here, rendered byte for byte alike, so such a conversation shares the system-prefix checkpoint.
ROLE_ALIASES = {"developer": "system"}


def canonical_roles(messages: list) -> list:
    """The messages with aliased roles renamed (others untouched, same objects)."""
    return [{**m, "role": ROLE_ALIASES[m["role"]]} if isinstance(m, dict) and m.get("role") in ROLE_ALIASES
            else m for m in messages]


def continues_final(messages) -> bool:
    """A conversation that ends with an assistant message with text and no tool calls asks for that
    message to be continued (aider's prefix continuation, DeepSeek's "prefix" completion): the last
    turn is rendered open — no end-of-turn token — and the reply goes on from its last character."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1]
    return last.get("role") == "assistant" and not last.get("tool_calls") and bool(last.get("content"))


# One rule for a message's text parts, whichever renderer: parts joined by a blank line.
PART_SEPARATOR = "\n\n"


def join_parts(texts: list[str]) -> str:
    return PART_SEPARATOR.join(texts)


class ChatTemplateError(ValueError):
    """Messages the template cannot render; the message is fit for an HTTP 400 answer."""


@dataclass(frozen=True)
class RenderedChat:
    text: str
    system_prefix_bytes: int | None  # UTF-8 length of the shared system part of `text`, if any
    resume_bytes: int | None = None  # where the next turn will diverge, when before the end (V4 thinking)
    # [start, end) character ranges of `text` that are the request's own text, which the tokenizer
    # must never turn into control tokens (TextTokenizer.encode_with_offsets). The native encoder
    # gives every piece of request text; a template, only where such text held a control token's text.
    content_spans: tuple[tuple[int, int], ...] = ()


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatRenderer:
    def __init__(self, template: str, bos_token: str, eos_token: str, protect: tuple[str, ...] = ()):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        # Control tokens' text (the tokenizer's added tokens; V4's own and BOS/EOS at least): masked in
        # the request's text before the template runs (_Masks).
        texts = sorted({t for t in (*protect, *SPECIAL_TOKENS, bos_token, eos_token) if t}, key=len, reverse=True)
        self._protect = re.compile("|".join(re.escape(t) for t in (*texts, _MASK_OPEN, _MASK_CLOSE)))

    @classmethod
    def from_model_dir(cls, md, protect: tuple[str, ...] = ()) -> "ChatRenderer":
        from cairn.daemon.weights.model_dir import ModelDirError

        try:
            return cls(md.chat_template, md.bos_token, md.eos_token, protect)
        except ChatTemplateError as e:
            raise ModelDirError(f"{md.path}: {e}") from None

    name = "model template"

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, options=None) -> RenderedChat:
        masks = _Masks(self._protect)
        msgs = masks.mask(check_messages(messages))
        tools = masks.mask(check_tools(tools))
        kw = _template_kwargs(options)
        if continues_final(msgs):
            text = self._open_last_turn(msgs, tools, kw)
        else:
            text = self._render(msgs, tools, add_generation_prompt, kw)
        prefix = self._system_prefix(msgs, tools, text, kw)
        text, spans = masks.unmask(text)
        return RenderedChat(text, None if prefix is None else len(masks.unmask(prefix)[0].encode()),
                            content_spans=spans)

    def _open_last_turn(self, msgs: list[dict], tools, kw) -> str:
        """The conversation without a generation prompt, cut right after the last assistant message's
        text: whatever the template writes after it (its end-of-turn token) is not rendered."""
        text = self._render(msgs, tools, False, kw)
        at = text.rfind(msgs[-1]["content"])
        if at < 0:
            _fail(f"messages[{len(msgs) - 1}].content", "the chat template does not write this assistant "
                  "message's text as is, so it cannot be continued; end the conversation with a user message")
        return text[: at + len(msgs[-1]["content"])]

    def _render(self, msgs: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                kwargs: dict | None = None) -> str:
        try:
            return self._template.render(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **(kwargs or {}))
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {e}") from None

    def _system_prefix(self, msgs: list[dict], tools: list[dict] | None, text: str,
                       kwargs: dict | None = None) -> str | None:
        n = 0
        while n < len(msgs) and msgs[n]["role"] == "system":
            n += 1
        if n == 0 and not tools:
            return None
        try:
            prefix = self._render(msgs[:n], tools, False, kwargs)
        except ChatTemplateError:  # e.g. a template that insists on a user turn
            return None
        if not text.startswith(prefix):
            return None
        return prefix


_MASK_OPEN, _MASK_CLOSE = "\ue000", "\ue001"     # private-use characters: no template changes them
_MASKED = re.compile(f"{_MASK_OPEN}([0-9]+){_MASK_CLOSE}")


class _Masks:
    """A template cannot tell the request's text from its own structure, so the request's text goes
    in with every control token's text replaced by a mask (`\\ue000<n>\\ue001`), and the rendered
    text comes back with the originals in place and their ranges as content spans: they are
    tokenized as text, while everything the template wrote itself stays what it was. A request
    without such text renders exactly as before (no masks, no spans). The mask characters themselves
    are masked too, so no request text can pass for a mask."""

    def __init__(self, find: re.Pattern) -> None:
        self._find = find                  # the control texts and the mask characters (ChatRenderer)
        self.found: list[str] = []

    def _one(self, m: re.Match) -> str:
        self.found.append(m.group())
        return f"{_MASK_OPEN}{len(self.found) - 1}{_MASK_CLOSE}"

    def mask(self, value):
        """A JSON-like value with its strings (dict keys too) masked."""
        if isinstance(value, str):
            return self._find.sub(self._one, value)
        if isinstance(value, list):
            return [self.mask(v) for v in value]
        if isinstance(value, dict):
            return {self.mask(k): self.mask(v) for k, v in value.items()}
        return value

    def unmask(self, text: str) -> tuple[str, tuple[tuple[int, int], ...]]:
        if not self.found:
            return text, ()
        parts, spans, at, n = [], [], 0, 0
        for m in _MASKED.finditer(text):
            k = int(m.group(1))
            if k >= len(self.found):       # not one of ours (the template's own text): left as it is
                continue
            parts.append(text[at:m.start()])
            n += m.start() - at
            parts.append(self.found[k])
            spans.append((n, n + len(self.found[k])))
            n += len(self.found[k])
            at = m.end()
        parts.append(text[at:])
        return "".join(parts), tuple(spans)


def _template_kwargs(options) -> dict:
    """The mode as HF-style template kwargs (`thinking`, `enable_thinking`, `reasoning_effort`)."""
    if options is None:
        return {}
    return {"thinking": options.thinking, "enable_thinking": options.thinking,
            "reasoning_effort": options.effort if options.thinking else None}


# ------------------------------------------------------------------------------------------------
# validation: the OpenAI message shapes -> plain dicts with string content


def _fail(where: str, what: str):
    raise ChatTemplateError(f"{where}: {what}")


def _text(value, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict):
                _fail(f"{where}[{j}]", 'expected a text part {"type": "text", "text": ...}')
            if part.get("type", "text") != "text":
                _fail(f"{where}[{j}].type", f"{part.get('type')!r} is not supported (only text parts)")
            if not isinstance(part.get("text"), str):
                _fail(f"{where}[{j}].text", "expected a string")
            texts.append(part["text"])
        return join_parts(texts)
    _fail(where, "expected a string or a list of text parts")


def check_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        _fail("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            _fail(at, "expected an object with role and content")
        role = ROLE_ALIASES.get(m.get("role"), m.get("role"))
        if role not in ROLES:
            _fail(f"{at}.role", f"expected one of {', '.join(ROLES + tuple(ROLE_ALIASES))}, got {m.get('role')!r}")
        msg = dict(m, role=role)
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            _fail(f"{at}.tool_calls", "only assistant messages carry tool_calls")
        # An assistant turn that only calls tools may have null or no content (OpenAI shape).
        msg["content"] = _text(m.get("content"), f"{at}.content", optional=role == "assistant")
        if calls is not None:
            msg["tool_calls"] = _check_tool_calls(calls, f"{at}.tool_calls")
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            if key in m and m[key] is not None and not isinstance(m[key], str):
                _fail(f"{at}.{key}", "expected a string")
        out.append(msg)
    return out


def _check_tool_calls(calls, at: str) -> list[dict]:
    if not isinstance(calls, list):
        _fail(at, "expected a list of tool calls")
    out = []
    for j, c in enumerate(calls):
        w = f"{at}[{j}]"
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
            _fail(f"{w}.function", 'expected an object {"name": ..., "arguments": ...}')
        if c.get("type", "function") != "function":
            _fail(f"{w}.type", f"expected \"function\", got {c.get('type')!r}")
        f = c["function"]
        if not isinstance(f.get("name"), str) or not f["name"]:
            _fail(f"{w}.function.name", "expected a non-empty string")
        args = f.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            _fail(f"{w}.function.arguments", "expected a JSON string or an object")
        if isinstance(args, str):
            _check_arguments_json(args, f"{w}.function.arguments")
        out.append({**c, "type": "function", "function": {**f, "arguments": args}})
    return out


def _check_arguments_json(args: str, where: str) -> None:
    """The encoder parses a JSON-string `arguments` (dsv4.encoding.dsml_arguments): what the body's
    own checks (api/schemas.py) refuse must be refused inside this string too."""
    try:
        parsed = json.loads(args)
    except RecursionError:
        _fail(where, "the JSON in this string is nested too deeply")
    except ValueError:
        return                       # not JSON: rendered as the raw text
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        _fail(where, "the JSON in this string has a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode")


def check_tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        _fail("tools", "expected a list of tools")
    for j, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
            _fail(f"tools[{j}].function", 'expected an object {"name": ..., "parameters": ...}')
        if t.get("type", "function") != "function":
            _fail(f"tools[{j}].type", f"expected \"function\", got {t.get('type')!r}")
        if not isinstance(t["function"].get("name"), str) or not t["function"]["name"]:
            _fail(f"tools[{j}].function.name", "expected a non-empty string")
        params = t["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            _fail(f"tools[{j}].function.parameters", "expected a JSON schema object")
        if params:
            _check_parameters(params, f"tools[{j}].function.parameters")
    return tools or None


def _check_parameters(params: dict, where: str) -> None:
    """The parts of a tool's schema the call grammar reads (constrain.py): properties and required."""
    props = params.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            _fail(f"{where}.properties", f"expected an object of name -> JSON schema, got {type(props).__name__}")
        for k, sub in props.items():
            if not isinstance(sub, (dict, bool)):
                _fail(f"{where}.properties.{k}", f"expected a JSON schema object, got {type(sub).__name__}")
    req = params.get("required")
    if req is not None:
        if not isinstance(req, list):
            _fail(f"{where}.required", f"expected a list of property names, got {type(req).__name__}")
        for i, name in enumerate(req):
            if not isinstance(name, str):
                _fail(f"{where}.required[{i}]", f"expected a property name (a string), got {type(name).__name__}")

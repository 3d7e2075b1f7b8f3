"""DeepSeek-V4's chat encoding, natively: OpenAI-shaped messages -> the prompt text the model was
trained on. Pure (no jinja, no I/O); nothing from a model directory is ever executed.

The released model defines its format by a reference Python encoder (`encoding_dsv4.py`); this module
follows its documented behaviour (docs/model-format.md, "Chat encoding"):

- BOS; in thinking mode a reasoning-effort preamble; the system text with no marker (several system
  messages are concatenated as they are); each user turn `<｜User｜>{content}`; after a user turn that is
  last, or followed by an assistant turn, `<｜Assistant｜>` and the mode marker: `<think>` (thinking)
  or `</think>` (chat). Nothing in the text switches the mode; the caller chooses it.
- A past assistant turn: `{reasoning}</think>` (thinking mode, when its reasoning is kept), then
  `{content}`, then the DSML tool-call block, then EOS.
- Past reasoning is dropped (`drop_thinking`) from assistant turns before the last user turn, and
  those turns are then announced with `</think>`, unless the request carries tools: then every
  reasoning is kept (interleaved thinking) and every user turn is announced with `<think>`.
- Tools: a `## Tools` block appended to the first system message (an empty one is put first if there
  is none). Tool results have no role of their own: consecutive tool messages (and a user message
  right after them) merge into one user turn, `<tool_result>{content}</tool_result>` parts joined by
  a blank line, sorted in the order of the preceding assistant turn's calls.
- The response format (a JSON schema) is an instruction block after the tools block; nothing here
  enforces it (constrained decoding does, daemon/protocol/constrain.py).
- Every piece of the request's text is marked as content (`Encoded.content_spans`): the tokenizer
  tokenizes it as text, so special-token text in it never becomes a control token; only what this
  encoder writes itself is structure (docs/model-format.md, "Chat encoding").

Two reasoning-effort variants exist: the first release (`original`: only `max` adds the "Absolute
maximum" preamble) and the later one (`0731`: `low` adds nothing, `high` the "Absolute maximum"
preamble, `max` the "Beyond maximum" one). `effort_variant_for` picks one from the model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
DSML = "｜DSML｜"
LATEST_REMINDER = "<｜latest_reminder｜>"
SPECIAL_TOKENS = (BOS, EOS, USER, ASSISTANT, LATEST_REMINDER, THINK, END_THINK, DSML)

TOOL_CALLS_OPEN = f"<{DSML}tool_calls>"
TOOL_CALLS_CLOSE = f"</{DSML}tool_calls>"
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAM_CLOSE = f"</{DSML}parameter>"

_ABSOLUTE_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
_BEYOND_MAX = (
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
)
# variant -> effort level -> preamble (only in thinking mode, right after BOS)
EFFORT_PREAMBLES = {
    "original": {"low": "", "high": "", "max": _ABSOLUTE_MAX},
    "0731": {"low": "", "high": _ABSOLUTE_MAX, "max": _BEYOND_MAX},
}
# OpenAI's reasoning_effort values -> the encoder's levels ("none" means chat mode, see resolve_mode)
EFFORT_LEVELS = {"minimal": "low", "low": "low", "medium": "high", "high": "high", "xhigh": "max", "max": "max"}

_TOOLS_BLOCK = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    f"\"<{DSML}tool_calls>\" block like the following:\n\n"
    f"<{DSML}tool_calls>\n"
    f"<{DSML}invoke name=\"$TOOL_NAME\">\n"
    f"<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"<{DSML}invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"</{DSML}tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    f"If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete reasoning inside "
    f"{THINK}...{END_THINK} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {END_THINK} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
_RESPONSE_FORMAT = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"


class EncodingError(ValueError):
    """Messages that cannot be encoded; the message names the field (an HTTP 400)."""


@dataclass(frozen=True)
class ChatOptions:
    thinking: bool = False
    effort: str = "low"                     # low | high | max (EFFORT_LEVELS' values)
    response_schema: dict | None = None     # rendered as the response-format block


@dataclass(frozen=True)
class Encoded:
    text: str
    system_prefix_bytes: int | None   # UTF-8 length of BOS + preamble + leading system part, if any
    resume_bytes: int | None          # where the next turn's prompt will diverge (before a dropped
                                      # `<think>`), when that is before the end; else None
    content_spans: tuple[tuple[int, int], ...] = ()   # [start, end) character ranges of `text` that
                                      # are the request's text (tokenized as text: never a control token)


def to_json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def effort_variant_for(model_name: str, template: str | None) -> str:
    """Which effort preambles a model directory expects. Unconfirmed upstream how to tell; the later
    release carries "0731" in its name and its template mentions "Beyond maximum"."""
    if "0731" in model_name or (template and "Beyond maximum" in template):
        return "0731"
    return "original"


def render_tools_block(tools: list[dict]) -> str:
    return "".join(text for text, _ in _tools_block_pieces(tools))


def _tools_block_pieces(tools: list[dict]) -> list[tuple[str, bool]]:
    """The tools block as (text, from the request?) pieces: the schemas are the client's text."""
    schemas = "\n".join(to_json(t["function"] if "function" in t else t) for t in tools)
    head, tail = _TOOLS_BLOCK.split("{schemas}")
    return [(head, False), (schemas, True), (tail, False)]


def dsml_arguments(arguments) -> dict:
    """A history tool call's arguments as a dict: a JSON object string is parsed; anything else is
    wrapped as {"arguments": raw}, as the reference encoder does."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def render_tool_calls(calls: list[dict]) -> str:
    """`\\n\\n<｜DSML｜tool_calls>…</｜DSML｜tool_calls>` for a list of {name, arguments}."""
    return "".join(text for text, _ in _tool_call_pieces(calls))


def _tool_call_pieces(calls: list[dict]) -> list[tuple[str, bool]]:
    """The DSML block as (text, from the request?) pieces: names, keys and values are the client's."""
    out = [(f"\n\n{TOOL_CALLS_OPEN}\n", False)]
    for j, c in enumerate(calls):
        out += [(("\n" if j else "") + f'<{DSML}invoke name="', False), (c["name"], True), ('">\n', False)]
        for k, (key, value) in enumerate(dsml_arguments(c["arguments"]).items()):
            is_str = isinstance(value, str)
            out += [(("\n" if k else "") + f'<{DSML}parameter name="', False), (str(key), True),
                    (f'" string="{"true" if is_str else "false"}">', False),
                    (value if is_str else to_json(value), True), (PARAM_CLOSE, False)]
        out.append((f"\n{INVOKE_CLOSE}", False))
    out.append((f"\n{TOOL_CALLS_CLOSE}", False))
    return out


# ------------------------------------------------------------------------------------------------
# messages -> turns


def _text(content, where: str) -> str:
    """A message's text: its parts joined as the template path joins them (chat.join_parts)."""
    from ..chat import join_parts

    return join_parts(_parts(content, where))


def _parts(content, where: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type", "text") != "text" or not isinstance(part.get("text"), str):
                raise EncodingError(f"{where}[{j}]: expected a text part {{\"type\": \"text\", \"text\": ...}}")
            out.append(part["text"])
        return out
    raise EncodingError(f"{where}: expected a string or a list of text parts")


def _turns(messages: list[dict]) -> list[dict]:
    """Merge tool results into user turns and sort them by call order (checked messages in)."""
    turns: list[dict] = []
    call_order: dict[str, int] = {}
    for i, m in enumerate(messages):
        role = m["role"]
        where = f"messages[{i}].content"
        if role == "tool":
            block = ("tool", m.get("tool_call_id") or "", _text(m.get("content"), where))
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].append(block)
            else:
                turns.append({"role": "user", "blocks": [block]})
        elif role == "user":
            blocks = [("text", "", t) for t in _parts(m.get("content"), where)] or [("text", "", "")]
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].extend(blocks)
            else:
                turns.append({"role": "user", "blocks": blocks})
        elif role in ("system", "developer") and any(t["role"] != "system" for t in turns):
            # A system message after the conversation has begun (Claude Code's environment block).
            # V4's encoder writes system text with no marker wherever it stands, which would glue it
            # to the turn before and leave no `<｜Assistant｜>` when it is last: it is read as a text
            # part of the user turn at its place instead (docs/model-format.md, "Chat encoding").
            blocks = [("text", "", t) for t in _parts(m.get("content"), where)] or [("text", "", "")]
            if turns[-1]["role"] == "user":
                turns[-1]["blocks"].extend(blocks)
            else:
                turns.append({"role": "user", "blocks": blocks})
        elif role in ("system", "developer"):   # developer: OpenAI's newer name for system
            turns.append({"role": "system", "text": _text(m.get("content"), where)})
        else:
            calls = [{"id": c.get("id") or "", "name": c["function"]["name"],
                      "arguments": c["function"].get("arguments", "{}")} for c in m.get("tool_calls") or []]
            reasoning = m.get("reasoning_content")
            if reasoning is None:
                reasoning = m.get("reasoning")
            turns.append({"role": "assistant", "content": _text(m.get("content"), where),
                          "reasoning": reasoning or "", "calls": calls})
        if role == "assistant" and turns[-1]["calls"]:
            call_order = {c["id"]: k for k, c in enumerate(turns[-1]["calls"]) if c["id"]}
        elif role == "tool" and call_order:
            _sort_results(turns[-1]["blocks"], call_order)
    return turns


def _sort_results(blocks: list, order: dict[str, int]) -> None:
    """Tool-result blocks in call order; text blocks keep their places."""
    slots = [k for k, b in enumerate(blocks) if b[0] == "tool"]
    ordered = sorted((blocks[k] for k in slots), key=lambda b: order.get(b[1], 0))
    for k, b in zip(slots, ordered):
        blocks[k] = b


# ------------------------------------------------------------------------------------------------


class _Writer:
    """The prompt as it is written, piece by piece, and which characters came from the request."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.n = 0                                  # characters so far
        self.spans: list[tuple[int, int]] = []      # the request's text: [start, end) character ranges

    def structure(self, text: str) -> None:
        self.parts.append(text)
        self.n += len(text)

    def content(self, text: str) -> None:
        if not text:
            return
        if self.spans and self.spans[-1][1] == self.n:
            self.spans[-1] = (self.spans[-1][0], self.n + len(text))
        else:
            self.spans.append((self.n, self.n + len(text)))
        self.structure(text)

    def pieces(self, pieces: list[tuple[str, bool]]) -> None:
        for text, from_request in pieces:
            (self.content if from_request else self.structure)(text)


def encode(messages: list[dict], tools: list[dict] | None, opts: ChatOptions, *,
           effort_variant: str = "original") -> Encoded:
    """Checked OpenAI messages (daemon/chat.check_messages) -> the prompt text."""
    turns = _turns(messages)
    if tools or opts.response_schema is not None:
        first = next((t for t in turns if t["role"] == "system"), None)
        if first is None:
            first = {"role": "system", "text": ""}
            turns.insert(0, first)
        first["tools"] = tools or None
        first["schema"] = opts.response_schema
    thinking = opts.thinking
    drop = thinking and not tools
    last_user = max((k for k, t in enumerate(turns) if t["role"] == "user"), default=-1)

    w = _Writer()
    w.structure(BOS)
    if thinking:
        w.structure(EFFORT_PREAMBLES[effort_variant][opts.effort])
    system_end = None
    turn_ends = []                 # characters written after each turn
    for k, t in enumerate(turns):
        role = t["role"]
        if role == "system":
            w.content(t["text"])
            if t.get("tools"):
                w.structure("\n\n")
                w.pieces(_tools_block_pieces(t["tools"]))
            if t.get("schema") is not None:
                w.structure("\n\n" + _RESPONSE_FORMAT)
                w.content(to_json(t["schema"]))
        elif role == "user":
            w.structure(USER)
            for j, (kind, _, text) in enumerate(t["blocks"]):
                if j:
                    w.structure("\n\n")
                if kind == "text":
                    w.content(text)
                else:
                    w.structure("<tool_result>")
                    w.content(text)
                    w.structure("</tool_result>")
        else:
            keep = thinking and (not drop or k > last_user)
            # the conversation's last message, an assistant prefix: left open for the model to continue
            open_turn = k == len(turns) - 1 and not t["calls"] and bool(t["content"])
            if keep:
                w.content(t["reasoning"])
                w.structure(END_THINK)
            w.content(t["content"])
            if t["calls"]:
                w.pieces(_tool_call_pieces(t["calls"]))
            if not open_turn:
                w.structure(EOS)
        turn_ends.append(w.n)
        if system_end is None and role != "system":
            system_end = k
        nxt = turns[k + 1]["role"] if k + 1 < len(turns) else None
        if role == "user" and nxt in (None, "assistant"):
            open_think = thinking and (not drop or k >= last_user)
            w.structure(ASSISTANT + (THINK if open_think else END_THINK))
    text = "".join(w.parts)
    n_system = len(turns) if system_end is None else system_end
    system_bytes = len(text[:turn_ends[n_system - 1]].encode()) if n_system else None
    resume = None
    if drop and text.endswith(ASSISTANT + THINK):
        resume = len(text.encode()) - len(THINK.encode())
    return Encoded(text, system_bytes, resume, tuple(w.spans))


def resolve_mode(*, thinking_field, template_kwargs: dict | None, reasoning_effort: str | None,
                 default: str) -> tuple[bool, str]:
    """(thinking?, effort level) from a request's fields, else the server default (`--reasoning`:
    chat | thinking | high | max). Explicit switches (`thinking`, `chat_template_kwargs`) win over
    `reasoning_effort`; `reasoning_effort: "none"` means chat mode."""
    kw = template_kwargs or {}
    explicit = None
    if isinstance(thinking_field, dict) and thinking_field.get("type") in ("enabled", "disabled"):
        explicit = thinking_field["type"] == "enabled"
    elif isinstance(thinking_field, bool):
        explicit = thinking_field
    elif isinstance(kw.get("thinking"), bool):
        explicit = kw["thinking"]
    elif isinstance(kw.get("enable_thinking"), bool):
        explicit = kw["enable_thinking"]
    effort = reasoning_effort if reasoning_effort is not None else kw.get("reasoning_effort")
    if default in ("high", "max"):
        default_thinking, default_level = True, default
    else:
        default_thinking, default_level = default == "thinking", "low"
    level = EFFORT_LEVELS.get(effort, default_level) if effort not in (None, "none") else default_level
    if explicit is not None:
        return explicit, level
    if effort == "none":
        return False, "low"
    if effort is not None:
        return True, level
    return default_thinking, default_level

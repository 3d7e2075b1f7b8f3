"""Which chat encoding a model directory gets: DeepSeek-V4's native encoder, or the directory's own
jinja template when it ships one that renders differently.

The released V4 shipped no template (its reference encoder is Python, which cairn never executes);
a template said to be equivalent came later. So: no template -> native; a template that renders a
set of probe conversations exactly as the native encoder does -> native (it is the same format, and
the native encoder also handles what a template cannot, such as JSON-string tool arguments); any
other template -> that template, as the model's authors wrote it. `describe` says which, for the
start-up log line.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chat import ChatRenderer, ChatTemplateError, RenderedChat, canonical_roles, check_messages, check_tools
from .dsv4.encoding import ChatOptions, EncodingError, effort_variant_for, encode


class V4Renderer:
    name = "deepseek-v4 native"

    def __init__(self, effort_variant: str = "original") -> None:
        self.effort_variant = effort_variant

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, options: ChatOptions | None = None) -> RenderedChat:
        check_messages(messages)                 # field-naming errors; the raw parts are encoded below
        tools = check_tools(tools)
        try:
            enc = encode(canonical_roles(messages), tools, options or ChatOptions(), effort_variant=self.effort_variant)
        except EncodingError as e:
            raise ChatTemplateError(str(e)) from None
        return RenderedChat(enc.text, enc.system_prefix_bytes, enc.resume_bytes, enc.content_spans)


_TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                            "parameters": {"type": "object",
                                                           "properties": {"path": {"type": "string"}}}}}]
PROBES: tuple[tuple[list[dict], list | None], ...] = (
    ([{"role": "user", "content": "Hi"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}, {"role": "user", "content": "Bye"}],
     None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "read a"},
      {"role": "assistant", "content": "", "reasoning_content": "need it",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "text of a"}], _TOOLS),
)
PROBE_OPTIONS = (ChatOptions(thinking=False), ChatOptions(thinking=True))


@dataclass(frozen=True)
class Choice:
    renderer: object
    encoding: str        # "deepseek-v4 native" | "model template"
    reason: str


def choose_renderer(md, protect: tuple[str, ...] = ()) -> Choice:
    """`protect`: the tokenizer's control-token texts, masked in request text by a template (chat.py)."""
    variant = effort_variant_for(md.name, md.chat_template)
    native = V4Renderer(variant)
    if not md.chat_template:
        return Choice(native, native.name, f"no chat template in the model directory; effort variant {variant}")
    try:
        template = ChatRenderer(md.chat_template, md.bos_token, md.eos_token, protect)
    except ChatTemplateError as e:
        return Choice(native, native.name, f"the directory's template does not compile ({e}); "
                                           f"effort variant {variant}")
    for messages, tools in PROBES:
        for opts in PROBE_OPTIONS:
            want = native.render(messages, tools=tools, options=opts).text
            try:
                got = template.render(messages, tools=tools, options=opts).text
            except ChatTemplateError as e:
                return Choice(template, template.name, f"the directory's template fails a V4 probe ({e})")
            if got != want:
                return Choice(template, template.name, "the directory's template renders differently from the "
                                                       "V4 encoding; using it as shipped")
    return Choice(native, native.name, f"the directory's template renders as the V4 encoding; "
                                       f"effort variant {variant}")

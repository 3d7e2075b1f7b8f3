"""Chat messages -> Qwen3.5 prompt text, through the model's own jinja template.

Design notes:
- The shared jinja renderer (daemon/protocol/chat.py) does the work: HF's environment, field-naming
  errors, control-token masking. This adds what Qwen's template needs or cannot tell us:
  - tool-call `arguments` sent as JSON strings (OpenAI's shape) are decoded to objects first: the
    template writes `arguments|items`, one `<parameter=…>` per key;
  - `reasoning` is the same field as `reasoning_content`; an assistant content holding
    `<think>…</think>` is split as the template itself would (it cannot, once the request's control
    text is masked), so the render stays the template's, byte for byte;
  - the system part (`<|im_start|>system\\n…<|im_end|>\\n`, tools included): the template refuses a
    conversation without a user query, so the shared probe (render the system messages alone)
    cannot find it; it is the first turn, read from the masked render;
  - `resume_bytes`: the template drops a past turn's `<think>` block before the last user query,
    so the next turn's prompt leaves this one right after `<|im_start|>assistant\\n`, before the
    generation prompt's `<think>\\n` (thinking) or `<think>\\n\\n</think>\\n\\n` (chat mode).
- Thinking on/off is the template's `enable_thinking` (ChatOptions.thinking; no options: the
  template's default, thinking).
"""

from __future__ import annotations

import dataclasses
import json

from ..chat import ChatRenderer, ChatTemplateError, RenderedChat, check_messages, continues_final
from .markers import CHAT_OPENER, CONTROL_TEXTS, END_THINK, IM_END, IM_START, THINK, THINKING_OPENER

ASSISTANT_START = IM_START + "assistant\n"
SYSTEM_START = IM_START + "system\n"


class Qwen35Renderer(ChatRenderer):
    name = "qwen3.5 template"

    def __init__(self, template: str, bos_token: str = "", eos_token: str = IM_END,
                 protect: tuple[str, ...] = ()) -> None:
        super().__init__(template, bos_token or "", eos_token or IM_END, (*CONTROL_TEXTS, *protect))

    @classmethod
    def from_model_dir(cls, md, protect: tuple[str, ...] = ()) -> "Qwen35Renderer":
        from cairn.daemon.weights.model_dir import ModelDirError

        if not md.chat_template:
            raise ModelDirError(f"{md.path}: no chat template (tokenizer_config.json `chat_template` or "
                                "chat_template.jinja); a Qwen3.5 model needs its own")
        try:
            return cls(md.chat_template, md.bos_token, md.eos_token, protect)
        except ChatTemplateError as e:
            raise ModelDirError(f"{md.path}: {e}") from None

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, options=None) -> RenderedChat:
        msgs = prepare_messages(check_messages(messages))
        r = super().render(msgs, tools=tools, add_generation_prompt=add_generation_prompt, options=options)
        resume = None
        if add_generation_prompt and not continues_final(msgs):
            for opener in (THINKING_OPENER, CHAT_OPENER):
                if r.text.endswith(ASSISTANT_START + opener):
                    resume = len(r.text.encode()) - len(opener.encode())
                    break
        return dataclasses.replace(r, resume_bytes=resume)

    def _system_prefix(self, msgs, tools, text: str, kwargs=None) -> str | None:
        # `text` is the masked render: the first `<|im_end|>` in it is the template's own.
        if not text.startswith(SYSTEM_START):
            return None
        end = text.find(IM_END + "\n")
        return None if end < 0 else text[:end + len(IM_END) + 1]


def prepare_messages(msgs: list[dict]) -> list[dict]:
    """Checked messages (chat.check_messages) in the shape the template reads (module notes)."""
    out = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            out.append(m)
            continue
        m = dict(m)
        if not isinstance(m.get("reasoning_content"), str) and isinstance(m.get("reasoning"), str):
            m["reasoning_content"] = m["reasoning"]
        content = m.get("content") or ""
        if not isinstance(m.get("reasoning_content"), str) and END_THINK in content:
            # the template's own split (its `'</think>' in content` branch)
            m["reasoning_content"] = content.split(END_THINK)[0].rstrip("\n").split(THINK)[-1].lstrip("\n")
            m["content"] = content.split(END_THINK)[-1].lstrip("\n")
        if m.get("tool_calls"):
            m["tool_calls"] = [_decoded(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
        out.append(m)
    return out


def _decoded(call: dict, where: str) -> dict:
    args = call["function"].get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            raise ChatTemplateError(f"{where}.function.arguments: not valid JSON; Qwen3.5's format writes each "
                                    "argument as a parameter, so arguments must be a JSON object") from None
    if not isinstance(args, dict):
        raise ChatTemplateError(f"{where}.function.arguments: expected a JSON object (one parameter per key), "
                                f"got {type(args).__name__}")
    return {**call, "function": {**call["function"], "arguments": args}}

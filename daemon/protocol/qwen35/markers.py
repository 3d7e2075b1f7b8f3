"""Qwen3.5's chat-format texts, as its chat template and tokenizer spell them (one place)."""

from __future__ import annotations

IM_START = "<|im_start|>"       # a turn opens: IM_START + role + "\n" (role text is ordinary tokens)
IM_END = "<|im_end|>"           # a turn closes; the end-of-sequence token of a reply
ENDOFTEXT = "<|endoftext|>"
THINK = "<think>"
END_THINK = "</think>"
TOOL_CALL = "<tool_call>"       # opens one call: TOOL_CALL "\n<function=NAME>\n" params "</function>\n" TOOL_CALL_CLOSE
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "\n</parameter>"  # a value ends here: a value may not contain it (the grammar forbids it)

# The generation prompt's tail the template writes after "<|im_start|>assistant\n", by mode.
THINKING_OPENER = THINK + "\n"
CHAT_OPENER = THINK + "\n\n" + END_THINK + "\n\n"

# Control tokens a reply may carry as text, because the output parser reads them (the tokenizer
# hides every other added token from a reply's text).
REPLY_MARKERS = frozenset({THINK, END_THINK, TOOL_CALL, TOOL_CALL_CLOSE})
# What `tool_choice: "none"` bans: the token that opens a call.
CALL_OPENER = TOOL_CALL

# Control texts of the format, masked in request text even when a tokenizer does not list them.
CONTROL_TEXTS = (IM_START, IM_END, ENDOFTEXT, THINK, END_THINK, TOOL_CALL, TOOL_CALL_CLOSE,
                 TOOL_RESPONSE, TOOL_RESPONSE_CLOSE)

"""A model family -> its chat half (`ChatFamily`, docs/design/families.md §1; issue 43): how a
prompt is rendered, what the model writes is parsed, a forced call is constrained, a turn starts,
and which token `tool_choice: "none"` bans. The family name is ModelDir.family
(daemon/weights/families.py chose it from the model's files).
"""

from __future__ import annotations

DEFAULT = "deepseek_v4"


def chat_family(name: str = DEFAULT):
    """The ChatFamily object of a family name (ModelDir.family)."""
    if name == "deepseek_v4":
        from .dsv4.family import CHAT
    elif name == "qwen3_5":
        from .qwen35.family import CHAT
    else:
        raise ValueError(f"no chat format for model family {name!r}; known: deepseek_v4, qwen3_5")
    return CHAT

"""Qwen3.5's chat format (issue 43): rendering through the model's template,
the output parser, forced-call grammar, turn markers. `family.CHAT` is the family's object."""

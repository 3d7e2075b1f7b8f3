"""Qwen3.5's chat half as one object: what the plan's `ChatFamily` (docs/design/families.md §1)
asks of a family, so wiring it into `daemon/protocol/families.py` and the app is a small change.

daemon/protocol/families.py maps a qwen3_5 model (ModelDir.family) to this object.
"""

from __future__ import annotations

from ..chat_encoding import Choice
from ..dsv4.encoding import resolve_mode as _resolve_mode
from .grammar import Qwen35Grammars
from .markers import CALL_OPENER, END_THINK, REPLY_MARKERS, THINK
from .output import OutputParser
from .render import Qwen35Renderer
from .turns import turn_boundaries, turn_markers


class Qwen35Chat:
    name = "qwen3_5"
    OutputParser = OutputParser
    reply_markers = REPLY_MARKERS     # control tokens a reply keeps as text (the parser reads them)
    think, end_think = THINK, END_THINK
    call_opener = CALL_OPENER         # the token `tool_choice: "none"` bans
    turn_markers = staticmethod(turn_markers)
    turn_boundaries = staticmethod(turn_boundaries)
    Grammars = Qwen35Grammars         # what daemon/protocol/agent_protocol.py builds per model

    @staticmethod
    def choose_renderer(md, protect: tuple[str, ...] = ()) -> Choice:
        r = Qwen35Renderer.from_model_dir(md, protect)
        return Choice(r, r.name, "Qwen3.5's own chat template from the model directory")

    @staticmethod
    def grammars(md, tok) -> Qwen35Grammars:
        return Qwen35Grammars(md.tokenizer_text(), int(md.config["vocab_size"]), tok.eos_id, tok)

    @staticmethod
    def resolve_mode(**kw) -> tuple[bool, str]:
        """(thinking?, effort): V4's reading of the request's switches; the template has no effort
        levels, so only thinking on/off (`enable_thinking`) reaches it."""
        return _resolve_mode(**kw)

    # reply_ids replays V4's rendering only (reply_ids.reply_marks is None for this renderer).
    render_reply = None


CHAT = Qwen35Chat()

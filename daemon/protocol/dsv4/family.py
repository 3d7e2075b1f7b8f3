"""DeepSeek-V4's chat half as one object: what the plan's `ChatFamily` (docs/design/families.md §1)
asks of a family, the same shape as daemon/protocol/qwen35/family.py. daemon/protocol/families.py
maps the model's family to it; the daemon asks it instead of importing V4's modules."""

from __future__ import annotations

from cairn.actors.checkpoints.turns import TemplateMarkers, markers_from_vocab, turn_boundaries

from . import encoding
from .encoding import ASSISTANT, DSML, END_THINK, THINK, USER
from .grammar import Dsv4Grammars
from .output import OutputParser

# The chat template writes each message's start as one special token (actors/checkpoints/turns.py);
# daemon/modelgen/make_model.py writes the same template for generated models.
USER_MARKER = USER
MESSAGE_START_MARKERS = (USER, ASSISTANT, "<｜tool▁outputs▁begin｜>")
REPLY_MARKERS = frozenset({THINK, END_THINK, DSML})   # control tokens a reply keeps as text


def turn_markers(tokenizer) -> TemplateMarkers | None:
    """The message-start ids a tokenizer (`token_to_id`) knows; None without any."""
    return markers_from_vocab(tokenizer.token_to_id, MESSAGE_START_MARKERS, USER_MARKER)


class Dsv4Chat:
    name = "deepseek_v4"
    OutputParser = OutputParser
    reply_markers = REPLY_MARKERS
    think, end_think = THINK, END_THINK
    call_opener = DSML               # the token `tool_choice: "none"` bans: it opens the call block
    turn_markers = staticmethod(turn_markers)
    turn_boundaries = staticmethod(turn_boundaries)
    resolve_mode = staticmethod(encoding.resolve_mode)
    render_reply = staticmethod(encoding.render_tool_calls)   # reply_ids replays V4's rendering
    Grammars = Dsv4Grammars          # per model: JSON schemas and the DSML forced-call grammar

    @staticmethod
    def choose_renderer(md, protect: tuple[str, ...] = ()):
        from ..chat_encoding import choose_renderer   # the native encoder or the directory's template

        return choose_renderer(md, protect)

    @staticmethod
    def grammars(md, tok):
        return Dsv4Grammars.from_model_dir(md, tok)


CHAT = Dsv4Chat()

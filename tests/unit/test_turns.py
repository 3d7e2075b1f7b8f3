"""turn_boundaries: message starts read from the template's special tokens in the ids."""

import numpy as np

from cairn.actors.checkpoints.turns import NO_BOUNDARIES, TemplateMarkers, TurnBoundaries, markers_from_vocab, turn_boundaries

BOS, EOS, USER, ASSISTANT, OUTPUTS = 0, 1, 2, 3, 9
M = TemplateMarkers(message_starts=(USER, ASSISTANT, OUTPUTS), user=USER)


def text(n: int, at: int = 100) -> list[int]:
    return list(range(at, at + n))


def test_raw_id_conversation_gives_system_end_and_last_user_start():
    system = [BOS] + text(50)
    turn1 = [USER] + text(7) + [ASSISTANT] + text(5, 300) + [EOS]
    prompt = system + turn1 + [USER] + text(4, 400) + [ASSISTANT]
    b = turn_boundaries(prompt, M)
    assert b == TurnBoundaries(system_end=len(system), last_user=len(system) + len(turn1))
    # the first request of a conversation: both are the system part's end
    first = system + [USER] + text(4, 400) + [ASSISTANT]
    assert turn_boundaries(np.asarray(first), M) == TurnBoundaries(len(system), len(system))


def test_tool_outputs_and_assistant_prefill_start_messages_too():
    system = [BOS] + text(20)
    assert turn_boundaries(system + [OUTPUTS] + text(3) + [ASSISTANT], M) == TurnBoundaries(21, None)
    assert turn_boundaries(system + [ASSISTANT] + text(3), M) == TurnBoundaries(21, None)


def test_ids_without_markers_have_no_boundaries():
    assert turn_boundaries(text(500), M) == NO_BOUNDARIES
    assert turn_boundaries([BOS] + text(500) + [EOS], M) == NO_BOUNDARIES
    assert turn_boundaries([USER] + text(10), M) == NO_BOUNDARIES      # nothing precedes a marker at 0
    assert turn_boundaries([USER] + text(10) + [USER] + text(3), M) == TurnBoundaries(11, 11)
    assert turn_boundaries(text(10) + [USER], None) == NO_BOUNDARIES


def test_markers_from_vocab_knows_the_deepseek_markers():
    from types import SimpleNamespace

    from cairn.daemon.protocol.dsv4.family import CHAT   # V4 names its markers (daemon/protocol/families.py)

    def v4(vocab):
        return CHAT.turn_markers(SimpleNamespace(token_to_id=vocab.get))

    vocab = {"<｜User｜>": 5, "<｜Assistant｜>": 6, "<｜tool▁outputs▁begin｜>": 12}
    assert v4(vocab) == TemplateMarkers((5, 6, 12), 5)
    assert v4({}) is None
    assert v4({"<｜Assistant｜>": 6}) == TemplateMarkers((6,), None)
    assert markers_from_vocab(vocab.get, ("<｜Assistant｜>",), "<｜User｜>") == TemplateMarkers((6,), 5)

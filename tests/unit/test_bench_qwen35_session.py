"""bench/qwen35_session.py's request plan (issue 43 §5: a system prompt, the main agent's 10 turns, two
sub-agents on the same system prompt) and its one tokenizer change ("\\n\\n" as one token, as the
release's vocabulary has it). No server, no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer

from cairn.daemon.modelgen.qwen35 import BENCH_PRESETS, make_qwen_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import qwen35_session as bench  # noqa: E402


def kinds(plan):
    out, previous = [], None
    for conv, turn in plan:
        out.append(bench.kind_of(conv, turn, previous))
        previous = conv
    return out


def test_full_plan_is_ten_main_turns_and_two_interleaved_sub_agents():
    plan = bench.schedule(bench.FULL)
    assert [f"{c}{t}" for c, t in plan] == [
        "main0", "main1", "A0", "B0", "main2", "A1", "B1", "main3", "A2", "B2", "main4",
        "main5", "main6", "main7", "main8", "main9"]
    for conv, n in (("main", 10), ("A", 3), ("B", 3)):
        assert [t for c, t in plan if c == conv] == list(range(n))     # each conversation's turns in order
    k = dict(zip((f"{c}{t}" for c, t in plan), kinds(plan)))
    assert [x for x, v in k.items() if v == "first"] == ["main0", "A0", "B0"]
    # every sub-agent turn after its first comes back after another conversation ran, as do main2..main4
    assert [x for x, v in k.items() if v == "switch back"] == ["main2", "A1", "B1", "main3", "A2", "B2", "main4"]
    assert [x for x, v in k.items() if v == "next"] == ["main1", "main5", "main6", "main7", "main8", "main9"]


def test_quick_plan_has_every_kind_of_request():
    plan = bench.schedule(bench.QUICK)
    assert [f"{c}{t}" for c, t in plan] == ["main0", "A0", "B0", "main1", "A1", "B1", "main2", "main3"]
    assert set(kinds(plan)) == {"first", "next", "switch back"}


def test_common_prefix():
    assert bench.common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert bench.common_prefix([1, 2], [1, 2, 3]) == 2
    assert bench.common_prefix([], [1]) == 0


def test_release_newlines_gives_two_newlines_one_token_and_keeps_every_other_id(tmp_path):
    size = BENCH_PRESETS[bench.PRESET].vocab_size
    (tmp_path / "tokenizer.json").write_text(make_qwen_tokenizer(size).to_str())
    before = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    opener = "<think>\n\n</think>\n\n"              # the chat-mode generation prompt past <|im_start|>assistant\n
    assert len(before.encode(opener).ids) == 6            # the trained BPE: "\n\n" is two tokens

    assert bench.release_newlines(tmp_path) is True
    after = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    # as the release tokenizes it: <think> \n\n </think> \n\n (llama.cpp's last checkpoint is 4 tokens before
    # a prompt's end: where the next turn's prompt leaves this one)
    assert len(after.encode(opener).ids) == 4 and len(after.encode("\n\n").ids) == 1
    assert after.get_vocab_size() == before.get_vocab_size() == size
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab)))   # no gap: readers renumber around one
    text = "def main():\n    return 12 + x  # Rule 7: read files first.\n"
    assert after.encode(text).ids == before.encode(text).ids
    assert bench.release_newlines(tmp_path) is False          # once only

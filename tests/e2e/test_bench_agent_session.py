"""bench/agent_session.py --sub-agents --quick against two real daemons (tiny model): the script runs end
to end and reports what it measured — the session's shape, where each switch back's prefix came
from, and what the captures copied in each mode. No timings are asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import agent_session  # noqa: E402


def test_schedule_interleaves_main_and_two_sub_agents():
    assert agent_session.schedule(2) == [("main", 0), ("A", 0), ("B", 0), ("main", 1), ("A", 1), ("B", 1)]


def test_turns_follow_the_template_and_share_only_the_system_prompt(tiny_model_dir):
    vocab = agent_session.Vocab.from_model_dir(tiny_model_dir)
    shape = agent_session.QUICK
    turns = agent_session.conversation_turns(vocab, shape)
    first = {c: turns[c][0] for c in agent_session.CONVERSATIONS}
    system = first["main"][:shape.system_tokens]
    assert system[0] == vocab.bos and all(first[c][:shape.system_tokens] == system for c in first)
    assert all(first[c][shape.system_tokens] == vocab.user for c in first)
    # past the system prompt and the user marker, the conversations differ
    assert first["A"][shape.system_tokens + 1:] != first["B"][shape.system_tokens + 1:]
    for conv, size in (("main", shape.main_turn_tokens), ("A", shape.sub_turn_tokens)):
        later = turns[conv][1]
        assert len(later) == size and later[0] == vocab.user and later[-2:] == [vocab.assistant, vocab.end_think]
        specials = {vocab.bos, vocab.eos, vocab.user, vocab.assistant, vocab.end_think}
        assert not specials & set(later[1:-2])


def test_quick_run_restores_every_paged_switch_back_from_memory(tiny_model_dir, tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(BENCH / "agent_session.py"), "--sub-agents", "--quick",
                           "--model", str(tiny_model_dir), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    shape = agent_session.QUICK
    n = 3 * shape.turns
    assert res["same_prompts"], "greedy replies must be the same in both modes, so the prompts are"
    assert res["checkpoint_memory_mb"] == agent_session.scaled_budget_mb(res["bytes_per_token"]["per_token"])
    for mode in agent_session.MODES:
        rows = res["rows"][mode]
        assert [(r["conv"], r["turn"]) for r in rows] == agent_session.schedule(shape.turns)
        assert res["summary"][mode]["switch_backs"] == n - 3
        for conv in agent_session.CONVERSATIONS:
            prompts = [r["prompt"] for r in rows if r["conv"] == conv]
            assert prompts == sorted(prompts) and len(set(prompts)) == shape.turns   # each turn extends the last
        # each switch back restored its conversation's previous prompt end
        for r in rows:
            if r["switch_back"]:
                assert r["from"].startswith(f"{r['conv']} t{r['turn'] - 1} prompt_end, "), r
    paged = res["summary"]["pages"]
    assert paged["switch_backs_from_memory"] == paged["switch_backs"]
    assert res["goal_met"]
    # full copies copy every page group at each capture; shared pages copy only the tails
    assert paged["captured_copied_bytes"] < res["summary"]["copies"]["captured_copied_bytes"]
    assert paged["switch_backs_whole_from_memory"] == paged["switch_backs"] and paged["recomputed_tokens"] == 0
    assert "goal (every switch back restores its whole previous prompt from memory in the paged run): met" in proc.stdout

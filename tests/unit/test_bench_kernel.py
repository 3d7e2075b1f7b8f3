"""bench/kernel.py and bench/llama_peer.py compare equal work: HF computes the last position's logits
only, the bandwidth bound's probe is not the kernel, and llama.cpp is asked for the same work
(without running llama.cpp: its command, its timings checks and the request sequence, on a fake)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import llama_peer  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_kernel", BENCH / "kernel.py")
bench_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_kernel)


def test_hf_prefill_and_decode_compute_last_position_logits_only(tiny_dir, monkeypatch):
    from transformers import DeepseekV4ForCausalLM

    head_rows: list[int] = []
    load = DeepseekV4ForCausalLM.from_pretrained

    def load_with_hook(*a, **kw):
        model = load(*a, **kw)
        model.lm_head.register_forward_hook(lambda mod, inp, out: head_rows.append(inp[0].shape[1]))
        return model

    monkeypatch.setattr(DeepseekV4ForCausalLM, "from_pretrained", load_with_hook)
    prompts = bench_kernel.prompts_for(512, [40])
    out = bench_kernel.bench_hf(str(tiny_dir), 1, prompts, 16, 2)
    assert out["decode_at"] == 40
    # 3 prefill chunks (16, 16, 8 tokens) and 2 decode steps, one LM-head row each
    assert head_rows == [1] * 5


def test_read_probe_runs_without_the_kernel(monkeypatch):
    monkeypatch.setitem(sys.modules, "cairn._kernel", None)  # any import of the kernel fails
    assert bench_kernel.stream_read_gbs(2, nbytes=8 << 20, repeat=1) > 0


def test_no_published_peer_figures_in_the_bench():
    text = (BENCH / "kernel.py").read_text()
    assert "LLAMA_PEER" not in text and "same shape" not in text


def test_llama_server_command_does_the_kernels_work():
    cmd = llama_peer.server_command(Path("llama-server"), Path("m.gguf"), 2, 512, 4096, 8080)
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["-t"] == flags["-tb"] == "2"
    assert flags["-np"] == "1" and flags["-ub"] == "512" and flags["-c"] == "4096"
    assert flags["-ctk"] == flags["-ctv"] == "f32"
    assert flags["-ctxcp"] == "0" and flags["-cram"] == "0"


@pytest.mark.parametrize("timings, field", [({"prompt_n": 511, "predicted_n": 1}, "prompt"),
                                            ({"prompt_n": 512, "predicted_n": 3}, "generated")])
def test_llama_timings_refused_unless_the_whole_prompt_and_all_steps_ran(timings, field):
    with pytest.raises(llama_peer.PeerError, match=field):
        llama_peer.check_timings(timings, 512, 1)


class FakeServer:
    def __init__(self):
        self.requests: list[tuple[list[int], int]] = []

    def complete(self, ids, n_predict):
        self.requests.append((ids, n_predict))
        return {"prompt_n": len(ids), "prompt_ms": len(ids) / 2.0, "predicted_n": n_predict,
                "predicted_ms": 100.0 * (n_predict - 1), "predicted_per_second": 0.0}


def test_llama_run_sends_the_same_ids_and_times_exactly_n_decode_steps():
    prompts = {n: [int(x) for x in p] for n, p in bench_kernel.prompts_for(8192, [64, 256]).items()}
    server = FakeServer()
    out = llama_peer.run_llama(server, prompts, 8)
    assert server.requests == [(prompts[64], 1), (prompts[256], 9)]
    assert out["prefill"][64]["tok_s"] == pytest.approx(2000.0)
    assert out["decode_tok_s"] == pytest.approx(10.0)  # 8 steps in 800 ms
    assert out["decode_at"] == 256


def test_bench_prompts_are_the_same_ids_for_every_system():
    a, b = bench_kernel.prompts_for(8192, [512, 2048]), bench_kernel.prompts_for(8192, [512, 2048])
    assert all(np.array_equal(a[n], b[n]) for n in (512, 2048))
    assert not np.array_equal(a[512], a[2048][:512])


def test_peer_tools_missing_is_a_clear_error(tmp_path):
    with pytest.raises(llama_peer.PeerError, match="--peer-tools"):
        llama_peer.tools_dir(str(tmp_path))

"""Qwen3.5 GGUF files through the daemon (issue 43 §4): llama.cpp's converter output and llama-quantize
mixes (tests/fixtures/gguf, scripts/make_gguf_fixtures_qwen35.py) served by an in-process daemon on the
real kernel.

- The F32 files (qwen3_5_moe, and dense qwen3_5 with tied embeddings) answer as HF transformers does
  on the directory each was converted from (greedy tokens equal, log-probabilities within 1e-5), cold
  and restored from a memory checkpoint.
- A Q4_0 and a Q4_K_M file (their matrices packed as their blocks, ssm_out in llama.cpp's tiled column
  order) answer as a kernel model built from gguf-py's dequantization of the same file: the same tokens
  and log-probabilities, cold and restored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))   # the HF oracle lives with the kernel tests

from daemon_harness import daemon, real_loaded, request, token_strings  # noqa: E402
from hf_oracle_qwen35 import hf_greedy, hf_logits  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
MANIFEST = json.loads((FIX / "MANIFEST.json").read_text())["fixtures"]
TOL = 1e-5
N_OUT = 4
MIN_TOKENS = 64
RNG = np.random.default_rng(4343)


def ids(n: int) -> list[int]:
    return [int(t) for t in RNG.integers(20, 400, size=n)]


def cmpl(prompt, model: str) -> dict:
    return {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": N_OUT, "logprobs": 1, "ignore_eos": True}


async def post(sock, body) -> dict:
    r = await request(sock, "POST", "/v1/completions", body)
    assert r.status == 200, r.body[:500]
    return r.json()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


async def cold_then_restored(loaded, tmp_path, greedy) -> tuple[list[int], list[int], list[dict]]:
    """A cold request, another that moves the live state away, then the first one's next turn (its
    prefix restored from memory; the reply as `greedy(prompt)`, the reference's answer, so a wrong
    answer fails in `check`, not here). Returns (first prompt, second turn's prompt, [cold, restored])."""
    sock = tmp_path / "g.sock"
    first = ids(150)
    with trio.fail_after(120), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoint_min_tokens=MIN_TOKENS):
            name = (await request(sock, "GET", "/v1/models")).json()["data"][0]["id"]
            cold = await post(sock, cmpl(first, name))
            answer = greedy(first)
            await post(sock, cmpl(ids(100), name))
            second = first + answer[:-1] + ids(20)
            restored = await post(sock, cmpl(second, name))
    assert [(e["tokens"], e["tier"]) for e in evs if e["event"] == "checkpoint_hit"] == [(len(first), "memory")]
    assert restored["usage"]["prompt_tokens_details"]["cached_tokens"] == len(first)
    return first, second, [cold, restored]


def check(loaded, prompt: list[int], body: dict, toks: list[int], rows: np.ndarray) -> None:
    """body's answer is toks, and its log-probs rows' (log-softmax at the answer's positions)."""
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == token_strings(loaded, toks)
    top2 = np.sort(rows, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 10 * TOL          # no near-tie: the argmax is robust
    diff = np.abs(np.asarray(lp["token_logprobs"]) - rows[np.arange(len(toks)), toks]).max()
    assert diff <= TOL, f"max |dlogprob| {diff:.3g}"


@pytest.mark.parametrize("stem", ["qwen35moe-tiny-f32", "qwen35-tiny-f32"])   # MoE; dense with tied embeddings
async def test_the_f32_gguf_answers_as_hf_on_its_source_directory(stem, tmp_path):
    from cairn.daemon.modelgen.make_model import make_model

    entry = MANIFEST[stem]
    src = make_model(entry["preset"], entry["seed"], tmp_path / "src")
    loaded = real_loaded(FIX / f"{stem}.gguf", checkpoint_dir=str(tmp_path / "state"))
    assert loaded.model.family == "qwen3_5" and loaded.tokenizer.chat.name == "qwen3_5"
    first, second, bodies = await cold_then_restored(loaded, tmp_path, lambda p: hf_greedy(src, p, N_OUT))
    for prompt, body in zip((first, second), bodies):
        toks = hf_greedy(src, prompt, N_OUT)
        rows = log_softmax(hf_logits(src, prompt + toks[:-1])[len(prompt) - 1:])
        check(loaded, prompt, body, toks, rows)


@pytest.mark.parametrize("stem", ["qwen35moe-tiny-q4_0", "qwen35moe-k256-q4_k_m"])
async def test_a_quantized_gguf_answers_as_fp32_on_its_dequantized_weights(stem, tmp_path):
    import cairn._kernel as K
    from cairn.daemon.weights.qwen35.kernel_inputs import kernel_weights, open_qwen35
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    loaded = real_loaded(FIX / f"{stem}.gguf", checkpoint_dir=str(tmp_path / "state"))
    cfg, w = kernel_weights(open_qwen35(FIX / f"{stem}.gguf"))
    plain = {n: dequantize(np.ascontiguousarray(v[0]), GGMLQuantizationType[v[1][5:]]).astype(np.float32)
             if isinstance(v, tuple) else v for n, v in w.items()}
    ref = K.Qwen35Model(cfg, plain)

    def greedy(prompt: list[int]) -> list[int]:
        seq = list(prompt)
        for _ in range(N_OUT):
            seq.append(int(ref.forward(np.asarray(seq, np.int32))[-1].argmax()))
        return seq[len(prompt):]

    first, second, bodies = await cold_then_restored(loaded, tmp_path, greedy)
    for prompt, body in zip((first, second), bodies):
        toks = greedy(prompt)
        rows = log_softmax(ref.forward(np.asarray(prompt + toks[:-1], np.int32))[len(prompt) - 1:])
        check(loaded, prompt, body, toks, rows)

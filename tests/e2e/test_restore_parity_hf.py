"""The daemon's restore path against HF at over 1024 tokens: a prompt-end checkpoint of 1100 tokens is
restored (from memory, then from disk after a restart), the prompt is extended and answered, and the
greedy tokens and their log-probabilities are compared with HF transformers' full no-cache forward
over the same ids (the generated model directory loaded with `from_pretrained`).
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, real_loaded, request, token_strings
from hf_greedy import hf_answer

import torch                                     # the oracle: missing is an error, never a skip
from transformers import DeepseekV4ForCausalLM

RNG = np.random.default_rng(23)
SHARED = 1100                     # the restored prefix
TOL = 1e-4                        # as in docs/validation.md


def ids(n: int) -> list[int]:
    return [int(t) for t in RNG.integers(20, 500, size=n)]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return DeepseekV4ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def cmpl(prompt) -> dict:
    return {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 4, "logprobs": 1}


async def post(sock, body) -> dict:
    r = await request(sock, "POST", "/v1/completions", body)
    assert r.status == 200, r.body
    return r.json()


def assert_matches_hf(hf, loaded, prompt: list[int], body: dict) -> float:
    """The answer's tokens are HF's greedy ones and their log-probs HF's; returns max |Δ logprob|."""
    toks, rows = hf_answer(hf, prompt)
    assert [int(t) for t in rows.argmax(1)] == toks          # HF's cached and no-cache paths agree
    top2 = np.sort(rows, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 10 * TOL         # no near-tie: the argmax is robust
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == token_strings(loaded, toks)
    diff = float(np.abs(np.asarray(lp["token_logprobs"]) - rows[np.arange(len(toks)), toks]).max())
    assert diff <= TOL, f"max |dlogprob| {diff:.3g}"
    return diff


async def wait_on_disk(sock, tokens: int) -> None:
    with trio.fail_after(30):
        while True:
            rows = (await request(sock, "GET", "/v1/checkpoints")).json()["data"]
            if any(r["tokens"] == tokens and "disk" in r["tier"] for r in rows):
                return
            await trio.sleep(0.02)


async def test_restored_1100_token_checkpoint_answers_like_hf_from_memory_and_disk(loaded, hf, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    shared = ids(SHARED)
    p_mem, p_disk = shared + ids(40), shared + ids(40)
    disk = dict(disk_checkpoints=True, checkpoint_dir=str(ckdir))
    with trio.fail_after(120), capture_logs() as evs:
        async with daemon(loaded, sock, **disk):
            await post(sock, cmpl(shared))                     # prompt-end checkpoint at 1100
            await post(sock, cmpl(ids(600)))                   # the live state moves elsewhere
            r_mem = await post(sock, cmpl(p_mem))              # restored from memory
            await wait_on_disk(sock, SHARED)
        async with daemon(loaded, sock, **disk):
            r_disk = await post(sock, cmpl(p_disk))            # restored from disk after a restart
    hits = [(e["tokens"], e["tier"]) for e in evs if e["event"] == "checkpoint_hit"]
    assert hits == [(SHARED, "memory"), (SHARED, "disk")]
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (r_mem, r_disk)] == [SHARED, SHARED]
    assert_matches_hf(hf, loaded, p_mem, r_mem)
    assert_matches_hf(hf, loaded, p_disk, r_disk)

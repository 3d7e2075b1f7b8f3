"""Exact speculative decoding through the daemon, on the shipped default model (models/cairn-code).

With `--speculate on` the reply is the one `--speculate off` gives, token for token: greedy, seeded
sampling, two slots decoding in one batched verify, a grammar-constrained reply, and the next turn
extending the live state. The drafts must really be verified and partly accepted (the metrics
count them), or these tests would compare plain decoding with itself. Sampling through drafts
draws from the model's distribution: checked statistically against the kernel's own probabilities.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import trio

from daemon_harness import daemon, real_loaded, request

MODEL = Path(__file__).resolve().parents[2] / "models" / "cairn-code"
# A prompt whose continuation repeats what it holds (the tiny model loops on it): drafts hit often,
# and miss sometimes.
# (a fixed excerpt of an older actors/decoding/drafts.py: read from the live source, the prompt changed with it)
CODE = Path(__file__).resolve().parents[1].joinpath("fixtures", "speculation_prompt.txt").read_text()
PROMPT = CODE + "\n\n# The same code again:\n" + CODE[:160]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec-state")
    return real_loaded(MODEL, checkpoint_dir=str(d), packed_cache_dir=str(d / "packed"))


def _spec_counts(metrics: str) -> dict[str, float]:
    out = {}
    for name in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "spec_batched_verify_steps",
                 "decode_steps", "decode_tokens"):
        m = re.search(rf"^cairn_{name}_total (\S+)$", metrics, re.M)
        out[name] = float(m.group(1))
    return out


async def _complete(sock, **body):
    r = await request(sock, "POST", "/v1/completions", {"model": "cairn-code", "prompt": PROMPT, **body})
    assert r.status == 200, r.body
    return r.json()


async def _run(loaded, tmp_path, speculate: str, bodies: list[dict], *, slots: int = 1, together: bool = False):
    """Replies to `bodies` (all at once when `together`) and the daemon's speculation counters."""
    sock = tmp_path / f"{speculate}-{slots}.sock"
    out: list = [None] * len(bodies)
    with trio.fail_after(120):
        async with daemon(loaded, sock, speculate=speculate, slots=slots, checkpoints=False):
            if together:
                async with trio.open_nursery() as n:
                    for i, b in enumerate(bodies):
                        async def one(i=i, b=b):
                            out[i] = await _complete(sock, **b)
                        n.start_soon(one)
            else:
                for i, b in enumerate(bodies):
                    out[i] = await _complete(sock, **b)
            counts = _spec_counts((await request(sock, "GET", "/metrics")).body.decode())
    return out, counts


def _tokens(reply) -> list:
    lp = reply["choices"][0]["logprobs"]
    return list(zip(lp["tokens"], lp["token_logprobs"]))


GREEDY = dict(temperature=0, max_tokens=80, logprobs=1)
SAMPLED = dict(temperature=0.9, top_p=0.95, seed=7, max_tokens=80, logprobs=1)


async def test_greedy_and_seeded_replies_are_the_same_with_drafts(loaded, tmp_path):
    bodies = [GREEDY, SAMPLED, dict(SAMPLED, seed=8, top_k=20)]
    off, c_off = await _run(loaded, tmp_path, "off", bodies)
    on, c_on = await _run(loaded, tmp_path, "on", bodies)
    for a, b in zip(off, on):
        assert b["choices"][0]["text"] == a["choices"][0]["text"]
        assert _tokens(b) == _tokens(a)             # the same tokens and the same log-probabilities
        assert b["usage"] == a["usage"]
    assert c_off["spec_drafts"] == 0
    assert c_on["spec_accepted_tokens"] > 0 and c_on["spec_draft_tokens"] > c_on["spec_accepted_tokens"]
    assert c_on["decode_tokens"] == c_off["decode_tokens"]
    assert c_on["decode_steps"] < c_off["decode_steps"]     # accepted drafts saved kernel calls


async def test_two_slots_verify_in_one_batch_and_each_reply_is_its_own(loaded, tmp_path):
    bodies = [GREEDY, dict(SAMPLED, seed=3)]
    alone, _ = await _run(loaded, tmp_path, "off", bodies)
    both, counts = await _run(loaded, tmp_path, "on", bodies, slots=2, together=True)
    for a, b in zip(alone, both):
        assert _tokens(b) == _tokens(a)
    assert counts["spec_accepted_tokens"] > 0
    assert counts["spec_batched_verify_steps"] > 0       # drafts of both slots verified in one kernel call


async def test_a_grammar_constrained_reply_is_the_same_with_drafts(loaded, tmp_path):
    """Drafts end at the first token the grammar forbids; the reply is what plain decoding gives."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
              "required": ["name", "size"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Describe this function as JSON.\n" + CODE[:400]}]
    body = {"model": "cairn-code", "messages": msgs, "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}}
    texts, counts = {}, {}
    for mode in ("off", "on"):
        sock = tmp_path / f"g-{mode}.sock"
        with trio.fail_after(120):
            async with daemon(loaded, sock, speculate=mode, checkpoints=False):
                r = await request(sock, "POST", "/v1/chat/completions", body)
                counts[mode] = _spec_counts((await request(sock, "GET", "/metrics")).body.decode())
        assert r.status == 200, r.body
        texts[mode] = r.json()["choices"][0]["message"]["content"]
    assert texts["on"] == texts["off"]
    json.loads(texts["on"])
    assert counts["off"]["spec_drafts"] == 0
    assert counts["on"]["spec_drafts"] > 0                # drafts were sent (through the grammar) and verified


async def test_the_live_state_holds_the_reply_as_plain_decoding_leaves_it(loaded, tmp_path):
    """After a turn with drafts (some rejected, and the reply ending inside a verified draft) the
    live state holds the prompt and the reply but its last token, as after plain decoding, so the
    next turn can extend it (tests/native/test_speculate.py: byte for byte the same state)."""
    snaps = {}
    for mode in ("off", "on"):
        sock = tmp_path / f"live-{mode}.sock"
        with trio.fail_after(120):
            async with daemon(loaded, sock, speculate=mode, checkpoints=False):
                first = await _complete(sock, temperature=0, max_tokens=40)
                status = (await request(sock, "GET", "/v1/status")).json()
                counts = _spec_counts((await request(sock, "GET", "/metrics")).body.decode())
        u = first["usage"]
        assert status["slots"][0]["state_tokens"] == u["prompt_tokens"] + u["completion_tokens"] - 1
        snaps[mode] = (counts, first["choices"][0]["text"])
    assert snaps["on"][0]["spec_accepted_tokens"] > 0
    assert snaps["on"][1] == snaps["off"][1]


async def test_sampling_through_drafts_draws_from_the_models_distribution(loaded, tmp_path):
    """Every token of sampled replies (most of them picked from verify rows after accepted drafts)
    is a draw from the model's softmax(logits / T) given its prefix: the randomised probability
    integral transform of each token under the kernel's own teacher-forced probabilities is
    uniform (Kolmogorov-Smirnov, p < 0.001)."""
    K, M, tok = loaded.kernel, loaded.model, loaded.tokenizer
    T, N, L = 0.4, 60, 24
    by_text: dict[str, int | None] = {}
    for i in range(int(M.vocab_size)):
        t = tok.decode([i])
        by_text[t] = None if t in by_text else i          # a text two ids share cannot be mapped back
    prompt_ids = tok.encode(PROMPT)
    replies = []
    sock = tmp_path / "stat.sock"
    with trio.fail_after(300):
        async with daemon(loaded, sock, speculate="on", checkpoints=False):
            for seed in range(N):
                r = await _complete(sock, temperature=T, seed=seed, max_tokens=L, logprobs=0, ignore_eos=True)
                replies.append(r["choices"][0]["logprobs"]["tokens"])
            counts = _spec_counts((await request(sock, "GET", "/metrics")).body.decode())
    # drafts were verified and kept (how many depends on auto-off, which follows measured call times)
    assert counts["spec_accepted_tokens"] >= 10, counts
    rng = np.random.default_rng(0)
    u = []
    for texts in replies:
        ids = [by_text.get(t) for t in texts]
        if None in ids:
            ids = ids[:ids.index(None)]                   # up to the first token whose id is ambiguous
        if not ids:
            continue
        st = K.State(M)
        K.prefill(st, np.asarray(prompt_ids[:-1], dtype=np.int32), chunk=128)
        _, rows = K.prefill(st, np.asarray([prompt_ids[-1]] + ids[:-1], dtype=np.int32), chunk=128,
                            all_logits=True)             # rows[j]: the logits token j was drawn from
        for j, t in enumerate(ids):
            z = (rows[j].astype(np.float64) - rows[j].max()) / T
            p = np.exp(z)
            p /= p.sum()
            below = p[p > p[t]].sum() + p[(p == p[t]) & (np.arange(len(p)) < t)].sum()
            u.append(below + rng.random() * p[t])
    n = len(u)
    assert n > N * L // 2
    u = np.sort(np.asarray(u))
    d = max(np.max(np.arange(1, n + 1) / n - u), np.max(u - np.arange(n) / n))
    assert d < 1.95 / np.sqrt(n), (d, n)

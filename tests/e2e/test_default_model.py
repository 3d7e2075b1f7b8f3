"""The shipped default model, models/cairn-code (docs/default-model.md): its files are the ones
SHA256SUMS lists, the daemon's greedy continuation of a code prompt is HF transformers' greedy
continuation token for token (float32 on the widened BF16 weights), and a multi-turn chat whose
turns are restored from prefix checkpoints answers with the same text as a cold daemon. Serving never
writes into the model directory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch                                     # the oracle: missing is an error, never a skip
import trio
from transformers import DeepseekV4ForCausalLM

from cairn.daemon.service.config import load_settings
from cairn.daemon.service.main import load
from daemon_harness import daemon, request, token_strings

MODEL = Path(__file__).resolve().parents[2] / "models" / "cairn-code"
PROMPT = "def fibonacci(n):"
N_NEW = 24


def listing(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    # the weight-digest cache goes to a temporary checkpoint directory, never next to the shipped model
    state = tmp_path_factory.mktemp("cairn-code-state")
    return load(load_settings({"model": str(MODEL), "threads": 2, "checkpoint_dir": str(state),
                               "packed_cache_dir": str(state / "packed")}, {}))


@pytest.fixture(scope="module")
def hf():
    return DeepseekV4ForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


def test_shipped_files_match_sha256sums():
    sums = {}
    for line in (MODEL / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    have = listing(MODEL)
    assert set(have) == set(sums) | {"SHA256SUMS"}, "files not listed in SHA256SUMS, or listed and missing"
    assert {n: have[n] for n in sums} == sums
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
            "model.safetensors"} <= set(sums)


def hf_greedy(hf, ids: list[int], n: int, eos: int) -> list[int]:
    """HF's greedy continuation (cached decode), up to n tokens or through EOS."""
    out_ids = []
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        while True:
            out_ids.append(int(out.logits[0, -1].argmax()))
            if len(out_ids) == n or out_ids[-1] == eos:
                return out_ids
            out = hf(input_ids=torch.tensor([[out_ids[-1]]]), cache=out.past_key_values, use_cache=True)


async def test_greedy_code_continuation_is_hfs(loaded, hf, tmp_path):
    sock = tmp_path / "c.sock"
    before = listing(MODEL)
    with trio.fail_after(60):
        async with daemon(loaded, sock, checkpoint_dir=str(tmp_path / "ck")):
            r = await request(sock, "POST", "/v1/completions",
                              {"model": "cairn-code", "prompt": PROMPT, "temperature": 0, "max_tokens": N_NEW,
                               "logprobs": 1})
    assert r.status == 200, r.body
    choice = r.json()["choices"][0]
    want = hf_greedy(hf, loaded.tokenizer.encode(PROMPT), N_NEW, loaded.tokenizer.eos_id)
    if want[-1] == loaded.tokenizer.eos_id:
        want = want[:-1]
        assert choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == token_strings(loaded, want)     # token for token
    assert choice["text"] == loaded.tokenizer.decode(want)
    # and the log-probabilities: HF's full no-cache forward over prompt + answer
    ids = loaded.tokenizer.encode(PROMPT)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids + want]), use_cache=False).logits[0, len(ids) - 1:-1]
    rows = torch.log_softmax(logits.double(), dim=-1).numpy()
    ref = rows[np.arange(len(want)), want]
    assert np.abs(np.asarray(choice["logprobs"]["token_logprobs"]) - ref).max() <= 1e-4   # docs/validation.md
    assert listing(MODEL) == before                      # serving wrote nothing into the model directory


# A system part long enough that restoring it saves more than a restore costs.
SYSTEM = "\n".join(f"Rule {i}: read module_{i}.py before you change it; keep functions small, documented "
                   "and tested." for i in range(10))


def conversation_turns() -> list[str]:
    return ["Write a Python function `flatten`: Flatten one level of nesting.",
            "What does `flatten` do?",
            "Write a Python function `chunked`: Break an iterable into lists of a given length."]


async def chat_turn(sock, msgs: list[dict]) -> dict:
    r = await request(sock, "POST", "/v1/chat/completions",
                      {"model": "cairn-code", "messages": msgs, "temperature": 0, "max_tokens": 32})
    assert r.status == 200, r.body
    return r.json()


async def test_multi_turn_chat_restored_from_checkpoints_equals_cold(loaded, tmp_path):
    """Each turn's request carries the earlier turns with the answers as given. Warm: one daemon, the
    later turns restore the earlier prompt ends. Cold: every turn's request on a fresh daemon with
    checkpoints off (no checkpoint, no live state to reuse)."""
    prompts, warm = [], []
    with trio.fail_after(120):
        async with daemon(loaded, tmp_path / "on.sock", checkpoint_min_tokens=32,
                          checkpoint_dir=str(tmp_path / "ck")):
            msgs: list[dict] = [{"role": "system", "content": SYSTEM}]
            for text in conversation_turns():
                msgs.append({"role": "user", "content": text})
                prompts.append(list(msgs))
                warm.append(await chat_turn(tmp_path / "on.sock", msgs))
                msgs.append({"role": "assistant", "content": warm[-1]["choices"][0]["message"]["content"]})
        cold = []
        for i, msgs in enumerate(prompts):
            async with daemon(loaded, tmp_path / f"off{i}.sock", checkpoints=False,
                              checkpoint_dir=str(tmp_path / f"ck{i}")):
                cold.append(await chat_turn(tmp_path / f"off{i}.sock", msgs))
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in warm]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    assert [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in cold] == [0, 0, 0]
    texts = [b["choices"][0]["message"]["content"] for b in warm]
    assert texts == [b["choices"][0]["message"]["content"] for b in cold]
    assert all(t.strip() for t in texts)                 # the model answers, never with nothing

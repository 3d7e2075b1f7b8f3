"""GGUF models through the daemon (issue 23): every quantized fixture (Q4_0-Q8_0, K-quants, IQ types, MXFP4, as
llama-quantize wrote them) answers as HF transformers does on the weights gguf.quants.dequantize makes
of it; the BF16 fixture answers as HF does on the same (bf16-rounded) weights, the F32 fixture exactly as its safetensors directory does, the
chat template from the GGUF metadata is checked against the native encoder as a directory's is, and
`cairn serve --model X.gguf` serves the file under its name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

from daemon_harness import daemon, real_loaded, request, token_strings, unix_get
from hf_greedy import hf_answer

import torch                                     # the oracle: missing is an error, never a skip
from transformers import DeepseekV4ForCausalLM

from cairn.daemon.cli.child import wait_until_serving
from cairn.daemon.modelgen.make_model import make_model

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
sys.path.insert(0, str(FIX.parents[2] / "scripts"))
from dequantize_gguf import dequantized_model_dir  # noqa: E402

QUANT = sorted(s for s in json.loads((FIX / "MANIFEST.json").read_text())["fixtures"] if s.startswith("gguf-quant-"))
TOL = 1e-4                        # as in docs/validation.md
PROMPT = [int(t) for t in np.random.default_rng(5).integers(20, 500, size=300)]


def copy_fixture(name: str, tmp: Path) -> Path:
    # real_loaded keeps its state next to the model: a copy in tmp, never in the repository
    (tmp / "m").mkdir()
    for p in FIX.glob(name.replace("00001", "*")):
        shutil.copy(p, tmp / "m" / p.name)
    return tmp / "m" / name


@pytest.fixture(scope="module")
def bf16_src(tmp_path_factory):
    return make_model("gguf-tiny", 0, tmp_path_factory.mktemp("bf16") / "gguf-tiny", dtype="bfloat16")


def cmpl(model: str) -> dict:
    return {"model": model, "prompt": PROMPT, "temperature": 0, "max_tokens": 4, "logprobs": 1}


async def answer(loaded, sock: Path, model: str) -> dict:
    with trio.fail_after(120):
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/completions", cmpl(model))
            assert r.status == 200, r.body
            chat = await request(sock, "POST", "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                "temperature": 0})
            assert chat.status == 200, chat.body
    return r.json()


@pytest.mark.parametrize("stem", QUANT)
async def test_quantized_gguf_answers_as_hf_on_its_dequantized_weights(stem, tmp_path):
    loaded = real_loaded(copy_fixture(f"{stem}.gguf", tmp_path))
    prompt = [int(t) for t in np.random.default_rng(5).integers(20, 300, size=300)]
    with trio.fail_after(120):
        async with daemon(loaded, tmp_path / "q.sock"):
            r = await request(tmp_path / "q.sock", "POST", "/v1/completions", {
                "model": stem, "prompt": prompt, "temperature": 0, "max_tokens": 4, "logprobs": 1})
            assert r.status == 200, r.body
    hf = DeepseekV4ForCausalLM.from_pretrained(dequantized_model_dir(FIX / f"{stem}.gguf", tmp_path / "deq"),
                                               dtype=torch.float32).eval()
    toks, rows = hf_answer(hf, prompt, 4)
    want = rows[np.arange(4), toks]
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == token_strings(loaded, toks)
    diff = float(np.abs(np.asarray(lp["token_logprobs"]) - want).max())
    assert diff <= TOL, f"max |dlogprob| {diff:.3g}"


async def test_bf16_gguf_answers_as_hf_on_its_weights(tmp_path, bf16_src):
    loaded = real_loaded(copy_fixture("gguf-tiny-bf16.gguf", tmp_path))
    assert loaded.name == "gguf-tiny-bf16"
    assert loaded.encoding.startswith("deepseek-v4 native")     # the GGUF's template matched the native encoder
    body = await answer(loaded, tmp_path / "g.sock", "gguf-tiny-bf16")
    hf = DeepseekV4ForCausalLM.from_pretrained(bf16_src, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([PROMPT]), use_cache=True, logits_to_keep=1)
        toks = [int(out.logits[0, -1].argmax())]
        for _ in range(3):
            out = hf(input_ids=torch.tensor([[toks[-1]]]), cache=out.past_key_values, use_cache=True)
            toks.append(int(out.logits[0, -1].argmax()))
        full = hf(input_ids=torch.tensor([PROMPT + toks[:-1]]), use_cache=False, logits_to_keep=4).logits[0]
    rows = torch.log_softmax(full.double(), dim=-1).numpy()
    assert [int(t) for t in rows.argmax(1)] == toks
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == token_strings(loaded, toks)
    diff = float(np.abs(np.asarray(lp["token_logprobs"]) - rows[np.arange(4), toks]).max())
    assert diff <= TOL, f"max |dlogprob| {diff:.3g}"


async def test_f32_and_split_gguf_answer_exactly_as_the_safetensors_directory(tmp_path):
    src = make_model("gguf-tiny", 0, tmp_path / "src" / "gguf-tiny")
    want = await answer(real_loaded(src), tmp_path / "d.sock", "gguf-tiny")
    for name in ("gguf-tiny-f32.gguf", "gguf-tiny-split-00001-of-00003.gguf"):
        sub = tmp_path / name.split(".")[0]
        sub.mkdir()
        loaded = real_loaded(copy_fixture(name, sub))
        got = await answer(loaded, sub / "g.sock", loaded.name)
        assert got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"], name
        assert got["choices"][0]["text"] == want["choices"][0]["text"]


def test_cairn_serve_takes_a_gguf_file(tmp_path):
    model = copy_fixture("gguf-tiny-f32.gguf", tmp_path)
    sock = tmp_path / "api.sock"
    proc = subprocess.Popen([sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "1",
                             "--model", str(model), "--socket", str(sock),
                             "--checkpoint-dir", str(tmp_path / "state")],
                            env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(sock, proc, timeout=60)
        raw = unix_get(str(sock), "/v1/models")
        models = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        assert [m["id"] for m in models["data"]] == ["gguf-tiny-f32"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)

"""Train cairn's default model, `models/cairn-code`: a 16.6 M-parameter DeepSeek-V4 on Python source.

Reproducible end to end (docs/default-model.md): a fixed corpus (the .py files of pinned PyPI source
distributions, checked by sha256), a byte-level BPE tokenizer trained on it with the same special
tokens and conventions as `cairn make-model` (daemon/modelgen/make_model.py), a fixed seed, a fixed step count.
The architecture keeps every DeepSeek-V4 feature the kernel implements: sliding, CSA and HCA layers,
hash-routed and top-k experts, hyper-connections (hc_mult 4). Training is HF transformers'
DeepseekV4ForCausalLM in float32 on the CPU (the `oracle` extra); the directory is written in the
layout make-model writes (HF file spelling, BF16 safetensors), so the daemon and HF both load it.

    .venv/bin/pip install -e '.[plots]'
    .venv/bin/python scripts/train_default_model.py --threads 1                     # full run (49 min here)
    .venv/bin/python scripts/train_default_model.py --steps 5 --out /tmp/smoke      # smoke run

Work files (downloads, checkpoints, summary.json, history.json) go to --work (default
build/default-model/); a run interrupted there resumes from its last checkpoint with --resume.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import sys
import tarfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# (name, version, sdist URL, sha256): the corpus. Pure-Python libraries with careful docstrings and
# comments, the kind of code cairn's users write and read.
SDISTS = [
    ("requests", "2.32.3", "https://files.pythonhosted.org/packages/63/70/2bf7780ad2d390a8d301ad0b550f1581eadbd9a20f896afe06353c2a2913/requests-2.32.3.tar.gz",
     "55365417734eb18255590a9ff9eb97e9e1da868d4ccd6402399eaf68af20a760"),
    ("click", "8.1.7", "https://files.pythonhosted.org/packages/96/d3/f04c7bfcf5c1862a2a5b845c6b2b360488cf47af55dfa79c98f6a6bf98b5/click-8.1.7.tar.gz",
     "ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de"),
    ("attrs", "24.2.0", "https://files.pythonhosted.org/packages/fc/0f/aafca9af9315aee06a89ffde799a10a582fe8de76c563ee80bbcdc08b3fb/attrs-24.2.0.tar.gz",
     "5cfb1b9148b5b086569baec03f20d7b6bf3bcacc9a42bebf87ffaaca362f6346"),
    ("more-itertools", "10.5.0", "https://files.pythonhosted.org/packages/51/78/65922308c4248e0eb08ebcbe67c95d48615cc6f27854b6f2e57143e9178f/more-itertools-10.5.0.tar.gz",
     "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6"),
    ("werkzeug", "3.0.4", "https://files.pythonhosted.org/packages/0f/e2/6dbcaab07560909ff8f654d3a2e5a60552d937c909455211b1b36d7101dc/werkzeug-3.0.4.tar.gz",
     "34f2371506b250df4d4f84bfe7b0921e4762525762bbd936614909fe25cd7306"),
    ("flask", "3.0.3", "https://files.pythonhosted.org/packages/41/e1/d104c83026f8d35dfd2c261df7d64738341067526406b40190bc063e829a/flask-3.0.3.tar.gz",
     "ceb27b0af3823ea2737928a4d99d125a06175b8512c445cbd9a9ce200ef76842"),
    ("jinja2", "3.1.4", "https://files.pythonhosted.org/packages/ed/55/39036716d19cab0747a5020fc7e907f362fbf48c984b14e62127f7e68e5d/jinja2-3.1.4.tar.gz",
     "4a3aee7acbbe7303aede8e9648d13b8bf88a429282aa6122a993f0ac800cb369"),
    ("python-dateutil", "2.9.0.post0", "https://files.pythonhosted.org/packages/66/c0/0c8b6ad9f17a802ee498c46e004a0eb49bc148f2fd230864601a86dcf6db/python-dateutil-2.9.0.post0.tar.gz",
     "37dd54208da7e1cd875388217d5e00ebd4179249f90fb72437e91a35459a0ad3"),
    ("toolz", "1.0.0", "https://files.pythonhosted.org/packages/8a/0b/d80dfa675bf592f636d1ea0b835eab4ec8df6e9415d8cfd766df54456123/toolz-1.0.0.tar.gz",
     "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02"),
    ("boltons", "24.0.0", "https://files.pythonhosted.org/packages/7a/fb/214de4d813f566849956915ff07ee60f2b86424f294525e60e01c460d4d2/boltons-24.0.0.tar.gz",
     "7153feccaea1ff2e1472f68d4b57fadb796a2ee49d29f638f1c9cd8fb5ebd916"),
    ("rich", "13.9.2", "https://files.pythonhosted.org/packages/aa/9e/1784d15b057b0075e5136445aaea92d23955aad2c93eaede673718a40d95/rich-13.9.2.tar.gz",
     "51a2c62057461aaf7152b4d611168f93a9fc73068f8ded2790f29fe2b5366d0c"),
    ("httpx", "0.27.2", "https://files.pythonhosted.org/packages/78/82/08f8c936781f67d9e6b9eeb8a0c8b4e406136ea4c3d1f89a5db71d42e0e6/httpx-0.27.2.tar.gz",
     "f7c2be1d2f3c3c3160d441802406b206c2b76f5947b11115e6df10c6c65e66c2"),
]

SEED = 0
VAL_EVERY = 20           # one file in 20 (by a hash of its path) is held out for validation
MAX_FILE_BYTES = 200_000  # skip generated tables and vendored blobs
VOCAB = 8192
SEQ = 512                # >= 2 HCA blocks (rate 128) and 128 CSA blocks (rate 4) per window
BATCH = 4
STEPS = 1000             # fixed, so the run is reproducible (~2.0 M tokens; see docs/default-model.md for the time)
LR, LR_MIN, WARMUP = 3e-3, 3e-4, 60
WEIGHT_DECAY, CLIP = 0.1, 1.0
BIAS_RATE = 1e-2         # aux-loss-free expert balancing (DeepSeek-V3/V4): router bias step per update; 1e-3 (V3's)
                         # is too slow for a run this short: the top-k routers collapsed onto 2 of 8 experts
EVAL_EVERY, EVAL_WINDOWS = 50, 16
CKPT_EVERY = 50


def preset():
    from cairn.daemon.modelgen.make_model import C, H, S, Preset

    return Preset(
        vocab_size=VOCAB, hidden_size=256, layer_types=(S, S, C, H, C, H),
        mlp_layer_types=("hash_moe",) * 2 + ("moe",) * 4,
        num_attention_heads=4, head_dim=64, qk_rope_head_dim=16, q_lora_rank=128, o_groups=2, o_lora_rank=128,
        sliding_window=128, csa_rate=4, hca_rate=128, index_n_heads=8, index_head_dim=32, index_topk=32,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, hc_mult=4,
        max_position_embeddings=65536,
    )


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Corpus

def fetch_sdists(work: Path) -> list[Path]:
    d = work / "sdists"
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for name, version, url, sha in SDISTS:
        path = d / url.rsplit("/", 1)[1]
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            log(f"download {name}=={version}")
            data = urllib.request.urlopen(url, timeout=120).read()
            got = hashlib.sha256(data).hexdigest()
            if got != sha:
                raise SystemExit(f"{name}=={version}: sha256 {got}, expected {sha}")
            path.write_bytes(data)
        out.append(path)
    return out


def python_files(sdists: list[Path]) -> list[tuple[str, str]]:
    """(path inside the sdist, text) of every UTF-8 .py file, in a fixed order."""
    files = []
    for sd in sdists:
        with tarfile.open(sd) as t:
            for m in sorted(t.getmembers(), key=lambda m: m.name):
                if not (m.isfile() and m.name.endswith(".py")) or m.size > MAX_FILE_BYTES or m.size == 0:
                    continue
                try:
                    text = t.extractfile(m).read().decode("utf-8")
                except UnicodeDecodeError:
                    continue
                files.append((m.name, text.replace("\r\n", "\n")))
    return files


def is_val(path: str) -> bool:
    return int(hashlib.sha256(path.encode()).hexdigest(), 16) % VAL_EVERY == 0


def chat_examples(path: str, text: str, rng: np.random.Generator) -> list[str]:
    """Chat-format documents made from the file's documented functions, in the V4 encoding the daemon
    renders (daemon/protocol/dsv4/encoding.py, thinking off): ask for a function by its summary and get its
    source; ask what a function does and get its docstring. This teaches the model the chat markers."""
    from cairn.daemon.protocol.dsv4 import encoding as e

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        src = ast.get_source_segment(text, node)
        if not doc or not src or len(src) > 1500:
            continue
        summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        if not (10 <= len(summary) <= 200):
            continue
        src = textwrap.dedent(" " * node.col_offset + src)
        if rng.random() < 0.5:
            q = f"Write a Python function `{node.name}`: {summary}"
            a = f"```python\n{src}\n```"
        else:
            q = f"What does `{node.name}` do?"
            a = f"`{node.name}`: {summary}"
        out.append(f"{e.BOS}{e.USER}{q}{e.ASSISTANT}{e.END_THINK}{a}{e.EOS}")
    return out


def documents(files: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(train, validation) documents: each file (framed by its path, ending in EOS) and its chat
    examples, shuffled with the fixed seed."""
    from cairn.daemon.modelgen.make_model import EOS

    rng = np.random.default_rng(SEED)
    train, val = [], []
    for path, text in files:
        docs = [f"# {path}\n{text}{EOS}"] + chat_examples(path, text, rng)
        (val if is_val(path) else train).extend(docs)
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


def train_tokenizer(train_docs: list[str]):
    """make_model's byte-level BPE (same pre-tokenizer, decoder, alphabet and special tokens at ids
    0..8), trained on the training documents."""
    from cairn.daemon.modelgen.make_model import make_tokenizer

    return make_tokenizer(VOCAB, train_docs, min_frequency=2)


def tokenize(tok, docs: list[str]) -> np.ndarray:
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.int32)


def unigram_baseline(train_ids: np.ndarray, val_ids: np.ndarray) -> tuple[float, float]:
    """(entropy of the training unigram distribution, its cross-entropy on the held-out tokens with
    add-one smoothing), nats/token: what a model that ignores context would score."""
    counts = np.bincount(train_ids, minlength=VOCAB).astype(np.float64)
    p = counts / counts.sum()
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    q = (counts + 1) / (counts.sum() + VOCAB)
    return entropy, float(-np.log(q[val_ids]).mean())


# ---------------------------------------------------------------------------------------------
# Model

def build_model(cfg: dict):
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(SEED)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**cfg))
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):   # HF leaves the hash table zero: every token to expert 0
                E = cfg["n_routed_experts"]
                b.copy_(torch.stack([torch.randperm(E, generator=g)[: b.shape[1]] for _ in range(b.shape[0])]))
    return model


def fast_hyper_connection(self, hidden_streams):
    """DeepseekV4HyperConnection.forward with the token axes innermost: the same arithmetic (outputs
    equal to ~1e-7, gradients equal), but HF's layout makes the 39 Sinkhorn steps broadcast over
    4-element inner loops, which took ~40% of a training step on the CPU. Used for training only."""
    import torch
    import torch.nn.functional as F

    B, S = hidden_streams.shape[:2]
    n = self.hc_mult
    flat = self.input_norm(hidden_streams.view(B, S, -1).float())
    mixed = F.linear(flat, self.fn.float()).permute(2, 0, 1)                 # [(2+n)*n, B, S]
    pre_w, post_w, comb_w = mixed.split([n, n, n * n], dim=0)
    pre_b, post_b, comb_b = self.base.split([n, n, n * n])
    pre_scale, post_scale, comb_scale = self.scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_scale + pre_b[:, None, None]) + self.hc_eps        # [n, B, S]
    post = 2 * torch.sigmoid(post_w * post_scale + post_b[:, None, None])              # [n, B, S]
    comb = comb_w.reshape(n, n, B, S) * comb_scale + comb_b.view(n, n)[:, :, None, None]
    comb = torch.softmax(comb, dim=1) + self.hc_eps                                    # [n(row), n(col), B, S]
    comb = comb / (comb.sum(dim=0, keepdim=True) + self.hc_eps)
    for _ in range(self.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=1, keepdim=True) + self.hc_eps)
        comb = comb / (comb.sum(dim=0, keepdim=True) + self.hc_eps)
    collapsed = (pre.permute(1, 2, 0).unsqueeze(-1) * hidden_streams).sum(dim=2).to(hidden_streams.dtype)
    return post.permute(1, 2, 0), comb.permute(2, 3, 0, 1), collapsed


def hf_file_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters in the HF file spelling make_model writes (per-expert w1/w2/w3)."""
    sd = {k: v.detach().float().numpy() if v.is_floating_point() else v.detach().numpy()
          for k, v in model.state_dict().items()}
    attn = {"q_a_proj": "wq_a", "q_a_norm": "q_norm", "q_b_proj": "wq_b", "kv_proj": "wkv", "kv_norm": "norm",
            "o_a_proj": "wo_a", "o_b_proj": "wo_b"}
    comp = {"kv_proj": "wkv", "gate_proj": "wgate", "kv_norm": "norm"}
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        if k in ("model.embed_tokens.weight", "model.norm.weight"):
            out[k] = v
        elif k == "lm_head.weight":
            out["head.weight"] = v
        elif k.startswith("model.hc_head."):
            out[k] = v
        elif k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            L = f"model.layers.{i}."
            parts = rest.split(".")
            if parts[0] == "input_layernorm":
                out[L + "attn_norm.weight"] = v
            elif parts[0] == "post_attention_layernorm":
                out[L + "ffn_norm.weight"] = v
            elif parts[0] in ("attn_hc", "ffn_hc"):
                out[f"{L}hc_{parts[0][:-3]}_{parts[1]}"] = v
            elif parts[0] == "self_attn":
                A = L + "attn."
                if parts[1] == "sinks":
                    out[A + "attn_sink"] = v
                elif parts[1] in attn:
                    out[A + attn[parts[1]] + ".weight"] = v
                elif parts[1] == "compressor" and parts[2] == "indexer":
                    Q = A + "indexer."
                    sub = {"position_bias": "compressor.ape", "q_b_proj": "wq_b.weight",
                           "scorer": "weights_proj.weight"}
                    name = sub.get(parts[3]) or "compressor." + comp[parts[3]] + ".weight"
                    out[Q + name] = v
                elif parts[1] == "compressor":
                    out[A + ("compressor.ape" if parts[2] == "position_bias"
                             else "compressor." + comp[parts[2]] + ".weight")] = v
                else:
                    raise KeyError(k)
            elif parts[0] == "mlp":
                F = L + "ffn."
                if parts[1] == "gate":
                    out[F + "gate." + {"weight": "weight", "tid2eid": "tid2eid",
                                       "e_score_correction_bias": "bias"}[parts[2]]] = v
                elif parts[1] == "experts" and parts[2] == "gate_up_proj":
                    inter = v.shape[1] // 2
                    for e in range(v.shape[0]):
                        out[f"{F}experts.{e}.w1.weight"] = v[e, :inter]
                        out[f"{F}experts.{e}.w3.weight"] = v[e, inter:]
                elif parts[1] == "experts":
                    for e in range(v.shape[0]):
                        out[f"{F}experts.{e}.w2.weight"] = v[e]
                elif parts[1] == "shared_experts":
                    out[F + "shared_experts." + {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[parts[2]]
                        + ".weight"] = v
                else:
                    raise KeyError(k)
            else:
                raise KeyError(k)
        else:
            raise KeyError(k)
    return out


def write_model_dir(model, cfg: dict, tok, out: Path) -> None:
    from cairn.daemon.modelgen.make_model import tokenizer_config
    from cairn.daemon.weights.safetensors_io import to_bf16_bits, write_file

    out.mkdir(parents=True, exist_ok=True)
    encoded = {}
    for name, arr in hf_file_weights(model).items():
        # BF16 halves the directory; the router bias stays F32 (it is added to scores before top-k)
        if arr.dtype == np.int64:
            encoded[name] = (np.ascontiguousarray(arr), "I64")
        elif name.endswith("gate.bias"):
            encoded[name] = (np.ascontiguousarray(arr, dtype=np.float32), "F32")
        else:
            encoded[name] = (to_bf16_bits(np.ascontiguousarray(arr, dtype=np.float32)), "BF16")
    write_file(out / "model.safetensors", dict(sorted(encoded.items())))
    (out / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(
        tokenizer_config(cfg["max_position_embeddings"]), indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2, sort_keys=True) + "\n")
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}"
            for p in sorted(out.iterdir()) if p.name != "SHA256SUMS"]
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")


# ---------------------------------------------------------------------------------------------
# Training

def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * t))


def batches(ids: np.ndarray, steps: int, seed: int):
    """Deterministic random windows [BATCH, SEQ + 1] of the training stream, one per step."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - SEQ - 1, size=BATCH)
        yield np.stack([ids[s:s + SEQ + 1] for s in starts]).astype(np.int64)


def val_windows(ids: np.ndarray) -> np.ndarray:
    """Fixed, evenly spaced held-out windows [EVAL_WINDOWS, SEQ + 1]."""
    starts = np.linspace(0, len(ids) - SEQ - 1, EVAL_WINDOWS).astype(np.int64)
    return np.stack([ids[s:s + SEQ + 1] for s in starts]).astype(np.int64)


def loss_on(model, windows) -> float:
    import torch

    with torch.no_grad():
        total = 0.0
        for i in range(0, len(windows), BATCH):
            x = torch.from_numpy(windows[i:i + BATCH])
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                                             reduction="sum"))
        return total / (windows.shape[0] * SEQ)


class ExpertBalance:
    """DeepSeek's auxiliary-loss-free balancing: count each top-k router's choices during a step and
    nudge its score-correction bias toward the under-used experts after it."""

    def __init__(self, model):
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

        self.routers = [m for m in model.modules() if isinstance(m, DeepseekV4TopKRouter)]
        self.counts = {id(r): None for r in self.routers}
        for r in self.routers:
            r.register_forward_hook(self._hook)

    def _hook(self, module, _inp, output) -> None:
        import torch

        if module.training:
            c = torch.bincount(output[2].reshape(-1), minlength=module.num_experts).float()
            prev = self.counts[id(module)]
            self.counts[id(module)] = c if prev is None else prev + c

    def update(self) -> float:
        """Apply the bias step; returns the worst max/mean load ratio over the routers."""
        import torch

        worst = 0.0
        for r in self.routers:
            c = self.counts[id(r)]
            if c is None:
                continue
            with torch.no_grad():
                r.e_score_correction_bias += BIAS_RATE * torch.sign(c.mean() - c)
            worst = max(worst, float(c.max() / c.mean()))
            self.counts[id(r)] = None
        return worst


def plot(history: dict, baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    tr = np.asarray(history["train"])
    ax.plot(tr[:, 0], tr[:, 1], lw=0.8, alpha=0.5, label="train (per step)")
    if len(tr) >= 20:
        k = 20
        smooth = np.convolve(tr[:, 1], np.ones(k) / k, mode="valid")
        ax.plot(tr[k - 1:, 0], smooth, lw=1.5, label=f"train ({k}-step mean)")
    va = np.asarray(history["val"])
    if len(va):
        ax.plot(va[:, 0], va[:, 1], "o-", lw=1.5, label="held-out")
    ax.axhline(baseline, color="gray", ls="--", label=f"unigram baseline ({baseline:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("cairn-code: DeepSeek-V4 trained on Python source")
    ax.set_ylim(0, max(baseline + 1.5, float(tr[:, 1].min()) + 1))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "cairn-code")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "default-model")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --work")
    ap.add_argument("--plot", type=Path, default=None, help="loss-curve PNG (default: docs/default-model-loss.png "
                    "for a full run, <work>/loss.png otherwise)")
    a = ap.parse_args(argv)

    # OpenMP threads that spin while they wait lose badly to other processes on a shared machine: a step
    # took 10x longer with 2 spinning threads next to another job's benchmarks than with 1 thread.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import matplotlib  # noqa: F401  (the `plots` extra; fail now rather than after an hour of training)
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(SEED)
    a.work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    files = python_files(fetch_sdists(a.work))
    train_docs, val_docs = documents(files)
    log(f"corpus: {len(files)} files, {sum(len(t) for _, t in files) / 1e6:.2f} MB; "
        f"{len(train_docs)} train / {len(val_docs)} held-out documents")
    tok = train_tokenizer(train_docs)
    train_ids, val_ids = tokenize(tok, train_docs), tokenize(tok, val_docs)
    entropy, baseline = unigram_baseline(train_ids, val_ids)
    log(f"tokens: {len(train_ids):,} train, {len(val_ids):,} held-out; unigram entropy {entropy:.3f}, "
        f"unigram held-out cross-entropy {baseline:.3f} nats/token")

    from cairn.daemon.modelgen.make_model import hf_config

    cfg = hf_config(preset())
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4

    hf_forward = hf_v4.DeepseekV4HyperConnection.forward
    hf_v4.DeepseekV4HyperConnection.forward = fast_hyper_connection
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters, layers {cfg['layer_types']}, mlp {cfg['mlp_layer_types']}")

    # weight decay on the matrices, not on norms, sinks, position biases or hyper-connection parameters
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "hc" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "hc" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95), eps=1e-8)
    balance = ExpertBalance(model)
    history = {"train": [], "val": []}
    start = 0
    ckpt = a.work / "checkpoint.pt"
    if a.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        history, start = state["history"], state["step"]
        log(f"resumed at step {start}")

    vw = val_windows(val_ids)
    model.train()
    t0, tokens_done = time.time(), 0
    for step, xb in enumerate(batches(train_ids, a.steps, SEED + 2)):
        if step < start:
            continue
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps)
        x = torch.from_numpy(xb)
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        load = balance.update()
        tokens_done += BATCH * SEQ
        history["train"].append((step + 1, loss.item()))
        el = time.time() - t0
        rate = tokens_done / el
        eta = (a.steps - step - 1) * BATCH * SEQ / rate
        log(f"step {step + 1}/{a.steps} loss {loss.item():.4f} lr {lr_at(step, a.steps):.2e} gnorm {gnorm:.2f} "
            f"load {load:.2f} {rate:.0f} tok/s ETA {eta / 60:.1f} min")
        last = step + 1 == a.steps
        if (step + 1) % EVAL_EVERY == 0 or last:
            model.eval()
            vl = loss_on(model, vw)
            model.train()
            history["val"].append((step + 1, vl))
            log(f"eval step {step + 1}: held-out {vl:.4f} nats/token (unigram {baseline:.4f})")
        if (step + 1) % CKPT_EVERY == 0 or last:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "history": history,
                        "step": step + 1}, a.work / "checkpoint.tmp")
            os.replace(a.work / "checkpoint.tmp", ckpt)

    model.eval()
    write_model_dir(model, cfg, tok, a.out)
    hf_v4.DeepseekV4HyperConnection.forward = hf_forward   # the shipped numbers: HF's own code
    # the shipped numbers are those of the BF16 weights the daemon serves
    from transformers import DeepseekV4ForCausalLM

    shipped = DeepseekV4ForCausalLM.from_pretrained(a.out, dtype=torch.float32).eval()
    final_val = loss_on(shipped, vw)
    wall = time.time() - t_start
    summary = {
        "steps": a.steps, "batch": BATCH, "seq": SEQ, "tokens_seen": a.steps * BATCH * SEQ,
        "parameters": n_params, "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(val_ids)),
        "corpus_files": len(files), "corpus_mb": round(sum(len(t.encode()) for _, t in files) / 1e6, 2),
        "unigram_entropy": round(entropy, 4), "unigram_heldout": round(baseline, 4),
        "final_train_loss_20step_mean": round(float(np.mean([l for _, l in history["train"][-20:]])), 4),
        "final_heldout_loss_fp32": round(history["val"][-1][1], 4) if history["val"] else None,
        "final_heldout_loss_bf16": round(final_val, 4),
        "wall_seconds": round(wall), "threads": a.threads, "resumed_from": start,
    }
    (a.work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (a.work / "history.json").write_text(json.dumps(history) + "\n")
    png = a.plot or (ROOT / "docs" / "default-model-loss.png" if a.steps == STEPS else a.work / "loss.png")
    plot(history, baseline, png)
    log("summary " + json.dumps(summary))
    log(f"wrote {a.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

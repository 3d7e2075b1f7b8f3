"""HF transformers as the oracle for the Qwen3.5 family (issue 43): logits of a `cairn make-model --preset
qwen35*` directory (or any Qwen3.5 text/conditional-generation checkpoint) as HF computes them.

HF runs its reference PyTorch paths only: eager attention, the plain per-expert loop
(`experts_implementation="eager"`, not torch's grouped_mm), and the torch fallbacks of the Gated DeltaNet
(`torch_chunk_gated_delta_rule` for several tokens, `torch_recurrent_gated_delta_rule` for one cached token,
`F.conv1d` for the short convolution). Those fallbacks are chosen at import when neither the hub `kernels`
package nor `fla` / `causal_conv1d` is installed; `require_torch_fallback` refuses to run otherwise, and
nothing here touches the network (HF_HUB_OFFLINE).

`hf_logits` is one full no-cache forward (HF's chunked delta rule, chunks of 64); `hf_greedy` decodes with
HF's cache (chunked prefill, then one token at a time).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

from hf_oracle import torch  # noqa: F401  (a missing oracle is an ImportError that says how to install it)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM  # noqa: E402

# Packages that would replace HF's torch paths (hub kernels, flash-linear-attention, causal-conv1d).
FAST_PATH_PACKAGES = ("kernels", "fla", "causal_conv1d")


def require_torch_fallback() -> None:
    present = [p for p in FAST_PATH_PACKAGES if importlib.util.find_spec(p) is not None]
    if present:
        raise RuntimeError(f"the Qwen3.5 oracle runs HF's reference torch paths; {', '.join(present)} would replace "
                           "them: run it in an environment without those packages")


def model_class(model_dir: str | os.PathLike):
    """The causal-LM class for a directory: MoE or dense, from config.json (a conditional-generation
    checkpoint's text part loads into the causal class: HF picks `text_config` and drops `model.visual.*`
    and `mtp.*`)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    kind = cfg["model_type"]
    if kind in ("qwen3_5_moe", "qwen3_5_moe_text"):
        return Qwen3_5MoeForCausalLM
    if kind in ("qwen3_5", "qwen3_5_text"):
        return Qwen3_5ForCausalLM
    raise ValueError(f"config.json model_type is {kind!r}; the Qwen3.5 oracle reads qwen3_5[_text] and "
                     "qwen3_5_moe[_text]")


def load(model_dir: str | os.PathLike, *, with_info: bool = False):
    """The HF model (fp32, eval, reference paths); with_info: (model, loading info)."""
    require_torch_fallback()
    cls = model_class(model_dir)
    kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if cls is Qwen3_5MoeForCausalLM:
        kw["experts_implementation"] = "eager"
    model, info = cls.from_pretrained(str(model_dir), **kw)
    model.eval()
    return (model, info) if with_info else model


@functools.lru_cache(maxsize=4)
def _cached(model_dir: str, mtime: float):
    return load(model_dir)


def _model(model_dir) -> object:
    d = str(Path(model_dir).resolve())
    return _cached(d, os.path.getmtime(Path(d) / "config.json"))


def hf_logits(model_dir: str | os.PathLike, ids) -> np.ndarray:
    """All-position logits [S, V] (float32) of one no-cache forward over `ids` (a sequence of token ids)."""
    model = _model(model_dir)
    x = torch.tensor([list(map(int, ids))], dtype=torch.long)
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits[0].float().numpy().copy()


def hf_greedy(model_dir: str | os.PathLike, ids, n: int) -> list[int]:
    """`n` greedy tokens after `ids` with HF's cache (ties: torch.argmax, the lowest index)."""
    from transformers import DynamicCache

    model = _model(model_dir)
    cache = DynamicCache(config=model.config)
    x = torch.tensor([list(map(int, ids))], dtype=torch.long)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=x, cache=cache, use_cache=True).logits[0, -1]
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            x = torch.tensor([[nxt]], dtype=torch.long)
    return out

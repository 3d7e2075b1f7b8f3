"""HF transformers' greedy answer, the oracle the daemon's answers are held against (e2e tests)."""

from __future__ import annotations

import numpy as np
import torch


def hf_answer(hf, prompt: list[int], n: int = 4) -> tuple[list[int], np.ndarray]:
    """HF's greedy continuation (cached decode) and, from one full no-cache forward over the prompt
    and it, the log-probability rows [n, V] at each answer position (float64)."""
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        toks = [int(out.logits[0, -1].argmax())]
        for _ in range(n - 1):
            out = hf(input_ids=torch.tensor([[toks[-1]]]), cache=out.past_key_values, use_cache=True)
            toks.append(int(out.logits[0, -1].argmax()))
        full = hf(input_ids=torch.tensor([prompt + toks[:-1]]), use_cache=False, logits_to_keep=n).logits[0]
    return toks, torch.log_softmax(full.double(), dim=-1).numpy()

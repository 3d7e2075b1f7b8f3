"""The CSA indexer's top-k ties. A score is sum_h relu(q_h . k) * w_h: with few indexer heads many
keys score exactly 0 (every head's dot product negative), and which of the tied keys are selected
decides the answer. The kernel breaks ties to the lowest entry index (attention.cpp `top_k`);
torch.topk breaks them its own, unspecified way. With that one rule applied to HF too, the two agree
to the usual tolerance, so a difference on such a model is the tie rule, not the arithmetic. (V4's
real models have 64 indexer heads, where exact ties do not happen in practice.)"""

import copy

import numpy as np
import pytest
import torch

import cairn._kernel as K
import hf_oracle as H


def _lowest_index_topk(x, k, dim=-1, largest=True, sorted=True):
    idx = torch.argsort(-x if largest else x, dim=dim, stable=True).narrow(dim, 0, k)
    return torch.return_types.topk((x.gather(dim, idx), idx))


@pytest.mark.parametrize("heads", [2, 4])
def test_few_indexer_heads_tie_at_zero_and_agree_with_hf_under_the_lowest_index_rule(heads, monkeypatch):
    cfg = copy.deepcopy(H.CONFIGS["w16-hca16"])
    cfg["index_n_heads"] = heads
    hf = H.build_hf(cfg, 1000)
    rc, w = H.resolved_config(hf.config), H.canonical_weights(hf)
    toks = np.random.default_rng(0).integers(0, rc["vocab_size"], 200).astype(np.int32)
    st = K.State(K.Model(rc, w, "ties", 2))
    _, got = K.prefill(st, toks, chunk=37, all_logits=True)
    ids = torch.tensor(toks[None].astype(np.int64))
    with torch.no_grad():
        plain = hf(ids).logits[0].float().numpy()
    monkeypatch.setattr(torch, "topk", _lowest_index_topk)
    monkeypatch.setattr(torch.Tensor, "topk", lambda self, *a, **kw: _lowest_index_topk(self, *a, **kw))
    with torch.no_grad():
        ruled = hf(ids).logits[0].float().numpy()
    assert np.abs(got - ruled).max() <= 1e-4
    assert np.abs(plain - ruled).max() > 1e-2      # the tie rule is what differs: this model does tie

"""Expected decode and prefill speed of the full 43-layer V4-Flash with paged experts on machines of
32-192 GB and NVMe at 3 and 7 GB/s: arithmetic from what bench/expert_paging.py measured on the
2-layer slice (its --json), written out so every assumption is visible.

    .venv/bin/python bench/flash_arithmetic.py /tmp/expert_paging.json

Model: V4-Flash's tensors as the flash-slice preset writes them (43 layers), sized without writing.
 * budget: daemon/service/expert_budget.py's auto rule with MemAvailable = AVAIL_SHARE of the RAM, the
   default 2 GiB checkpoint budget and one state at 32k tokens;
 * hit rate h: the measured LRFU curve (agent stream, one token per call) at the budget's share;
 * decode, per token: every dense byte but the embedding, and 6 x 43 experts (12.75 MiB each), read
   from RAM at the bandwidth the resident slice's decode achieved; the (1 - h) missed experts from
   disk; RAM and disk time added (a layer's experts are known only after its router: little
   overlap within one token);
 * prefill, per 128-token chunk: compute at the slice's measured rate, scaled by active parameters
   per token (43 layers against the slice's 2); the experts a chunk needs (with random routing,
   1 - (1 - 6/256)^128 = 95 % of each layer's) minus the cached share read from disk, overlapped with
   compute (the pager streams reads while experts compute): time = max(compute, disk).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

AVAIL_SHARE = 0.94
GB = 1e9


def flash_sizes() -> dict:
    from cairn.daemon.modelgen.flash_slice import _layer
    from cairn.daemon.modelgen.make_model import PRESETS, hf_config
    from cairn.daemon.weights.dsv4.config import resolve_config
    from cairn.daemon.weights.safetensors_io import DTYPES
    from cairn.daemon.service.memory_plan import StateCost, state_bytes

    p = PRESETS["flash-slice"]
    cfg = resolve_config(hf_config(p))
    V, D, k, E = p.vocab_size, p.hidden_size, p.num_experts_per_tok, p.n_routed_experts
    out = {"layers": len(p.layer_types), "embed": V * D * 2, "head": V * D * 2, "state_32k": state_bytes(cfg, 32768),
           "state_cost": StateCost.from_config(cfg)}
    dense_layers, experts, params_layers = [], 0, []
    for i in range(len(p.layer_types)):
        d = e = par = 0
        for name, (shape, tag, _) in _layer(p, i, 0).items():
            n = int(np.prod(shape))
            b = n * DTYPES[tag].itemsize
            if ".ffn.experts." in name:
                e += b
                if name.endswith(".weight"):
                    par += n * (2 if tag == "I8" else 1) * k / E    # the active share of routed experts
            else:
                d += b
                if name.endswith(".weight") and len(shape) == 2:
                    par += n
        dense_layers.append(d)
        experts += e
        params_layers.append(par)
    out |= {"dense_layers": dense_layers, "experts": experts, "params_layers": params_layers,
            "expert_bytes": experts / len(p.layer_types) / E, "k": k, "E": E}
    return out


def interp(curve: list[float], shares: list[float], s: float) -> float:
    return float(np.interp(s, [0.0] + shares, [0.0] + curve))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--stream", default="agent")
    ap.add_argument("--policy", default="hotpin")
    ap.add_argument("--decode-tok-s", type=float, default=None,
                    help="the resident slice's decode rate to scale from (default: the bench run's)")
    ap.add_argument("--prefill-tok-s", type=float, default=None,
                    help="the resident slice's prefill rate (chunk 128) to scale from (default: the bench run's)")
    a = ap.parse_args()
    res = json.loads(a.bench_json.read_text())
    from cairn.daemon.service.memory_plan import LimitSource, ModelBytes, plan_memory

    f = flash_sizes()
    L, k, E, xb = f["layers"], f["k"], f["E"], f["expert_bytes"]
    dense = sum(f["dense_layers"]) + f["embed"] + f["head"]
    res_run = dict(res["runs"][a.stream]["resident"])
    if a.decode_tok_s:
        res_run["decode_tok_s"] = a.decode_tok_s
    if a.prefill_tok_s:
        res_run["prefill_tok_s"] = a.prefill_tok_s
    # the 2-layer slice: bytes read per decoded token, and the RAM bandwidth its decode achieved
    slice_tok_bytes = sum(f["dense_layers"][:2]) + f["head"] + 2 * k * xb
    ram_bw = slice_tok_bytes * res_run["decode_tok_s"]
    slice_params = sum(f["params_layers"][:2])
    full_params = sum(f["params_layers"])
    prefill_full = res_run["prefill_tok_s"] * slice_params / full_params      # compute-bound tok/s
    tok_bytes_dense = sum(f["dense_layers"]) + f["head"]
    tok_bytes_experts = L * k * xb
    chunk_need = 1 - (1 - k / E) ** 128
    curve, shares = res["curves"][a.stream][a.policy], res["curve_shares"]
    print(f"V4-Flash: dense {dense / GB:.2f} GB, experts {f['experts'] / GB:.1f} GB ({L} x {E} x "
          f"{xb / 2**20:.2f} MiB); per token {tok_bytes_dense / GB:.2f} GB dense + {tok_bytes_experts / GB:.2f} GB experts")
    print(f"from the slice: RAM bandwidth of decode {ram_bw / GB:.1f} GB/s ({res_run['decode_tok_s']:.1f} tok/s x "
          f"{slice_tok_bytes / GB:.2f} GB), prefill compute {res_run['prefill_tok_s']:.1f} tok/s x "
          f"{slice_params / 1e6:.0f} M / {full_params / 1e6:.0f} M active params = {prefill_full:.2f} tok/s")
    print(f"resident (RAM only) decode bound: {ram_bw / (tok_bytes_dense + tok_bytes_experts):.2f} tok/s")
    print()
    print("| RAM | expert budget | share | hit rate h | disk | decode tok/s | prefill tok/s (chunk 128) | prefill disk / compute |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for ram in (32, 64, 128, 192):
        plan = plan_memory(limit=LimitSource("MemAvailable", int(ram * GB * AVAIL_SHARE)),
                           weights=ModelBytes(dense, f["experts"]), state=f["state_cost"], context_length=1 << 20,
                           checkpoint_setting=2 << 30)
        budget = plan.expert_cache_bytes if plan.paged else f["experts"]
        share = min(1.0, budget / f["experts"])
        h = interp(curve, shares, share) if plan.paged else 1.0
        for disk in (3.0, 7.0):
            t_ram = (tok_bytes_dense + h * tok_bytes_experts) / ram_bw
            t_disk = (1 - h) * tok_bytes_experts / (disk * GB)
            dec = 1 / (t_ram + t_disk)
            miss_chunk = max(0.0, chunk_need - share) * f["experts"]
            t_comp = 128 / prefill_full
            t_read = miss_chunk / (disk * GB)
            pre = 128 / max(t_comp, t_read)
            rows.append(dict(ram=ram, budget=budget, share=share, h=h, disk=disk, decode=dec, prefill=pre,
                             read_over_compute=t_read / t_comp))
            print(f"| {ram} GB | {budget / GB:.1f} GB{'' if plan.paged else ' (all resident)'} | {100 * share:.0f} % | "
                  f"{100 * h:.0f} % | {disk:.0f} GB/s | {dec:.2f} | {pre:.2f} | {t_read:.1f} s / {t_comp:.1f} s |")
    return rows


if __name__ == "__main__":
    main()

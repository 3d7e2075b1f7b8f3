"""bench/depth.py's arithmetic (the indexer's multiply-adds, the keys attention reads), its V4-Flash
projection on a known linear cost model, and its llama.cpp requests on a stub server (no kernel, no
llama.cpp)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cairn.daemon.modelgen.make_model import PRESETS, hf_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import depth  # noqa: E402


@pytest.fixture
def shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(PRESETS["flash-attn"])))
    return depth.Shape(str(tmp_path))


def test_indexer_scores_only_past_top_k_and_prefill_sums_the_positions(shape):
    proj = shape.indexer_proj_macs()
    assert proj == 64 * 128 * 1024 + 64 * 4096 + 2 * 2 * 128 * 4096
    assert shape.indexer_macs(2048) == proj                     # 512 entries: all taken unscored
    assert shape.indexer_macs(131072) == 64 * 128 * 32768 + proj  # one CSA layer
    p, d = 1000, 3000
    assert shape.prefill_indexer_macs(p, d) == sum(shape.indexer_macs(t + 1) for t in range(p, d))
    # one window each, CSA's top-k, HCA's entries
    assert shape.keys(131072) == 2 * 128 + 512 + 1024
    assert shape.keys(64) == 2 * 64 + 16


def test_projection_recovers_a_linear_cost_model(shape):
    fixed = {"hc": 1e-4, "qkv": 2e-3, "compress": 5e-4, "out": 3e-3, "router": 1e-5, "experts": 4e-3}
    head, i0, i1, a0, a1 = 2e-2, 1e-3, 1.0 / 40e9, 2e-4, 3e-8

    def sections(n):
        s = {k: v * shape.layers for k, v in fixed.items()}
        s["head"] = head
        s["indexer"] = shape.kinds[depth.C_] * (i0 + i1 * shape.nI * shape.Di * shape.scored(n))
        s["attn"] = a0 * shape.layers + a1 * shape.keys(n)
        return s

    runs = [{"depth": n, "cairn": {"decode": {"sections_s_per_token": sections(n)}}} for n in (1024, 8192, 32768)]
    p = depth.project(shape, runs, None)
    fl = depth.FLASH_LAYERS
    for n in depth.PROJECT_AT:
        want = (sum(fixed.values()) * 43 + head + 21 * (i0 + i1 * 64 * 128 * shape.scored(n))
                + a0 * 43 + a1 * shape.keys(n, fl))
        assert p["at"][n]["s"] == pytest.approx(want, rel=1e-6)
    tok = [p["at"][n]["tok_s"] for n in depth.PROJECT_AT]
    assert tok == sorted(tok, reverse=True) and "warning" not in p
    # the slice's sections replace the fixed ones and the indexer's intercept (it scored nothing)
    sl = {"model": "slice", "shape": {"layers": 2, "csa_layers": 1, "scored_at_shallowest": 0},
          "depths": [{"depth": 1024, "cairn": {"decode": {"sections_s_per_token": {
              **{k: 2 * v for k, v in fixed.items()}, "head": 0.2, "indexer": 5e-4, "attn": 0.0}}}}]}
    q = depth.project(shape, runs, sl)
    assert q["head_s"] == 0.2 and q["indexer_fit"]["i0_s_per_csa_layer"] == 5e-4
    assert q["at"][1024]["s"] == pytest.approx(p["at"][1024]["s"] + 0.2 - head - 21 * (i0 - 5e-4), rel=1e-6)


def test_rates_are_multiply_adds_over_the_sections_seconds(shape):
    n, gflops = 65536, 100.0
    macs = shape.indexer_macs(n)
    sec = {"indexer": macs / 25e9, "attn": 1e-2}   # 25 G multiply-adds/s = 50 % of 100 GFLOP/s
    r = depth.rates(shape, n, {"sections_s_per_token": sec}, None, {"gemm_gflops": gflops, "read_gbs": 20.0})
    assert r["indexer_of_gemm"] == pytest.approx(0.5)
    ent = n // 128
    assert r["hca_s_per_token"] == pytest.approx(1e-2 * ent / shape.keys(n))
    assert r["hca_read_gbs"] == pytest.approx(ent * 512 * 4 / r["hca_s_per_token"] / 1e9)
    assert np.isfinite(r["hca_of_gemm"])


def test_peer_segment_extends_the_cached_prompt_saves_the_slot_and_times_resumed_decodes():
    """llama.cpp's side, on a stub server: the whole prompt to the depth with cache_prompt and one token
    (its checkpoint holds the rest; prefill = the tokens it computed), the slot saved holding exactly
    those ids, then each decode round the same ids again (resumed 4 tokens before the end) for n + 1
    tokens (the first is the prompt's); the median round is the decode. A repeated prompt the server
    recomputes (no checkpoint) is an error, not a figure."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import llama_peer

    bodies: list[tuple[str, dict]] = []
    seen: set = set()
    predicted_ms = iter([400.0, 200.0, 800.0, 400.0])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append((self.path, body))
            if self.path.startswith("/slots/0?action=save"):
                out = {"n_saved": len(bodies[0][1]["prompt"])}
            else:
                key = tuple(body["prompt"])
                n = 4 if key in seen and not recompute else 100
                seen.add(key)
                out = {"timings": {"prompt_n": n, "cache_n": len(key) - n, "prompt_ms": 50.0,
                                   "predicted_n": body["n_predict"],
                                   "predicted_ms": 5.0 if body["n_predict"] == 1 else next(predicted_ms)}}
            out = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    recompute = False
    try:
        server = llama_peer.LlamaServer.__new__(llama_peer.LlamaServer)
        server.port = httpd.server_address[1]
        ids = list(range(16, 1040))
        r = depth.peer_segment(server, ids, 32, rounds=3, save_as="m.seed0.d1024.bin")
        recompute, seen = True, set()
        with pytest.raises(RuntimeError, match="recomputed 100 tokens of a repeated prompt"):
            depth.peer_segment(server, ids, 32, rounds=1)
    finally:
        httpd.shutdown()
    first, save, *rounds = bodies[:5]
    assert first[1]["cache_prompt"] is True and first[1]["n_predict"] == 1 and first[1]["prompt"] == ids
    assert save == ("/slots/0?action=save", {"filename": "m.seed0.d1024.bin"})
    assert [b["n_predict"] for _, b in rounds] == [33, 33, 33] and all(b["prompt"] == ids for _, b in rounds)
    assert r["prefill"] == {"tokens": 100, "cached": 924, "s": 0.05, "tok_s": 2000.0,
                            "saved": {"file": "m.seed0.d1024.bin", "tokens": 1024}}
    assert r["decode"]["tok_s"] == pytest.approx(80.0) and r["decode"]["resumed_tokens"] == 4   # 32 in 0.4 s
    assert [x["tok_s"] for x in r["decode"]["rounds"]] == pytest.approx([80.0, 160.0, 40.0])
    assert depth.slot_name("/x/m.f32.gguf", 0, 1024) == "m.f32.seed0.d1024.bin"
    # the server keeps its checkpoints in this mode, and only in it
    cmd = llama_peer.server_command(Path("llama-server"), Path("m.gguf"), 2, 512, 4096, 8080, extend=True)
    assert "-ctxcp" not in cmd and "-cram" not in cmd

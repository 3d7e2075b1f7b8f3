"""Resident memory of a quantized model is about its stored bytes: the quantized panels keep the
stored codes (no widened copy), the mapped sources of packed matrices are released as they are packed,
and the BF16 embedding stays in the mapping (its rows are read per token, not at load)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from cairn.daemon.modelgen.make_model import C, S, make_model, preset_with

# Resident memory of the measuring process, by kind (bytes); prepended to each script below.
_RSS = textwrap.dedent("""
    def rss():
        with open("/proc/self/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f)
                    if k in ("VmRSS", "RssAnon", "RssFile")}
""")

_MEASURE = _RSS + textwrap.dedent("""
    import json, sys
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    md = open_model_dir(sys.argv[1])
    stored = sum(t.end - t.start for t in md.tensors.values())
    # A first load warms up what every load pays once per process (the OpenMP team's stacks, the
    # kernel's thread-local buffers, allocator arenas): a few MB, not weights; the second is measured.
    del_me = load_model(md, threads=2)
    del del_me
    before = rss()
    model = load_model(md, threads=2)
    after = rss()
    print(json.dumps({"stored": stored, "grown": after["VmRSS"] - before["VmRSS"],
                      "file_grown": after["RssFile"] - before["RssFile"]}))
""")


@pytest.mark.parametrize("quant", ["fp4", "fp8"])
def test_rss_after_load_is_at_most_1_1x_stored_weight_bytes(tmp_path, quant):
    p = preset_with("small", vocab_size=1024, layer_types=(S, C), mlp_layer_types=("hash_moe", "moe"), quant=quant)
    d = make_model(p, 1, tmp_path / "m", dtype="bfloat16")
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(d)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["stored"] > 30_000_000  # large against the interpreter's own noise
    assert r["grown"] <= 1.1 * r["stored"], r
    assert r["file_grown"] <= 0.05 * r["stored"], r  # the mapping's pages did not stay resident


_PEAK = textwrap.dedent("""
    import json, sys
    from cairn.daemon.weights.model_dir import load_model, open_model_dir
    import cairn._kernel

    def status():
        with open("/proc/self/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmRSS", "VmHWM")}

    md = open_model_dir(sys.argv[1])
    stored = sum(t.end - t.start for t in md.tensors.values())
    before = status()
    model = load_model(md, threads=2)
    print(json.dumps({"stored": stored, "peak_grown": status()["VmHWM"] - before["VmRSS"]}))
""")


@pytest.mark.parametrize("quant", ["fp4", "fp8"])
def test_a_resident_load_peaks_at_about_the_stored_bytes_not_twice_them(tmp_path, quant):
    # Packing reads every stored code and BF16 value through the file's mapping; each job drops the
    # pages it has packed, and BF16 matrices are packed from their stored values, not a widened fp32
    # copy: the load never holds the mapped bytes and their panels at once (2.1x before, 1.1x now).
    p = preset_with("small", vocab_size=1024, layer_types=(S, C), mlp_layer_types=("hash_moe", "moe"), quant=quant)
    d = make_model(p, 1, tmp_path / "m", dtype="bfloat16")
    out = subprocess.run([sys.executable, "-c", _PEAK, str(d)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["stored"] > 30_000_000, r
    assert r["peak_grown"] <= 1.2 * r["stored"], r


_RESTART = _RSS + textwrap.dedent("""
    import json, sys
    import numpy as np
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    md = open_model_dir(sys.argv[1])
    before = rss()
    model = load_model(md, threads=2, packed_cache=sys.argv[2], packed_cache_min_bytes=0)
    after = rss()
    logits = K.prefill(K.State(model), np.arange(40, dtype=np.int32), chunk=16, all_logits=True)[1]
    print(json.dumps({"from_cache": model.packed_from_cache, "written": model.packed_cache_written,
                      "anon_grown": after["RssAnon"] - before["RssAnon"], "packed": model.packed_bytes,
                      "logits": logits.tobytes().hex()}))
""")


def test_second_start_maps_the_packed_cache_instead_of_packing(tmp_path):
    """First start packs and writes the panels atomically; the second maps them (no packing, no
    anonymous copy: the panels are page cache, read when used) and computes the same bits; a
    cache of another model (fingerprint in the header) is not used."""
    p = preset_with("small", vocab_size=1024, layer_types=(S, C), mlp_layer_types=("hash_moe", "moe"), quant="fp4")
    d = make_model(p, 1, tmp_path / "m", dtype="bfloat16")
    cache = tmp_path / "cache"

    def start(model_dir):
        out = subprocess.run([sys.executable, "-c", _RESTART, str(model_dir), str(cache)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    first, second = start(d), start(d)
    assert (first["from_cache"], first["written"]) == (False, True)
    assert (second["from_cache"], second["written"]) == (True, False)
    assert first["anon_grown"] >= first["packed"] > 20_000_000
    assert second["anon_grown"] < 0.2 * second["packed"], second
    assert second["logits"] == first["logits"]
    assert all(f.suffix == ".pack" for f in cache.iterdir())  # no temporary file left behind
    other = make_model(p, 2, tmp_path / "other", dtype="bfloat16")
    assert start(other)["from_cache"] is False

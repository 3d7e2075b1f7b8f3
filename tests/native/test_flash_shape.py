"""The loader at V4-Flash-0731's real structure (the flash-shape preset: 43 layers x 256 experts, official
names and FP8/FP4 layout, 48 shards with the DSpark drafter, ~70,000 tensors, toy widths): index parsing,
checks, fingerprint, packing and the daemon's start-up at the real tensor count, under a small open-file
limit (issue 20: one memory map per tensor ran out of descriptors)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

from cairn.daemon.cli.child import wait_until_serving
from cairn.daemon.modelgen.make_model import PRESETS
from cairn.daemon.weights.model_dir import open_model_dir
from cairn.daemon.weights.safetensors_io import read_header
from daemon_harness import unix_get

NOFILE = 256   # far below the tensor count (and below systemd's soft default of 1024)


def _limit_open_files() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))


def test_flash_shape_has_the_release_structure(flash_shape_dir):
    index = json.loads((flash_shape_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) == 48 and shards[0] == "model-00001-of-00048.safetensors"
    assert len(index) >= 66_000                                       # the release's order of magnitude
    drafter = {n for n in index if n.startswith("mtp.")}
    assert {n.split(".")[1] for n in drafter} == {"0", "1", "2"}
    assert "mtp.2.markov_head.markov_w1" in drafter and "mtp.2.confidence_head.proj.weight" in drafter
    assert {index[n] for n in drafter} == set(shards[-3:])            # the drafter in the last shards
    assert index["embed.weight"] == shards[0] and index["layers.42.ffn.experts.255.w2.weight"] == shards[43]
    _, infos = read_header(flash_shape_dir / shards[2])               # layer 1: hash-routed, FP4 experts
    assert infos["layers.1.ffn.gate.tid2eid"].dtype == "I64" and infos["layers.1.ffn.gate.tid2eid"].shape[1] == 6
    assert infos["layers.1.ffn.experts.7.w1.weight"].dtype == "I8"
    assert infos["layers.1.attn.wq_a.weight"].dtype == "F8_E4M3" and infos["layers.1.attn.wq_a.scale"].dtype == "F8_E8M0"
    md = open_model_dir(flash_shape_dir)
    cfg = md.config
    assert cfg["num_hidden_layers"] == 43 and cfg["n_routed_experts"] == 256 and cfg["num_experts_per_tok"] == 6
    assert cfg["mlp_layer_types"][:4] == ["hash_moe"] * 3 + ["moe"]
    assert cfg["quantization"] == {"expert_dtype": "fp4"}
    assert not any(n.startswith("mtp.") for n in md.tensors)         # the drafter is not served
    assert len(md.tensors) == len(index) - len(drafter)
    size = sum((flash_shape_dir / s).stat().st_size for s in shards)
    assert size < 80_000_000, size                                    # small enough for the suite
    assert PRESETS["flash-shape"].layer_types == PRESETS["flash-slice"].layer_types


def test_the_drafter_is_ignored_with_one_log_line(flash_shape_dir):
    class Log:
        lines: list = []

        def info(self, event, **kw):
            self.lines.append((event, kw))

    log = Log()
    index = json.loads((flash_shape_dir / "model.safetensors.index.json").read_text())["weight_map"]
    drafter = [n for n in index if n.startswith("mtp.")]
    open_model_dir(flash_shape_dir, log=log)
    ignored = [kw for event, kw in log.lines if event == "model_tensors_ignored"]
    assert len(ignored) == 1 and ignored[0]["tensors"] == len(drafter) and ignored[0]["names"] == "mtp.*"
    assert ignored[0]["bytes"] > 0 and "DSpark" in ignored[0]["why"]


def test_fingerprint_reads_every_shard_once_then_comes_from_the_digest_cache(flash_shape_dir, tmp_path):
    cache = tmp_path / "digests.json"
    first = open_model_dir(flash_shape_dir, digest_cache=cache)
    again = open_model_dir(flash_shape_dir, digest_cache=cache)
    assert first.fingerprint == again.fingerprint
    assert len(json.loads(cache.read_text())["files"]) == 48


_LOAD = textwrap.dedent("""
    import json, os, resource, sys
    import numpy as np
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    def fds():
        return len(os.listdir("/proc/self/fd"))

    base = fds()
    md = open_model_dir(sys.argv[1])
    model = load_model(md, threads=2)
    held = fds()
    n, logits = K.prefill(K.State(model), np.array([5, 6, 7, 8, 9], dtype=np.int32), chunk=4)
    del model
    print(json.dumps({"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "tensors": len(md.tensors),
                      "base": base, "held": held, "after": fds(), "n": n,
                      "finite": bool(np.isfinite(np.asarray(logits)).all())}))
""")


def test_loads_and_runs_under_an_open_file_limit_of_256(flash_shape_dir):
    r = subprocess.run([sys.executable, "-c", _LOAD, str(flash_shape_dir)], capture_output=True, text=True,
                       timeout=300, preexec_fn=_limit_open_files)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["limit"] == NOFILE and out["tensors"] > 60_000
    assert out["n"] == 5 and out["finite"]
    # a descriptor per mapped file at most while the model lives, none once it is gone
    assert out["held"] - out["base"] <= 48, out
    assert out["after"] <= out["base"] + 1, out


def test_daemon_starts_and_answers_under_an_open_file_limit_of_256(flash_shape_dir, tmp_path):
    sock = tmp_path / "api.sock"
    cmd = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "2", "--threads", "2",
           "--model", str(flash_shape_dir), "--socket", str(sock), "--checkpoint-dir", str(tmp_path / "state"),
           "--packed-cache-dir", str(tmp_path / "packed")]
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_open_files)
    try:
        wait_until_serving(sock, proc, timeout=240, log=tmp_path / "serve.log")
        assert b'"status":"ok"' in unix_get(str(sock), "/health")
        loads = unix_get(str(sock), "/v1/loads")
        assert loads.startswith(b"HTTP/1.1 200"), loads
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) < NOFILE // 2
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()

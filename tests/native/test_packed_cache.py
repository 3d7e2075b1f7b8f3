"""The packed cache file's lifecycle:

- the header's layout key derives from the kernel's layout description (every field counts), and a
  file with another key is re-packed, not mapped;
- a crashed pack's temporary file (writer dead) is removed by the next pack, also after a SIGKILL
  mid-pack; no lock or temporary file stays behind;
- two loads started together pack once: the other waits for the lock and maps the finished file;
- load_model trims the directory to packed_cache_budget (least recently used first), never
  removing the current file or a file a live Model holds.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import C, S, make_model, preset_with
from cairn.daemon.weights.model_dir import load_model, map_weights, open_model_dir, packed_cache_file
from cairn.daemon.weights.packed_cache import source_key, trim_packed_cache


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return open_model_dir(make_model("tiny-fp4", 3, tmp_path_factory.mktemp("packed") / "m"))


def kmodel(md, path) -> K.Model:
    return K.Model(md.config, map_weights(md), md.fingerprint, 2, packed_cache=str(path))


def logits(model) -> np.ndarray:
    return K.prefill(K.State(model), np.arange(20, dtype=np.int32), chunk=8, all_logits=True)[1]


def test_layout_key_changes_with_every_description_field():
    layout = K.packed_layout()
    assert {"panel_rows", "e2m1_scale_group", "e4m3_scale_bias", "header_struct_bytes", "expert_slot_align"} <= set(layout)
    assert layout["panel_rows"] == "16" and layout["magic"] == "CAIRNPK2"
    base = K.packed_layout_key()
    assert base == K.packed_layout_key({}) and base == K.packed_layout_key({"panel_rows": "16"})
    keys = {K.packed_layout_key({name: value + "1"}) for name, value in layout.items()}
    assert base not in keys and len(keys) == len(layout)  # each field changes the key, each differently
    with pytest.raises(ValueError, match="no field 'panel_cols'"):
        K.packed_layout_key({"panel_cols": "16"})


def test_a_file_with_another_layout_key_is_repacked_not_mapped(tiny, tmp_path):
    path = tmp_path / "m.pack"
    first = kmodel(tiny, path)
    assert first.packed_cache_written and not first.packed_from_cache
    head = path.read_bytes()[:16]
    assert head[:8] == b"CAIRNPK2" and struct.unpack("<Q", head[8:16])[0] == first.packed_layout_key
    assert kmodel(tiny, path).packed_from_cache
    # as a build with another layout description would have written it
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<Q", first.packed_layout_key ^ 1))
    again = kmodel(tiny, path)
    assert again.packed_cache_written and not again.packed_from_cache
    assert struct.unpack("<Q", path.read_bytes()[8:16])[0] == first.packed_layout_key
    assert np.array_equal(logits(first), logits(again))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_stale_temporary_file_is_removed_by_the_next_pack(tiny, tmp_path):
    import fcntl

    path = tmp_path / "m.pack"
    stale = tmp_path / f"m.pack.tmp.{dead_pid()}"
    alive = tmp_path / "m.pack.tmp.1"                   # pid 1 is alive: a writer between open and flock
    locked = tmp_path / f"m.pack.tmp.{dead_pid() + 1}"  # flocked: a writer (in another pid namespace)
    other = tmp_path / f"other.pack.tmp.{dead_pid()}"   # another file's: not this pack's business
    for f in (stale, alive, locked, other):
        f.write_bytes(b"x" * 100_000)
    fd = os.open(locked, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        model = kmodel(tiny, path)
    finally:
        os.close(fd)
    assert model.packed_cache_written
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.pack", alive.name, locked.name, other.name])


_PACK = """
import resource, signal, sys
from cairn.daemon.weights.model_dir import load_model
# The pack dies mid-write, deterministically: past 1 MiB the kernel kills the process (SIGXFSZ,
# which Python ignores unless told otherwise), as a crash or a kill -9 would, the temp file half written.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
load_model(sys.argv[1], threads=1, packed_cache=sys.argv[2], packed_cache_min_bytes=0)
"""


def test_a_pack_killed_midway_leaves_nothing_after_the_next_start(tmp_path):
    p = preset_with("small", vocab_size=1024, layer_types=(S, C), mlp_layer_types=("hash_moe", "moe"), quant="fp4")
    d = make_model(p, 1, tmp_path / "m", dtype="bfloat16")
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _PACK, str(d), str(cache)])
    assert proc.returncode == -signal.SIGXFSZ     # killed while writing, not finished
    left = os.listdir(cache)
    assert any(".tmp." in f for f in left), left  # the crash left its temporary file (and maybe its lock)
    assert not any(f.endswith(".pack") for f in left)
    model = load_model(d, threads=2, packed_cache=cache, packed_cache_min_bytes=0)
    assert model.packed_cache_written
    assert os.listdir(cache) == [packed_cache_file(open_model_dir(d), cache).name]


def test_two_loads_started_together_pack_once(tiny, tmp_path):
    start = threading.Barrier(2)
    models = [None, None]

    def load(i):
        start.wait()
        models[i] = load_model(tiny, 2, packed_cache=tmp_path, packed_cache_min_bytes=0)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted((m.packed_cache_written, m.packed_from_cache) for m in models) == [(False, True), (True, False)]
    assert np.array_equal(logits(models[0]), logits(models[1]))
    assert [f.name for f in tmp_path.iterdir()] == [packed_cache_file(tiny, tmp_path).name]  # no lock file left


def test_load_keeps_one_file_per_model_and_trims_others_to_the_budget(tiny, tmp_path):
    other = open_model_dir(make_model("tiny-fp4", 4, tmp_path / "other"))
    cache = tmp_path / "cache"
    current = packed_cache_file(tiny, cache)
    theirs = packed_cache_file(other, cache)
    assert current.name.startswith(source_key(tiny.path) + "-") and current.name != theirs.name
    held = load_model(other, 2, packed_cache=cache, packed_cache_min_bytes=0)  # a live Model: in use
    older = cache / f"{source_key(tiny.path)}-{'0' * 32}.pack"  # this model's older fingerprint
    older.write_bytes(b"\0" * 200_000)
    old_naming = cache / ("1" * 32 + ".pack")  # an earlier cairn's name: never mapped again
    old_naming.write_bytes(b"\0" * 1000)
    lock = cache / ("2" * 32 + ".pack.lock")  # a crashed packer's lock
    lock.touch()
    model = load_model(tiny, 2, packed_cache=cache, packed_cache_min_bytes=0, packed_cache_budget=0)
    assert model.packed_cache_written
    assert sorted(p.name for p in cache.iterdir()) == sorted([current.name, theirs.name])
    del held, model  # no longer in use: with no cap, the other model's file still stays
    load_model(tiny, 2, packed_cache=cache, packed_cache_min_bytes=0, packed_cache_budget=0)
    assert sorted(p.name for p in cache.iterdir()) == sorted([current.name, theirs.name])
    # a cap both fit under keeps both
    load_model(other, 2, packed_cache=cache, packed_cache_min_bytes=0, packed_cache_budget=1 << 30)
    assert len(list(cache.iterdir())) == 2
    # a cap of one file: the least recently used other model's file goes, never the one just loaded
    os.utime(current, (2, 2))
    model3 = load_model(other, 2, packed_cache=cache, packed_cache_min_bytes=0,
                        packed_cache_budget=theirs.stat().st_size + 1)
    assert [p.name for p in cache.iterdir()] == [theirs.name]
    del model3


def test_trim_removes_least_recently_used_first_and_never_a_held_file(tmp_path):
    import fcntl

    files = []
    for i, age in enumerate((30, 10, 20)):
        f = tmp_path / f"{i}.pack"
        f.write_bytes(b"\0" * 1000)
        os.utime(f, (age, age))
        files.append(f)
    current = tmp_path / "cur.pack"
    current.write_bytes(b"\0" * 1000)
    fd = os.open(files[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # as a running kernel holds its file
    try:
        removed = trim_packed_cache(tmp_path, current, 2500)  # 4000 bytes: two must go; 1 is held
        assert removed == [files[2], files[0]]
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.pack", "cur.pack"]
    assert trim_packed_cache(tmp_path, current, 0) == []         # no cap
    assert trim_packed_cache(tmp_path, current, 1) == [files[1]]

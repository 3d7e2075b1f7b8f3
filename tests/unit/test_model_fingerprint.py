"""The model fingerprint covers every weight byte, and its digest cache (issue 10, item 6); the
checkpoint fingerprint adds the kernel build's rounding class (issue 40, §5)."""

from __future__ import annotations

import os
import shutil

from types import SimpleNamespace

import pytest

from cairn.actors.checkpoints import disk_io
from cairn.daemon.service.main import checkpoint_fingerprint
from cairn.daemon.weights import weight_digest
from cairn.daemon.weights.model_dir import open_model_dir


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def _flip_byte_between_old_samples(f) -> None:
    """A byte the old sampled digest (64 blocks of 4 KiB, evenly spaced) never read."""
    total = f.stat().st_size
    off = total * 10 // 64 + 5000
    assert total // 64 > 5000 + 4096
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x01]))


def test_an_edited_tensor_byte_changes_the_fingerprint(model_copy):
    before = open_model_dir(model_copy).fingerprint
    _flip_byte_between_old_samples(model_copy / "model.safetensors")
    assert open_model_dir(model_copy).fingerprint != before


def test_digest_cache_skips_rereading_an_unchanged_model_and_lives_outside_it(model_copy, tmp_path, monkeypatch):
    cache = tmp_path / "state" / weight_digest.CACHE_NAME
    listing = sorted(p.name for p in model_copy.iterdir())
    first = open_model_dir(model_copy, digest_cache=cache).fingerprint
    assert cache.exists() and sorted(p.name for p in model_copy.iterdir()) == listing
    assert first == open_model_dir(model_copy).fingerprint          # the cache does not change the value

    reads = []
    real = weight_digest.file_digest
    monkeypatch.setattr(weight_digest, "file_digest", lambda p: reads.append(p) or real(p))
    assert open_model_dir(model_copy, digest_cache=cache).fingerprint == first
    assert reads == []                                                # a restart reads no weight bytes

    # an edit that even puts the old mtime back is seen (ctime moved): rehashed, new fingerprint
    f = model_copy / "model.safetensors"
    st = f.stat()
    _flip_byte_between_old_samples(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert open_model_dir(model_copy, digest_cache=cache).fingerprint != first
    assert reads == [f.resolve()]


def test_unreadable_or_unwritable_cache_only_costs_a_rehash(model_copy, tmp_path):
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    fp = open_model_dir(model_copy, digest_cache=cache).fingerprint
    assert fp == open_model_dir(model_copy).fingerprint
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    events = []

    class Log:
        def warning(self, event, **kw):
            events.append(event)

        def info(self, event, **kw):
            pass

    assert open_model_dir(model_copy, digest_cache=blocked / "c.json", log=Log()).fingerprint == fp
    assert events == ["weight_digest_cache_not_saved"]


def test_file_digest_is_sha256_of_every_byte(tmp_path):
    import hashlib

    f = tmp_path / "w.bin"
    data = os.urandom(weight_digest.READ_SIZE + 12345)
    f.write_bytes(data)
    assert weight_digest.file_digest(f) == hashlib.sha256(data).hexdigest()


def _checkpoint_fp(isa: str | None) -> str:
    kernel = SimpleNamespace(SNAPSHOT_VERSION=3, **({"ISA": isa} if isa else {}))
    return checkpoint_fingerprint(SimpleNamespace(fingerprint="abc", model=SimpleNamespace(page_tokens=16),
                                                  kernel=kernel))


def test_checkpoint_fingerprints_differ_exactly_by_the_builds_numeric_class(monkeypatch):
    """x86-64-v2 rounds a multiply and an add apart; v3, v4 and aarch64 fuse them (the same bits):
    a shared directory must not mix their states and pages."""
    import platform

    v2, v3, v4 = _checkpoint_fp("v2"), _checkpoint_fp("v3"), _checkpoint_fp("v4")
    assert v3 == v4 == "abc;snapshot-v3;pages-16;numeric-fma"
    assert v2 == "abc;snapshot-v3;pages-16;numeric-nofma"
    assert disk_io.model_key(v2) != disk_io.model_key(v3)         # another subdirectory: never seen, never touched
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert _checkpoint_fp("base") == v3
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert _checkpoint_fp("base") == v2
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert _checkpoint_fp("base") not in (v2, v3)
    assert _checkpoint_fp(None).endswith(";numeric-unknown")      # a kernel that does not say (the tests' fake)


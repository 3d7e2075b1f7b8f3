"""The model fingerprint covers every weight byte, and its digest cache (issue 10, item 6)."""

from __future__ import annotations

import os
import shutil

import pytest

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

"""Disk checkpoints over pages, with the real kernel on the tiny model (16-token pages): a page is
stored once and shared by every checkpoint of its prefix; a restore from files gives the same bits;
a missing or damaged page is a miss that falls back to a shorter intact checkpoint; eviction
deletes a page file only with the last checkpoint that references it."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from cairn.actors.checkpoints.actor import Checkpoints
from cairn.actors.checkpoints.disk_format import file_name, prefix_hash
from cairn.actors.engine.messages import WriteCheckpoint
from cairn.daemon.service.logs import get_logger
from cairn.daemon.service.main import checkpoint_fingerprint

from daemon_harness import real_loaded

P = 16


def prompt(n: int) -> np.ndarray:
    return np.random.default_rng(5).integers(20, 500, size=n).astype(np.int32)


def state_at(loaded, ids):
    st = loaded.kernel.State(loaded.model)
    loaded.kernel.prefill(st, ids, chunk=32)
    return st


async def disk_ck(loaded, tmp_path, **kw) -> Checkpoints:
    ck = Checkpoints(fingerprint=checkpoint_fingerprint(loaded), disk_dir=tmp_path / "ck", log=get_logger(),
                     rebuild=lambda t, p: loaded.kernel.Snapshot.from_parts(loaded.model, t, p), **kw)
    await ck.open_disk()
    assert ck.disk_enabled
    return ck


async def write(ck, loaded, ids, kind="prompt_end"):
    snap = state_at(loaded, ids).snapshot()
    ck.capture(ids, kind, snap, "r")
    await ck.write(WriteCheckpoint(prefix_hash(ids), ids, kind, snap))
    return snap


def continuation(loaded, state, rest) -> np.ndarray:
    return loaded.kernel.prefill(state, rest, chunk=7, all_logits=True)[1]


async def test_pages_are_stored_once_and_a_restore_from_files_gives_the_same_bits(tiny_model_dir, tmp_path):
    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    assert loaded.model.page_tokens == P
    ids = prompt(200)
    ck = await disk_ck(loaded, tmp_path, disk_max_bytes=1 << 30)
    await write(ck, loaded, ids[:100], "system")             # 6 full pages
    await write(ck, loaded, ids[:150])                        # 9 full pages, the first 6 the same
    pages = sorted((ck.disk_dir / "pages").glob("*.page"))
    assert len(pages) == 9                                    # not 6 + 9
    e = ck.store.get(prefix_hash(ids[:150]))
    own, shared = ck.store.disk_breakdown(e)
    assert shared == 6 * pages[0].stat().st_size and own == e.disk_nbytes + 3 * pages[0].stat().st_size
    # a restarted index, a restore from the files alone
    ck.close_disk()
    again = await disk_ck(loaded, tmp_path, disk_max_bytes=1 << 30)
    snap, tier = await again.snapshot_for(prefix_hash(ids[:150]), "r2")
    assert tier == "disk" and snap.n_tokens == 150
    restored = loaded.kernel.State.restore(loaded.model, snap)
    want = continuation(loaded, state_at(loaded, ids[:150]), ids[150:])
    assert np.array_equal(continuation(loaded, restored, ids[150:]), want)


async def test_a_damaged_or_missing_page_is_a_miss_and_the_shorter_checkpoint_still_serves(tiny_model_dir, tmp_path):
    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    ids = prompt(200)
    ck = await disk_ck(loaded, tmp_path, disk_max_bytes=1 << 30)
    await write(ck, loaded, ids[:40], "system")               # pages 0, 1
    await write(ck, loaded, ids[:120])                        # pages 0 .. 6
    await write(ck, loaded, ids[:180])                        # pages 0 .. 10
    pdir = ck.disk_dir / "pages"
    from cairn.actors.checkpoints.disk_format import page_key
    damaged = pdir / f"{page_key(ids, 4, P)}.page"            # only the two longer ones need page 4
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    damaged.write_bytes(bytes(raw))
    (pdir / f"{page_key(ids, 9, P)}.page").unlink()           # and page 9 is gone
    ck.close_disk()
    again = await disk_ck(loaded, tmp_path, disk_max_bytes=1 << 30)
    with capture_logs() as evs:
        got, _ = await again.snapshot_for(prefix_hash(ids[:180]), "r")
        assert got is None                                     # damaged page 4 (read first): a miss, never a wrong state
        got, _ = await again.snapshot_for(prefix_hash(ids[:120]), "r")
        assert got is None                                     # page 4's file went with it: missing, the same
        snap, tier = await again.snapshot_for(prefix_hash(ids[:40]), "r")
    bad = [e for e in evs if e["event"] == "checkpoint_bad"]
    assert [("missing" in e["reason"], "checksum" in e["reason"]) for e in bad] == [(False, True), (True, False)]
    assert not damaged.exists() and not (again.disk_dir / file_name(ids[:120])).exists()
    # the intact, shorter checkpoint restores and continues with the same bits
    assert tier == "disk" and snap.n_tokens == 40
    want = continuation(loaded, state_at(loaded, ids[:40]), ids[40:])
    assert np.array_equal(continuation(loaded, loaded.kernel.State.restore(loaded.model, snap), ids[40:]), want)
    # and only its pages are left
    assert sorted(p.name for p in pdir.glob("*.page")) == sorted(f"{page_key(ids, k, P)}.page" for k in (0, 1))


async def test_disk_eviction_deletes_a_page_file_with_its_last_checkpoint(tiny_model_dir, tmp_path):
    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    a, b = prompt(200), prompt(200)[::-1].copy()
    probe = await disk_ck(loaded, tmp_path / "probe", disk_max_bytes=1 << 30)
    await write(probe, loaded, a[:160])
    one = probe.store.disk_usage()                             # one 160-token checkpoint with its pages
    probe.close_disk()
    ck = await disk_ck(loaded, tmp_path, disk_max_bytes=int(one * 2.2))
    await write(ck, loaded, a[:160])
    await write(ck, loaded, a[:176])                          # shares 10 pages with the first: both fit
    a_pages = {n for e in ck.store.entries() for n, _ in e.disk_pages}
    assert {e.n_tokens for e in ck.store.entries() if e.on_disk} == {160, 176}
    await write(ck, loaded, b[:160])                          # another conversation: the oldest go
    left = {e.n_tokens: e for e in ck.store.entries() if e.on_disk}
    assert 160 in left and prefix_hash(b[:160]) == left[160].id and ck.store.disk_usage() <= int(one * 2.2)
    names = {p.name for p in (ck.disk_dir / "pages").glob("*.page")}
    assert names == {n for e in left.values() for n, _ in e.disk_pages}   # no orphans, none missing
    assert a_pages <= names        # the evicted checkpoint's pages live on: 176 still references them


@pytest.mark.parametrize("old_version", [2, 3])   # 2: before pages; 3: indexer keys row-major in them
async def test_checkpoints_of_the_format_before_pages_are_reported_never_read(tiny_model_dir, tmp_path, old_version):
    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    fp = checkpoint_fingerprint(loaded)
    assert loaded.kernel.SNAPSHOT_VERSION == 4 and f";snapshot-v4;pages-{P};numeric-" in fp
    from cairn.actors.checkpoints import disk_io
    old_fp = fp.split(";snapshot-")[0] + f";snapshot-v{old_version}"
    old = disk_io.ensure_dir(disk_io.model_subdir(disk_io.ensure_dir(tmp_path / "ck"), old_fp))
    (old / disk_io.FINGERPRINT_NAME).write_text(old_fp)
    (old / "0123456789abcdef.ckpt").write_bytes(b"x" * 1000)
    with capture_logs() as evs:
        ck = await disk_ck(loaded, tmp_path)
    (ev,) = [e for e in evs if e["event"] == "checkpoint_files_old_format"]
    assert ev["dir"] == str(old) and ev["files"] == 1 and ev["bytes"] == 1000 and ev["log_level"] == "warning"
    assert len(ck.store) == 0 and (old / "0123456789abcdef.ckpt").exists()   # never read, never deleted


def test_shared_eviction_counts_pages_once_and_frees_them_with_their_last_checkpoint():
    from cairn.actors.checkpoints.shared_evict import FileStat, choose_victims

    pages = (("p0.page", 100), ("p1.page", 100))
    files = [FileStat("old.ckpt", 50, 1.0, pages), FileStat("new.ckpt", 50, 2.0, pages + (("p2.page", 100),))]
    # 50 + 50 + 300 of pages: deleting old.ckpt frees only its 50 bytes, its pages stay for new.ckpt
    assert [f.name for f in choose_victims(files, 350)] == ["old.ckpt"]
    assert [f.name for f in choose_victims(files, 340)] == ["old.ckpt", "new.ckpt"]


async def test_two_daemons_on_a_shared_directory_share_page_files(tiny_model_dir, tmp_path):
    from cairn.actors.checkpoints import shared_dir

    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    ids = prompt(200)

    async def shared(**kw):
        ck = Checkpoints(fingerprint=checkpoint_fingerprint(loaded), disk_dir=tmp_path / "shared", shared=True,
                         log=get_logger(), rebuild=lambda t, p: loaded.kernel.Snapshot.from_parts(loaded.model, t, p),
                         **{"disk_max_bytes": 1 << 30, **kw})
        await ck.open_disk()
        return ck

    a, b = await shared(), await shared()
    await write(a, loaded, ids[:100])                         # 6 pages
    await write(b, loaded, ids[:150])                         # 9 pages: its first 6 are a's files
    pdir = a.disk_dir / "pages"
    assert len(list(pdir.glob("*.page"))) == 9
    await b.refresh(force=True)
    snap, tier = await b.snapshot_for(prefix_hash(ids[:100]), "r")   # a's checkpoint, read by b
    assert tier == "disk" and snap.n_tokens == 100
    want = continuation(loaded, state_at(loaded, ids[:100]), ids[100:])
    assert np.array_equal(continuation(loaded, loaded.kernel.State.restore(loaded.model, snap), ids[100:]), want)
    # an eviction pass down to one checkpoint: the older goes; the pages the newer needs stay
    import os
    os.utime(a.disk_dir / file_name(ids[:100]), (1, 1))
    one = (a.disk_dir / file_name(ids[:150])).stat().st_size + 9 * next(pdir.glob("*.page")).stat().st_size
    res = shared_dir.evict_pass(a.disk_dir, one, page_grace_s=0)
    assert res.removed == [file_name(ids[:100])] and res.pages_removed == 0 and len(list(pdir.glob("*.page"))) == 9
    res = shared_dir.evict_pass(a.disk_dir, 0, page_grace_s=0)   # nothing fits: all go, pages too
    assert res.pages_removed == 9 and not list(pdir.glob("*.page"))


@pytest.mark.parametrize("shared", [False, True])
async def test_a_planted_file_listing_another_prompts_pages_is_never_restored_and_the_answer_is_unchanged(
        tiny_model_dir, tmp_path, shared):
    """A's header, name and tail (its state's own tokens are A's, so the check after a restore
    passes) with B's page list and CRCs (valid page files, of B's prefixes): only the page keys,
    recomputed from A's token ids, tell. The request prefills and answers as a cold run does."""
    from cairn.actors.checkpoints import disk_io
    from cairn.actors.checkpoints.disk_format import encode_header
    from daemon_harness import daemon, reference_greedy, reply_text, request

    loaded = real_loaded(tiny_model_dir, checkpoint_page_tokens=P)
    fp = checkpoint_fingerprint(loaded)
    root, sock = tmp_path / "ck", tmp_path / "c.sock"
    tier = {"shared_checkpoint_dir": str(root)} if shared else {"checkpoint_dir": str(root), "disk_checkpoints": True}
    rng = np.random.default_rng(9)
    a, b = ([int(t) for t in rng.integers(20, 500, size=300)] for _ in range(2))
    d = disk_io.model_subdir(root, fp)
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock, checkpoint_min_tokens=16, **tier):
            for ids in (a, b):
                r = await request(sock, "POST", "/v1/completions",
                                  {"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0})
                assert r.status == 200
                while not (d / file_name(np.asarray(ids, dtype=np.int32))).exists():
                    await trio.sleep(0.01)
    a_t, b_t = np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32)
    a_header, a_tail, _ = disk_io.load(d / file_name(a_t), fp)
    b_header = disk_io.load(d / file_name(b_t), fp)[0]
    assert len(b_header.pages) == len(a_header.pages) == 300 // P
    disk_io.atomic_write(d, file_name(a_t), [encode_header(fp, a_header.kind, a_t, a_tail, b_header.page_nbytes,
                                                           b_header.pages), a_tail])
    assert disk_io.load(d / file_name(a_t), fp)[0].pages == b_header.pages    # every file check passes
    longer = a + [11, 12, 13]
    want = reply_text(loaded, reference_greedy(loaded, longer, 8))
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoint_min_tokens=16, **tier):
            r = await request(sock, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": longer, "max_tokens": 8, "temperature": 0})
    [bad] = [e for e in evs if e["event"] == "checkpoint_bad"]
    assert bad["log_level"] == "warning" and bad["reason"].startswith("page keys do not match its token ids")
    assert not any(e["event"] == "checkpoint_hit" for e in evs)
    assert any(e["event"] == "checkpoint_miss" and e["reason"] == "page_keys_mismatch" for e in evs)
    assert r.status == 200 and r.json()["choices"][0]["text"] == want
    assert {p.name for p in (d / "pages").iterdir()} >= {n for n, _ in disk_io.page_files(b_header)}   # B's intact

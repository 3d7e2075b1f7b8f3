"""The shared disk tier (actors/checkpoints/shared_dir.py, shared_evict.py, Checkpoints(shared=True)): several
daemons of one model writing, discovering, reading and evicting in one directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from cairn.actors.checkpoints import actor as checkpoints_mod
from cairn.actors.checkpoints import disk_io, shared_dir
from cairn.actors.checkpoints.actor import Checkpoints
from cairn.actors.checkpoints.disk_format import file_name, prefix_hash
from cairn.actors.engine.messages import WriteCheckpoint
from cairn.actors.checkpoints.shared_evict import FileStat, abandoned_temps, choose_victims
from cairn.daemon.service.logs import get_logger
from cairn.daemon.service.metrics import Metrics
from daemon_harness import daemon, fake_loaded, reference_greedy, reply_text, request

HERE = Path(__file__).parent


def toks(seed: int, n: int = 600) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=n).astype(np.int32)


def sub(tmp_path) -> Path:
    return disk_io.model_subdir(tmp_path / "shared", "fp")


async def shared_ck(tmp_path, **kw) -> Checkpoints:
    ck = Checkpoints(fingerprint="fp", disk_dir=tmp_path / "shared", shared=True, log=get_logger(),
                     metrics=Metrics(("ram", "disk")), **{"disk_max_bytes": 1 << 20, **kw})
    await ck.open_disk()
    assert ck.disk_enabled and ck.shared
    return ck


async def write(ck: Checkpoints, seed: int, blob: bytes, n: int = 600) -> str:
    """What the writer actor does for one capture (capture + WriteCheckpoint handled inline)."""
    t = toks(seed, n)
    ck.capture(t, "prompt_end", blob, f"r{seed}")
    await ck.write(WriteCheckpoint(prefix_hash(t), t, "prompt_end", blob))
    return prefix_hash(t)


# ---- policy -----------------------------------------------------------------------------------

def test_eviction_deletes_least_recently_used_across_all_daemons_until_it_fits():
    files = [FileStat("b.ckpt", 400, 20.0), FileStat("a.ckpt", 400, 10.0), FileStat("c.ckpt", 400, 30.0),
             FileStat("d.ckpt", 400, 10.0)]
    assert [f.name for f in choose_victims(files, 800)] == ["a.ckpt", "d.ckpt"]   # oldest, ties by name
    assert choose_victims(files, 1600) == []
    temps = [FileStat(".x.tmp", 5, 0.0), FileStat(".y.tmp", 5, 990.0)]
    assert [t.name for t in abandoned_temps(temps, now=1000.0, grace_s=600)] == [".x.tmp"]


# ---- file effects -----------------------------------------------------------------------------

def test_a_file_opened_before_another_daemon_evicts_it_is_read_whole_and_verifies(tmp_path):
    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    blob = os.urandom(50_000)
    disk_io.write_checkpoint(d, "fp", "system", toks(1), blob)
    path = d / file_name(toks(1))
    with open(path, "rb") as f:                      # the reader has opened it ...
        res = shared_dir.evict_pass(d, max_bytes=0)  # ... when the other daemon's pass deletes it
        assert res.removed == [path.name] and not path.exists()
        from cairn.actors.checkpoints.disk_format import read_header, read_payload
        header = read_header(f, "fp")
        assert read_payload(f, header) == blob       # the open file is intact: CRC verified
    assert not list(d.glob("*.ckpt"))


def test_changes_finds_new_files_reports_vanished_ones_and_removes_damaged_ones(tmp_path):
    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    disk_io.write_checkpoint(d, "fp", "system", toks(1), b"a" * 1000)
    disk_io.write_checkpoint(d, "fp", "common", toks(2), b"b" * 1000)
    bad = d / file_name(toks(3))
    bad.write_bytes(b"CAIRNCKP" + b"\xff" * 40)                 # damaged header
    ch = shared_dir.changes(d, "fp", known={file_name(toks(9))})
    assert [f.path.name for f in ch.found] == sorted([file_name(toks(1)), file_name(toks(2))],
                                                     key=lambda n: (os.stat(d / n).st_mtime, n))
    assert ch.gone == [file_name(toks(9))]
    assert [(p.path.name, p.removed) for p in ch.problems] == [(bad.name, True)] and not bad.exists()
    assert shared_dir.changes(d, "fp", known={f.path.name for f in ch.found}).found == []


def test_eviction_pass_removes_temp_files_of_crashed_writers_only_after_the_grace(tmp_path):
    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    old, fresh = d / ".x.ckpt.1-aa.tmp", d / ".y.ckpt.2-bb.tmp"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(old, (1000.0, 1000.0))
    res = shared_dir.evict_pass(d, 1 << 20, now=1000.0 + shared_dir.TMP_GRACE_S + 1)
    assert res.temps_removed == 1 and not old.exists() and fresh.exists()


def test_an_eviction_pass_waits_for_the_lease_and_is_skipped_when_a_peer_keeps_it(tmp_path):
    import fcntl

    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    disk_io.write_checkpoint(d, "fp", "system", toks(1), b"a" * 1000)
    fd = os.open(d / shared_dir.LEASE_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                 # a peer's pass in progress (another open file)
        res = shared_dir.evict_pass(d, 0, lease_wait_s=0.0)
        assert res.skipped and res.removed == [] and (d / file_name(toks(1))).exists()
    finally:
        os.close(fd)
    res = shared_dir.evict_pass(d, 0, lease_wait_s=0.0)  # the lease is free again
    assert not res.skipped and res.removed == [file_name(toks(1))]


# ---- two daemons (Checkpoints) in one directory -------------------------------------------------

async def test_a_checkpoint_written_by_one_daemon_is_found_and_restored_by_the_other(tmp_path):
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path)
    blob = os.urandom(20_000)
    eid = await write(a, 1, blob)
    assert b.store.get(eid) is None
    await b.refresh()                                 # what the prefill worker does before it plans
    e = b.store.get(eid)
    assert e is not None and e.on_disk and not e.in_memory
    got, tier = await b.snapshot_for(eid, "req")
    assert got == blob and tier == "disk"
    # the same prefix captured by b too: b indexes a's file instead of writing it again
    mtime = os.stat(sub(tmp_path) / file_name(toks(1))).st_mtime_ns
    await write(b, 1, blob)
    assert os.stat(sub(tmp_path) / file_name(toks(1))).st_mtime_ns == mtime


async def test_refresh_lists_when_the_directory_changed_or_the_last_listing_is_old(tmp_path, mock_clock,
                                                                                   monkeypatch):
    # A mock clock moved by hand, not an autojump one: autojump would leap past the mount calls'
    # deadlines while their threads run (a loaded machine), and see a hung mount that is not.
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path)
    listings = []
    real = shared_dir.changes
    monkeypatch.setattr(shared_dir, "changes", lambda *args: listings.append(1) or real(*args))
    await b.refresh()
    assert listings == []                             # nothing changed since b opened the directory
    eid = await write(a, 1, b"x" * 1000)
    await b.refresh()
    assert len(listings) == 1 and b.store.get(eid) is not None
    monkeypatch.setattr(shared_dir, "dir_mtime", lambda d: b._dir_mtime)   # a cached, stale mtime (NFS)
    await b.refresh()
    assert len(listings) == 1
    mock_clock.jump(10)                               # RELIST_EVERY_S later: listed whatever the mtime says
    await b.refresh()
    assert len(listings) == 2


async def test_a_foreign_file_in_the_shared_directory_is_warned_about_once_and_left_alone(tmp_path):
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path)
    foreign = sub(tmp_path) / file_name(toks(7))
    disk_io.write_checkpoint(sub(tmp_path), "another-model", "system", toks(7), b"f" * 100)
    with capture_logs() as evs:
        await b.refresh()
        await write(a, 1, b"x" * 1000)                # the directory changes again: b lists it again
        await b.refresh()
    assert [e["reason"] for e in evs if e["event"] == "checkpoint_file_bad"] == ["foreign fingerprint; left in place"]
    assert foreign.exists() and b.store.get(prefix_hash(toks(7))) is None


async def test_a_file_another_daemon_evicted_is_a_quiet_miss_not_a_bad_checkpoint(tmp_path):
    a, b = await shared_ck(tmp_path, disk_max_bytes=30_000), await shared_ck(tmp_path, disk_max_bytes=30_000)
    first = await write(a, 1, os.urandom(20_000))
    await b.refresh()
    assert b.store.get(first).on_disk
    await write(a, 2, os.urandom(20_000))             # a's eviction pass deletes the older file (b's index stale)
    assert not (sub(tmp_path) / file_name(toks(1))).exists()
    with capture_logs() as evs:
        got, _ = await b.snapshot_for(first, "req")
    assert got is None and b.store.get(first) is None
    assert [e["event"] for e in evs if e["log_level"] == "warning"] == []
    assert any(e["event"] == "checkpoint_miss" and e["reason"] == "evicted_elsewhere" for e in evs)


async def test_a_damaged_shared_file_fails_its_checksum_and_is_never_served(tmp_path):
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path)
    eid = await write(a, 1, os.urandom(20_000))
    await b.refresh()
    path = sub(tmp_path) / file_name(toks(1))
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF                                 # a flipped payload byte: the header still parses
    path.write_bytes(bytes(raw))
    with capture_logs() as evs:
        got, _ = await b.snapshot_for(eid, "req")
    assert got is None and not path.exists()
    assert [e["reason"] for e in evs if e["event"] == "checkpoint_bad"] == ["checksum mismatch"]


async def test_one_budget_for_the_directory_whoever_wrote_the_files(tmp_path):
    a, b = await shared_ck(tmp_path, disk_max_bytes=70_000), await shared_ck(tmp_path, disk_max_bytes=70_000)
    for i in range(6):
        await write(a if i % 2 == 0 else b, i, os.urandom(20_000))
    files = sorted(sub(tmp_path).glob("*.ckpt"))
    assert sum(p.stat().st_size for p in files) <= 70_000
    assert {p.name for p in files} == {file_name(toks(i)) for i in (3, 4, 5)}   # the three most recent
    await a.refresh()
    await b.refresh()
    for ck in (a, b):
        assert {file_name(e.tokens) for e in ck.store.entries() if e.on_disk} == {p.name for p in files}
    assert a.checkpoint_stats()["disk"]["max_bytes"] == 70_000 and a.checkpoint_stats()["disk"]["shared"]


# ---- pages: only the leased pass deletes them ---------------------------------------------------

class PagedBlob:
    """A snapshot with full page groups and no kernel: what the store and disk_io.write_checkpoint
    read of one. A page's bytes depend only on the prefix it closes (as the kernel's do)."""

    page_tokens, page_nbytes = 16, 256

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int32)
        self.n_full_pages = len(self.ids) // self.page_tokens
        self.keys = [prefix_hash(self.ids[: (k + 1) * self.page_tokens]) for k in range(self.n_full_pages)]
        self.page_ids = [int(key, 16) for key in self.keys]
        self.own_nbytes = 64

    def tail(self) -> bytes:
        return b"tail" + self.ids.tobytes()

    def page(self, k: int) -> np.ndarray:
        return np.frombuffer(np.random.default_rng(self.page_ids[k]).bytes(self.page_nbytes), dtype=np.uint8)


async def write_paged(ck: Checkpoints, ids: np.ndarray) -> str:
    snap = PagedBlob(ids)
    ck.capture(ids, "prompt_end", snap, "r")
    await ck.write(WriteCheckpoint(prefix_hash(ids), ids, "prompt_end", snap))
    return prefix_hash(ids)


def page_names(ids: np.ndarray) -> set[str]:
    return {f"{key}.page" for key in PagedBlob(ids).keys}


def age_pages(d: Path) -> None:
    for p in (d / "pages").glob("*.page"):
        os.utime(p, (1, 1))                          # written long ago: past any sweep's grace


@pytest.mark.parametrize("how", ["delete", "drop_bad", "deleted_while_written"])
async def test_in_a_shared_directory_a_daemon_never_deletes_pages_a_peers_newer_checkpoint_needs(tmp_path, how,
                                                                                                monkeypatch):
    """a's index does not know b's checkpoint yet; a's DELETE, drop_bad or a write deleted while it
    is written (the no-write branch) must not delete the pages b's checkpoint shares with a's."""
    a, b = await shared_ck(tmp_path, disk_max_bytes=1 << 30), await shared_ck(tmp_path, disk_max_bytes=1 << 30)
    t = toks(7, 48)
    d = sub(tmp_path)
    if how == "deleted_while_written":
        await write_paged(b, t)                                       # b: pages 0, 1 and 2
        a.out, queued = trio.open_memory_channel(4)
        a.capture(t[:32], "prompt_end", PagedBlob(t[:32]), "r")    # queued for a's writer
        written, go_on = threading.Event(), threading.Event()
        real = disk_io.write_checkpoint
        monkeypatch.setattr(disk_io, "write_checkpoint",
                            lambda *args: (real(*args), written.set(), go_on.wait())[0])
        async with trio.open_nursery() as n:
            n.start_soon(a.write, queued.receive_nowait())            # reuses pages 0, 1 ...
            await trio.to_thread.run_sync(written.wait)
            assert await a.delete(prefix_hash(t[:32]))                # ... deleted while it is written
            go_on.set()                                               # the no-write branch deletes the file
    else:
        x = await write_paged(a, t[:32])                              # pages 0, 1
        await write_paged(b, t)                                       # reuses them, adds page 2
        if how == "delete":
            assert await a.delete(x)
        else:
            await a.drop_bad(a.store.get(x), "kernel refused the snapshot: test")
    assert not (d / file_name(t[:32])).exists()                       # a's checkpoint file is gone ...
    header, _, pages = disk_io.load(d / file_name(t), "fp")           # ... b's loads whole
    assert len(pages) == 3 and {p.name for p in (d / "pages").iterdir()} == page_names(t)
    age_pages(d)
    res = shared_dir.evict_pass(d, 0)                                 # the leased pass deletes what nothing needs
    assert res.removed == [file_name(t)] and res.pages_removed == 3


def test_a_reused_page_is_not_swept_between_its_reuse_and_the_publish(tmp_path, monkeypatch):
    """A page left by an evicted checkpoint, long unused, is reused by a new one: a peer's pass
    running between the reuse and the publish sees it young (its mtime refreshed) and keeps it;
    a pass that deletes it anyway (no grace) is repaired once the checkpoint is published."""
    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    t = toks(8, 48)
    disk_io.write_checkpoint(d, "fp", "prompt_end", t[:32], PagedBlob(t[:32]))
    os.unlink(d / file_name(t[:32]))                  # its checkpoint evicted: pages 0, 1 unreferenced ...
    age_pages(d)                                      # ... and old
    real, passes = disk_io.atomic_write, []

    def publish_after_a_peers_pass(directory, name, data):
        if name.endswith(".ckpt"):
            passes.append(shared_dir.evict_pass(d, 1 << 30, page_grace_s=grace))
        return real(directory, name, data)

    monkeypatch.setattr(disk_io, "atomic_write", publish_after_a_peers_pass)
    grace = shared_dir.PAGE_GRACE_S
    disk_io.write_checkpoint(d, "fp", "prompt_end", t, PagedBlob(t))   # reuses pages 0, 1; writes page 2
    assert [p.pages_removed for p in passes] == [0]
    assert len(disk_io.load(d / file_name(t), "fp")[2]) == 3
    os.unlink(d / file_name(t))
    age_pages(d)
    grace = 0                                         # a pass that deletes even a page written this instant
    disk_io.write_checkpoint(d, "fp", "prompt_end", t, PagedBlob(t))
    assert [p.pages_removed for p in passes] == [0, 3]
    assert len(disk_io.load(d / file_name(t), "fp")[2]) == 3   # the reused pages were written again


async def test_a_header_that_cannot_be_read_during_a_pass_skips_that_passs_page_sweep(tmp_path, monkeypatch):
    a = await shared_ck(tmp_path, disk_max_bytes=1 << 30)
    t = toks(9, 48)
    await write_paged(a, t)
    d = sub(tmp_path)
    age_pages(d)
    real = shared_dir.read_header

    def read_error(f, *args):
        if Path(f.name).name == file_name(t):
            raise OSError(5, "Input/output error")    # a network file system's transient EIO
        return real(f, *args)

    monkeypatch.setattr(shared_dir, "read_header", read_error)
    with capture_logs() as evs:
        await a._evict_shared()
    [skip] = [e for e in evs if e["event"] == "checkpoint_page_sweep_skipped"]
    assert skip["log_level"] == "warning" and skip["unreadable"] == [file_name(t)]
    assert {p.name for p in (d / "pages").iterdir()} == page_names(t)   # its pages were not taken for orphans
    monkeypatch.setattr(shared_dir, "read_header", real)
    assert shared_dir.evict_pass(d, 1 << 30).pages_removed == 0 and len(disk_io.load(d / file_name(t), "fp")[2]) == 3


# ---- two processes, a while --------------------------------------------------------------------

def test_two_processes_writing_and_evicting_lose_no_file_being_read_and_serve_nothing_damaged(tmp_path):
    d = shared_dir.open_shared(tmp_path / "shared", "fp")
    worker = HERE / "shared_tier_worker.py"
    budget = 400_000
    procs = [subprocess.Popen([sys.executable, str(worker), str(d), str(seed), "250", str(budget)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    for r in results:
        assert r["damaged"] == 0 and r["wrong_content"] == 0          # never a damaged checkpoint served
        assert r["read_through_eviction"] > 0                        # reads an eviction pass deleted under them
        assert r["reads_ok"] >= 10 and r["lost_mid_read"] == 0
    assert sum(r["misses"] for r in results) > 0                      # evictions did happen meanwhile
    shared_dir.evict_pass(d, budget)
    assert sum(p.stat().st_size for p in d.glob("*.ckpt")) <= budget
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


# ---- a hung mount, a planted file (the daemon, fake kernel) -------------------------------------

def blocking(calls: list, release: threading.Event):
    """A stand-in for a file call on a hung NFS mount: it never returns until the test lets it."""
    def call(*args, **kw):
        calls.append(args)
        release.wait()
        raise OSError(5, "Input/output error")
    return call


async def test_a_listing_past_its_deadline_is_given_up_logged_once_and_resumed_when_it_returns(tmp_path,
                                                                                             monkeypatch):
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path, shared_list_timeout_s=0.2)
    eid = await write(a, 1, b"x" * 1000)                 # the directory changed: b lists it next
    calls, release = [], threading.Event()
    monkeypatch.setattr(shared_dir, "changes", blocking(calls, release))
    try:
        with capture_logs() as evs, trio.fail_after(5):
            t0 = trio.current_time()
            await b.refresh()
            assert 0.2 <= trio.current_time() - t0 < 2         # given up at the deadline, not waited for
            await b.refresh()                                  # still hung: no second call to the mount
            assert len(calls) == 1 and b.store.get(eid) is None
            assert b.plan(toks(1), None, hint_tokens=None, need_all_logits=False).action == "fresh"
        assert [e["event"] for e in evs if e["event"].startswith("checkpoint_shared")] == [
            "checkpoint_shared_unresponsive"]
    finally:
        release.set()
    monkeypatch.undo()
    while not b._hung.is_set():
        await trio.sleep(0.01)
    with capture_logs() as evs:
        await b.refresh(force=True)
    assert [e["event"] for e in evs if e["event"].startswith("checkpoint_shared")] == ["checkpoint_shared_responsive"]
    assert b.store.get(eid) is not None                  # listed again once the mount answered


SHARED_ON = dict(checkpoint_min_tokens=16)


def prompt(seed: int, n: int = 300) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(10, 200, size=n)]


async def serve_once(loaded, sock, shared, ids, n=4):
    """One completion through a daemon on the shared directory; waits until its capture is on disk."""
    async with daemon(loaded, sock, shared_checkpoint_dir=str(shared), **SHARED_ON):
        r = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": n,
                                                            "temperature": 0})
        d = disk_io.model_subdir(shared, _fingerprint(shared))
        with trio.fail_after(10):
            while not (d / file_name(np.asarray(ids, dtype=np.int32))).exists():
                await trio.sleep(0.01)
    return r


def _fingerprint(shared: Path) -> str:
    [sub_dir] = [p for p in shared.iterdir() if p.is_dir()]
    return (sub_dir / disk_io.FINGERPRINT_NAME).read_text()


async def test_planning_never_waits_on_a_hung_shared_listing_and_requests_complete(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    loaded = fake_loaded(tiny_model_dir)
    sock, shared = tmp_path / "c.sock", tmp_path / "shared"
    calls, release = [], threading.Event()
    ids = prompt(1)
    try:
        with trio.fail_after(20), capture_logs():
            async with daemon(loaded, sock, shared_checkpoint_dir=str(shared), **SHARED_ON):
                monkeypatch.setattr(shared_dir, "dir_mtime", blocking(calls, release))   # the mount hangs now
                first = await request(sock, "POST", "/v1/completions",
                                      {"model": "tiny", "prompt": ids, "max_tokens": 4, "temperature": 0})
                while not calls:                       # the background refresh is stuck in the mount ...
                    await trio.sleep(0.01)
                second = await request(sock, "POST", "/v1/completions",   # ... and planning does not wait for it
                                       {"model": "tiny", "prompt": ids + [5, 6], "max_tokens": 4, "temperature": 0})
                assert not release.is_set() and len(calls) == 1
    finally:
        release.set()
    assert first.status == 200 and second.status == 200
    assert [c["text"] for c in first.json()["choices"]] == [
        reply_text(loaded, reference_greedy(loaded, ids, 4))]


async def test_a_shared_load_past_its_deadline_is_a_miss_and_the_request_prefills_cold(tiny_model_dir, tmp_path,
                                                                                      monkeypatch):
    loaded = fake_loaded(tiny_model_dir)
    sock, shared = tmp_path / "c.sock", tmp_path / "shared"
    ids = prompt(2)
    with trio.fail_after(30), capture_logs():
        await serve_once(loaded, sock, shared, ids)               # a peer's checkpoint of the prefix, on disk
    monkeypatch.setattr(checkpoints_mod, "SHARED_LOAD_TIMEOUT_S", 0.3)
    calls, release = [], threading.Event()
    longer = ids + [7, 8, 9]
    try:
        with trio.fail_after(20), capture_logs() as evs:
            async with daemon(loaded, sock, shared_checkpoint_dir=str(shared), **SHARED_ON):
                monkeypatch.setattr(disk_io, "load", blocking(calls, release))
                r = await request(sock, "POST", "/v1/completions",
                                  {"model": "tiny", "prompt": longer, "max_tokens": 4, "temperature": 0})
    finally:
        release.set()
    assert r.status == 200 and len(calls) == 1
    assert r.json()["choices"][0]["text"] == reply_text(loaded, reference_greedy(loaded, longer, 4))
    [timeout] = [e for e in evs if e["event"] == "checkpoint_load_timeout"]
    assert timeout["log_level"] == "warning" and timeout["tokens"] == len(ids)
    [plan] = [e for e in evs if e["event"] == "prefill_plan"]
    assert plan["action"] == "fresh" and plan["reused_tokens"] == 0
    assert any(e["event"] == "checkpoint_miss" and e["reason"] == "shared_timeout" for e in evs)


async def test_a_planted_file_whose_state_holds_other_tokens_never_changes_the_answer(tiny_model_dir, tmp_path):
    """A valid checkpoint of prompt B planted under the name of prompt A: once renamed (the header
    names B: refused when listed), once with a header rewritten to claim A (header, name and CRC
    consistent; only the restored state's own tokens tell): discarded, and A is prefilled cold."""
    loaded = fake_loaded(tiny_model_dir)
    sock, shared = tmp_path / "c.sock", tmp_path / "shared"
    a_ids, b_ids = prompt(3), prompt(4)
    with trio.fail_after(30), capture_logs():
        await serve_once(loaded, sock, shared, b_ids)
    fp = _fingerprint(shared)
    d = disk_io.model_subdir(shared, fp)
    a_t, b_t = np.asarray(a_ids, dtype=np.int32), np.asarray(b_ids, dtype=np.int32)
    b_header, b_blob, _ = disk_io.load(d / file_name(b_t), fp)
    longer = a_ids + [11, 12]
    want = reply_text(loaded, reference_greedy(loaded, longer, 4))
    body = {"model": "tiny", "prompt": longer, "max_tokens": 4, "temperature": 0}

    shutil.copy(d / file_name(b_t), d / file_name(a_t))                        # renamed
    with trio.fail_after(20), capture_logs() as evs:
        async with daemon(loaded, sock, shared_checkpoint_dir=str(shared), **SHARED_ON):
            renamed = await request(sock, "POST", "/v1/completions", body)
    assert any(e["event"] == "checkpoint_file_bad" and e["reason"] == "file name does not match its token ids"
               for e in evs)
    assert renamed.json()["choices"][0]["text"] == want

    disk_io.write_checkpoint(d, fp, b_header.kind, a_t, b_blob)              # forged header, B's state
    assert disk_io.load(d / file_name(a_t), fp)[0].name == file_name(a_t)  # it passes every file check
    other = a_ids + [13, 14]                     # not the prompt above: its own capture is not a prefix
    want = reply_text(loaded, reference_greedy(loaded, other, 4))
    with trio.fail_after(20), capture_logs() as evs:
        async with daemon(loaded, sock, shared_checkpoint_dir=str(shared), **SHARED_ON):
            forged = await request(sock, "POST", "/v1/completions", {**body, "prompt": other})
    [bad] = [e for e in evs if e["event"] == "checkpoint_bad"]
    assert bad["log_level"] == "warning" and "restored state's tokens differ" in bad["reason"]
    plans = [e for e in evs if e["event"] == "prefill_plan"]
    assert [p["action"] for p in plans] == ["fresh"] and plans[0]["reused_tokens"] == 0
    assert forged.status == 200 and forged.json()["choices"][0]["text"] == want
    assert not (d / file_name(a_t)).exists() or disk_io.load(d / file_name(a_t), fp)[1] != b_blob


async def test_before_a_plan_a_healthy_mount_gives_a_fresh_listing_and_a_hung_one_only_a_bounded_wait(tmp_path,
                                                                                                    monkeypatch):
    a, b = await shared_ck(tmp_path), await shared_ck(tmp_path)
    async with trio.open_nursery() as n:
        n.start_soon(b.refresh_loop)
        await trio.sleep(0.05)
        eid = await write(a, 1, b"x" * 1000)           # published a moment before b plans
        await b.refresh_before_plan()
        assert b.store.get(eid) is not None            # found by the listing it asked for
        calls, release = [], threading.Event()
        monkeypatch.setattr(shared_dir, "dir_mtime", blocking(calls, release))
        try:
            with trio.fail_after(5):
                for _ in range(3):
                    t0 = trio.current_time()
                    await b.refresh_before_plan(wait_s=0.2)
                    assert trio.current_time() - t0 < 1.0   # bounded, though the listing never returns
            assert len(calls) == 1                     # one listing stuck in the mount, not one per plan
        finally:
            release.set()
            n.cancel_scope.cancel()

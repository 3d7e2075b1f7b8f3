"""Checkpoints (actors/checkpoints/actor.py) and the checkpoint writer on their own (opaque blobs, a temp directory):
the dropped write when the writer's queue is full, a delete racing a queued write, the disk budget
deleting files, the stats dict for /v1/status."""

from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import trio
from structlog.testing import capture_logs

from cairn.actors.checkpoints import disk_format, disk_io
from cairn.actors.checkpoints.checkpoint_writer import checkpoint_writer
from cairn.actors.checkpoints.actor import Checkpoints
from cairn.actors.checkpoints.disk_format import file_name, prefix_hash
from cairn.daemon.service.logs import get_logger
from cairn.daemon.service.metrics import Metrics


def toks(seed: int, n: int = 600) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=n).astype(np.int32)


def model_dir(tmp_path):
    return disk_io.model_subdir(tmp_path / "ck", "fp")


def ck_files(tmp_path) -> list:
    return sorted(model_dir(tmp_path).glob("*.ckpt"))


async def disk_ck(tmp_path, **kw) -> Checkpoints:
    ck = Checkpoints(fingerprint="fp", disk_dir=tmp_path / "ck", log=get_logger(), metrics=Metrics(("ram", "disk")),
                     **kw)
    await ck.open_disk()
    assert ck.disk_enabled
    return ck


async def test_full_writer_queue_drops_the_disk_write_and_never_blocks(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(1)
    ck.out = send
    with capture_logs() as evs:
        ck.capture(toks(1), "prompt_end", b"a" * 100, "r1")
        ck.capture(toks(2), "prompt_end", b"b" * 100, "r2")     # queue full: dropped, not awaited
    assert [e["event"] for e in evs].count("checkpoint_write_dropped") == 1
    assert len(ck.store) == 2 and recv.receive_nowait().id == prefix_hash(toks(1))


async def test_writer_writes_files_and_the_disk_budget_deletes_old_ones(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=3000)
    send, recv = trio.open_memory_channel(4)
    ck.out = send
    with capture_logs() as evs:
        async with trio.open_nursery() as n:
            await n.start(lambda task_status: checkpoint_writer(recv, checkpoints=ck, log=get_logger(),
                                                               task_status=task_status))
            for i in range(3):
                ck.capture(toks(i, 100), "prompt_end", bytes([i]) * 1000, f"r{i}")
                # Wait for the writer's effect (file written, budget applied), not for a time.
                # Within a budget of 3000 bytes only the last two 1000-byte blobs fit.
                want = sorted(file_name(toks(j, 100)) for j in range(max(0, i - 1), i + 1))
                with trio.fail_after(30):
                    while not (sorted(p.name for p in ck_files(tmp_path)) == want
                               and ck.checkpoint_stats()["disk"]["entries"] == len(want)):
                        await trio.sleep(0.005)
            st = ck.checkpoint_stats()
            n.cancel_scope.cancel()
    names = sorted(p.name for p in ck_files(tmp_path))
    assert names == sorted(file_name(toks(i, 100)) for i in (1, 2))      # the oldest one deleted
    assert [e["tier"] for e in evs if e["event"] == "checkpoint_evict"] == ["disk"]
    assert st["disk"]["entries"] == 2 and st["disk"]["bytes"] <= 3000 and st["memory"]["entries"] == 3
    assert st["disk"]["enabled"] is True and set(st) >= {"memory", "disk", "by_kind", "hits", "enabled"}
    header, blob, _ = disk_io.load(model_dir(tmp_path) / file_name(toks(2, 100)), "fp")
    assert blob == bytes([2]) * 1000 and header.kind == "prompt_end"


async def test_delete_while_a_write_is_queued_leaves_no_file(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(4)
    ck.out = send
    ck.capture(toks(5), "system", b"x" * 500, "r")
    assert await ck.delete(prefix_hash(toks(5)))
    await ck.write(recv.receive_nowait())
    assert not ck_files(tmp_path) and len(ck.store) == 0
    assert not await ck.delete(prefix_hash(toks(5)))


async def test_restart_indexes_files_and_reads_payloads_on_first_use(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(4)
    ck.out = send
    ck.capture(toks(7), "system", b"payload" * 50, "r")
    await ck.write(recv.receive_nowait())
    ck.close_disk()                                      # the writer does this when the daemon stops
    again = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    [row] = again.listing()
    assert (row.tier, row.kind, row.tokens) == ("disk", "system", 600)
    blob, tier = await again.snapshot_for(row.id, "r2")
    assert (blob, tier) == (b"payload" * 50, "disk")
    assert again.listing()[0].tier == "memory+disk"


async def test_checkpoint_deleted_while_it_is_being_restored_is_not_an_error(tmp_path):
    """DELETE /v1/checkpoints/{id} can land between reading a checkpoint and the restore's hit: the
    request goes on with the blob it has, and the deleted entry does not come back."""
    ck = Checkpoints(fingerprint="fp", log=get_logger(), metrics=Metrics(("ram",)))
    ck.capture(toks(1), "prompt_end", b"a" * 100, "r1")
    entry_id = prefix_hash(toks(1))
    blob, tier = await ck.snapshot_for(entry_id, "r2")
    assert blob == b"a" * 100 and tier == "memory"
    assert await ck.delete(entry_id)
    ck.hit(entry_id, tier, "r2", 700)                    # the restore finished after the delete
    assert len(ck.store) == 0


# --- hardening (issue 10): shared directory, lock, CRC thread, memory budget, recency -------------

async def write_one(ck: Checkpoints, tokens: np.ndarray, kind: str, blob: bytes) -> None:
    """Capture and run the queued write as the writer would."""
    send, recv = trio.open_memory_channel(4)
    ck.out = send
    ck.capture(tokens, kind, blob, "r")
    await ck.write(recv.receive_nowait())


async def test_two_models_share_a_checkpoint_directory_without_deleting_each_others_files(tmp_path):
    a = Checkpoints(fingerprint="model-a", disk_dir=tmp_path / "ck", log=get_logger(), disk_max_bytes=1 << 20)
    await a.open_disk()
    await write_one(a, toks(1), "system", b"a" * 500)
    a.close_disk()
    b = Checkpoints(fingerprint="model-b", disk_dir=tmp_path / "ck", log=get_logger(), disk_max_bytes=1 << 20)
    with capture_logs() as evs:
        await b.open_disk()
    assert b.disk_enabled and not [e for e in evs if e["event"] == "checkpoint_file_bad"]
    await write_one(b, toks(2), "system", b"b" * 500)
    b.close_disk()
    again = Checkpoints(fingerprint="model-a", disk_dir=tmp_path / "ck", log=get_logger(), disk_max_bytes=1 << 20)
    await again.open_disk()
    assert [r.id for r in again.listing()] == [prefix_hash(toks(1))]
    assert (await again.snapshot_for(prefix_hash(toks(1)), "r"))[0] == b"a" * 500
    assert len(list((tmp_path / "ck").glob("*/*.ckpt"))) == 2


async def test_second_daemon_of_the_same_model_runs_without_disk_tier_and_leaves_the_first_ones_temp_files(tmp_path):
    first = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    in_flight = model_dir(tmp_path) / f".{file_name(toks(3))}.{12345}-abcd.tmp"   # the first one's write
    in_flight.write_bytes(b"half a checkpoint")
    second = Checkpoints(fingerprint="fp", disk_dir=tmp_path / "ck", log=get_logger(), disk_max_bytes=1 << 20)
    with capture_logs() as evs:
        await second.open_disk()
    assert first.disk_enabled and not second.disk_enabled
    [warn] = [e for e in evs if e["event"] == "checkpoint_disk_unavailable"]
    assert warn["during"] == "lock" and f"pid {os.getpid()}" in warn["error"] and warn["log_level"] == "warning"
    assert in_flight.exists()
    await write_one(first, toks(4), "system", b"x" * 500)      # the first one's writes keep working
    assert first.disk_enabled and len(ck_files(tmp_path)) == 1
    # once the first one is gone, its temp file is provably abandoned: the next holder removes it
    first.close_disk()
    third = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    assert not in_flight.exists() and len(third.listing()) == 1


async def test_flat_layout_files_of_this_model_are_adopted_and_others_left_alone(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    disk_io.atomic_write(root, file_name(toks(5)), disk_format.encode("fp", "system", toks(5), b"mine"))
    disk_io.atomic_write(root, file_name(toks(6)), disk_format.encode("other", "system", toks(6), b"theirs"))
    leftover = root / f".{file_name(toks(7))}.1-abcd.tmp"
    leftover.write_bytes(b"?")
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    assert [r.id for r in ck.listing()] == [prefix_hash(toks(5))]
    assert (root / file_name(toks(6))).exists() and leftover.exists()
    assert [p.name for p in ck_files(tmp_path)] == [file_name(toks(5))]


async def test_payload_crc_is_computed_off_the_trio_thread(tmp_path, monkeypatch):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    threads = []
    real = zlib.crc32

    def spy(data, *a):
        threads.append(threading.current_thread())
        return real(data, *a)

    monkeypatch.setattr(disk_format.zlib, "crc32", spy)
    await write_one(ck, toks(8), "system", b"p" * 5000)
    assert threads and threading.main_thread() not in threads
    assert len(ck_files(tmp_path)) == 1


async def test_blobs_queued_for_the_writer_count_against_the_memory_budget(tmp_path):
    ck = await disk_ck(tmp_path, max_bytes=2500, max_slots=4, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(8)
    ck.out = send
    with capture_logs() as evs:
        for i in range(4):      # 1000 B each; memory keeps two, the writer has not run yet
            ck.capture(toks(10 + i), "prompt_end", bytes([i]) * 1000, f"r{i}")
    queued = []
    while True:
        try:
            queued.append(recv.receive_nowait())
        except trio.WouldBlock:
            break
    held = sum(len(m.snapshot) for m in queued) + sum(e.nbytes for e in ck.store.entries()
                                                     if e.in_memory and e.id not in {m.id for m in queued})
    assert held <= 2500          # everything in memory or queued, counted once
    assert len(queued) == 2 and [e["reason"] for e in evs if e["event"] == "checkpoint_write_dropped"] == [
        "memory budget (snapshots waiting for the writer count against it)"] * 2
    for m in queued:
        await ck.write(m)
    assert ck.store.queued_bytes == 0 and ck.checkpoint_stats()["memory"]["queued_bytes"] == 0


async def test_deletes_without_a_queued_write_leave_no_tombstones(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    for i in range(20):
        await write_one(ck, toks(20 + i), "prompt_end", b"d" * 100)
        assert await ck.delete(prefix_hash(toks(20 + i)))
    assert ck._no_write == set() and not ck_files(tmp_path)


async def test_disk_recency_survives_a_restart(tmp_path):
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(8)
    ck.out = send
    seeds = [30, 31, 32]
    for s in seeds:
        ck.capture(toks(s), "prompt_end", bytes([s]) * 300, "r")
        await ck.handle(recv.receive_nowait())
    # use them in another order than written (and than file names): 32, 30, 31 (most recent last)
    for s in (32, 30, 31):
        ck.hit(prefix_hash(toks(s)), "memory", "r", 700)
    while True:
        try:
            await ck.handle(recv.receive_nowait())
        except trio.WouldBlock:
            break
    before = [r.id for r in ck.listing()]
    ck.close_disk()
    again = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    assert [r.id for r in again.listing()] == before == [prefix_hash(toks(s)) for s in (31, 30, 32)]
    assert [round(r.last_used, 3) for r in again.listing()] == [round(r.last_used, 3) for r in ck.listing()]


async def test_a_failed_write_pauses_disk_writes_and_a_capture_after_the_back_off_is_written(tmp_path, monkeypatch,
                                                                                            autojump_clock):
    """ENOSPC injected into the write: the tier pauses (one warning, not one per failed write), a
    capture during the pause stays in memory, a failed retry doubles the pause, and the first
    capture after it is written and ends the pause."""
    ck = await disk_ck(tmp_path, disk_max_bytes=1 << 20)
    send, recv = trio.open_memory_channel(8)
    ck.out = send
    real = disk_io.atomic_write
    full = [True]

    def atomic_write(directory, name, data):
        if full[0] and name.endswith(".ckpt"):
            raise OSError(28, "No space left on device")
        return real(directory, name, data)

    monkeypatch.setattr(disk_io, "atomic_write", atomic_write)

    async def capture(seed: int) -> None:
        ck.capture(toks(seed), "prompt_end", bytes([seed]) * 500, f"r{seed}")
        while True:                                   # what the writer actor does with what was queued
            try:
                await ck.handle(recv.receive_nowait())
            except trio.WouldBlock:
                return

    with capture_logs() as evs:
        await capture(1)                              # fails: pause 1 s
        assert ck.write_backoff.delay_s == 1.0 and ck.disk_enabled
        await capture(2)                              # during the pause: memory only, no attempt
        assert ck.store.get(prefix_hash(toks(2))).in_memory and not ck.store.get(prefix_hash(toks(2))).on_disk
        await trio.sleep(1.0)
        await capture(3)                              # the retry fails too: pause 2 s
        assert ck.write_backoff.delay_s == 2.0
        full[0] = False
        await trio.sleep(1.0)
        await capture(4)                              # still paused (1 s of 2): not written
        await trio.sleep(1.0)
        await capture(5)                              # after the back-off: written, the pause ends
    assert [p.name for p in ck_files(tmp_path)] == [file_name(toks(5))]
    assert ck.store.get(prefix_hash(toks(5))).on_disk and not ck.write_backoff.paused
    state_lines = [e for e in evs if e["event"].startswith("checkpoint_disk_writes")]
    assert [e["event"] for e in state_lines] == ["checkpoint_disk_writes_paused", "checkpoint_disk_writes_resumed"]
    assert "No space left" in state_lines[0]["error"] and state_lines[0]["log_level"] == "warning"
    assert ck.checkpoint_stats()["disk"]["writes_paused_s"] == 0.0

"""actors/checkpoints.py and the checkpoint writer on their own (opaque blobs, a temp directory):
the dropped write when the writer's queue is full, a delete racing a queued write, the disk budget
deleting files, the stats dict for /v1/status."""

from __future__ import annotations

import numpy as np
import trio
from structlog.testing import capture_logs

from cairn.actors import disk_io
from cairn.actors.checkpoint_writer import checkpoint_writer
from cairn.actors.checkpoints import Checkpoints
from cairn.actors.disk_format import file_name, prefix_hash
from cairn.daemon.logs import get_logger
from cairn.daemon.metrics import Metrics


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
                await trio.sleep(0.2)
            st = ck.checkpoint_stats()
            n.cancel_scope.cancel()
    names = sorted(p.name for p in ck_files(tmp_path))
    assert names == sorted(file_name(toks(i, 100)) for i in (1, 2))      # the oldest one deleted
    assert [e["tier"] for e in evs if e["event"] == "checkpoint_evict"] == ["disk"]
    assert st["disk"]["entries"] == 2 and st["disk"]["bytes"] <= 3000 and st["memory"]["entries"] == 3
    assert st["disk"]["enabled"] is True and set(st) >= {"memory", "disk", "by_kind", "hits", "enabled"}
    header, blob = disk_io.load(model_dir(tmp_path) / file_name(toks(2, 100)), "fp")
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
    blob, tier = await again.blob_for(row.id, "r2")
    assert (blob, tier) == (b"payload" * 50, "disk")
    assert again.listing()[0].tier == "memory+disk"


async def test_checkpoint_deleted_while_it_is_being_restored_is_not_an_error(tmp_path):
    """DELETE /v1/checkpoints/{id} can land between reading a checkpoint and the restore's hit: the
    request goes on with the blob it has, and the deleted entry does not come back."""
    ck = Checkpoints(fingerprint="fp", log=get_logger(), metrics=Metrics(("ram",)))
    ck.capture(toks(1), "prompt_end", b"a" * 100, "r1")
    entry_id = prefix_hash(toks(1))
    blob, tier = await ck.blob_for(entry_id, "r2")
    assert blob == b"a" * 100 and tier == "memory"
    assert await ck.delete(entry_id)
    ck.hit(entry_id, tier, "r2", 700)                    # the restore finished after the delete
    assert len(ck.store) == 0

"""Checkpoint writer actor: disk writes off the request path.

Each `WriteCheckpoint` becomes one file (``Checkpoints.write``: header with fingerprint and
checksums, temp file, fsync, rename, fsync of the directory — ``disk_io.atomic_write`` in a worker
thread), then the disk tier's budget is enforced (evicted files are deleted). The prefill worker
sends with ``send_nowait`` on a bounded channel and drops the write (one log line) when it is full,
so a slow disk never delays a request. A failed write pauses disk writes (one warning) and a later
capture retries after a back-off (``Checkpoints.write_backoff``).
`FlushRecency` saves the recency of used disk checkpoints (file mtimes). With a shared directory the
actor also runs ``Checkpoints.refresh_loop``: listings with a deadline, so planning never waits on the mount. The writer holds the model's
checkpoint subdirectory: when it stops, the directory's lock is released (``close_disk``).
"""

from __future__ import annotations

import trio

from ..engine.messages import FlushRecency, WriteCheckpoint


async def checkpoint_writer(inbox: trio.MemoryReceiveChannel, *, checkpoints, log,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
    try:
        async with inbox, trio.open_nursery() as nursery:
            if checkpoints.shared:   # listings of the shared directory, off the request path
                nursery.start_soon(checkpoints.refresh_loop)
            task_status.started()
            async for msg in inbox:
                msg: WriteCheckpoint | FlushRecency
                try:
                    await checkpoints.handle(msg)
                except Exception as e:   # a bug in one write must not stop the daemon; the write is lost
                    log.exception("checkpoint_write_failed", id=getattr(msg, "id", None),
                                  error=f"{type(e).__name__}: {e}")
            nursery.cancel_scope.cancel()
    finally:
        checkpoints.close_disk()

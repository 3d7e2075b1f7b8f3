"""Checkpoint writer actor: disk writes off the request path.

The checkpoints issue gives it its real work (disk_format.py: header, checksum, atomic write).
Until then it drains its channel so that senders never block, and logs what it was given.
"""

from __future__ import annotations

import trio

from .messages import WriteCheckpoint


async def checkpoint_writer(inbox: trio.MemoryReceiveChannel, *, enabled: bool, log,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with inbox:
        task_status.started()
        async for msg in inbox:
            msg: WriteCheckpoint
            log.debug("checkpoint_write_skipped", key=msg.key, bytes=len(msg.blob), enabled=enabled)

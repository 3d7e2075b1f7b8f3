"""The kernel's call thread at interpreter exit (actors/engine/call_thread.py): an idle thread waits
inside the kernel's `StepWorker.serve` without the GIL; had that wait ended while Python finalizes,
taking the GIL back would unwind the thread through C++ frames and abort the process (exit 134,
"terminate called without an active exception") after everything else had passed. The atexit hook
stops and joins every call thread first.

A child interpreter makes the race certain: the idle wait is 2 s (finalization begins well before it
ends) and finalization is held for 4 s by an object's `__del__`, so without the hook the wait ends
inside finalization."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import atexit, sys, time
import trio
import cairn._kernel as K
from cairn.actors.engine import call_thread
call_thread.IDLE_S = 2.0
if sys.argv[1] == "without-hook":
    atexit.unregister(call_thread._stop_all)

class SlowFinalizer:
    def __del__(self):
        time.sleep(4.0)

thread = call_thread.CallThread(worker=K.StepWorker())

async def main():
    assert await thread.run_sync(lambda: 42) == 42      # the thread is now idle inside serve()

trio.run(main)
slow = SlowFinalizer()
print("ran", flush=True)
"""


def _exit_of(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60)


def test_an_idle_call_thread_does_not_abort_the_interpreter_at_exit():
    r = _exit_of("with-hook")
    assert r.stdout.strip() == "ran" and r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "terminate called" not in r.stderr


def test_without_the_hook_the_same_exit_aborts():
    """The probe does reach the race: without the hook the process aborts (so the test above can fail)."""
    r = _exit_of("without-hook")
    assert r.stdout.strip() == "ran"
    assert r.returncode == -6 or r.returncode == 134, (r.returncode, r.stderr[-2000:])
    assert "terminate called without an active exception" in r.stderr

"""tests/memory_cap.py: finding a memory cgroup on this host, and caps that work (where the host has one).

The parsing is checked on fixed /proc texts; the caps on the real host: a process over the cap is
OOM-killed and counted, one under it is not and its peak is seen, a long-running process left in the
group is killed and the group removed on exit.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import memory_cap
from memory_cap import MemoryCapUnavailable, memory_cap_unavailable_reason
from skip_policy import host_cannot

MIB = 1 << 20

HYBRID = """\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
"""
UNIFIED = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
BIND = "40 23 0:26 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"   # a sub-group bind-mounted: not a root


def test_mounts_and_own_cgroups_are_read_from_proc():
    from pathlib import Path

    assert memory_cap._mounts(HYBRID) == (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified"))
    assert memory_cap._mounts(UNIFIED) == (None, Path("/sys/fs/cgroup"))
    assert memory_cap._mounts(BIND) == (None, None)
    assert memory_cap._own_cgroups("4:memory:/process_api/ab\n1:cpu:/\n0::/\n") == ("/process_api/ab", "/")
    assert memory_cap._own_cgroups("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n") == (
        None, "/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope")


def test_a_named_directory_that_is_no_cgroup_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(memory_cap.ENV, str(tmp_path))
    with pytest.raises(MemoryCapUnavailable, match="not a cgroup directory"):
        memory_cap.find_base()
    reason = memory_cap_unavailable_reason()
    assert reason.startswith("needs a memory cgroup") and "CAIRN_TEST_CGROUP" in reason and str(tmp_path) in reason


@pytest.fixture
def cap_host():
    if (reason := memory_cap_unavailable_reason()) is not None:
        host_cannot(reason)


def test_a_process_over_the_cap_is_oom_killed_and_counted(cap_host):
    with memory_cap.memory_cap(64 * MIB, name="unit-over") as cap:
        assert cap.limit_bytes() == 64 * MIB
        r = cap.run([sys.executable, "-c", "b = bytearray(256 << 20); print('survived')"], timeout=60,
                    capture_output=True)
        assert r.returncode == -9 and "survived" not in r.stdout
        assert cap.oom_kills() >= 1 and cap.limit_hits() >= 1
        assert cap.peak_bytes() <= 64 * MIB


def test_a_process_under_the_cap_runs_and_its_peak_is_seen(cap_host):
    with memory_cap.memory_cap(256 * MIB, name="unit-under") as cap:
        r = cap.run([sys.executable, "-c", "b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096])"],
                    timeout=60, capture_output=True)
        assert r.returncode == 0, r.stderr
        assert cap.oom_kills() == 0 and not cap.under_oom()
        assert 48 * MIB <= cap.peak_bytes() <= 256 * MIB


def test_a_long_running_process_is_killed_and_the_group_removed_on_exit(cap_host):
    with memory_cap.memory_cap(128 * MIB, name="unit-daemon") as cap:
        proc = cap.popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                         stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "up\n"
        assert cap.pids() == [proc.pid] and cap.usage_bytes() > 0
        path = cap.path
    assert proc.wait(timeout=10) == -9
    assert not path.exists()


def test_v2_readings_are_parsed_from_the_groups_files(tmp_path):
    """The v2 backend's files on a directory standing in for a v2 group (this host may be v1)."""
    base = memory_cap.Base(tmp_path, 2, "test")
    cap = memory_cap.MemoryCap(base, 100 * MIB, "fake")
    try:
        assert (cap.path / "memory.max").read_text() == str(100 * MIB)
        (cap.path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\noom_group_kill 0\n")
        (cap.path / "memory.peak").write_text(f"{90 * MIB}\n")
        (cap.path / "memory.current").write_text(f"{5 * MIB}\n")
        assert (cap.oom_kills(), cap.limit_hits(), cap.peak_bytes(), cap.usage_bytes()) == (1, 7, 90 * MIB, 5 * MIB)
        assert cap.under_oom() is False and cap.limit_bytes() == 100 * MIB
        (cap.path / "memory.max").write_text("max\n")
        assert cap.limit_bytes() == (1 << 63) - 1
        (cap.path / "memory.peak").unlink()
        with pytest.raises(MemoryCapUnavailable, match="memory.peak needs 5.19"):
            cap.peak_bytes()
    finally:
        for f in cap.path.iterdir():
            f.unlink()
        cap.close()
    assert not cap.path.exists()


def test_v2_processes_in_the_base_are_moved_to_a_leaf_before_memory_is_enabled(tmp_path):
    """No internal processes: the base's own processes go to cairn-leaf, then +memory (stand-in files)."""
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "cgroup.subtree_control").write_text("")
    memory_cap._prepare_v2(tmp_path)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    assert not (tmp_path / "cairn-leaf").exists()           # nothing to move
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.procs").write_text("4242\n")
    (tmp_path / "cairn-leaf").mkdir()
    (tmp_path / "cairn-leaf" / "cgroup.procs").write_text("")
    memory_cap._prepare_v2(tmp_path)
    assert (tmp_path / "cairn-leaf" / "cgroup.procs").read_text() == "4242"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"

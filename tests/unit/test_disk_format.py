"""Checkpoint files: the pure format (disk_format) and the file effects (disk_io).

Failures a file system can produce are produced for real: a writer killed with SIGKILL mid-write,
a read-only directory (as an unprivileged uid when the tests run as root), a full disk via
RLIMIT_FSIZE in a subprocess.
"""

import errno
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from cairn.actors.checkpoints import disk_io
from cairn.actors.checkpoints.disk_format import (
    MAGIC, CheckpointFileError, check_page_keys, encode, encode_header, file_name, page_keys, prefix_hash,
    read_header, read_payload,
)
from cairn.actors.checkpoints.store import CheckpointStore

FP = "model=abc123;tok=def456;snapshot=1"
TOKENS = list(range(100, 700))
PAYLOAD = bytes(range(256)) * 40


def reason(data: bytes, fingerprint: str | None = FP) -> str:
    with pytest.raises(CheckpointFileError) as e:
        h = read_header(data, fingerprint)
        read_payload(data, h)
    return e.value.reason


# ---- pure format ---------------------------------------------------------------------------------

def test_page_keys_are_checked_against_the_headers_own_token_ids():
    """One hashing pass over the header's ids names every page group: a file listing another
    prefix's pages, too few or too many, is refused before a restore (never at read_header)."""
    own = [(k, 7) for k in page_keys(TOKENS, len(TOKENS) // 64, 64)]
    check_page_keys(read_header(encode_header(FP, "prompt_end", TOKENS, PAYLOAD, 4096, own)), 64)
    other = [(k, 7) for k in page_keys(TOKENS[::-1], len(TOKENS) // 64, 64)]
    for pages, what in ((own[:4] + other[4:5] + own[5:], "page 4 of 9"), (own[:-1], "8 pages listed"),
                        (own + other[:1], "10 pages listed")):
        h = read_header(encode_header(FP, "prompt_end", TOKENS, PAYLOAD, 4096, pages))   # a valid header ...
        with pytest.raises(CheckpointFileError, match=what) as e:
            check_page_keys(h, 64)                                                      # ... of another prefix's pages
        assert e.value.reason.startswith("page keys do not match its token ids")
    with pytest.raises(CheckpointFileError):
        check_page_keys(read_header(encode_header(FP, "prompt_end", TOKENS, PAYLOAD, 4096, own)), 32)
    check_page_keys(read_header(encode(FP, "prompt_end", TOKENS, PAYLOAD)), 0)           # a blob: no pages

def test_round_trip():
    data = encode(FP, "system", TOKENS, PAYLOAD)
    h = read_header(data, FP)
    assert (h.version, h.fingerprint, h.kind, h.n_tokens, h.payload_len) == (2, FP, "system", 600, len(PAYLOAD))
    assert h.tokens.dtype == np.int32 and h.tokens.tolist() == TOKENS
    assert h.file_len == len(data)
    assert read_payload(data, h) == PAYLOAD
    assert h.name == file_name(TOKENS) == prefix_hash(TOKENS) + ".ckpt"
    assert read_header(data).fingerprint == FP  # no expectation: any fingerprint


def test_header_alone_is_enough_for_the_index():
    header = encode_header(FP, "common", TOKENS, PAYLOAD)
    h = read_header(header, FP)
    assert h.header_len == len(header) and h.tokens.tolist() == TOKENS


def test_bad_magic():
    data = bytearray(encode(FP, "system", TOKENS, PAYLOAD))
    data[0:8] = b"NOTCAIRN"
    assert reason(bytes(data)) == "bad magic"
    assert reason(b"") == "truncated"
    assert reason(MAGIC[:5]) == "truncated"


def test_wrong_version_is_reported_before_checksums():
    data = bytearray(encode(FP, "system", TOKENS, PAYLOAD))
    struct.pack_into("<I", data, 8, 3)
    assert reason(bytes(data)) == "wrong version 3 (expected 2)"
    struct.pack_into("<I", data, 8, 1)   # the whole-state files of before pages: recomputed, never restored
    assert reason(bytes(data)) == "wrong version 1 (expected 2); written before paged state, so it is recomputed"


def test_foreign_fingerprint():
    data = encode("other-model", "system", TOKENS, PAYLOAD)
    assert reason(data) == "foreign fingerprint"


@pytest.mark.parametrize("cut", [10, 30, 500, -1])
def test_truncated(cut):
    data = encode(FP, "system", TOKENS, PAYLOAD)
    assert reason(data[:cut]) == "truncated"


def test_trailing_bytes():
    assert reason(encode(FP, "system", TOKENS, PAYLOAD) + b"\0") == "trailing bytes"


def test_corrupt_header_and_payload():
    data = encode(FP, "system", TOKENS, PAYLOAD)
    h = read_header(data)
    flip_token = bytearray(data)
    flip_token[h.header_len - 100] ^= 0x01
    assert reason(bytes(flip_token)) == "checksum mismatch (header)"
    flip_payload = bytearray(data)
    flip_payload[h.header_len + 1234] ^= 0x80
    assert reason(bytes(flip_payload)) == "checksum mismatch"


def test_header_lengths_are_bounded_before_allocation():
    data = bytearray(encode(FP, "system", TOKENS, PAYLOAD))
    struct.pack_into("<I", data, 12, 0xFFFFFFFF)
    assert reason(bytes(data)) == "corrupt header (length)"
    data = bytearray(encode(FP, "system", TOKENS, PAYLOAD))
    struct.pack_into("<Q", data, 24, 7)  # n_tokens disagrees with header_len; fix the crc
    hl = struct.unpack_from("<I", data, 12)[0]
    struct.pack_into("<I", data, hl - 4, zlib.crc32(bytes(data[: hl - 4])))
    assert reason(bytes(data)) == "corrupt header (lengths disagree)"


def test_encode_rejects_unknown_kind():
    with pytest.raises(ValueError):
        encode(FP, "bogus", TOKENS, PAYLOAD)


# ---- disk_io -------------------------------------------------------------------------------------

def write(d, tokens=TOKENS, kind="system", fp=FP, payload=PAYLOAD):
    header = encode_header(fp, kind, tokens, payload)
    return disk_io.atomic_write(d, file_name(tokens), [header, payload])


def test_atomic_write_scan_load_round_trip(tmp_path):
    path = write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(TOKENS)]
    good, problems = disk_io.scan(tmp_path, FP)
    assert problems == [] and [(f.path, f.header.tokens.tolist()) for f in good] == [(path, TOKENS)]
    header, payload, _ = disk_io.load(path, FP)
    assert payload == PAYLOAD and header.kind == "system"
    # the index is rebuilt from headers alone
    s = CheckpointStore(disk_max_bytes=1 << 20)
    for f in good:
        s.put_disk(f.header.tokens, f.header.kind, f.header.payload_len, f.header.file_len)
    assert s.longest_prefix(TOKENS + [1]).tier == "disk"
    assert disk_io.remove(tmp_path, path.name) and not disk_io.remove(tmp_path, path.name)


def test_atomic_write_replaces_existing(tmp_path):
    write(tmp_path, payload=b"old")
    write(tmp_path, payload=b"new")
    assert disk_io.load(tmp_path / file_name(TOKENS), FP)[1] == b"new"


def test_scan_missing_directory_is_empty(tmp_path):
    assert disk_io.scan(tmp_path / "nope", FP) == ([], [])


def test_scan_skips_removes_and_reports_bad_files(tmp_path):
    good_path = write(tmp_path)
    data = encode(FP, "common", TOKENS[:550], PAYLOAD)
    bad = {
        "truncated": data[:-10],
        "checksum mismatch (header)": data[:40] + bytes([data[40] ^ 1]) + data[41:],
        "wrong version 3 (expected 2)": data[:8] + struct.pack("<I", 3) + data[12:],
        "bad magic": b"garbage" * 20,
        "trailing bytes": data + b"\0\0",
    }
    for i, (why, blob) in enumerate(bad.items()):
        (tmp_path / f"{i:016x}.ckpt").write_bytes(blob)
    misnamed = tmp_path / ("f" * 16 + ".ckpt")
    misnamed.write_bytes(data)
    (tmp_path / f".{file_name(TOKENS[:520])}.123-abcd.tmp").write_bytes(data)  # leftover temp file
    (tmp_path / "README").write_text("not ours")
    foreign = tmp_path / file_name(TOKENS[:550])
    foreign.write_bytes(encode("other", "common", TOKENS[:550], PAYLOAD))
    good, problems = disk_io.scan(tmp_path, FP)
    assert [f.path for f in good] == [good_path]
    reasons = sorted(p.reason for p in problems if p.path != foreign)
    assert reasons == sorted([*bad, "file name does not match its token ids", "leftover temp file (interrupted write)"])
    assert all(p.removed and not p.path.exists() for p in problems if p.path != foreign)
    # another fingerprint's file is reported but never deleted: it is not ours
    assert [(p.reason, p.removed) for p in problems if p.path == foreign] == [("foreign fingerprint; left in place",
                                                                              False)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["README", good_path.name, foreign.name])


def test_temp_file_of_a_writer_killed_mid_write_is_never_loaded(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from cairn.actors.checkpoints import disk_io
        from cairn.actors.checkpoints.disk_format import encode_header
        payload = b"p" * 100_000
        def parts():
            yield encode_header({FP!r}, "system", list(range(600)), payload)
            yield payload[:5000]
            print("ready", flush=True)
            time.sleep(60)
            yield payload[5000:]
        disk_io.atomic_write(sys.argv[1], "x.ckpt", parts())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp") and "x.ckpt" != leftovers[0]
    good, problems = disk_io.scan(tmp_path, FP)
    assert good == [] and [p.reason for p in problems] == ["leftover temp file (interrupted write)"]
    assert list(tmp_path.iterdir()) == []


def _in_unprivileged_child(fn) -> int:
    """Run fn() in a forked child as uid/gid 65534 when we are root (root ignores permissions);
    return the errno it raised (0 if none)."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            fn()
        except OSError as e:
            code = e.errno or 1
        except BaseException:
            code = 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_read_only_directory_raises_oserror_and_leaves_nothing(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        code = _in_unprivileged_child(lambda: write(d))
    finally:
        d.chmod(0o755)
    assert code in (errno.EACCES, errno.EPERM, errno.EROFS)
    assert list(d.iterdir()) == []


def test_full_disk_raises_and_leaves_no_partial_file(tmp_path):
    script = textwrap.dedent("""
        import resource, signal, sys
        from cairn.actors.checkpoints import disk_io
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            disk_io.atomic_write(sys.argv[1], "big.ckpt", [b"h" * 100, b"p" * 100_000])
        except OSError as e:
            print(e.errno)
            sys.exit(0)
        sys.exit(1)
    """)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) in (errno.EFBIG, errno.ENOSPC)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    write(tmp_path, payload=b"old")

    def boom(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_io.os, "fsync", boom)
    with pytest.raises(OSError):
        write(tmp_path, payload=b"new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [file_name(TOKENS)]
    assert disk_io.load(tmp_path / file_name(TOKENS), FP)[1] == b"old"

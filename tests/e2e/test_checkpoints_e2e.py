"""Prefix checkpoints end to end: the real kernel on the tiny model, a real daemon on a real socket.

`checkpoint_min_tokens=32` so prompts of a few hundred tokens exercise every rule. Parity: each
answer (greedy tokens and their log-probabilities, exactly: the kernel gives the same bits wherever
a restore or a capture point makes a kernel call start) equals the answer of the same request
sequence replayed against a daemon with checkpoints off.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from cairn.actors.checkpoints import disk_format, disk_io
from daemon_harness import daemon, real_loaded, request

RNG = np.random.default_rng(11)
ON = {"checkpoint_min_tokens": 32}
SYSTEM = "\n".join(f"Rule {i}: read file_{i}.py before you change it, and keep the change small."
                   for i in range(12))
SIDE_SYSTEMS = [f"You write short titles, style {i}." for i in range(12)]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


def ids(n: int) -> list[int]:
    return [int(t) for t in RNG.integers(20, 500, size=n)]


def cmpl(prompt, **kw) -> dict:
    return {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 4, "logprobs": 1, **kw}


def chat(messages, **kw) -> dict:
    return {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 4, "logprobs": True, **kw}


def user(i: int, conv: str = "A") -> dict:
    return {"role": "user", "content": f"Conversation {conv}, turn {i}: please fix test_{i}.py and explain why."}


def answer(body: dict) -> tuple[list, list]:
    ch = body["choices"][0]
    if "message" in ch:
        content = ch["logprobs"]["content"]
        return [c["token"] for c in content], [c["logprob"] for c in content]
    return ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"]


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def path_of(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


async def post(sock, body) -> dict:
    r = await request(sock, "POST", path_of(body), body)
    assert r.status == 200, r.body
    return r.json()


async def listing(sock) -> list[dict]:
    r = await request(sock, "GET", "/v1/checkpoints")
    assert r.status == 200 and r.json()["object"] == "list"
    return r.json()["data"]


async def replay_off(loaded, tmp_path, bodies) -> list[dict]:
    """The same requests, in order, against a daemon with checkpoints off."""
    sock = tmp_path / "off.sock"
    async with daemon(loaded, sock, checkpoints=False):
        return [await post(sock, b) for b in bodies]


def assert_parity(on: list[dict], off: list[dict]) -> None:
    assert len(on) == len(off)
    for a, b in zip(on, off):
        (ta, la), (tb, lb) = answer(a), answer(b)
        assert ta == tb
        np.testing.assert_array_equal(la, lb)


def model_ckdir(ckdir: Path, loaded) -> Path:
    """Where the daemon of `loaded` keeps its checkpoint files: one subdirectory per model."""
    from cairn.daemon.service.main import checkpoint_fingerprint

    return disk_io.model_subdir(ckdir, checkpoint_fingerprint(loaded))


def events(evs, name, **match) -> list[dict]:
    return [e for e in evs if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


async def wait_disk(sock, n: int, timeout: float = 10) -> list[dict]:
    """Until at least n entries are on disk (the writer works off the request path)."""
    with trio.fail_after(timeout):
        while True:
            rows = await listing(sock)
            if sum("disk" in r["tier"] for r in rows) >= n:
                return rows
            await trio.sleep(0.02)


# --- the three capture rules, parity ------------------------------------------------------------

async def test_rule1_system_hint_checkpoint_serves_a_new_conversation(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    sys_msg = {"role": "system", "content": SYSTEM}
    bodies = [chat([sys_msg, user(1)]), chat([sys_msg, user(2, "B")])]
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            r1 = await post(sock, bodies[0])
            rows = await listing(sock)
            r2 = await post(sock, bodies[1])
            m = (await request(sock, "GET", "/metrics")).body.decode()
    system = [r for r in rows if r["kind"] == "system"]
    assert len(system) == 1 and 32 <= system[0]["tokens"] < r1["usage"]["prompt_tokens"] - 8
    assert cached(r1) == 0 and cached(r2) == system[0]["tokens"]
    hit = events(evs, "checkpoint_hit")
    assert [(h["id"], h["kind"], h["tier"]) for h in hit] == [(system[0]["id"], "system", "memory")]
    assert 'cairn_checkpoint_hits_total{tier="ram"} 1' in m
    assert f'cairn_prefill_tokens_total{{kind="restored"}} {system[0]["tokens"]}' in m
    assert events(evs, "checkpoint_store", kind="system", tier="memory")
    assert_parity([r1, r2], await replay_off(loaded, tmp_path, bodies))


async def test_rule2_common_prefix_of_two_fresh_prompts(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    shared = ids(200)
    bodies = [cmpl(shared + ids(60)), cmpl(shared + ids(60)), cmpl(shared + ids(60))]
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            out = [await post(sock, bodies[0]), await post(sock, bodies[1])]
            rows = await listing(sock)
            out.append(await post(sock, bodies[2]))
    common = [r for r in rows if r["kind"] == "common"]
    assert [c["tokens"] for c in common] == [200]
    assert [cached(r) for r in out] == [0, 0, 200]
    assert events(evs, "checkpoint_hit", id=common[0]["id"])
    assert_parity(out, await replay_off(loaded, tmp_path, bodies))


async def test_rule3_rerendered_agent_turn_restores_the_prompt_end(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    p1 = ids(150)
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            # token ids: the client re-renders the reply differently from what was generated
            r1 = await post(sock, cmpl(p1))
            b2 = cmpl(p1 + [7, 8, 9] + ids(40))
            r2 = await post(sock, b2)
            # chat: turn 2 re-renders turn 1's reply as text
            msgs = [{"role": "system", "content": SYSTEM}, user(1)]
            c1 = await post(sock, chat(msgs))
            msgs2 = msgs + [{"role": "assistant", "content": c1["choices"][0]["message"]["content"]}, user(2)]
            c2 = await post(sock, chat(msgs2))
    assert cached(r2) == len(p1)
    assert events(evs, "checkpoint_hit", kind="prompt_end", tokens=len(p1))
    assert cached(c2) >= c1["usage"]["prompt_tokens"]     # the prompt end (or the live state, if longer)
    off = await replay_off(loaded, tmp_path, [cmpl(p1), b2, chat(msgs), chat(msgs2)])
    assert_parity([r1, r2, c1, c2], off)


def marker(loaded, text: str) -> int:
    i = loaded.tokenizer.token_to_id(text)
    assert i is not None
    return i


async def test_raw_id_conversations_sharing_a_system_part_restore_it(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    bos, usr, asst = (marker(loaded, t) for t in ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"))
    system = [bos] + ids(300)
    expected = len(system)                     # the first <｜User｜> is the system part's end
    conv_a = system + [usr] + ids(20) + [asst]
    conv_b = system + [usr] + ids(25) + [asst]
    bodies = [cmpl(conv_a), cmpl(conv_b)]
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            out = [await post(sock, b) for b in bodies]
            rows = await listing(sock)
    assert cached(out[0]) == 0 and cached(out[1]) == expected
    system_rows = [r for r in rows if r["kind"] == "system"]
    assert [r["tokens"] for r in system_rows] == [expected]
    assert events(evs, "checkpoint_hit", id=system_rows[0]["id"], kind="system")
    assert_parity(out, await replay_off(loaded, tmp_path, bodies))


async def test_chat_token_ids_and_text_prompts_capture_at_the_same_boundaries(loaded, tmp_path):
    msgs = [{"role": "system", "content": SYSTEM}, user(1),
            {"role": "assistant", "content": "Done: test_1.py passes now."}, user(2)]
    text = loaded.renderer.render(msgs).text
    prompt_ids = loaded.tokenizer.encode(text)
    usr = marker(loaded, "<｜User｜>")
    users = [i for i, t in enumerate(prompt_ids) if t == usr]
    assert len(users) == 2
    captured = []
    for i, body in enumerate([chat(msgs), cmpl(prompt_ids), cmpl(text)]):
        sock = tmp_path / f"c{i}.sock"
        with trio.fail_after(60):
            async with daemon(loaded, sock, **ON):
                r = await post(sock, body)
                captured.append(sorted((row["tokens"], row["kind"]) for row in await listing(sock)))
        assert r["usage"]["prompt_tokens"] == len(prompt_ids)
    n = len(prompt_ids)
    assert captured[0] == [(users[0], "system"), (users[1], "common"), (n, "prompt_end")]
    assert captured[1] == captured[0] and captured[2] == captured[0]


async def test_request_log_line_traces_a_cold_request_stage_by_stage(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    bos, usr, asst = (marker(loaded, t) for t in ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"))
    prompt = [bos] + ids(200) + [usr] + ids(30) + [asst]
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            await post(sock, cmpl(prompt))
    [line] = events(evs, "request")
    trace = line["trace_ms"]
    # one kernel call up to the system end, one after it; a snapshot at each (system, prompt end)
    assert trace["kernel_calls"] == 2 and trace["snapshots"] == 2
    stages = ("edge", "queue", "plan", "kernel", "snapshot", "prefill_other", "first_token")
    assert set(trace) == set(stages) | {"kernel_calls", "snapshots", "total"}
    assert all(trace[s] >= 0 for s in stages if s != "prefill_other")
    # the stages are consecutive: together they are the time from the request to its first token
    assert abs(sum(trace[s] for s in stages) - trace["total"]) < 0.1


# --- eviction and budgets -----------------------------------------------------------------------

async def test_slot_budget_and_prompt_end_evicted_before_prefix_captures(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    shared = ids(100)
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoint_slots=3, **ON):
            await post(sock, cmpl(shared + ids(50)))     # prompt_end P1
            await post(sock, cmpl(shared + ids(50)))     # common@100 + prompt_end P2: 3 slots full
            full = await listing(sock)
            for _ in range(3):                           # unrelated prompts: each pushes out a prompt_end
                await post(sock, cmpl(ids(120)))
            rows = await listing(sock)
            m = (await request(sock, "GET", "/metrics")).body.decode()
    assert sorted(r["kind"] for r in full) == ["common", "prompt_end", "prompt_end"]
    assert len(rows) == 3 and [r["tokens"] for r in rows if r["kind"] == "common"] == [100]
    evicted = events(evs, "checkpoint_evict", tier="memory")
    assert len(evicted) == 3 and all(e["kind"] == "prompt_end" for e in evicted)
    assert 'cairn_checkpoint_evictions_total{tier="ram"} 3' in m


async def test_byte_budget_holds(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(90), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoint_slots=8, checkpoint_memory_mb=1, **ON):
            for _ in range(9):
                await post(sock, cmpl(ids(1200), max_tokens=1))
            rows = await listing(sock)
            m = (await request(sock, "GET", "/metrics")).body.decode()
    total = sum(r["bytes"] for r in rows)
    assert total <= 1 << 20 and len(rows) < 8
    assert len(events(evs, "checkpoint_evict", tier="memory")) == 9 - len(rows)
    assert f'cairn_checkpoint_bytes{{tier="ram"}} {total}' in m


async def test_disk_byte_budget_deletes_files(loaded, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    with trio.fail_after(90), capture_logs() as evs:
        async with daemon(loaded, sock, disk_checkpoints=True, checkpoint_dir=str(ckdir), checkpoint_disk_mb=1,
                          **ON):
            for i in range(9):
                await post(sock, cmpl(ids(1200), max_tokens=1))
                await wait_disk(sock, min(i + 1, 5))
            await trio.sleep(0.3)
            rows = await listing(sock)
    files = {f.name: f.stat().st_size for f in model_ckdir(ckdir, loaded).glob("*.ckpt")}
    on_disk = {f"{r['id']}.ckpt" for r in rows if "disk" in r["tier"]}
    assert set(files) == on_disk and sum(files.values()) <= 1 << 20 and 5 <= len(files) < 9
    assert len(events(evs, "checkpoint_evict", tier="disk")) == 9 - len(files)


async def test_main_system_checkpoint_survives_a_burst_of_side_requests(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    sys_msg = {"role": "system", "content": SYSTEM}
    with trio.fail_after(120), capture_logs() as evs:
        async with daemon(loaded, sock, checkpoint_slots=3, **ON):
            await post(sock, chat([sys_msg, user(1)]))
            main = [r for r in await listing(sock) if r["kind"] == "system"][0]
            for i, side in enumerate(SIDE_SYSTEMS):       # titles, sub-agents: their own prompts
                msgs = [{"role": "system", "content": side}] if i % 2 else []
                await post(sock, chat(msgs + [{"role": "user", "content": f"Title for request {i}: " + "x" * 60}]))
                assert main["id"] in [r["id"] for r in await listing(sock)]
            r = await post(sock, chat([sys_msg, user(9, "C")]))
    assert cached(r) == main["tokens"]
    assert len(events(evs, "checkpoint_evict", tier="memory")) >= len(SIDE_SYSTEMS)


# --- the API ------------------------------------------------------------------------------------

async def test_get_and_delete_checkpoints(loaded, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    p = ids(120)
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock, disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON):
            t0 = time.time()
            await post(sock, cmpl(p))
            rows = await wait_disk(sock, 1)
            assert (model_ckdir(ckdir, loaded) / f"{rows[0]['id']}.ckpt").exists()
            d = await request(sock, "DELETE", f"/v1/checkpoints/{rows[0]['id']}")
            after = await listing(sock)
            gone = not (model_ckdir(ckdir, loaded) / f"{rows[0]['id']}.ckpt").exists()
            again = await request(sock, "DELETE", f"/v1/checkpoints/{rows[0]['id']}")
            bad_method = await request(sock, "GET", f"/v1/checkpoints/{rows[0]['id']}")
            r = await post(sock, cmpl(p))
    row = rows[0]
    assert set(row) == {"id", "object", "tokens", "kind", "bytes", "own_bytes", "shared_bytes", "tier", "hits",
                        "last_used"}
    assert row["own_bytes"] + row["shared_bytes"] == row["bytes"]   # loaded: its tail + its pages, shared or not
    assert (row["tokens"], row["kind"], row["tier"], row["hits"]) == (120, "prompt_end", "memory+disk", 0)
    assert row["bytes"] > 0 and t0 - 1 <= row["last_used"] <= time.time() + 1 and len(row["id"]) == 16
    assert d.status == 200 and d.json() == {"id": row["id"], "object": "checkpoint", "deleted": True}
    assert after == [] and gone
    assert again.status == 404 and again.json()["error"]["code"] == "checkpoint_not_found"
    assert again.json()["error"]["type"] and "message" in again.json()["error"]
    assert bad_method.status == 405
    assert cached(r) == 0        # the checkpoint is gone (and the live state holds 3 more tokens)


# --- disk tier ----------------------------------------------------------------------------------

async def test_restarted_daemon_serves_the_second_session_from_disk(loaded, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    sys_msg = {"role": "system", "content": SYSTEM}
    bodies = [chat([sys_msg, user(1)]), chat([sys_msg, user(2, "B")])]
    disk = dict(disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON)
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **disk):
            r1 = await post(sock, bodies[0])
            await wait_disk(sock, 2)
        async with daemon(loaded, sock, **disk):
            before = await listing(sock)
            r2 = await post(sock, bodies[1])
            after = await listing(sock)
            m = (await request(sock, "GET", "/metrics")).body.decode()
    system = [r for r in before if r["kind"] == "system"][0]
    assert {r["tier"] for r in before} == {"disk"}
    assert cached(r2) == system["tokens"]
    assert events(evs, "checkpoint_hit", id=system["id"], tier="disk")
    assert [r["tier"] for r in after if r["id"] == system["id"]] == ["memory+disk"]
    assert 'cairn_checkpoint_hits_total{tier="disk"} 1' in m
    assert_parity([r1, r2], await replay_off(loaded, tmp_path, bodies))


def _rewrite(path: Path, *, fingerprint: str | None = None, version: int | None = None) -> None:
    raw = path.read_bytes()
    h = disk_format.read_header(raw)
    payload = raw[h.header_len:]
    new = disk_format.encode(fingerprint or h.fingerprint, h.kind, h.tokens, payload, h.page_nbytes, h.pages)
    if version is not None:
        new = new[:8] + version.to_bytes(4, "little") + new[12:]
    path.write_bytes(new)


async def test_bad_files_are_skipped_removed_and_warned_never_restored(loaded, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    disk = dict(disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON)
    prompts = [ids(100 + 20 * i) for i in range(4)]
    with trio.fail_after(90), capture_logs() as evs:
        async with daemon(loaded, sock, **disk):
            for p in prompts:
                await post(sock, cmpl(p))
            rows = await wait_disk(sock, 4)
        files = {r["tokens"]: model_ckdir(ckdir, loaded) / f"{r['id']}.ckpt" for r in rows}
        f_trunc, f_foreign, f_version, f_late = (files[len(p)] for p in prompts)
        f_trunc.write_bytes(f_trunc.read_bytes()[:-100])
        _rewrite(f_foreign, fingerprint="some-other-model;snapshot-v1")
        _rewrite(f_version, version=3)
        async with daemon(loaded, sock, **disk):
            listed = await listing(sock)
            # the last file goes bad after the scan: found at load time
            raw = bytearray(f_late.read_bytes())
            raw[-5] ^= 0xFF
            f_late.write_bytes(bytes(raw))
            later = [cmpl(p + ids(20)) for p in prompts]
            out = [await post(sock, b) for b in later]
    bad = {Path(e["path"]).name: e["reason"] for e in events(evs, "checkpoint_file_bad")}
    assert bad == {f_trunc.name: "truncated", f_foreign.name: "foreign fingerprint; left in place",
                   f_version.name: "wrong version 3 (expected 2)"}
    assert [r["tokens"] for r in listed] == [len(prompts[3])]
    late = events(evs, "checkpoint_bad")
    assert len(late) == 1 and late[0]["reason"] == "checksum mismatch" and late[0]["log_level"] == "warning"
    assert all(cached(r) == 0 for r in out)           # nothing restored from a bad file
    assert not any(f.exists() for f in (f_trunc, f_version, f_late))
    assert f_foreign.exists()                         # another fingerprint's file is never ours to delete
    assert_parity(out, await replay_off(loaded, tmp_path, later))


@contextmanager
def _readonly_dir(path: Path):
    path.mkdir()
    if os.geteuid() == 0:       # root writes through mode bits: a read-only tmpfs instead
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=False)
    else:
        path.chmod(0o500)
        try:
            yield path
        finally:
            path.chmod(0o700)


async def test_read_only_directory_one_warning_and_requests_succeed(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    sys_msg = {"role": "system", "content": SYSTEM}
    bodies = [chat([sys_msg, user(1)]), chat([sys_msg, user(2, "B")]), cmpl(ids(100))]
    with _readonly_dir(tmp_path / "ro") as ro, trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, disk_checkpoints=True, checkpoint_dir=str(ro), **ON):
            out = [await post(sock, b) for b in bodies]
            await trio.sleep(0.3)
            rows = await listing(sock)
    warn = events(evs, "checkpoint_disk_unavailable")
    assert len(warn) == 1 and warn[0]["log_level"] == "warning"
    assert cached(out[1]) > 0                          # memory checkpoints keep working
    assert {r["tier"] for r in rows} == {"memory"}
    assert_parity(out, await replay_off(loaded, tmp_path, bodies))


# --- subprocess daemons: a full disk (RLIMIT_FSIZE) and kill -9 ----------------------------------

class Proc:
    """`cairn serve` in a subprocess; its JSON log lines are collected from a pipe."""

    def __init__(self, model: Path, sock: Path, ckdir: Path | None, *, fsize: int | None = None,
                 env: dict | None = None, threads: int = 2) -> None:
        """``ckdir`` None: the default checkpoint directory (from ``env``'s XDG_STATE_HOME)."""
        args = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "1", "--model", str(model), "--socket", str(sock),
                "--threads", str(threads), "--disk-checkpoints", "--checkpoint-min-tokens", "32"]
        if ckdir is not None:
            args += ["--checkpoint-dir", str(ckdir)]

        def limit():
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        self.lines: list[dict] = []
        self.sock = sock
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit,
                                  env=env)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for raw in self.p.stdout:
            try:
                self.lines.append(json.loads(raw))
            except ValueError:
                self.lines.append({"event": "text", "text": raw.decode(errors="replace")})

    async def ready(self) -> None:
        with trio.fail_after(60):
            while not any(e.get("event") == "listening" for e in self.lines):
                assert self.p.poll() is None, self.lines
                await trio.sleep(0.05)

    def stop(self, sig=signal.SIGTERM) -> None:
        self.p.send_signal(sig)
        self.p.wait(timeout=30)
        self._t.join(timeout=5)


async def test_full_disk_rlimit_fsize_one_warning_requests_succeed(loaded, tiny_model_dir, tmp_path):
    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    bodies = [cmpl(ids(200)), cmpl(ids(200)), cmpl(ids(200))]
    d = Proc(tiny_model_dir, sock, ckdir, fsize=20_000)     # every checkpoint file is larger
    try:
        await d.ready()
        with trio.fail_after(60):
            out = [await post(sock, b) for b in bodies]
            await trio.sleep(0.3)
            rows = await listing(sock)
    finally:
        d.stop()
    assert d.p.returncode == 0
    warn = [e for e in d.lines if e.get("event") == "checkpoint_disk_writes_paused"]
    assert len(warn) == 1 and warn[0]["level"] == "warning" and "too large" in warn[0]["error"].lower()
    assert {r["tier"] for r in rows} == {"memory"} and not list(ckdir.glob("**/*.ckpt"))
    assert not list(ckdir.glob("**/.*.ckpt.*.tmp"))
    with capture_logs():
        assert_parity(out, await replay_off(loaded, tmp_path, bodies))


SLOW_WRITER = """
import sys, time
from cairn.actors.checkpoints import disk_io
data = open(sys.argv[2], "rb").read()
sub, lock = disk_io.lock_model_dir(sys.argv[1], sys.argv[4])   # as a daemon's writer does
def parts():
    yield data[:len(data) // 2]
    print("half", flush=True)
    time.sleep(60)
    yield data[len(data) // 2:]
disk_io.atomic_write(sub, sys.argv[3], parts())
"""


async def test_kill_9_during_writes_leaves_nothing_that_loads(loaded, tiny_model_dir, tmp_path):
    from cairn.daemon.service.main import checkpoint_fingerprint

    sock, ckdir = tmp_path / "c.sock", tmp_path / "ck"
    # 1. the daemon killed at arbitrary moments while it prefills, captures and writes
    for delay in (0.05, 0.15, 0.3, 0.6):
        d = Proc(tiny_model_dir, sock, ckdir)
        await d.ready()

        def fire():
            try:
                import httpx
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=30) as c:
                    c.post("http://x/v1/completions", json=cmpl(ids(1500), max_tokens=1))
            except Exception:
                pass

        t = threading.Thread(target=fire, daemon=True)
        t.start()
        await trio.sleep(delay)
        d.stop(signal.SIGKILL)
        t.join(timeout=10)
    # 2. a checkpoint write killed exactly half-way (after the first buffer, before fsync/rename)
    fp = checkpoint_fingerprint(loaded)
    prompt = ids(300)
    st = loaded.kernel.State(loaded.model)
    loaded.kernel.prefill(st, np.asarray(prompt, dtype=np.int32), chunk=128)
    blob = st.snapshot().tail()      # 300 tokens: one full page group, which this file does not list
    src = tmp_path / "whole.bin"
    src.write_bytes(disk_format.encode(fp, "prompt_end", prompt, blob))
    w = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(ckdir), str(src), disk_format.file_name(prompt), fp],
                         stdout=subprocess.PIPE)
    assert w.stdout.readline().strip() == b"half"
    w.kill()
    w.wait(timeout=10)
    sub = model_ckdir(ckdir, loaded)
    assert list(sub.glob(".*.tmp")) and not (sub / disk_format.file_name(prompt)).exists()
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON):
            rows = await listing(sock)
            at_start = {f.name for f in sub.glob("*.ckpt")}
            r = await post(sock, cmpl(prompt + ids(30)))
    assert {f"{row['id']}.ckpt" for row in rows} == at_start
    assert not list(sub.glob(".*.tmp"))      # its writer is dead (the lock was free): provably abandoned
    assert any("interrupted write" in e["reason"] for e in events(evs, "checkpoint_file_bad"))
    assert cached(r) == 0                                 # the half-written checkpoint was never loaded
    for f in sub.glob("*.ckpt"):                           # every file left is whole and ours
        h, tail, pages = disk_io.load(f, fp)
        snap = loaded.kernel.Snapshot.from_parts(loaded.model, tail, pages)
        assert loaded.kernel.State.restore(loaded.model, snap).n_tokens == h.n_tokens


# --- one checkpoint directory, several daemons ---------------------------------------------------

async def test_two_models_on_the_default_directory_keep_their_checkpoints_across_restarts(
        tiny_model_dir, tiny_model_dir_b, tmp_path):
    """Two daemons of different models, both with --disk-checkpoints on the DEFAULT directory:
    restarting either one deletes nothing of the other, and each restores its own checkpoints."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    root = tmp_path / "state" / "cairn" / "checkpoints"          # the default, from XDG_STATE_HOME
    socks = {"a": tmp_path / "a.sock", "b": tmp_path / "b.sock"}
    models = {"a": tiny_model_dir, "b": tiny_model_dir_b}
    sys_msg = {"role": "system", "content": SYSTEM}

    def body(turn: int) -> dict:
        return chat([sys_msg, user(turn, f"T{turn}")], max_tokens=1)

    def start(name: str) -> Proc:
        return Proc(models[name], socks[name], None, env=env, threads=1)   # two daemons on 2 cores

    procs = {name: start(name) for name in ("a", "b")}
    try:
        for name in ("a", "b"):
            await procs[name].ready()
        with trio.fail_after(120):
            for name in ("a", "b"):                               # both write their checkpoints
                await post(socks[name], body(1))
                await wait_disk(socks[name], 2)
            written = {str(f) for f in root.rglob("*.ckpt")}
            assert len(written) == 4
            for turn, name in enumerate(("a", "b", "a"), start=2):  # restart a, then b, then a again
                procs[name].stop()
                assert procs[name].p.returncode == 0
                procs[name] = start(name)
                await procs[name].ready()
                assert written <= {str(f) for f in root.rglob("*.ckpt")}   # nobody's files deleted
                other = "b" if name == "a" else "a"
                r = await post(socks[name], body(turn))
                system = [row for row in await listing(socks[name]) if row["kind"] == "system"]
                assert system and cached(r) >= system[0]["tokens"] > 0   # restored from its own disk files
                assert "disk" in system[0]["tier"]
                assert [e for e in procs[name].lines if e.get("event") == "checkpoint_hit" and e.get("tier") == "disk"]
                r_other = await post(socks[other], body(turn + 10))   # the other one never lost its own
                assert cached(r_other) > 0
    finally:
        for d in procs.values():
            if d.p.poll() is None:
                d.stop()
    lines = [e for d in procs.values() for e in d.lines]
    assert not [e for e in lines if e.get("event") in ("checkpoint_file_bad", "checkpoint_disk_unavailable")]
    assert written <= {str(f) for f in root.rglob("*.ckpt")}
    assert len({f.parent for f in root.glob("*/*.ckpt")}) == 2       # one subdirectory per model


async def test_two_daemons_of_the_same_model_on_one_directory_the_second_runs_memory_only(loaded, tmp_path):
    """The documented choice: the first daemon owns the model's checkpoint subdirectory (a lock); a
    second one of the same model serves with memory checkpoints only and says why. Nothing of the
    first is touched, and the second takes the directory over once the first is gone."""
    ckdir, s1, s2 = tmp_path / "ck", tmp_path / "one.sock", tmp_path / "two.sock"
    disk = dict(disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON)
    sys_msg = {"role": "system", "content": SYSTEM}
    with trio.fail_after(120), capture_logs() as evs:
        async with daemon(loaded, s1, **disk):
            await post(s1, chat([sys_msg, user(1)]))
            first_rows = await wait_disk(s1, 2)
            files = sorted(str(f) for f in ckdir.rglob("*.ckpt"))
            async with daemon(loaded, s2, **disk):
                warn = events(evs, "checkpoint_disk_unavailable")
                r2 = await post(s2, chat([sys_msg, user(2, "B")]))
                r2b = await post(s2, chat([sys_msg, user(3, "C")]))
                second_rows = await listing(s2)
                st2 = (await request(s2, "GET", "/v1/status")).json()
            await post(s1, cmpl(ids(100)))                   # the first keeps writing
            await wait_disk(s1, 3)
            after = sorted(str(f) for f in ckdir.rglob("*.ckpt"))
        async with daemon(loaded, s2, **disk):               # the first one has stopped: lock is free
            r3 = await post(s2, chat([sys_msg, user(4, "D")]))
    assert len(warn) == 1 and warn[0]["during"] == "lock" and warn[0]["log_level"] == "warning"
    assert f"pid {os.getpid()}" in warn[0]["error"]
    assert cached(r2) == 0 and cached(r2b) > 0              # memory checkpoints work in the second one
    assert {r["tier"] for r in second_rows} == {"memory"}
    assert st2["checkpoints"]["disk"]["enabled"] is False and st2["checkpoints"]["disk"]["count"] == 0
    assert set(files) <= set(after) and len(after) == len(files) + 1
    assert len(first_rows) == 2 and cached(r3) == [r for r in first_rows if r["kind"] == "system"][0]["tokens"]


async def test_a_developer_role_conversation_restores_the_system_checkpoint(loaded, tmp_path):
    # `developer` (Codex, the openai SDK) renders as `system` byte for byte, so it shares the checkpoint.
    sock = tmp_path / "c.sock"
    bodies = [chat([{"role": "system", "content": SYSTEM}, user(1)]),
              chat([{"role": "developer", "content": SYSTEM}, user(2, "B")])]
    with trio.fail_after(60), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            r1 = await post(sock, bodies[0])
            rows = await listing(sock)
            r2 = await post(sock, bodies[1])
    (system,) = [r for r in rows if r["kind"] == "system"]
    assert cached(r1) == 0 and cached(r2) == system["tokens"] >= 32
    assert [h["id"] for h in events(evs, "checkpoint_hit")] == [system["id"]]
    assert_parity([r1, r2], await replay_off(loaded, tmp_path, bodies))


# --- pages: checkpoints of one conversation share their prefix's page groups ---------------------

async def test_turns_share_pages_in_memory_and_on_disk_and_answer_as_without_checkpoints(tiny_model_dir, tmp_path):
    """16-token pages: two conversations on one system prompt, alternating, each turn a checkpoint.
    Later turns' checkpoints share the earlier ones' groups (listing: shared_bytes), the store holds
    less than the sum of their whole sizes, a restarted daemon restores from the page files, and
    every answer equals the one with checkpoints off."""
    paged = real_loaded(tiny_model_dir, checkpoint_page_tokens=16)
    sock, ckdir = tmp_path / "p.sock", tmp_path / "ck"
    disk = dict(disk_checkpoints=True, checkpoint_dir=str(ckdir), **ON)
    system = ids(100)
    convs = {"a": system + ids(60), "b": system + ids(45)}
    bodies, out = [], []
    with trio.fail_after(120), capture_logs() as evs:
        async with daemon(paged, sock, **disk):
            for turn in range(3):
                for k in "ab":
                    body = cmpl(convs[k])
                    r = await post(sock, body)
                    bodies.append(body)
                    out.append(r)
                    convs[k] = convs[k] + ids(30 + 7 * turn)
            rows = await listing(sock)
            status = (await request(sock, "GET", "/v1/status")).json()
            await wait_disk(sock, len(rows))
        async with daemon(paged, sock, **disk):     # restarted: only the files
            for k in "ab":
                body = cmpl(convs[k])
                out.append(await post(sock, body))
                bodies.append(body)
    assert any(r["shared_bytes"] > 0 for r in rows)
    assert status["checkpoints"]["memory"]["bytes"] < sum(r["bytes"] for r in rows)
    pages = list((model_ckdir(ckdir, paged) / "pages").glob("*.page"))
    assert pages and len(pages) < sum(r["tokens"] // 16 for r in rows)       # stored once each
    assert events(evs, "checkpoint_hit", tier="disk")                         # after the restart
    assert all(cached(r) > 0 for r in out[2:])                                # every switch back restored
    assert_parity(out, await replay_off(paged, tmp_path, bodies))

"""The memory guard (actors/engine/memory_guard.py) with the fake kernel: a growing state gets room by evicting
checkpoints first; when even that is not enough its request ends with HTTP 507 `insufficient_memory`
and the next request is served; a capture whose snapshot could not be kept is never taken."""

from __future__ import annotations

import dataclasses

import numpy as np
import trio
from structlog.testing import capture_logs

import fake_kernel
from cairn.actors.checkpoints.actor import Checkpoints
from cairn.actors.engine.engine import Engine
from cairn.actors.engine.memory_guard import MemoryExceeded, MemoryGuard
from cairn.daemon.service.memory_plan import LimitSource, ModelBytes, StateCost, plan_memory
from cairn.daemon.service.metrics import Metrics
from daemon_harness import daemon, fake_loaded, request

VOCAB = 512
# The fake kernel's State.nbytes is 64 bytes a token: one HCA-like layer at rate 1, 16 floats a row.
FAKE_COST = StateCost(("heavily_compressed_attention",), window=1, head_dim=16, index_head_dim=16, csa_rate=4,
                      hca_rate=1, vocab=VOCAB)


def fake_plan(*, states: int, checkpoints: int, transients: int | None = None):
    """A plan with the given parts (the rest as plan_memory computes them for a small room)."""
    base = plan_memory(limit=LimitSource("cgroup v1 memory.limit_in_bytes", 1 << 30, 0, "/test"),
                       weights=ModelBytes(1 << 20, 0), state=FAKE_COST, context_length=65536, slots_setting=1,
                       checkpoint_setting=checkpoints)
    return dataclasses.replace(base, state_bytes=states, checkpoint_bytes=checkpoints,
                               transient_bytes=checkpoints if transients is None else transients)


def test_fake_cost_matches_the_fake_kernel():
    model = fake_kernel.Model(vocab_size=VOCAB)
    st = fake_kernel.State(model)
    fake_kernel.prefill(st, np.arange(300, dtype=np.int32) % VOCAB)
    assert FAKE_COST.bytes_at(300) == st.nbytes + 4 * 300 + 4 * VOCAB


def test_guard_evicts_checkpoints_first_then_refuses_naming_memory():
    model = fake_kernel.Model(vocab_size=VOCAB)
    ck = Checkpoints(max_slots=4, max_bytes=1 << 20, metrics=Metrics())
    for i in range(3):                                   # three 20 kB checkpoints in memory
        ck.capture(np.full(600, i + 1, dtype=np.int32), "prompt_end", b"x" * 20_000, f"r{i}")
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck, metrics=Metrics())
    plan = fake_plan(states=100_000, checkpoints=60_000)
    guard = engine.memory = MemoryGuard(plan, engine, metrics=engine.metrics)
    seq = engine.slots[0]
    st = engine.new_state(seq)
    seq.request_id = "big"
    fake_kernel.prefill(st, np.ones(1000, dtype=np.int32))
    seq.publish()   # a kernel call outside the engine's runner: publish its figures
    # 1000 + 500 tokens: 1.25 x (68 x 1500 + 2048) = 130 kB; with 60 kB of checkpoints over the 160 kB pool
    engine.room_for(seq, 500)
    assert ck.store.memory_usage() == 20_000 and ck.store.stats().memory_entries == 1   # two evicted, one kept
    # 1000 + 1100 tokens: 181 kB alone is over the pool: every checkpoint goes, then the request ends
    try:
        engine.room_for(seq, 1100)
    except MemoryExceeded as e:
        msg = str(e)
    else:
        raise AssertionError("no MemoryExceeded")
    assert msg.startswith("memory:") and "2100 tokens" in msg and "cgroup v1 memory.limit_in_bytes" in msg
    assert ck.store.memory_usage() == 0 and guard.refused == 1
    assert guard.usage()["refused"] == 1 and engine.metrics.memory_refused.value() == 1
    engine.room_for(seq, 100)                       # a smaller step still fits: nothing raised


async def test_memory_error_is_a_507_naming_memory_and_the_next_request_is_served(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    # room for states of ~2300 tokens: a 3000-token prompt cannot be prefilled, a 200-token one can
    loaded.memory_plan = fake_plan(states=150_000, checkpoints=50_000)
    sock = tmp_path / "m.sock"
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(loaded, sock, chunk=64, segment=64):
            big = await request(sock, "POST", "/v1/completions",
                                {"model": "tiny", "prompt": [5] * 3000, "max_tokens": 4})
            small = await request(sock, "POST", "/v1/completions",
                                  {"model": "tiny", "prompt": [6] * 200, "max_tokens": 4, "temperature": 0})
            status = (await request(sock, "GET", "/v1/status")).json()
    assert big.status == 507
    err = big.json()["error"]
    assert err["code"] == "insufficient_memory" and err["message"].startswith("memory:")
    assert small.status == 200 and small.json()["usage"]["completion_tokens"] == 4
    assert any(e["event"] == "memory_exceeded" for e in events)
    mem = status["memory"]
    assert mem["plan"]["limit_source"].startswith("cgroup v1") and mem["in_use"]["refused"] == 1


async def test_decode_that_outgrows_the_plan_ends_the_stream_with_the_memory_error(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    loaded.memory_plan = fake_plan(states=30_000, checkpoints=0)         # ~330 tokens in all
    sock = tmp_path / "d.sock"
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock, checkpoints=False):
            r = await request(sock, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": [7] * 300, "max_tokens": 100, "stream": True,
                               "ignore_eos": True})
    events = r.events()
    assert r.status == 200 and events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if "choices" in e]
    assert 0 < len(tokens) < 100                                          # it decoded until the plan was full
    assert events[-2]["error"]["code"] == "insufficient_memory"


async def test_a_capture_that_could_not_be_kept_never_calls_the_snapshot(tiny_model_dir, tmp_path):
    """Budget 1 MiB: the prompt-end capture of a 20000-token prompt (1.3 MB) is skipped before the
    kernel's snapshot, with a log line and a metric; a 600-token prompt's capture is taken."""
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "s.sock"
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(loaded, sock, checkpoint_memory_mb=1):
            r = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [3] * 20000, "max_tokens": 1})
            assert r.status == 200
            assert loaded.model.snapshots == 0
            r = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [4] * 600, "max_tokens": 1})
            assert r.status == 200
            metrics = (await request(sock, "GET", "/metrics")).body.decode()
    assert loaded.model.snapshots == 1
    skipped = [e for e in events if e["event"] == "checkpoint_capture_skipped"]
    assert len(skipped) == 1 and skipped[0]["tokens"] == 20000 and "checkpoint memory budget" in skipped[0]["reason"]
    assert 'cairn_checkpoint_captures_skipped_total{reason="budget"} 1' in metrics


async def test_a_capture_without_transient_room_in_the_plan_is_not_taken(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    # the store would keep 1 MB, but the plan leaves room for a 10 kB copy only
    loaded.memory_plan = fake_plan(states=1 << 30, checkpoints=1 << 20, transients=10_000)
    sock = tmp_path / "t.sock"
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [3] * 600, "max_tokens": 1})
    assert r.status == 200 and loaded.model.snapshots == 0
    (skip,) = [e for e in events if e["event"] == "checkpoint_capture_skipped"]
    assert "room for a capture's copy" in skip["reason"]


def test_slot_mode_drops_an_idle_slots_state_after_the_checkpoints_and_never_a_busy_one():
    from cairn.actors.engine.sequence import Sequence

    model = fake_kernel.Model(vocab_size=VOCAB)
    ck = Checkpoints(max_slots=4, max_bytes=1 << 20)
    ck.capture(np.full(600, 1, dtype=np.int32), "prompt_end", b"x" * 10_000, "r0")
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
    engine.slots = [Sequence(i) for i in range(3)]
    engine.memory = MemoryGuard(fake_plan(states=200_000, checkpoints=10_000), engine)
    idle, busy, growing = engine.slots
    for slot, n in ((idle, 800), (busy, 800), (growing, 200)):
        fake_kernel.prefill(engine.new_state(slot), np.ones(n, dtype=np.int32))
        slot.publish()   # a kernel call outside the engine's runner: publish its figures
    busy.request_id, growing.request_id = "busy", "grow"
    # growing to 800: three states of 1.25 x (68 x 800 + 2048) = 70.6 kB + 10 kB of checkpoints > 210 kB,
    # and still over without the checkpoints
    engine.room_for(growing, 600)
    assert ck.store.memory_usage() == 0 and idle.state is None and busy.state is not None
    # growing to 1700 (147 kB): with the busy state's 70.6 kB over the pool; the busy one is never touched
    try:
        engine.room_for(growing, 1500)
    except MemoryExceeded:
        pass
    else:
        raise AssertionError("no MemoryExceeded")
    assert busy.state is not None and growing.state is not None


def test_page_groups_a_live_state_shares_with_checkpoints_count_once_in_the_pool():
    """A state restored from a checkpoint shares its groups: the pool counts them once, so a growth
    that fits with sharing evicts nothing (counted twice it would have evicted the checkpoint)."""

    class Snap:            # a checkpoint holding groups 0..9
        own_nbytes, page_ids, page_nbytes = 1000, list(range(10)), 5000

    class PagedState(fake_kernel.State):
        page_ids, page_nbytes = np.arange(10, dtype=np.uint64), 5000

    model = fake_kernel.Model(vocab_size=VOCAB)
    ck = Checkpoints(max_slots=4, max_bytes=1 << 20)
    ck.capture(np.full(600, 1, dtype=np.int32), "system", Snap(), "r0")
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
    guard = engine.memory = MemoryGuard(fake_plan(states=80_000, checkpoints=40_000), engine)
    seq = engine.slots[0]
    seq.state, seq.request_id = PagedState(model), "grow"
    fake_kernel.prefill(seq.state, np.ones(1000, dtype=np.int32))
    seq.publish()   # a kernel call outside the engine's runner: publish its figures
    resident = guard.plan.state_cost.resident_at
    assert guard.usage()["pool_in_use_bytes"] == resident(1000) + 1000      # the groups once, not twice
    # 1100 tokens: resident(1100) + 1000 = 97 kB of a 120 kB pool; counted twice it would be 147 kB
    assert resident(1100) + 1000 <= 120_000 < resident(1100) + 51_000
    engine.room_for(seq, 100)
    assert ck.store.stats().memory_entries == 1                             # nothing had to go


def test_try_reserve_answers_false_without_ending_or_counting_and_still_makes_room():
    """The non-raising check (a draft that has no room is not sent): it evicts like reserve, answers
    False when even that is not enough, and neither counts a refusal nor raises."""
    model = fake_kernel.Model(vocab_size=VOCAB)
    ck = Checkpoints(max_slots=4, max_bytes=1 << 20, metrics=Metrics())
    ck.capture(np.full(600, 1, dtype=np.int32), "prompt_end", b"x" * 20_000, "r0")
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck, metrics=Metrics())
    guard = engine.memory = MemoryGuard(fake_plan(states=100_000, checkpoints=60_000), engine, metrics=engine.metrics)
    seq = engine.slots[0]
    fake_kernel.prefill(engine.new_state(seq), np.ones(1000, dtype=np.int32))
    seq.publish()   # a kernel call outside the engine's runner: publish its figures
    seq.request_id = "r"
    assert engine.try_room_for(seq, 800)                        # fits once the checkpoint has gone
    assert ck.store.memory_usage() == 0
    assert not engine.try_room_for(seq, 5000)                   # no room: False, nothing raised
    assert guard.refused == 0 and engine.metrics.memory_refused.value() == 0
    engine.room_for(seq, 1)                                     # a plain step still fits


def test_evicting_goes_on_until_there_is_room_when_older_checkpoints_share_the_live_states_pages():
    """Issue 40 §2: the older prompt-end checkpoint shares its groups with the live state, so evicting
    it frees only its tail; the guard goes on to the checkpoint whose groups nobody else holds instead
    of refusing (the store used to count the shared groups as freed and stop)."""

    def snap(pages):
        return type("Snap", (), {"own_nbytes": 1000, "page_ids": list(pages), "page_nbytes": 5000})()

    class PagedState(fake_kernel.State):
        page_ids, page_nbytes = np.arange(10, dtype=np.uint64), 5000

    model = fake_kernel.Model(vocab_size=VOCAB)
    ck = Checkpoints(max_slots=4, max_bytes=1 << 20)
    ck.capture(np.full(600, 1, dtype=np.int32), "prompt_end", snap(range(10)), "r0")          # shares 0..9
    ck.capture(np.full(700, 2, dtype=np.int32), "prompt_end", snap(range(100, 110)), "r1")    # its own groups
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
    guard = engine.memory = MemoryGuard(fake_plan(states=80_000, checkpoints=40_000), engine)
    seq = engine.slots[0]
    seq.state, seq.request_id = PagedState(model), "grow"
    fake_kernel.prefill(seq.state, np.ones(1000, dtype=np.int32))
    seq.publish()
    resident = guard.plan.state_cost.resident_at
    # growing to 1100: 2 tails + its tail + 20 groups = 148 kB of a 120 kB pool; without the second
    # checkpoint 96 kB fits, without the first alone 147 kB does not
    assert 2000 + resident(1100) + 50_000 > 120_000 >= resident(1100) and 1000 + resident(1100) + 50_000 > 120_000
    engine.room_for(seq, 100)                                      # no MemoryExceeded
    assert ck.store.stats().memory_entries == 0 and guard.refused == 0
    assert guard._in_use(guard._live(), seq, 1100) == resident(1100) <= 120_000


async def test_a_restore_without_room_in_the_plan_is_skipped_and_the_request_prefills():
    """Issue 40 §3: bringing a checkpoint in (the new live state; from disk also the file read and the
    snapshot rebuilt from it: twice its size) holds room in the plan first, evicting other checkpoints
    (never the one restored) and, if that is not enough, the live state it would replace. Without room
    even then, the restore is not tried and the request is planned again: it prefills fresh."""
    from types import SimpleNamespace

    from structlog import get_logger

    from cairn.actors.engine.prefill import _prepare

    ids = np.arange(3, 903, dtype=np.int32)
    submit = SimpleNamespace(request_id="r", hint_tokens=None, turn_tokens=None, prompt_logprobs=False,
                             turn_end_tokens=None)
    model = fake_kernel.Model(vocab_size=VOCAB)
    src = fake_kernel.State(model)
    fake_kernel.prefill(src, ids[:600])
    resident = FAKE_COST.resident_at
    outcomes = {}
    for pool in (55_000, 100_000):
        ck = Checkpoints(max_slots=8, max_bytes=1 << 20)
        ck.capture(ids[:600], "prompt_end", src.snapshot(), "r0")                        # the one to restore
        ck.capture(np.full(700, 1, dtype=np.int32), "prompt_end", b"o" * 30_000, "r1")   # newer, but evictable
        engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
        guard = engine.memory = MemoryGuard(fake_plan(states=pool - 50_000, checkpoints=50_000), engine)
        seq = engine.slots[0]
        seq.request_id = "r"
        old = engine.new_state(seq)
        fake_kernel.prefill(old, np.full(300, 2, dtype=np.int32))      # a live state the checkpoint beats
        seq.publish()
        with capture_logs() as events:
            plan, state = await _prepare(engine, seq, submit, ids, get_logger())
        skipped = [e for e in events if e["event"] == "checkpoint_restore_skipped"]
        outcomes[pool] = (plan.action, len(skipped), seq.state is state, int(state.n_tokens),
                          ck.store.contains(ids[:600]), ck.store.stats().memory_entries)
        assert guard.held == 0                                          # the hold was let go
    need = resident(600)                                                # the new live state
    snap = len(src.snapshot())
    assert need + snap > 55_000 and resident(300) + need + snap + 30_000 > 100_000 >= need + snap + resident(300)
    # no room even with the other checkpoint and the old live state gone: planned again, fresh (and the
    # other checkpoint is not evicted for a hold that could not be made anyway)
    assert outcomes[55_000] == ("fresh", 1, True, 0, True, 2)
    # room once the other checkpoint is evicted (the restored one is spared): restored, 600 tokens
    assert outcomes[100_000] == ("restore", 0, True, 600, True, 1)


def test_a_capture_the_store_would_drop_beside_its_protected_entry_is_refused_before_the_snapshot():
    """Issue 40 §3: the store keeps its protected system prefix and refuses a newcomer that does not fit
    beside it; the capture is refused before the snapshot is taken (and holds the kernel gate), not
    taken and then dropped. The same state is captured when the protected entry leaves room."""
    model = fake_kernel.Model(vocab_size=VOCAB)
    for system_bytes, refused in ((990_000, True), (900_000, False)):
        ck = Checkpoints(max_slots=4, max_bytes=1_000_000)
        ck.capture(np.full(800, 5, dtype=np.int32), "system", b"s" * system_bytes, "r0")
        engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
        seq = engine.slots[0]
        fake_kernel.prefill(engine.new_state(seq), np.ones(600, dtype=np.int32))
        seq.publish()
        nbytes, why = engine.capture_refusal(seq, "prompt_end")
        assert nbytes == seq.figures.tail_nbytes and (why is not None) == refused, (system_bytes, why)
        if refused:
            assert "beside the protected checkpoint" in why
        # what put does with a snapshot of that size agrees
        ck.capture(np.ones(600, dtype=np.int32), "prompt_end", b"t" * nbytes, "r1")
        assert ck.store.contains(np.ones(600, dtype=np.int32)) == (not refused)


async def test_every_restore_skipped_for_room_the_request_still_prefills_to_the_reference_answer():
    """Issue 40 (the soak): a prompt with more stored prefixes than the prefill tries, none of which the
    plan has room to bring in (each held beside the checkpoints it must keep), used to end with HTTP 500
    "checkpoints kept failing". Skipped restores only cost their tokens: it prefills from scratch, with
    the reference logits, evicting the checkpoints as its state grows."""
    from types import SimpleNamespace

    from structlog import get_logger

    from cairn.actors.engine.messages import Sampling
    from cairn.actors.engine.prefill import MAX_RESTORE_ATTEMPTS, run_prefill
    from cairn.actors.engine.trace import RequestTrace

    ids = np.arange(3, 903, dtype=np.int32) % VOCAB
    model = fake_kernel.Model(vocab_size=VOCAB)
    ref = fake_kernel.State(model)
    _, ref_logits = fake_kernel.prefill(ref, ids)
    lengths = [520 + 60 * k for k in range(MAX_RESTORE_ATTEMPTS + 2)]     # more prefixes than the prefill tries
    ck = Checkpoints(max_slots=16, max_bytes=1 << 20)
    for n in lengths:      # never restored: a blob as large as a wide model's checkpoint stands in for each
        ck.capture(ids[:n], "prompt_end", b"c" * 40_000, "r0")
    resident = FAKE_COST.resident_at
    pool = resident(len(ids)) + 1_000
    assert all(resident(n) + 40_000 > pool for n in lengths)      # no restore fits beside its own checkpoint
    engine = Engine(fake_kernel, model, None, 65536, checkpoints=ck)
    guard = engine.memory = MemoryGuard(fake_plan(states=pool - 250_000, checkpoints=250_000), engine)
    seq = engine.slots[0]
    seq.request_id = "r"
    submit = SimpleNamespace(request_id="r", prompt=tuple(int(t) for t in ids), hint_tokens=None, turn_tokens=None,
                             prompt_logprobs=False, turn_end_tokens=None, trace=RequestTrace(),
                             sampling=Sampling(max_tokens=1, temperature=0.0), reply=trio.open_memory_channel(64)[0])
    with capture_logs() as events:
        logits, reused, _ = await run_prefill(engine, seq, submit, get_logger())
    skipped = [e for e in events if e["event"] == "checkpoint_restore_skipped"]
    assert len(skipped) >= MAX_RESTORE_ATTEMPTS                    # every try was refused for room
    assert reused == 0 and int(seq.state.n_tokens) == len(ids)
    np.testing.assert_array_equal(logits, ref_logits)
    assert guard.held == 0 and guard.refused == 0

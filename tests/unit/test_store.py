"""CheckpointStore: prefix lookup, both budgets, eviction order, protection of the system prefix."""

import numpy as np
import pytest

from cairn.actors.checkpoints.disk_format import prefix_hash
from cairn.actors.checkpoints.store import CheckpointStore

SYSTEM = list(range(1000, 1800))  # an 800-token system prefix


def blob(n: int = 100) -> bytes:
    return b"x" * n


def test_longest_prefix_is_strictly_shorter_and_verified():
    s = CheckpointStore(max_slots=8)
    s.put(SYSTEM[:600], "common", blob())
    s.put(SYSTEM, "system", blob())
    prompt = SYSTEM + [5, 6, 7]
    assert s.longest_prefix(prompt).n_tokens == 800
    assert s.longest_prefix(SYSTEM).n_tokens == 600          # equal length excluded by default
    assert s.longest_prefix(SYSTEM, strict=False).n_tokens == 800
    assert s.longest_prefix([1, 2, 3] + SYSTEM) is None
    assert s.longest_prefix(SYSTEM[:599]) is None
    assert [e.n_tokens for e in s.prefixes_of(prompt)] == [800, 600]
    assert s.contains(SYSTEM) and not s.contains(SYSTEM[:700])
    assert s.get(prefix_hash(SYSTEM)).kind == "system"


def test_lookup_verifies_ids_not_just_the_hash():
    s = CheckpointStore()
    s.put(SYSTEM, "system", blob())
    e = s.get(prefix_hash(SYSTEM))
    fake = np.array(SYSTEM, dtype=np.int32)
    fake[10] += 1
    fake.flags.writeable = False
    e.tokens = fake  # as if another prefix had collided on the hash
    assert s.longest_prefix(SYSTEM + [1]) is None
    assert not s.contains(SYSTEM)


def test_lru_and_prompt_end_first_under_slot_budget():
    s = CheckpointStore(max_slots=3)
    s.put(list(range(10)), "common", blob())
    s.put(list(range(20)), "prompt_end", blob())
    s.put(list(range(30)), "prompt_end", blob())
    s.touch(prefix_hash(list(range(20))))         # 20 is now more recent than 30
    ev = s.put(list(range(40)), "common", blob())  # over by one: LRU prompt_end goes first
    assert [(v.entry.n_tokens, v.tier, v.dropped) for v in ev] == [(30, "memory", True)]
    ev = s.put(list(range(50)), "common", blob())
    assert [v.entry.n_tokens for v in ev] == [20]  # the last prompt_end before any prefix capture
    ev = s.put(list(range(60)), "common", blob())
    assert [v.entry.n_tokens for v in ev] == [10]  # then LRU of prefix captures
    assert s.stats().memory_entries == 3


def test_reply_end_captures_go_with_the_prompt_ends_before_prefix_captures():
    s = CheckpointStore(max_slots=3)
    s.put(list(range(10)), "common", blob())
    s.put(list(range(20)), "reply_end", blob())
    s.put(list(range(30)), "prompt_end", blob())
    ev = s.put(list(range(40)), "common", blob())   # turn ends first, least recently used first
    assert [v.entry.n_tokens for v in ev] == [20]
    ev = s.put(list(range(50)), "reply_end", blob())
    assert [v.entry.n_tokens for v in ev] == [30]
    s.put(list(range(50)), "common", blob())         # the same ids as a prefix capture: upgraded
    assert s.get(prefix_hash(list(range(50)))).kind == "common"
    s.put(list(range(40)), "reply_end", blob())      # never downgraded
    assert s.get(prefix_hash(list(range(40)))).kind == "common"


def test_byte_budget_evicts_until_it_fits():
    s = CheckpointStore(max_slots=10, max_bytes=1000)
    for n in (10, 20, 30):
        s.put(list(range(n)), "prompt_end", blob(300))
    ev = s.put(list(range(40)), "prompt_end", blob(500))
    assert [v.entry.n_tokens for v in ev] == [10, 20]
    assert s.stats().memory_bytes == 800


def test_entry_larger_than_the_budget_is_refused():
    s = CheckpointStore(max_bytes=1000)
    s.put(list(range(10)), "prompt_end", blob(600))
    ev = s.put(list(range(20)), "prompt_end", blob(5000))
    assert [(v.entry.n_tokens, v.dropped) for v in ev] == [(20, True)]
    assert s.contains(list(range(10))) and len(s) == 1


@pytest.mark.parametrize("protect", [True, False])
def test_system_checkpoint_survives_a_burst_of_20_side_requests(protect):
    s = CheckpointStore(max_slots=4, protect_system=protect)
    s.record_prompt(SYSTEM + [1])
    s.put(SYSTEM, "system", blob(1000))
    main_turn = SYSTEM + list(range(2000, 2300))
    s.record_prompt(main_turn)
    s.put(main_turn, "prompt_end", blob(1300))
    for i in range(20):  # titles / sub-agents: another system prompt, each a common + prompt_end
        side_sys = list(range(5000 + i, 5600 + i))
        side = side_sys + [7] * (100 + i)
        s.record_prompt(side)
        s.put(side_sys, "common", blob(900))
        s.put(side, "prompt_end", blob(1000))
    if not protect:  # the test bites: plain LRU loses it
        assert not s.contains(SYSTEM)
        return
    assert s.contains(SYSTEM)
    assert s.protected_id == prefix_hash(SYSTEM)
    assert s.longest_prefix(SYSTEM + [42]).kind == "system"


def test_newcomer_refused_rather_than_evicting_the_protected_entry():
    s = CheckpointStore(max_slots=1)
    s.put(SYSTEM, "system", blob())
    ev = s.put(list(range(700)), "prompt_end", blob())
    assert [v.entry.n_tokens for v in ev] == [700] and s.contains(SYSTEM)


def test_protection_moves_to_a_system_prompt_that_saves_more():
    s = CheckpointStore(max_slots=2)
    old, new = SYSTEM, list(range(9000, 9600))
    s.put(old, "system", blob())
    s.put(new, "system", blob())
    assert s.protected_id == prefix_hash(old)        # 1 share x 800 > 1 x 600
    s.record_prompt(new + [1])
    assert s.protected_id == prefix_hash(new)        # 2 x 600 > 800
    s.put(list(range(50)), "common", blob())          # the unprotected old system prefix goes
    assert not s.contains(old) and s.contains(new)


def test_without_system_entries_the_best_common_prefix_is_protected():
    s = CheckpointStore(max_slots=2)
    s.put(SYSTEM, "common", blob())
    for i in range(5):
        s.put(list(range(100 * i, 100 * i + 50)), "common", blob())
    assert s.contains(SYSTEM)


def test_put_existing_upgrades_kind_and_loads_blob():
    s = CheckpointStore(disk_max_bytes=10_000)
    s.put_disk(SYSTEM, "prompt_end", nbytes=100, disk_nbytes=150)
    e = s.get(prefix_hash(SYSTEM))
    assert e.tier == "disk" and e.snapshot is None
    s.put(SYSTEM, "system", blob(100))
    assert e.tier == "memory" and e.on_disk and e.kind == "system" and len(s) == 1


def test_disk_tier_budget_and_lru():
    s = CheckpointStore(max_slots=1, disk_max_bytes=1000, disk_max_slots=10)
    for n in (10, 20, 30):
        s.put_disk(list(range(n)), "common", nbytes=300, disk_nbytes=400)
    st = s.stats()
    assert (st.disk_entries, st.disk_bytes) == (2, 800)
    assert not s.contains(list(range(10)))           # LRU file evicted, caller deletes it
    s.put(list(range(20)), "common", blob())
    ev = s.put(list(range(5)), "prompt_end", blob())
    assert [(v.entry.n_tokens, v.tier, v.dropped) for v in ev] == [(5, "memory", True)]  # 20 is protected
    # a memory entry that is also on disk: dropping it from memory keeps it indexed as disk-only
    s2 = CheckpointStore(max_slots=1, disk_max_bytes=1000)
    s2.put_disk(list(range(20)), "prompt_end", nbytes=100, disk_nbytes=150)
    s2.put(list(range(20)), "prompt_end", blob())
    ev = s2.put(list(range(30)), "prompt_end", blob())
    assert [(v.entry.n_tokens, v.tier, v.dropped) for v in ev] == [(20, "memory", False)]
    assert s2.get(prefix_hash(list(range(20)))).tier == "disk"


def test_disk_off_refuses_files():
    s = CheckpointStore()  # disk_max_bytes = 0
    ev = s.put_disk(SYSTEM, "system", nbytes=10, disk_nbytes=20)
    assert [(v.tier, v.dropped) for v in ev] == [("disk", True)] and len(s) == 0


def test_remove_tiers_and_stats():
    s = CheckpointStore(disk_max_bytes=10_000)
    s.put(SYSTEM, "system", blob(100))
    s.put_disk(SYSTEM, "system", nbytes=100, disk_nbytes=130)
    eid = prefix_hash(SYSTEM)
    s.touch(eid)
    st = s.stats()
    assert (st.memory_entries, st.memory_bytes, st.disk_entries, st.disk_bytes, st.hits) == (1, 100, 1, 130, 1)
    assert st.entries_by_kind == {"system": 1, "common": 0, "prompt_end": 0, "reply_end": 0}
    s.remove(eid, "disk")
    assert s.get(eid).tier == "memory" and not s.get(eid).on_disk
    s.remove(eid)
    assert s.get(eid) is None and s.remove(eid) is None


def test_deterministic_clock_injection():
    t = iter(range(100, 200))
    s = CheckpointStore(clock=lambda: next(t))
    s.put([1] * 10, "common", blob())
    e = s.entries()[0]
    assert (e.created, e.last_used) == (100, 100)
    s.touch(e.id)
    assert e.last_used == 101 and e.hits == 1


def test_unknown_kind_rejected():
    with pytest.raises(ValueError):
        CheckpointStore().put([1, 2], "nope", blob())


def test_blobs_held_for_the_writer_count_against_the_memory_budget_until_released():
    s = CheckpointStore(max_slots=4, max_bytes=250)
    a, b, c = [7] * 10, [8] * 10, [9] * 10
    s.put(a, "prompt_end", blob(100))
    s.hold(prefix_hash(a), b"x" * 100)                      # queued for the disk writer
    assert s.can_hold(prefix_hash(a), b"x" * 100) and s.memory_usage() == 100   # counted once
    s.put(b, "prompt_end", blob(100))
    s.hold(prefix_hash(b), b"x" * 100)
    assert not s.can_hold(prefix_hash(c), b"x" * 100)       # 200 + 100 would break 250
    # a third blob: evicting a held entry would free no bytes (it stays queued), so only the
    # newcomer is refused and the held ones stay usable from memory
    ev = s.put(c, "prompt_end", blob(100))
    assert [e.entry.id for e in ev] == [prefix_hash(c)]
    assert s.memory_usage() == 200 and s.queued_bytes == 0 and s.stats().memory_bytes == 200
    s.remove(prefix_hash(a))                         # e.g. DELETE while its write is queued
    assert s.memory_usage() == 200 == s.queued_bytes + 100
    s.release(prefix_hash(a))                        # written (or cancelled): the bytes are free
    s.release(prefix_hash(b))
    assert s.memory_usage() == 100 and s.queued_bytes == 0
    assert s.put(c, "prompt_end", blob(100)) == [] and s.memory_usage() == 200


def toks(n: int) -> list[int]:
    return list(range(n))


class _Snap:
    """A stand-in for a kernel Snapshot: own bytes and the page groups it references."""

    def __init__(self, own: int, pages, page_nbytes: int = 100):
        self.own_nbytes, self.page_ids, self.page_nbytes = own, list(pages), page_nbytes


def test_page_groups_shared_by_checkpoints_count_once_and_leave_with_the_last():
    s = CheckpointStore(max_slots=64, max_bytes=10_000)
    base = list(range(20))                               # a shared prefix of 20 groups (2000 bytes)
    s.put(toks(1), "system", _Snap(50, base))
    s.put(toks(2), "prompt_end", _Snap(50, base + [100, 101]))
    s.put(toks(3), "prompt_end", _Snap(50, base + [200]))
    assert s.memory_usage() == 3 * 50 + (20 + 3) * 100   # not 3 whole states
    st = s.stats()
    assert st.memory_bytes == s.memory_usage() and st.shared_bytes == 20 * 100
    assert s.breakdown(s.get(prefix_hash(toks(2)))) == (50 + 200, 2000)
    # evicting one frees its tail and the groups only it held, never the shared ones
    s.remove(prefix_hash(toks(2)), "memory")
    assert s.memory_usage() == 2 * 50 + 21 * 100
    s.remove(prefix_hash(toks(3)), "memory")
    s.remove(prefix_hash(toks(1)), "memory")
    assert s.memory_usage() == 0


def test_memory_budget_counts_unique_pages_so_many_turns_fit():
    # ten turns of one conversation: each adds one group to the last; whole copies would need
    # 10 * ~5500 bytes, shared pages need 10 * 50 + 59 * 100
    s = CheckpointStore(max_slots=64, max_bytes=7_000)
    for t in range(10):
        s.put(toks(t + 1), "prompt_end", _Snap(50, range(50 + t)))
    assert s.stats().memory_entries == 10 and s.memory_usage() == 10 * 50 + 59 * 100
    # one more over the budget evicts the least recently used, freeing only its tail
    s.put(toks(99), "prompt_end", _Snap(50, list(range(59)) + [500, 501, 502, 503, 504, 505, 506, 507, 508, 509]))
    assert s.memory_usage() <= 7_000
    assert s.get(prefix_hash(toks(1))) is None                 # the oldest turn went
    assert s.get(prefix_hash(toks(99))).in_memory


def test_disk_pages_are_freed_when_their_last_checkpoint_leaves():
    s = CheckpointStore(disk_max_bytes=1_000_000)
    shared = [("p0.page", 1000), ("p1.page", 1000)]
    s.put_disk(toks(1), "system", 2000, 300, pages=shared)
    s.put_disk(toks(2), "prompt_end", 3000, 300, pages=shared + [("p2.page", 1000)])
    assert s.disk_usage() == 600 + 3000
    assert s.disk_breakdown(s.get(prefix_hash(toks(2)))) == (300 + 1000, 2000)
    s.remove(prefix_hash(toks(2)), "disk")
    assert s.orphan_pages(shared + [("p2.page", 1000)]) == ("p2.page",)
    # a budget eviction names the page files nobody references any more
    small = CheckpointStore(disk_max_bytes=3000)
    small.put_disk(toks(1), "prompt_end", 2000, 300, pages=shared)
    evs = small.put_disk(toks(2), "prompt_end", 2000, 300, pages=[("p2.page", 1000), ("p3.page", 1000)])
    assert [(e.entry.n_tokens, e.pages_freed) for e in evs] == [(1, ("p0.page", "p1.page"))]
    assert small.disk_usage() == 2300


class _Paged:
    """A snapshot footprint with shared page groups (what footprint() reads of a kernel Snapshot)."""

    def __init__(self, own: int, pages, page_nbytes: int = 1000) -> None:
        self.own_nbytes, self.page_ids, self.page_nbytes = own, list(pages), page_nbytes


def test_would_keep_predicts_whether_put_keeps_the_new_entry():
    """Issue 40 §3: a capture the store would drop at once (no room beside the protected entry and the
    queued snapshots) is refused before it is taken: `would_keep` says exactly what `put` then does
    (random stores: kinds, sizes, shared pages, queued snapshots, slot limits)."""
    from cairn.actors.checkpoints.store import footprint

    rng = np.random.default_rng(40)
    kinds = ("system", "common", "prompt_end", "reply_end")
    seen = {True: 0, False: 0}
    for trial in range(400):
        s = CheckpointStore(max_slots=int(rng.integers(1, 5)), max_bytes=int(rng.integers(2, 12)) * 1000)
        for i in range(int(rng.integers(0, 5))):
            tokens = [int(trial), i] + [7] * int(rng.integers(1, 40))
            pages = [int(p) for p in rng.choice(12, size=int(rng.integers(0, 4)), replace=False)]
            snap = _Paged(int(rng.integers(100, 3000)), pages)
            s.put(tokens, kinds[int(rng.integers(0, 4))], snap)
            if s.contains(tokens) and rng.random() < 0.25:
                s.hold(prefix_hash(tokens), snap)             # queued for the disk writer
        for _ in range(int(rng.integers(0, 3))):
            s.record_prompt([int(trial), 0] + [7] * 40)
        kind = kinds[int(rng.integers(0, 4))]
        tokens = [int(trial), 99] + [7] * int(rng.integers(1, 60))
        pages = [int(p) for p in rng.choice(12, size=int(rng.integers(0, 4)), replace=False)]
        snap = _Paged(int(rng.integers(100, 5000)), pages)
        predicted = s.would_keep(footprint(snap), kind, len(tokens))
        s.put(tokens, kind, snap)
        e = s.get(prefix_hash(tokens))
        kept = e is not None and e.in_memory
        assert predicted == kept, (trial, kind, predicted, kept)
        seen[kept] += 1
    assert min(seen.values()) > 50                           # both outcomes were exercised

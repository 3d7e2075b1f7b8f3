"""Prompt-lookup drafts (actors/decoding/drafts.py) and the per-request drafting policy
(actors/decoding/speculation.py)."""

import numpy as np
import pytest

from cairn.actors.decoding.drafts import PromptLookup, longest_match
from cairn.actors.decoding.speculation import (DEFAULT_DRAFT_COST, FIRST_DRAFT, FIRST_PAUSE, MAX_DRAFT, MIN_DRAFT_COST,
                                      WARMUP_CALLS, Speculation, draft_cost_of)


def test_lookup_equals_a_plain_scan_as_tokens_arrive():
    """Incremental lookup gives the reference scan's draft after every token (small alphabet: many
    matches, of every length)."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        seq = [int(t) for t in rng.integers(0, 4 + trial % 5, 120)]
        pl = PromptLookup(seq[:30])
        for i in range(30, len(seq)):
            for k in (1, 3, 8):
                assert pl.draft(k) == longest_match(seq[:i], k), (trial, i, k)
            pl.append(seq[i])


def test_bulk_extend_builds_what_appending_one_by_one_builds():
    rng = np.random.default_rng(1)
    seq = [int(t) for t in rng.integers(0, 6, 300)]
    one = PromptLookup()
    for t in seq:
        one.append(t)
    bulk = PromptLookup(seq[:7])
    for a, b in [(7, 8), (8, 100), (100, 101), (101, 300)]:
        bulk.extend(seq[a:b])
    assert bulk.tokens == one.tokens and bulk.draft(8) == one.draft(8)


def test_the_longest_suffix_wins_and_the_latest_occurrence_of_it():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    pl = PromptLookup([5, 1, 2, 9, 7, 1, 2, 8, 3, 5, 1, 2])
    assert pl.draft(2) == [9, 7]            # "5 1 2" occurred at 0..2 (followed by 9), "1 2" last at 5..6 (by 8)
    pl2 = PromptLookup([1, 2, 9, 1, 2, 8, 4, 1, 2])
    assert pl2.draft(3) == [8, 4, 1]        # only "1 2" matches: its latest earlier occurrence
    assert PromptLookup([1, 2, 3]).draft(4) == []       # nothing repeats
    assert PromptLookup([1, 2, 1, 2]).draft(0) == []


def test_draft_stops_at_the_end_of_the_history():
    pl = PromptLookup([7, 8, 9, 7, 8])
    assert pl.draft(10) == [9, 7, 8]


def test_bad_ngram_lengths_are_refused():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)


def _spec(prompt=(1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3)):
    return Speculation.over(prompt)


def test_draft_length_doubles_on_full_acceptance_and_shrinks_on_rejection():
    s = _spec()
    assert s.k == FIRST_DRAFT
    s.record(FIRST_DRAFT, FIRST_DRAFT)
    assert s.k == 2 * FIRST_DRAFT
    for _ in range(5):
        s.record(s.k, s.k)
    assert s.k == MAX_DRAFT
    s.record(MAX_DRAFT, 2)
    assert s.k == 3
    s.record(3, 0)
    assert s.k == 1
    assert s.stats["drafts"] == 8 and s.stats["accepted"] == 4 + 8 + 16 * 4 + 2


def test_drafting_pauses_when_it_loses_and_comes_back_longer_paused_each_time():
    s = _spec()
    assert s.draft(8) == [4, 5, 6, 7]         # "1 2 3" matched: what followed it, FIRST_DRAFT long
    for _ in range(WARMUP_CALLS):             # nothing accepted: a call of 4 drafts gives 1 token for 2 steps' cost
        s.record(4, 0, 0.25)
    assert s.paused_for == FIRST_PAUSE and s.stats["off"] == 1
    assert s.draft(8) == []
    for t in range(FIRST_PAUSE):
        s.push(t % 3)
    assert s.paused_for == 0 and s.draft(8) != []
    for _ in range(WARMUP_CALLS):
        s.record(4, 0, 0.25)
    assert s.paused_for == 2 * FIRST_PAUSE


def test_drafting_that_wins_stays_on():
    s = _spec()
    for _ in range(20):
        s.record(4, 3, 0.075)                 # 4 tokens per call at 1.3 plain steps: a gain of ~3
    assert s.paused_for == 0 and s.stats["off"] == 0
    assert s.gain == pytest.approx(4 / 1.3)


def test_each_request_decides_from_its_own_acceptance():
    """Two requests in the same batched steps (the same draft cost): the one whose drafts are all
    rejected turns drafting off for itself; the one whose drafts are kept goes on — whatever the
    measured cost, which stays within [MIN_DRAFT_COST, 1] (a rejected draft is never free; a draft
    token never costs more than a step of its own)."""
    for cost in (0.0, MIN_DRAFT_COST, DEFAULT_DRAFT_COST, 0.9, 5.0):
        rejected, kept = _spec(), _spec()
        for _ in range(WARMUP_CALLS):
            rejected.record(rejected.k, 0, cost)
            kept.record(kept.k, kept.k, cost)
        assert rejected.stats["off"] == 1 and rejected.draft(8) == [], cost
        assert kept.stats["off"] == 0 and kept.draft(8) != [], cost


def test_the_draft_cost_measured_from_step_times():
    assert draft_cost_of(1.5, 1.0, 4) == pytest.approx(0.125)   # 4 drafts added half a plain step
    assert draft_cost_of(0.9, 1.0, 4) == MIN_DRAFT_COST           # timing noise: never free
    assert draft_cost_of(9.0, 1.0, 4) == 1.0                      # never more than a step of its own
    assert draft_cost_of(1.0, 0.0, 4) == DEFAULT_DRAFT_COST       # nothing to compare with


def test_no_room_no_draft():
    s = _spec()
    assert s.draft(0) == []
    assert s.draft(2) == [4, 5]

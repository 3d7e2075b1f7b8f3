import numpy as np

from cairn.actors.engine.admission_queue import AdmissionQueue
from cairn.actors.engine.messages import Sampling
from cairn.actors.decoding.sampling import choose, log_softmax, make_rng, top_logprobs
from cairn.actors.decoding.stops import StopMatcher


def test_admission_queue_fifo_bounded_and_held_until_release():
    q = AdmissionQueue(capacity=2)
    assert q.offer("a", 1) and q.admit_next() == ("a", 1)
    assert q.offer("b", 2) and q.offer("c", 3) and not q.offer("d", 4)
    assert q.admit_next() is None                      # "a" still holds the engine
    assert q.remove("b") == 2 and q.remove("zz") is None
    q.release("a")
    assert q.admit_next() == ("c", 3)


def test_admission_queue_of_zero_rejects_while_busy():
    q = AdmissionQueue(capacity=0)
    assert q.offer("a", 1) and q.admit_next()
    assert not q.offer("b", 2)


def test_stop_matcher_holds_back_possible_prefix():
    m = StopMatcher(("END",))
    assert m.push("hello E") == ("hello ", False)
    assert m.push("N") == ("", False)
    assert m.push("D tail") == ("", True)
    m = StopMatcher(("END",))
    assert m.push("hello E") == ("hello ", False)
    assert m.push("x") == ("Ex", False)
    assert m.flush() == ""
    m = StopMatcher(("\n\n", "###"))
    assert m.push("a\n") == ("a", False)
    assert m.push("b##") == ("\nb", False)
    assert m.flush() == "##"


def test_sampling_greedy_seeded_and_topk():
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    assert choose(logits, Sampling(max_tokens=1, temperature=0), make_rng(0)) == 1
    s = Sampling(max_tokens=1, temperature=1.0, seed=5)
    a = [choose(logits, s, r) for r in [make_rng(5)] for _ in range(20)]
    b = [choose(logits, s, r) for r in [make_rng(5)] for _ in range(20)]
    assert a == b
    k2 = Sampling(max_tokens=1, temperature=1.5, top_k=2)
    rng = make_rng(1)
    assert {choose(logits, k2, rng) for _ in range(200)} <= {1, 3}
    p = Sampling(max_tokens=1, temperature=1.0, top_p=0.5)
    assert {choose(logits, p, rng) for _ in range(100)} == {1}


def test_logprobs_and_top():
    lp = log_softmax(np.array([0.0, 3.0, 1.0, 3.0]))
    assert abs(np.exp(lp).sum() - 1) < 1e-12
    assert [i for i, _ in top_logprobs(lp, 3)] == [1, 3, 2]


def test_all_logits_segments_stay_within_budget():
    from cairn.actors.engine.prefill import ALL_LOGITS_BUDGET, segment_length

    assert segment_length(4096, 128, 129280, all_logits=False) == 4096
    n = segment_length(4096, 128, 129280, all_logits=True)
    assert n % 128 == 0 and n * 129280 <= ALL_LOGITS_BUDGET
    assert segment_length(4096, 128, 512, all_logits=True) == 4096
    assert segment_length(4096, 128, 10**9, all_logits=True) == 128

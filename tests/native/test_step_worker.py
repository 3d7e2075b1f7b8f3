"""StepWorker: the GIL-free hand-off of decode steps (native/src/step_worker.h, actors/engine/call_thread.py).

The kernel thread waits in `serve` with the GIL released; `decode` posts a step and returns at once;
the worker's eventfd becomes readable when the step finished; `collect` returns its result. These
tests serve from a plain Python thread and wait on the fd with select, as the daemon does with Trio.
"""

import select
import threading
import time

import numpy as np
import pytest

import cairn._kernel as K


class Server:
    """A thread that serves `w` until stopped (post_python makes serve return; `stop` then ends it)."""

    def __init__(self, w):
        self.w, self.stop, self.python = w, False, 0
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop:
            if self.w.serve(0.05):
                self.python += 1

    def close(self):
        self.stop = True
        self.t.join(timeout=30)
        assert not self.t.is_alive()


def _collect(w):
    r, _, _ = select.select([w.fileno()], [], [], 30)
    assert r, "the step did not finish within 30 s"
    return w.collect()


def _prefilled(model, tokens):
    st = K.State(model)
    K.prefill(st, np.asarray(tokens, dtype=np.int32), chunk=7)
    return st


def test_steps_through_the_worker_are_bit_identical_to_decode(small_oracle):
    """Logits, state bytes and last logits match plain decode step for step, across the window and
    compressor boundaries; the step's own clock is reported (perf_counter_ns, thread CPU)."""
    model = small_oracle.model()
    prompt = small_oracle.tokens[:13]
    alone, handed = _prefilled(model, prompt), _prefilled(model, prompt)
    w = K.StepWorker()
    srv = Server(w)
    try:
        tok = 7
        for i in range(40):
            want = K.decode(alone, tok)
            before = time.perf_counter_ns()
            w.decode(handed, tok)
            logits, t0, t1, cpu = _collect(w)
            after = time.perf_counter_ns()
            np.testing.assert_array_equal(logits, want, err_msg=f"step {i}")
            assert before <= t0 <= t1 <= after and cpu >= 0
            assert not w.in_flight and w.idle
            tok = int(np.argmax(want))
    finally:
        srv.close()
    assert alone.snapshot().to_bytes() == handed.snapshot().to_bytes()
    np.testing.assert_array_equal(alone.last_logits, handed.last_logits)


def test_a_posted_step_holds_its_state_until_it_ran_and_bad_input_never_posts(small_oracle):
    model = small_oracle.model()
    st, other = _prefilled(model, [1, 2, 3]), _prefilled(model, [1, 2, 3])
    w = K.StepWorker()
    with pytest.raises(ValueError, match=r"token id 100000 is out of range \[0, "):
        w.decode(st, 100_000)
    assert w.idle and not w.in_flight and int(st.n_tokens) == 3     # nothing posted, the state free
    with pytest.raises(ValueError, match="no step is in flight"):
        w.collect()
    w.decode(st, 5)                                    # no thread serves yet: the step waits, posted
    assert w.in_flight and not w.idle
    with pytest.raises(K.StateBusyError):              # the posted step holds its state
        K.decode(st, 5)
    with pytest.raises(ValueError, match="already in flight"):
        w.decode(other, 5)
    with pytest.raises(ValueError, match="has not finished"):
        w.collect()
    srv = Server(w)
    try:
        logits, *_ = _collect(w)
    finally:
        srv.close()
    np.testing.assert_array_equal(logits, K.decode(other, 5))
    assert int(st.n_tokens) == 4


def test_serve_returns_for_a_python_call_and_after_idle_time():
    w = K.StepWorker()
    w.post_python()
    assert w.serve(5.0) is True                        # at once: a Python call waits
    assert w.idle
    assert w.serve(0.01) is False                      # nothing posted: back after idle_s
    with pytest.raises(ValueError, match="idle_s must be > 0"):
        w.serve(0)


def test_a_worker_dropped_with_an_uncollected_step_lets_go_of_its_state(small_oracle):
    """A finished step nobody collected: dropping the worker releases the state and the logits it held
    (no leak, no use after free: the sanitizer leg runs this), and the state is free again."""
    model = small_oracle.model()
    st = _prefilled(model, [4, 5, 6])
    w = K.StepWorker()
    w.decode(st, 9)
    srv = Server(w)
    try:
        assert select.select([w.fileno()], [], [], 30)[0]
    finally:
        srv.close()
    del w, srv
    assert int(st.n_tokens) == 4
    K.decode(st, 1)


def test_a_fault_inside_a_step_reaches_collect_and_frees_its_state(small_oracle):
    """A step that fails midway (the kernel's fault-injection hook: after the layers wrote the state,
    before n advanced) raises from collect with the fault's message; the state is free again and its token
    count unchanged (what the layers wrote stays: the daemon discards it); the worker serves the next step, and
    the hook fires once, in the armed step, not in a plain decode."""
    model = small_oracle.model()
    prompt = small_oracle.tokens[:13]
    st, ref = _prefilled(model, prompt), _prefilled(model, prompt)
    w = K.StepWorker()
    srv = Server(w)
    try:
        K._fail_worker_step(1)                         # the second worker step from now fails
        K.decode(ref, 7)                               # a plain decode is not a worker step
        assert K._fail_worker_step() == 1
        w.decode(st, 7)
        np.testing.assert_array_equal(_collect(w)[0], K.decode(_prefilled(model, prompt), 7))
        w.decode(st, 8)
        with pytest.raises(RuntimeError, match=r"injected fault in a decode step"):
            _collect(w)
        assert K._fail_worker_step() == -1             # fired, disarmed
        assert not w.in_flight and w.idle
        assert int(st.n_tokens) == len(prompt) + 1     # n did not advance (what the layers wrote stays)
        fresh = _prefilled(model, prompt)
        K.decode(fresh, 7)
        w.decode(fresh, 8)                             # the worker goes on
        np.testing.assert_array_equal(_collect(w)[0], K.decode(ref, 8))
    finally:
        K._fail_worker_step(-1)
        srv.close()
    with pytest.raises(ValueError, match=r"skip must be >= -1"):
        K._fail_worker_step(-2)

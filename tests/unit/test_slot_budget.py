"""The default --slots from the memory budget (daemon/service/slot_budget.py), and how the daemon applies it."""

from __future__ import annotations

import numpy as np
import pytest

from cairn.daemon.service.config import load_settings
from cairn.daemon.service.main import Loaded, choose_slots
from cairn.daemon.service.slot_budget import SLOTS_CAP, available_memory, default_slots, state_bytes

MiB = 1 << 20
GiB = 1 << 30


def test_default_slots_fill_the_memory_left_after_the_checkpoint_budget():
    # 10 GiB - 2 GiB checkpoints = 8 GiB; 1 GiB per slot doubled for headroom: 4 fit
    assert default_slots(10 * GiB, 1 * GiB, 2 * GiB).slots == 4
    assert default_slots(8 * GiB, 1 * GiB, 2 * GiB).slots == 3
    assert default_slots(6 * GiB, 1 * GiB, 2 * GiB).slots == 2


def test_default_slots_are_capped():
    assert default_slots(1 << 50, 1 * MiB).slots == SLOTS_CAP == 4
    assert default_slots(1 << 50, 1 * MiB, cap=2).slots == 2


def test_default_slots_are_at_least_one_when_nothing_fits():
    assert default_slots(3 * GiB, 1 * GiB, 2 * GiB).slots == 1
    assert default_slots(1 * GiB, 1 * GiB, 4 * GiB).slots == 1      # budget larger than memory


@pytest.mark.parametrize("available,per_slot", [(None, GiB), (0, GiB), (8 * GiB, None), (8 * GiB, 0)])
def test_default_slots_is_one_when_the_computation_cannot_be_done(available, per_slot):
    d = default_slots(available, per_slot)
    assert d.slots == 1 and "unknown" in d.reason


def test_default_slots_reason_says_the_numbers():
    d = default_slots(10 * GiB, 1 * GiB, 2 * GiB)
    assert "10240 MiB available" in d.reason and "2048 MiB checkpoint budget" in d.reason
    assert "1024 MiB state per slot" in d.reason and "1..4" in d.reason


def test_available_memory_reads_memavailable():
    text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n"
    assert available_memory(text) == 8000000 * 1024
    assert available_memory("MemTotal: 5 kB\n") is None
    assert available_memory("MemAvailable: lots\n") is None


def test_state_bytes_match_the_kernels_state_nbytes(tiny_model_dir):
    """The formula agrees with the real kernel's State.nbytes (payload) on either side of the window
    and of the compression rates."""
    from cairn import _kernel
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    md = open_model_dir(tiny_model_dir)
    model = load_model(md, 1)
    cfg = md.config
    rng = np.random.default_rng(0)
    for n in (1, 3, cfg["sliding_window"] + 5, 2 * cfg["hca_rate"] + 3):
        st = _kernel.State(model)
        _kernel.prefill(st, rng.integers(0, cfg["vocab_size"], n, dtype=np.int32))
        extra = 4 * n + 4 * cfg["vocab_size"]      # token ids and last logits, outside the payload
        assert state_bytes(cfg, n) == st.nbytes + extra, n


def test_state_bytes_grow_with_tokens(tiny_model_dir):
    from cairn.daemon.weights.model_dir import open_model_dir

    cfg = open_model_dir(tiny_model_dir).config
    assert state_bytes(cfg, 100_000) > state_bytes(cfg, 10_000) > state_bytes(cfg, 1)


def _loaded(config, context_length=4096) -> Loaded:
    return Loaded(kernel=None, model=None, tokenizer=None, renderer=None, name="m", fingerprint="f",
                  context_length=context_length, config=config)


def test_explicit_slots_setting_wins_over_the_memory_budget(tmp_path, tiny_model_dir):
    from cairn.daemon.weights.model_dir import open_model_dir

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 64000000 kB\n")
    cfg = open_model_dir(tiny_model_dir).config
    given = choose_slots(load_settings({"model": "x", "slots": 2}, {}), _loaded(cfg), str(meminfo))
    assert (given.slots, given.reason) == (2, "set by the slots setting")
    auto = choose_slots(load_settings({"model": "x"}, {}), _loaded(cfg), str(meminfo))
    assert auto.slots == 4 and "state per slot" in auto.reason


def test_slots_default_is_one_without_a_model_config_or_meminfo(tmp_path):
    s = load_settings({"model": "x"}, {})
    assert s.slots is None
    assert choose_slots(s, _loaded(None), str(tmp_path / "meminfo")).slots == 1
    assert choose_slots(s, _loaded({"vocab_size": 8}), "/proc/meminfo").slots == 1   # config lacks sizes

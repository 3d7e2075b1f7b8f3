"""bench/checkpoint_pages.py runs end to end (--quick on a generated tiny model) and measures what it
says: full copies store the whole state every turn, pages only what is new, both modes compute the
same bits, and the copy-on-write decode step is the one that writes a compressed row. No timings are
asserted (a shared machine's timings are not a property of the code)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("bench_checkpoint_pages", BENCH / "checkpoint_pages.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def quick(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pages") / "quick.json"
    assert bench.main(["--quick", "--model", str(tiny_dir), "--threads", "1", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_quick_run_covers_every_length_and_mode(quick):
    assert [r["n"] for r in quick["rows"]] == [512, 2048]
    for r in quick["rows"]:
        assert set(r["modes"]) == {"full", "pages"}
        for m in r["modes"].values():
            assert [c["turn"] for c in m["turns"]] == [0, 1, 2]
            assert [c["n_tokens"] for c in m["turns"]] == [r["n"] + 99 + 512 * t for t in range(3)]


def test_full_copies_store_the_whole_state_and_pages_only_what_is_new(quick):
    for r in quick["rows"]:
        full, pages = r["modes"]["full"], r["modes"]["pages"]
        for f, p in zip(full["turns"], pages["turns"]):
            assert f["capture_bytes"] == f["nbytes"] == f["copied_nbytes"]
            assert p["copied_nbytes"] == p["own_nbytes"] < p["nbytes"]
        for p in pages["turns"][1:]:
            # a 512-token turn from mid-page: the copied-on-write old partial group, one full, one new partial
            assert p["new_groups"] == 3
            assert p["capture_bytes"] == p["own_nbytes"] + 3 * quick["page_nbytes"]
            assert p["capture_bytes"] <= p["bound_bytes"]
        assert pages["capture_bytes"] < full["capture_bytes"]
        assert pages["pool_growth_bytes"] < full["pool_growth_bytes"]


def test_both_modes_and_the_rebuilt_snapshot_compute_the_same_bits(quick):
    for r in quick["rows"]:
        assert r["identical"] is True
        fp = r["from_parts"]
        last = r["modes"]["pages"]["turns"][-1]["n_tokens"]
        assert fp["full_pages"] == last // quick["page_tokens"]
        assert fp["pages_bytes"] == fp["full_pages"] * quick["page_nbytes"]


def test_the_copy_on_write_step_is_the_first_that_writes_a_row(quick):
    assert quick["row_rates"] == [4, 16]              # the tiny preset's CSA and HCA rates
    for r in quick["rows"]:
        for m in r["modes"].values():
            for c in m["turns"]:
                assert c["n_tokens"] % 4 == 3 and c["cow_step"] == 1   # offset 99, turns of 512
                assert len(c["decode_steps_s"]) == 5                    # the next CSA-only row write
                # the restored state copies the shared partial group there, and only there
                assert c["decode_steps_new_groups"] == [1, 0, 0, 0, 0]


@pytest.mark.parametrize("n, cow, ref", [(611, 1, 5), (612, 4, 8), (624, 4, 8), (639, 1, 17)])
def test_row_steps_find_the_first_row_write_and_the_next_with_the_same_writers(n, cow, ref):
    # 639 + 1 = 640: CSA (4) and HCA (16) both write, and next both again 16 steps later
    assert bench.row_steps(n, [4, 16]) == (cow, ref)
    assert bench.row_steps(n, []) == (None, None)


def test_bad_arguments_name_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--model", str(tmp_path), "--lengths", "8k"])
    assert "--lengths" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--model", str(tmp_path)])
    assert "no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--chunk", "1024"])
    assert "--chunk must be in 1..512" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--lengths", "512"])
    assert "--model is required" in capsys.readouterr().err

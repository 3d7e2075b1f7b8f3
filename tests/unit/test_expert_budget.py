"""`--expert-cache`: the setting's forms, the sizing policy (daemon/service/expert_budget.py), the memory
room of this process from /proc and its cgroup v1/v2 (daemon/service/memory_probe.py), and how the daemon
applies the plan (daemon/service/main.py)."""

from __future__ import annotations

import pytest

from cairn.daemon.service.config import ConfigError, load_settings
from cairn.daemon.service.expert_budget import (MARGIN_MIN, STATE_PLAN_TOKENS, BudgetError, ExpertCacheSetting,
                                        ModelBytes, parse_expert_cache, plan_memory, split_weight_bytes)
from cairn.daemon.service.memory_probe import CgroupRoom, MemoryRoom, cgroup_room, memory_room, own_cgroups

GIB, MIB = 1 << 30, 1 << 20


@pytest.mark.parametrize("text,mode,value", [
    ("auto", "auto", 0), ("all", "all", 0), ("0", "all", 0), ("ALL", "all", 0),
    ("12G", "bytes", 12 * GIB), ("800M", "bytes", 800 * MIB), ("800MiB", "bytes", 800 * MIB),
    ("1.5g", "bytes", 3 * GIB // 2), ("123456", "bytes", 123456), ("64KB", "bytes", 64 << 10),
    ("25%", "percent", 25.0), ("100%", "all", 100.0),
])
def test_setting_forms(text, mode, value):
    got = parse_expert_cache(text)
    assert got.mode == mode and (mode == "all" or got.value == value)


@pytest.mark.parametrize("text", ["12X", "-1G", "lots", "0%", "101%", "", "G"])
def test_bad_setting_names_the_field_and_the_allowed_forms(text):
    with pytest.raises(BudgetError):
        parse_expert_cache(text)
    with pytest.raises(ConfigError) as e:
        load_settings({"model": "x", "expert_cache": text}, {})
    msg = str(e.value)
    assert "'expert_cache'" in msg and "flag --expert-cache" in msg
    assert "auto" in msg and "all or 0" in msg and "12G" in msg and "25%" in msg


def test_setting_default_and_layers(tmp_path):
    assert load_settings({"model": "x"}, {}).expert_cache == "auto"
    assert load_settings({"model": "x"}, {"CAIRN_EXPERT_CACHE": "8G"}).expert_cache == "8G"
    cfg = tmp_path / "c.toml"
    cfg.write_text("expert_cache = 1073741824\n")           # a TOML integer is bytes
    assert parse_expert_cache(load_settings({"config": str(cfg)}, {}).expert_cache).value == GIB


def test_split_counts_routed_experts_apart_from_the_shared_expert_and_the_rest():
    sizes = [("layers.0.ffn.experts.3.w1.weight", 100), ("layers.0.ffn.experts.3.w1.scale", 4),
             ("layers.0.ffn.shared_experts.w1.weight", 100), ("embed.weight", 1000),
             ("layers.0.ffn.gate.weight", 10)]
    assert split_weight_bytes(sizes) == ModelBytes(dense=1110, experts=104)


MODEL = ModelBytes(dense=6 * GIB, experts=40 * GIB)
AUTO = ExpertCacheSetting("auto")


def _plan(avail, setting=AUTO, state=GIB // 4, ck=2 * GIB, slots=None, model=MODEL):
    return plan_memory(setting, model, avail=avail, state_bytes=state, checkpoint_bytes=ck, slots_setting=slots)


def test_auto_everything_fits_is_all_resident_and_leaves_slots_to_the_slots_rule():
    p = _plan(64 * GIB)
    assert (p.expert_cache_bytes, p.slots, p.paged) == (0, None, False)
    assert "all resident" in p.reason


def test_auto_pages_with_what_is_left_after_dense_checkpoints_state_and_margin():
    avail = 32 * GIB
    margin = max(MARGIN_MIN, int(avail * 0.05))
    p = _plan(avail)
    assert p.paged and p.slots == 1
    assert p.expert_cache_bytes == avail - 6 * GIB - 2 * GIB - GIB // 4 - margin
    assert "paged" in p.reason and "MemAvailable 32.00 GiB" in p.reason and f"{STATE_PLAN_TOKENS} tokens" in p.reason
    # explicit slots: each state comes out of the expert cache
    p3 = _plan(avail, slots=3)
    assert p3.slots == 3 and p3.expert_cache_bytes == p.expert_cache_bytes - 2 * (GIB // 4)
    # checkpoints off: their budget goes to experts
    assert _plan(avail, ck=0).expert_cache_bytes == p.expert_cache_bytes + 2 * GIB


def test_auto_with_less_room_than_the_kernels_minimum_keeps_everything_resident():
    p = _plan(7 * GIB)                                            # nothing left after dense + checkpoints
    assert (p.expert_cache_bytes, p.slots) == (0, None) and "least budget" in p.reason
    room = 6 * GIB + 2 * GIB + GIB // 4 + MARGIN_MIN + 100 * MIB   # 100 MiB left for experts
    assert plan_memory(AUTO, MODEL, avail=room, state_bytes=GIB // 4, checkpoint_bytes=2 * GIB,
                       slots_setting=None, min_budget=200 * MIB).expert_cache_bytes == 0
    assert plan_memory(AUTO, MODEL, avail=room, state_bytes=GIB // 4, checkpoint_bytes=2 * GIB,
                       slots_setting=None, min_budget=50 * MIB).expert_cache_bytes == 100 * MIB


def test_explicit_forms():
    assert _plan(8 * GIB, ExpertCacheSetting("all")).expert_cache_bytes == 0
    assert _plan(8 * GIB, ExpertCacheSetting("bytes", 12 * GIB)).expert_cache_bytes == 12 * GIB
    assert _plan(None, ExpertCacheSetting("bytes", 12 * GIB)).expert_cache_bytes == 12 * GIB
    assert _plan(8 * GIB, ExpertCacheSetting("bytes", 50 * GIB)).expert_cache_bytes == 0   # holds them all
    assert _plan(8 * GIB, ExpertCacheSetting("percent", 25)).expert_cache_bytes == 10 * GIB
    assert _plan(None).expert_cache_bytes == 0                       # memory unknown: resident, as before


# --- memory room ------------------------------------------------------------------------------

def _write(d, **files):
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text)


def test_own_cgroups_parses_v1_and_v2_lines():
    text = "9:name=systemd:/\n4:memory:/svc/a\n3:cpu,cpuacct:/\n0::/system.slice/cairn.service\n"
    assert own_cgroups(text) == ("/svc/a", "/system.slice/cairn.service")


def test_cgroup_v1_limit_of_an_ancestor_binds_and_inactive_file_is_reclaimable(tmp_path):
    mem = tmp_path / "memory"
    _write(mem / "svc", memory__limit_in_bytes=str(10 * GIB), memory__usage_in_bytes=str(3 * GIB),
           memory__stat=f"total_inactive_file {2 * GIB}\n")
    _write(mem / "svc" / "a", memory__limit_in_bytes=str(9223372036854771712),
           memory__usage_in_bytes=str(GIB), memory__stat="total_inactive_file 0\n")
    room = cgroup_room("4:memory:/svc/a\n", tmp_path)
    assert room == CgroupRoom(1, "/svc", 10 * GIB, GIB) and room.room == 9 * GIB


def test_cgroup_v2_memory_max_of_the_service(tmp_path):
    _write(tmp_path, cgroup__controllers="memory\n")
    _write(tmp_path / "system.slice" / "cairn.service", memory__max=str(24 * GIB),
           memory__current=str(GIB), memory__stat=f"inactive_file {GIB // 2}\n")
    _write(tmp_path / "system.slice", memory__max="max\n")
    room = cgroup_room("0::/system.slice/cairn.service\n", tmp_path)
    assert room.version == 2 and room.limit == 24 * GIB and room.usage == GIB // 2


def test_cgroup_v2_hybrid_mount_and_no_limit(tmp_path):
    _write(tmp_path / "unified", cgroup__controllers="")
    _write(tmp_path / "unified" / "x", memory__max=str(5 * GIB), memory__current="0")
    assert cgroup_room("0::/x\n", tmp_path).limit == 5 * GIB
    assert cgroup_room("0::/\n", tmp_path) is None


def test_memory_room_is_the_smaller_of_memavailable_and_the_cgroup(tmp_path):
    proc = tmp_path / "proc"
    _write(proc, meminfo="MemTotal: 33554432 kB\nMemAvailable: 31457280 kB\n")
    _write(proc / "self", cgroup="4:memory:/c\n")
    _write(tmp_path / "sys" / "memory" / "c", memory__limit_in_bytes=str(8 * GIB), memory__usage_in_bytes="0")
    room = memory_room(proc, tmp_path / "sys")
    assert room.bytes == 8 * GIB and room.source.startswith("cgroup v1 /c")
    assert MemoryRoom(4 * GIB, room.cgroup).bytes == 4 * GIB and MemoryRoom(4 * GIB, room.cgroup).source == "MemAvailable"


def test_daemon_plans_from_the_model_directory(tiny_model_dir):
    from cairn.daemon.service.main import Loaded, choose_slots, plan_expert_cache
    from cairn.daemon.weights.model_dir import open_model_dir

    md = open_model_dir(tiny_model_dir)
    weights = split_weight_bytes((n, t.end - t.start) for n, t in md.tensors.items())
    assert weights.experts > 0 and weights.dense > 0
    s = load_settings({"model": "x", "expert_cache": "50%"}, {})
    plan = plan_expert_cache(s, md, room=MemoryRoom(64 * GIB, None))
    assert plan.expert_cache_bytes == weights.experts // 2 and plan.slots == 1
    loaded = Loaded(kernel=None, model=None, tokenizer=None, renderer=None, name="m", fingerprint="f",
                    context_length=4096, config=md.config, memory_plan=plan)
    chosen = choose_slots(s, loaded)
    assert chosen.slots == 1 and "experts paged" in chosen.reason
    assert choose_slots(load_settings({"model": "x", "expert_cache": "50%", "slots": 2}, {}), loaded).slots == 2
    resident = plan_expert_cache(load_settings({"model": "x"}, {}), md, room=MemoryRoom(64 * GIB, None))
    assert resident.expert_cache_bytes == 0

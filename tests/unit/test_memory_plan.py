"""The memory plan (daemon/service/memory_plan.py): `--expert-cache`'s forms, the limit (cgroup v2, v1,
MemAvailable: smallest wins, and which), each part's bytes, the slots and the reasons; the limits of this
process read from /proc and its cgroups (daemon/service/memory_probe.py); a state's bytes against the
kernel's; how the daemon builds the plan from a model directory (daemon/service/main.py)."""

from __future__ import annotations

import pytest

from cairn.daemon.service.config import ConfigError, load_settings
import numpy as np

from cairn.daemon.service.memory_plan import (CHECKPOINT_SHARE, DIAGNOSTIC_IDS_BYTES, MARGIN_MIN, REPLY_IDS_BYTES,
                                              REPLY_SHARE, SLOTS_CAP, STATE_PLAN_TOKENS, STATE_SLACK, BudgetError, ExpertCacheSetting,
                                              LimitSource, ModelBytes, StateCost, available_memory,
                                              parse_expert_cache, pick_limit, plan_memory, split_weight_bytes,
                                              state_bytes)
from cairn.daemon.service.memory_probe import V1, V2, binding_limit, cgroup_limits, memory_limits, own_cgroups

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



# --- the plan ---------------------------------------------------------------------------------------

COST = StateCost(("sliding_attention",) * 2 + ("compressed_sparse_attention", "heavily_compressed_attention") * 20,
                 window=128,
                 head_dim=512, index_head_dim=128, csa_rate=4, hca_rate=128, vocab=1000)
SHARE = COST.resident_at(STATE_PLAN_TOKENS)
MODEL = ModelBytes(dense=6 * GIB, experts=40 * GIB)
SMALL = ModelBytes(dense=100 * MIB, experts=20 * MIB)
AUTO = ExpertCacheSetting("auto")


def _plan(room, model=SMALL, setting=AUTO, slots=None, ck=2 * GIB, source="MemAvailable", **kw):
    limit = None if room is None else LimitSource(source, room, 0, "" if source == "MemAvailable" else "/svc")
    return plan_memory(limit=limit, weights=model, state=COST, context_length=1 << 20, expert_setting=setting,
                       slots_setting=slots, checkpoint_setting=ck, **kw)


def _parts(p) -> int:
    return (p.dense_bytes + p.expert_bytes + p.margin_bytes + p.request_bytes + p.transient_bytes
            + p.checkpoint_bytes + p.reply_bytes + p.diagnostic_bytes + p.bodies_bytes + p.state_bytes)


def test_the_smallest_room_wins_whichever_source_it_is():
    avail = LimitSource("MemAvailable", 20 * GIB)
    v1 = LimitSource(V1, 12 * GIB, 2 * GIB, "/docker/x")       # room 10 GiB
    v2 = LimitSource(V2, 8 * GIB, 1 * GIB, "/system.slice/cairn.service")   # room 7 GiB
    assert pick_limit([avail, v1, v2]) is v2
    assert pick_limit([avail, v1]) is v1
    assert pick_limit([avail]) is avail
    assert pick_limit([]) is None
    for src, kind in ((v2, V2), (v1, V1), (avail, "MemAvailable")):
        p = plan_memory(limit=src, weights=SMALL, state=COST, context_length=65536)
        assert p.room_bytes == src.limit - src.used and p.limit_bytes == src.limit
        assert p.limit_source.startswith(kind) and kind in p.reason
    assert "/system.slice/cairn.service" in plan_memory(limit=v2, weights=SMALL, state=COST,
                                                        context_length=65536).limit_source


def test_every_part_adds_up_to_the_room_and_the_pool_is_states_plus_checkpoints():
    for room in (4 * GIB, 16 * GIB, 64 * GIB):
        p = _plan(room)
        assert _parts(p) == room, room
        assert p.pool_bytes == p.state_bytes + p.checkpoint_bytes
        assert p.margin_bytes == max(MARGIN_MIN, int(room * 0.05))
        assert p.transient_bytes == min(COST.snapshot_bytes_at(STATE_PLAN_TOKENS), p.checkpoint_bytes)
        assert p.state_share_bytes == SHARE and p.share_tokens == STATE_PLAN_TOKENS
        assert p.per_token_bytes == COST.per_token
        for word in ("dense", "experts", "margin", "requests", "transients", "checkpoints", "states"):
            assert word in p.reason


def test_the_reply_table_is_a_part_of_its_own():
    without, with_ = _plan(16 * GIB), _plan(16 * GIB, reply_bytes=REPLY_IDS_BYTES)
    assert with_.reply_bytes == REPLY_IDS_BYTES and _parts(with_) == 16 * GIB
    assert with_.state_bytes == without.state_bytes - REPLY_IDS_BYTES
    assert "replies 16.0 MiB" in with_.reason and with_.as_status()["parts"]["replies"] == REPLY_IDS_BYTES
    assert _plan(None, reply_bytes=REPLY_IDS_BYTES).reply_bytes == REPLY_IDS_BYTES   # no limit: the table's bound
    small = _plan(600 * MIB, ck=0, reply_bytes=REPLY_IDS_BYTES)     # a small limit: a share of what is left
    assert small.reply_bytes == int((600 * MIB - SMALL.dense - small.margin_bytes) * REPLY_SHARE) < REPLY_IDS_BYTES
    assert _parts(small) == 600 * MIB


def test_the_cache_diagnostics_are_a_part_of_their_own():
    without, with_ = _plan(16 * GIB), _plan(16 * GIB, diagnostic_bytes=DIAGNOSTIC_IDS_BYTES)
    assert with_.diagnostic_bytes == DIAGNOSTIC_IDS_BYTES and _parts(with_) == 16 * GIB
    assert with_.state_bytes == without.state_bytes - DIAGNOSTIC_IDS_BYTES
    assert "diagnostics 8.0 MiB" in with_.reason
    assert with_.as_status()["parts"]["diagnostics"] == DIAGNOSTIC_IDS_BYTES
    small = _plan(600 * MIB, ck=0, diagnostic_bytes=DIAGNOSTIC_IDS_BYTES)     # a small limit: a share of what is left
    assert small.diagnostic_bytes < DIAGNOSTIC_IDS_BYTES and _parts(small) == 600 * MIB


def test_slots_are_the_shares_that_fit_capped_and_at_least_one():
    per = SHARE + STATE_PLAN_TOKENS * 40 + 4 * 4 * COST.vocab       # a share and its request buffers
    big = _plan(64 * GIB)
    assert big.slots == SLOTS_CAP
    p = _plan(3 * GIB)
    fixed = SMALL.dense + SMALL.experts + p.margin_bytes + p.checkpoint_bytes + p.transient_bytes + p.bodies_bytes
    assert p.slots == min(SLOTS_CAP, (3 * GIB - fixed) // per) and 1 < p.slots < SLOTS_CAP
    assert f"holds {p.slots} share(s)" in p.slots_reason
    tiny = _plan(600 * MIB, ck=0)
    assert tiny.slots == 1 and "holds 0 share(s)" in tiny.slots_reason and "a state may reach" in tiny.reason
    assert _plan(64 * GIB, slots=2).slots == 2 and _plan(64 * GIB, slots=2).slots_reason == "set by the slots setting"


def test_a_room_smaller_than_the_weights_and_margin_leaves_no_pool_and_says_so():
    p = _plan(SMALL.dense + SMALL.experts + MARGIN_MIN // 2, source=V2)
    assert p.pool_bytes == 0 and p.slots == 1 and "nothing is left for live states" in p.reason


def test_the_checkpoint_budget_is_cut_to_its_share_under_a_small_limit():
    roomy = _plan(64 * GIB)
    assert roomy.checkpoint_bytes == 2 * GIB and "cut from" not in roomy.reason
    p = _plan(1 * GIB, source=V1)
    want = int((1 * GIB - SMALL.dense - p.margin_bytes) * CHECKPOINT_SHARE)
    assert p.checkpoint_bytes == want < 2 * GIB and "cut from 2.00 GiB" in p.reason
    assert _plan(64 * GIB, ck=0).checkpoint_bytes == 0 and _plan(64 * GIB, ck=0).transient_bytes == 0


def test_auto_pages_the_experts_when_they_do_not_fit_and_keeps_one_slot():
    room = 32 * GIB
    p = _plan(room, model=MODEL)
    per = SHARE + STATE_PLAN_TOKENS * 40 + 4 * 4 * COST.vocab
    fixed = MODEL.dense + p.margin_bytes + p.checkpoint_bytes + p.transient_bytes + p.bodies_bytes
    assert p.paged and p.slots == 1 and p.expert_cache_bytes == room - fixed - per
    assert p.expert_bytes == p.expert_cache_bytes and "experts paged" in p.expert_reason
    assert _parts(p) == room
    # explicit slots: each further state comes out of the expert cache
    p3 = _plan(room, model=MODEL, slots=3)
    assert p3.slots == 3 and p3.expert_cache_bytes == p.expert_cache_bytes - 2 * per
    # less room than the kernel's least budget: everything resident, and it says why
    q = _plan(room, model=MODEL, min_expert_budget=p.expert_cache_bytes + 1)
    assert not q.paged and "least budget" in q.expert_reason
    assert not _plan(64 * GIB, model=ModelBytes(6 * GIB, 20 * GIB)).paged


def test_explicit_expert_forms():
    assert _plan(8 * GIB, model=MODEL, setting=ExpertCacheSetting("all")).expert_cache_bytes == 0
    assert _plan(8 * GIB, model=MODEL, setting=ExpertCacheSetting("bytes", 12 * GIB)).expert_cache_bytes == 12 * GIB
    assert _plan(None, model=MODEL, setting=ExpertCacheSetting("bytes", 12 * GIB)).expert_cache_bytes == 12 * GIB
    assert _plan(8 * GIB, model=MODEL, setting=ExpertCacheSetting("bytes", 50 * GIB)).expert_cache_bytes == 0
    assert _plan(8 * GIB, model=MODEL, setting=ExpertCacheSetting("percent", 25)).expert_cache_bytes == 10 * GIB


def test_no_limit_known_means_no_guard_and_one_slot():
    p = _plan(None)
    assert p.room_bytes is None and p.pool_bytes is None and p.slots == 1 and not p.paged
    assert "no memory limit known" in p.reason and "no memory guard" in p.reason
    assert _plan(None, slots=3).slots == 3


def test_status_shape_has_every_part_and_the_limit():
    st = _plan(16 * GIB, source=V2).as_status()
    assert set(st["parts"]) == {"dense", "experts", "margin", "requests", "transients", "checkpoints", "replies",
                                "diagnostics", "bodies", "states"}
    assert st["limit_source"].startswith(V2) and st["room_bytes"] == 16 * GIB and st["reason"]


# --- a state's bytes ----------------------------------------------------------------------------------

def test_available_memory_reads_memavailable():
    text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n"
    assert available_memory(text) == 8000000 * 1024
    assert available_memory("MemTotal: 5 kB\n") is None
    assert available_memory("MemAvailable: lots\n") is None


def test_state_bytes_match_the_kernels_state_nbytes(tiny_model_dir):
    """The formula agrees with the real kernel's State.nbytes (payload) on either side of the window
    and of the compression rates, and with the size of its snapshot."""
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
        assert abs(len(st.snapshot().to_bytes()) - state_bytes(cfg, n)) < 256   # the blob: the same plus a header


def test_per_token_cost_of_v4_flash_is_the_documented_13760_bytes():
    from cairn.daemon.modelgen.make_model import PRESETS, hf_config
    from cairn.daemon.weights.dsv4.config import resolve_config

    cost = StateCost.from_config(resolve_config(hf_config(PRESETS["flash-slice"])))
    assert abs(cost.per_token - 13760) < 16            # ../shared/docs/v4-architecture.md section 3
    assert cost.resident_at(1000) >= int(cost.bytes_at(1000) * STATE_SLACK) + cost.group_bytes()
    # a live state keeps its window ring and compressor buffers at full size from its first token (issue 40
    # §3): ~23 MB at V4-Flash width, however short the conversation
    assert cost.resident_at(1) - cost.bytes_at(1) > 20 << 20
    assert cost.bytes_at(100_000) > cost.bytes_at(10_000) > cost.bytes_at(1)


# --- the limits of this process ------------------------------------------------------------------------

def _write(d, **files):
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text)


def test_own_cgroups_parses_v1_and_v2_lines():
    text = "9:name=systemd:/\n4:memory:/svc/a\n3:cpu,cpuacct:/\n0::/system.slice/cairn.service\n"
    assert own_cgroups(text) == ("/svc/a", "/system.slice/cairn.service")


def test_cgroup_v1_limit_of_an_ancestor_counts_and_inactive_file_is_reclaimable(tmp_path):
    mem = tmp_path / "memory"
    _write(mem / "svc", memory__limit_in_bytes=str(10 * GIB), memory__usage_in_bytes=str(3 * GIB),
           memory__stat=f"total_inactive_file {2 * GIB}\n")
    _write(mem / "svc" / "a", memory__limit_in_bytes=str(9223372036854771712),
           memory__usage_in_bytes=str(GIB), memory__stat="total_inactive_file 0\n")
    limits = cgroup_limits("4:memory:/svc/a\n", tmp_path)
    assert limits == [LimitSource(V1, 10 * GIB, GIB, "/svc")] and limits[0].room == 9 * GIB


def test_cgroup_v2_memory_max_of_the_service(tmp_path):
    _write(tmp_path, cgroup__controllers="memory\n")
    _write(tmp_path / "system.slice" / "cairn.service", memory__max=str(24 * GIB),
           memory__current=str(GIB), memory__stat=f"inactive_file {GIB // 2}\n")
    _write(tmp_path / "system.slice", memory__max="max\n")
    (lim,) = cgroup_limits("0::/system.slice/cairn.service\n", tmp_path)
    assert lim.kind == V2 and lim.limit == 24 * GIB and lim.used == GIB // 2
    assert lim.path == "/system.slice/cairn.service"


def test_cgroup_v2_hybrid_mount_and_no_limit(tmp_path):
    _write(tmp_path / "unified", cgroup__controllers="")
    _write(tmp_path / "unified" / "x", memory__max=str(5 * GIB), memory__current="0")
    assert cgroup_limits("0::/x\n", tmp_path)[0].limit == 5 * GIB
    assert cgroup_limits("0::/\n", tmp_path) == []


def test_binding_limit_is_the_smallest_of_memavailable_v1_and_v2(tmp_path):
    proc = tmp_path / "proc"
    _write(proc, meminfo="MemTotal: 33554432 kB\nMemAvailable: 31457280 kB\n")
    _write(proc / "self", cgroup="4:memory:/c\n0::/d\n")
    sys_ = tmp_path / "sys"
    _write(sys_ / "memory" / "c", memory__limit_in_bytes=str(8 * GIB), memory__usage_in_bytes="0")
    _write(sys_ / "unified", cgroup__controllers="memory\n")
    _write(sys_ / "unified" / "d", memory__max=str(6 * GIB), memory__current=str(GIB))
    kinds = [s.kind for s in memory_limits(proc, sys_)]
    assert kinds == ["MemAvailable", V1, V2]
    got = binding_limit(proc, sys_)
    assert got.kind == V2 and got.room == 5 * GIB                   # v2: 6 GiB - 1 GiB in use
    _write(sys_ / "unified" / "d", memory__max="max\n")
    assert binding_limit(proc, sys_).kind == V1                      # then v1's 8 GiB
    _write(sys_ / "memory" / "c", memory__limit_in_bytes=str(64 * GIB))
    assert binding_limit(proc, sys_).kind == "MemAvailable"          # then MemAvailable's 30 GiB


def test_daemon_plans_from_the_model_directory(tiny_model_dir):
    from cairn.daemon.service.main import Loaded, choose_slots, plan_for
    from cairn.daemon.weights.model_dir import open_model_dir

    md = open_model_dir(tiny_model_dir)
    weights = split_weight_bytes((n, t.end - t.start) for n, t in md.tensors.items())
    assert weights.experts > 0 and weights.dense > 0
    roomy = LimitSource("MemAvailable", 64 * GIB)
    s = load_settings({"model": "x", "expert_cache": "50%"}, {})
    plan = plan_for(s, md, roomy)
    assert plan.expert_cache_bytes == weights.experts // 2 and plan.slots == 1
    loaded = Loaded(kernel=None, model=None, tokenizer=None, renderer=None, name="m", fingerprint="f",
                    context_length=4096, config=md.config, memory_plan=plan)
    chosen = choose_slots(s, loaded)
    assert chosen.slots == 1 and "experts paged" in chosen.reason
    two = load_settings({"model": "x", "expert_cache": "50%", "slots": 2}, {})
    assert choose_slots(two, Loaded(**{**loaded.__dict__, "memory_plan": plan_for(two, md, roomy)})).slots == 2
    resident = plan_for(load_settings({"model": "x"}, {}), md, roomy)
    assert resident.expert_cache_bytes == 0 and resident.slots == SLOTS_CAP
    assert resident.checkpoint_bytes == 2048 << 20
    off = plan_for(load_settings({"model": "x", "checkpoints": False}, {}), md, roomy)
    assert off.checkpoint_bytes == 0
    unknown = plan_for(load_settings({"model": "x"}, {}), md, None, probe=False)
    assert unknown.pool_bytes is None and unknown.slots == 1
    no_plan = Loaded(kernel=None, model=None, tokenizer=None, renderer=None, name="m", fingerprint="f",
                     context_length=4096)
    assert choose_slots(load_settings({"model": "x"}, {}), no_plan).slots == 1


# --- what the plan counts against what is measured (issue 40 §3) -------------------------------------------

def _parse_peak(raw: bytes, parse) -> int:
    import tracemalloc

    from cairn.daemon.api.schemas import parse_json_body

    tracemalloc.start()
    try:
        kept = parse(parse_json_body(raw))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        del kept


def test_a_parsed_request_body_holds_no_more_than_the_plan_counts_for_it():
    """BODY_PARSE_FACTOR x the raw bytes >= what parsing the usual shapes holds at its peak: a prompt of
    token ids, a long text, many short messages (each ~1 MB)."""
    import json
    import random

    from cairn.daemon.api.schemas import parse_chat, parse_completion
    from cairn.daemon.service.memory_plan import BODY_PARSE_FACTOR

    rng = random.Random(40)
    bodies = [
        (json.dumps({"model": "x", "prompt": [rng.randrange(100_000, 129_000) for _ in range(150_000)]}),
         lambda d: parse_completion(d, context_length=1 << 20)),
        # the costliest ids: 3 digits and a comma, each a 32-byte int and an 8-byte list slot (~12x)
        (json.dumps({"model": "x", "prompt": [rng.randrange(256, 1000) for _ in range(250_000)]},
                    separators=(",", ":")), lambda d: parse_completion(d, context_length=1 << 20)),
        (json.dumps({"model": "x", "messages": [{"role": "user", "content": "ab cd " * 200_000}]}), parse_chat),
        (json.dumps({"model": "x", "messages": [{"role": "user", "content": "a"}] * 50_000}), parse_chat),
    ]
    for text, parse in bodies:
        raw = text.encode()
        peak = _parse_peak(raw, parse)
        assert BODY_PARSE_FACTOR * len(raw) >= peak + len(raw), (len(raw), peak)


def test_bodies_and_the_verify_journal_are_parts_of_the_plan():
    from cairn.daemon.service.memory_plan import BODY_MAX, BODY_MIN, BODY_PARSE_FACTOR

    plain = _plan(64 * GIB)
    spec = plan_memory(limit=LimitSource("MemAvailable", 64 * GIB), weights=ModelBytes(100 << 20, 0), state=COST,
                       context_length=65536, checkpoint_setting=1 * GIB, journal_bytes=COST.journal_bytes(17))
    assert BODY_MIN <= plain.body_bytes <= BODY_MAX
    assert plain.as_status()["parts"]["bodies"] == plain.body_bytes * BODY_PARSE_FACTOR == plain.bodies_bytes
    assert spec.journal_bytes == COST.journal_bytes(17) > 0
    assert spec.request_bytes - plain.request_bytes == spec.slots * COST.journal_bytes(17)
    assert _parts(spec) == 64 * GIB


def test_a_prompt_lookup_table_holds_no_more_than_the_plan_counts_for_it():
    """Issue 40 §3: the drafts' lookup over a 20k-token prompt and a reply (measured ~416 bytes a token
    as dicts of n-gram tuples) holds at most LOOKUP_BYTES_PER_TOKEN a token, and the plan counts that per
    slot at its share of tokens when speculation is on."""
    import tracemalloc

    from cairn.actors.decoding.drafts import LOOKUP_BYTES_PER_TOKEN, PromptLookup

    rng = np.random.default_rng(3)
    prompt = tuple(int(t) for t in rng.integers(0, 129_000, 20_000))
    tracemalloc.start()
    try:
        lookup = PromptLookup(prompt)
        for t in rng.integers(0, 129_000, 3_000):          # a reply, token by token
            lookup.append(int(t))
            lookup.draft(16)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(lookup) == 23_000
    assert LOOKUP_BYTES_PER_TOKEN * 23_000 >= held, held
    plain = _plan(64 * GIB)
    spec = _plan(64 * GIB, lookup_bytes_per_token=LOOKUP_BYTES_PER_TOKEN)
    assert spec.request_bytes - plain.request_bytes == spec.slots * LOOKUP_BYTES_PER_TOKEN * spec.share_tokens


@pytest.mark.parametrize("room_mib", [100, 116, 140, 160, 300])
def test_the_fixed_parts_never_leave_the_pool_more_than_is_there(room_mib):
    """Issue 40 (the soak): at a small limit the fixed parts (margin, requests, bodies, transients,
    checkpoints) passed the room and the plan still offered the checkpoint budget as the guard's pool.
    The checkpoint budget gives way first, so every part sums to the room; where even that is not
    enough the reason says so at start."""
    wide = StateCost(("sliding_attention",) + ("compressed_sparse_attention",) * 6, window=128, head_dim=256,
                     index_head_dim=16, csa_rate=2, hca_rate=16, vocab=512)
    p = plan_memory(limit=LimitSource("cgroup v1 memory.limit_in_bytes", room_mib * MIB, 0, "/svc"),
                    weights=ModelBytes(3 * MIB, 1 * MIB), state=wide, context_length=65536, slots_setting=4,
                    checkpoint_setting=2 * GIB, journal_bytes=wide.journal_bytes(17), lookup_bytes_per_token=8)
    fits = p.margin_bytes + p.dense_bytes + p.expert_bytes + p.request_bytes + p.bodies_bytes + p.reply_bytes \
        + p.diagnostic_bytes <= room_mib * MIB
    if fits:
        assert _parts(p) == room_mib * MIB, p.reason
        assert "pass the room" not in p.reason
    else:
        assert p.checkpoint_bytes == 0 and p.state_bytes == 0
        assert "the fixed parts pass the room by" in p.reason and "raise the limit" in p.reason

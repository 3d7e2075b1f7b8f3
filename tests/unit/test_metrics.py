"""cairn.daemon.service.metrics: values, label checks, and output that a real Prometheus parser accepts."""

from __future__ import annotations

import math
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cairn.daemon.service.metrics import CONTENT_TYPE, Metrics, Registry


def parse(text: str) -> dict:
    """{family name: (type, {(sample name, frozenset(labels)): value})}"""
    return {f.name: (f.type, {(s.name, frozenset(s.labels.items())): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_fresh_metrics_parse_with_every_known_series_at_zero():
    families = parse(Metrics(tiers=("ram", "disk")).render())
    assert {name: kind for name, (kind, _) in families.items()} == {
        "cairn_requests": "counter", "cairn_cancels": "counter", "cairn_queue_depth": "gauge",
        "cairn_prefill_tokens": "counter", "cairn_checkpoint_hits": "counter",
        "cairn_checkpoint_misses": "counter", "cairn_checkpoint_evictions": "counter",
        "cairn_checkpoint_bytes": "gauge", "cairn_ttft_seconds": "histogram",
        "cairn_decode_tokens_per_second": "histogram", "cairn_live_state_tokens": "gauge",
        "cairn_slots": "gauge", "cairn_decode_steps": "counter", "cairn_decode_step_rows": "counter",
        "cairn_decode_tokens": "counter", "cairn_spec_drafts": "counter", "cairn_spec_draft_tokens": "counter",
        "cairn_spec_accepted_tokens": "counter", "cairn_spec_batched_verify_steps": "counter",
        "cairn_expert_cache_budget_bytes": "gauge", "cairn_expert_cache_hits": "counter",
        "cairn_expert_cache_misses": "counter", "cairn_expert_cache_read_bytes": "counter",
        "cairn_expert_cache_read_seconds": "counter", "cairn_expert_cache_stall_seconds": "counter",
        "cairn_expert_cache_evictions": "counter", "cairn_memory_refused": "counter",
        "cairn_expert_prefetch_reads": "counter", "cairn_expert_prefetch_used": "counter",
        "cairn_expert_lookahead_guesses": "counter", "cairn_expert_lookahead_right": "counter",
        "cairn_checkpoint_captures_skipped": "counter",
    }
    requests = families["cairn_requests"][1]
    assert {dict(labels)["outcome"] for _, labels in requests} == {"done", "cancelled", "error", "rejected"}
    assert set(requests.values()) == {0}
    assert {dict(labels)["kind"] for _, labels in families["cairn_prefill_tokens"][1]} == {
        "computed", "reused", "restored"}
    assert {dict(labels)["tier"] for _, labels in families["cairn_checkpoint_bytes"][1]} == {"ram", "disk"}
    assert families["cairn_checkpoint_misses"][1] == {}  # reasons appear when first counted


def test_recorded_values_round_trip_through_the_parser():
    m = Metrics()
    m.requests.inc(outcome="done")
    m.requests.inc(outcome="done")
    m.requests.inc(outcome="cancelled")
    m.cancels.inc()
    m.queue_depth.set(3)
    m.queue_depth.dec()
    m.prefill_tokens.inc(4096, kind="restored")
    m.prefill_tokens.inc(128, kind="computed")
    m.checkpoint_hits.inc(tier="ram")
    m.checkpoint_misses.inc(reason="no_prefix")
    m.checkpoint_evictions.inc(tier="disk")
    m.checkpoint_bytes.set(1.5 * 2**30, tier="disk")
    m.live_state_tokens.set(4224)
    for seconds in (0.02, 0.3, 0.3, 7.0, 1000.0):
        m.ttft.observe(seconds)
    m.decode_tps.observe(12.5)

    f = parse(m.render())
    assert f["cairn_requests"][1][("cairn_requests_total", frozenset({("outcome", "done")}))] == 2
    assert f["cairn_requests"][1][("cairn_requests_total", frozenset({("outcome", "cancelled")}))] == 1
    assert f["cairn_cancels"][1][("cairn_cancels_total", frozenset())] == 1
    assert f["cairn_queue_depth"][1][("cairn_queue_depth", frozenset())] == 2
    assert f["cairn_prefill_tokens"][1][("cairn_prefill_tokens_total", frozenset({("kind", "restored")}))] == 4096
    assert f["cairn_checkpoint_misses"][1] == {
        ("cairn_checkpoint_misses_total", frozenset({("reason", "no_prefix")})): 1}
    assert f["cairn_checkpoint_bytes"][1][("cairn_checkpoint_bytes", frozenset({("tier", "disk")}))] == 1.5 * 2**30
    assert f["cairn_live_state_tokens"][1][("cairn_live_state_tokens", frozenset())] == 4224

    ttft = f["cairn_ttft_seconds"][1]
    bucket = {dict(labels)["le"]: v for (name, labels), v in ttft.items() if name.endswith("_bucket")}
    assert bucket["0.01"] == 0 and bucket["0.025"] == 1 and bucket["0.5"] == 3 and bucket["10.0"] == 4
    assert bucket["300.0"] == 4 and bucket["+Inf"] == 5
    assert list(bucket.values()) == sorted(bucket.values())  # cumulative
    assert ttft[("cairn_ttft_seconds_count", frozenset())] == 5
    assert math.isclose(ttft[("cairn_ttft_seconds_sum", frozenset())], 1007.62)
    assert m.ttft.count() == 5 and m.decode_tps.count() == 1


def test_observation_on_a_bucket_bound_counts_in_that_bucket():
    r = Registry()
    h = r.histogram("x_seconds", "x", [1, 2])
    h.observe(1.0)
    h.observe(2.0)
    f = parse(r.render())["x_seconds"][1]
    assert f[("x_seconds_bucket", frozenset({("le", "1.0")}))] == 1
    assert f[("x_seconds_bucket", frozenset({("le", "2.0")}))] == 2


def test_label_values_are_escaped():
    r = Registry()
    c = r.counter("odd_total", 'help with \\ and\nnewline', ["reason"])
    c.inc(reason='quote " backslash \\ newline \n end')
    (family,) = text_string_to_metric_families(r.render())
    assert family.documentation == 'help with \\ and\nnewline'
    assert family.samples[0].labels == {"reason": 'quote " backslash \\ newline \n end'}


def test_label_mistakes_raise():
    m = Metrics()
    with pytest.raises(ValueError, match="not one of"):
        m.requests.inc(outcome="finished")
    with pytest.raises(ValueError, match="takes labels"):
        m.requests.inc()
    with pytest.raises(ValueError, match="takes labels"):
        m.cancels.inc(outcome="done")
    with pytest.raises(TypeError):
        m.checkpoint_hits.inc(tier=1)
    with pytest.raises(ValueError, match="only go up"):
        m.cancels.inc(-1)


def test_registry_rejects_bad_names_and_duplicates():
    r = Registry()
    r.gauge("a", "a")
    with pytest.raises(ValueError, match="twice"):
        r.gauge("a", "a")
    with pytest.raises(ValueError, match="invalid metric name"):
        r.gauge("1a", "a")
    with pytest.raises(ValueError, match="invalid label name"):
        r.histogram("h", "h", [1], ["le"])


def test_each_metrics_object_is_independent():
    a, b = Metrics(), Metrics()
    a.cancels.inc()
    assert a.cancels.value() == 1 and b.cancels.value() == 0


def test_counts_from_threads_are_not_lost():
    m = Metrics()

    def work():
        for _ in range(10_000):
            m.prefill_tokens.inc(kind="computed")
            m.ttft.observe(0.1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.prefill_tokens.value(kind="computed") == 40_000 and m.ttft.count() == 40_000


def test_content_type_is_text_format_0_0_4():
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"

// cairn bindings: the expert cache's visibility (info, counters, routing trace) and the policy
// replay benches use to measure hit rates with the kernel's own policy code.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include "bind.h"
#include "cairn/expert_cache.h"

namespace py = pybind11;
using namespace cairn;

namespace {

py::dict info(BoundModel& m) {
  const int64_t experts = (int64_t)m.cfg.n_layers * m.cfg.E;
  py::dict d;
  ExpertPager* P = m.pager.get();
  d["budget_bytes"] = (int64_t)m.expert_budget;  // as asked; the slots use slots * slot_bytes of it
  d["slot_bytes"] = (int64_t)m.expert_slot_bytes;
  d["slots"] = P ? P->policy.slots() : (int)experts;  // resident: one per expert
  d["expert_bytes_total"] = (int64_t)m.expert_bytes_total;
  d["dense_bytes"] = (int64_t)m.dense_bytes;
  d["experts_total"] = experts;
  int pinned = 0;
  if (P) {
    py::gil_scoped_release rel;
    std::lock_guard<std::mutex> g(P->call_mu);
    pinned = P->policy.pinned();
  }
  d["pinned"] = pinned;
  d["direct_io"] = P ? P->direct_io() : false;
  d["readers"] = P ? P->readers() : 0;
  d["prefetch"] = P ? P->prefetch_on.load() : false;
  d["paging"] = P != nullptr;
  return d;
}

py::dict stats(BoundModel& m) {
  ExpertPager::Stats s;
  if (ExpertPager* P = m.pager.get()) {
    py::gil_scoped_release rel;
    std::lock_guard<std::mutex> g(P->call_mu);  // between MoE calls: evictions belong to the policy
    s = P->stats();
  }
  py::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["bytes_read"] = s.bytes_read;
  d["read_seconds"] = s.read_seconds;
  d["stall_seconds"] = s.stall_seconds;
  d["read_busy_seconds"] = s.busy_seconds;
  d["evictions"] = s.evictions;
  d["prefetch_reads"] = s.prefetch_reads;
  d["prefetch_used"] = s.prefetch_used;
  d["prefetch_dropped"] = s.prefetch_dropped;
  d["lookahead_guesses"] = s.lookahead_guesses;
  d["lookahead_right"] = s.lookahead_right;
  d["lookahead_keys"] = s.lookahead_keys;
  return d;
}

py::array_t<int32_t> take_trace(BoundModel& m) {
  std::vector<int32_t> rows;
  {
    std::lock_guard<std::mutex> g(m.trace->mu);
    rows.swap(m.trace->rows);
  }
  py::array_t<int32_t> out({(py::ssize_t)(rows.size() / 3), (py::ssize_t)3});
  if (!rows.empty()) std::memcpy(out.mutable_data(), rows.data(), rows.size() * sizeof(int32_t));
  return out;
}

// Replays keys (in access order; steps: the MoE call of each key, non-decreasing) through the
// policy exactly as moe_paged does: one call's distinct keys acquired in order; when acquire finds
// no slot, the call's oldest held slot is released and the acquire retried (the model releases
// the same slot at the same point of the sequence, after that expert's compute).
// ahead (optional, per key): the row is a prefetch issued before call `steps[i]`, not an access.
// A call ends (its slots released, its layer's reservations ended; layer = key // num_experts) at the
// first row of another step.
py::dict replay(py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys,
                py::array_t<int64_t, py::array::c_style | py::array::forcecast> steps, int slots,
                const std::string& policy, int per_tok, int n_layers, int num_experts,
                std::optional<py::array_t<bool>> ahead_arg) {
  if (keys.ndim() != 1 || steps.ndim() != 1 || keys.size() != steps.size())
    throw py::value_error("keys and steps must be 1-D arrays of the same length, got sizes " +
                          std::to_string(keys.size()) + " and " + std::to_string(steps.size()));
  if (slots < 1) throw py::value_error("slots must be >= 1, got " + std::to_string(slots));
  if (per_tok < 1 || per_tok > slots)
    throw py::value_error("k must be in 1..slots, got " + std::to_string(per_tok));
  std::vector<char> ahead(keys.size(), 0);
  if (ahead_arg) {
    auto a = ahead_arg->unchecked<1>();
    if (ahead_arg->ndim() != 1 || a.shape(0) != keys.size())
      throw py::value_error("prefetch must be a 1-D bool array of the keys' length");
    if (num_experts < 1) throw py::value_error("num_experts (routed experts per layer) must be >= 1 with prefetch");
    for (py::ssize_t i = 0; i < a.shape(0); ++i) ahead[i] = a(i);
  }
  const SlotPolicy::Kind kind = SlotPolicy::parse(policy);
  if (kind == SlotPolicy::CYCLE && (n_layers < 1 || num_experts < 1))
    throw py::value_error("policy 'cycle' needs n_layers and num_experts (>= 1), got " + std::to_string(n_layers) +
                          " and " + std::to_string(num_experts));
  const int64_t* k = keys.data();
  const int64_t* s = steps.data();
  const py::ssize_t n = keys.size();
  for (py::ssize_t i = 0; i < n; ++i) {
    if (k[i] < 0) throw py::value_error("keys[" + std::to_string(i) + "] is negative");
    if (kind == SlotPolicy::CYCLE && k[i] >= (int64_t)n_layers * num_experts)
      throw py::value_error("keys[" + std::to_string(i) + "] is beyond n_layers * num_experts");
    if (i && s[i] < s[i - 1]) throw py::value_error("steps must be non-decreasing (at index " + std::to_string(i) + ")");
  }
  int64_t hits = 0, misses = 0, releases = 0, reads_ahead = 0, used_ahead = 0;
  SlotPolicy P(slots, kind, per_tok);
  if (n_layers > 0 && num_experts > 0) P.set_layers(n_layers, num_experts);
  {
    py::gil_scoped_release rel;
    std::unordered_set<int64_t> seen;  // this call's keys (a repeat within a call is no access)
    std::deque<int> held;              // this call's busy slots, oldest first
    std::vector<char> read_ahead(slots, 0);
    int64_t call = -1, layer = -1;     // the open call (-1: none)
    for (py::ssize_t i = 0; i < n; ++i) {
      if (call >= 0 && s[i] != call) {  // the open call ends
        P.release_all();
        if (num_experts > 0) P.end_reservations(layer * num_experts, (layer + 1) * num_experts);
        call = -1;
      }
      if (ahead[i]) {
        const int slot = P.prefetch(k[i]);
        if (slot >= 0) read_ahead[slot] = 1, ++reads_ahead;
        continue;
      }
      if (call < 0) {
        P.begin_call();
        seen.clear();
        held.clear();
        call = s[i];
        layer = num_experts > 0 ? k[i] / num_experts : 0;
      }
      if (!seen.insert(k[i]).second) continue;
      if (num_experts > 0) P.end_reservations(layer * num_experts, k[i]);  // guesses the call passed over
      bool hit = false;
      int slot;
      while ((slot = P.acquire(k[i], &hit)) < 0) {
        if (held.empty()) throw std::logic_error("expert cache replay: no slot for a key");
        P.release(held.front());
        held.pop_front();
        ++releases;
      }
      held.push_back(slot);
      (hit ? hits : misses) += 1;
      if (hit && read_ahead[slot]) ++used_ahead;
      read_ahead[slot] = 0;
    }
  }
  py::dict d;
  d["hits"] = hits;
  d["misses"] = misses;
  d["evictions"] = P.evictions();
  d["releases"] = releases;
  if (ahead_arg) {
    d["prefetch_reads"] = reads_ahead;
    d["prefetch_used"] = used_ahead;
  }
  return d;
}

}  // namespace

void register_experts(py::module_& m) {
  py::class_<BoundModel, std::shared_ptr<BoundModel>> cls =
      py::reinterpret_borrow<py::class_<BoundModel, std::shared_ptr<BoundModel>>>(m.attr("Model"));
  cls.def("expert_cache_info", &info,
          "Expert cache shape: budget_bytes (0 = every expert resident), slot_bytes, slots, expert_bytes_total, "
          "dense_bytes, experts_total, pinned, direct_io, readers (reader threads; 0 when resident), paging, "
          "prefetch (expert_prefetch).")
      .def("expert_cache_stats", &stats,
           "Cumulative counters: hits, misses, bytes_read, read_seconds (sum over reads), stall_seconds (compute "
           "waiting for reads), read_busy_seconds (wall time with at least one read in flight), evictions; "
           "prefetch_reads (reads issued ahead of their call; bytes_read counts them too), prefetch_used (of "
           "those, acquired by their call: counted as hits), prefetch_dropped (of those, dropped unread because "
           "their slot was reused first: a wrong guess passed over before its read began), lookahead_guesses / lookahead_right (keys the "
           "router lookahead predicted, and of those the ones the call used), lookahead_keys (keys acquired by "
           "calls that had a guess). All 0 when every expert is resident.")
      .def_property("expert_prefetch",
                    [](BoundModel& b) { return b.pager ? b.pager->prefetch_on.load() : false; },
                    [](BoundModel& b, bool on) {
                      if (b.pager) b.pager->prefetch_on.store(on);
                      else if (on) throw py::value_error("expert_prefetch: every expert is resident (no paging)");
                    },
                    "Paged experts: read a layer's experts ahead of its call (hash layers from the token ids at the "
                    "step's start, other layers guessed by their router on the previous layer's output). On by "
                    "default; outputs are the same bits either way. False when nothing is paged.")
      .def("set_route_trace", [](BoundModel& b, bool on) {
             std::lock_guard<std::mutex> g(b.trace->mu);
             b.trace->on.store(on, std::memory_order_release);
           }, py::arg("on"), "Record each MoE call's distinct experts (take_route_trace returns them).")
      .def("take_route_trace", &take_trace,
           "The recorded rows (call_seq, layer, expert) as int32 [n, 3], and clears them. With paged experts and "
           "expert_prefetch, a prefetch offered to the slot policy before call call_seq is a row (call_seq, layer, "
           "-1 - expert).");
  m.def("replay_expert_policy", &replay, py::arg("keys"), py::arg("steps"), py::arg("slots"),
        py::arg("policy") = "hotpin", py::kw_only(), py::arg("k") = 1, py::arg("n_layers") = 0,
        py::arg("num_experts") = 0, py::arg("prefetch") = py::none(),
        "Hit counts of the kernel's expert slot policy ('lru' | 'lrfu' | 'hotpin' | 'cycle') on keys (int64 "
        "layer*E+expert, access order) with steps (the MoE call of each key), k = num_experts_per_tok (slots hotpin "
        "never pins), n_layers and num_experts = E (the layer cycle; 'cycle' and prefetch need them) "
        "as the model with that many slots runs them: dict(hits, misses, evictions, releases); releases counts "
        "the times a call released its oldest expert's slot to go on (0 when every call's experts fit). "
        "prefetch (bool per key) marks rows that are prefetches issued before call steps[i] (a route trace's rows "
        "with a negative expert, -1 - e), not accesses (keys // num_experts is the layer whose reservations a "
        "call's end ends); then the dict adds prefetch_reads and prefetch_used.");
}

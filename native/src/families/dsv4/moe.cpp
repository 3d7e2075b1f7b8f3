// cairn kernel: MoE block -- the router (hash or sqrt-softplus top-k routing) and the experts
// (clamped SwiGLU, one shared expert with the same clamp) through the MoE executor
// (moe_executor.h), resident or paged.
//
// Design notes
//  * Prefill groups the chunk's tokens by expert; each expert's ~S*k/E rows run on the packed
//    panels (packed.cpp, packed once at load -- OpenBLAS would re-pack the weight per call);
//    decode (S == 1) takes the same path. act = silu(min(g, L)) * clamp(u, -L, L), applied on
//    the fused gate/up tile.
//  * Routed outputs are accumulated in expert-index order, then the shared expert is added
//    (HF: index_add_ per expert, then routed + shared).
//  * Top-k ties in the router go to the lowest expert index.
#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include "cairn/expert_cache.h"
#include "cairn/forward.h"
#include "dsv4.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"
#include "../../moe_executor.h"

namespace cairn {

// log1p in double: glibc's float log1pf rounds differently on x86-64 and aarch64 (its double
// log1p and float exp agree bit for bit, and the double result rounded to float is the same).
static inline float softplus(float v) { return v > 20.f ? v : (float)std::log1p((double)std::exp(v)); }

// idx/wt [S, k]: each token's experts and routing weights (wt may be null: the experts alone)
static void route(const Model& m, int layer, const float* x, const int32_t* tokens, int S, std::vector<int>& idx,
                  std::vector<float>* wt) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int E = c.E, k = c.k;
  std::vector<float> logits((size_t)S * E);  // [S, E]
  linear(x, S, L.gate, logits.data(), m.threads);
  idx.resize((size_t)S * k);
  if (wt) wt->resize((size_t)S * k);
  for (int i = 0; i < S; ++i) {
    float* lg = &logits[(size_t)i * E];
    for (int e = 0; e < E; ++e) lg[e] = std::sqrt(softplus(lg[e]));  // scores
    int* ix = &idx[(size_t)i * k];
    if (c.hash_moe[layer]) {
      for (int j = 0; j < k; ++j) ix[j] = L.tid2eid[(size_t)tokens[i] * k + j];
    } else {
      // top-k of score + bias by insertion into a sorted list of k (ties: lowest index first,
      // since a later expert only displaces on a strictly greater value)
      const float* b = L.gate_bias;
      int n = 0;
      for (int e = 0; e < E; ++e) {
        const float v = lg[e] + b[e];
        if (n == k && !(v > lg[ix[k - 1]] + b[ix[k - 1]])) continue;
        int pos = n < k ? n++ : k - 1;
        while (pos > 0 && v > lg[ix[pos - 1]] + b[ix[pos - 1]]) {
          ix[pos] = ix[pos - 1];
          --pos;
        }
        ix[pos] = e;
      }
    }
    if (!wt) continue;
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += lg[ix[j]];
    for (int j = 0; j < k; ++j) (*wt)[(size_t)i * k + j] = lg[ix[j]] / (sum + 1e-20f) * c.routed_scale;
  }
}

void prefetch_experts(const Model& m, int layer, const float* x, const int32_t* tokens, int S) {
  ExpertPager* P = m.pager.get();
  if (!P || !P->prefetch_on) return;
  const Config& c = m.cfg;
  std::vector<int> idx;
  if (c.hash_moe[layer]) {  // known from the tokens alone
    idx.resize((size_t)S * c.k);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = m.layers[layer].tid2eid[(size_t)tokens[i / c.k] * c.k + i % c.k];
  } else {
    ProfScope ps(P_ROUTER);
    route(m, layer, x, tokens, S, idx, nullptr);
  }
  std::vector<char> used(c.E, 0);
  for (int e : idx) used[e] = 1;
  std::vector<int64_t> keys;  // the call's acquisition order: expert index
  for (int e = 0; e < c.E; ++e)
    if (used[e]) keys.push_back((int64_t)layer * c.E + e);
  const size_t offered = P->prefetch(layer, keys, !c.hash_moe[layer]);
  if (m.trace && m.trace->on.load(std::memory_order_acquire)) {  // numbered as the next call, not counted
    RouteTrace& tr = *m.trace;
    std::lock_guard<std::mutex> g(tr.mu);
    const int32_t call = (int32_t)tr.calls.load(std::memory_order_relaxed);
    for (size_t i = 0; i < offered; ++i)
      tr.rows.insert(tr.rows.end(), {call, (int32_t)layer, (int32_t)(-1 - keys[i] % c.E)});
  }
}

void moe_block(const Model& m, int layer, const float* x, const int32_t* tokens, int S, float* y) {
  const Config& c = m.cfg;
  const int E = c.E, k = c.k;
  double t0 = omp_get_wtime();
  std::vector<int> idx;
  std::vector<float> wt;
  route(m, layer, x, tokens, S, idx, &wt);
  prof_lap(P_ROUTER, t0);
  if (m.trace) {  // the distinct experts of this call, for benches to replay
    RouteTrace& tr = *m.trace;
    if (!tr.on.load(std::memory_order_acquire)) {
      tr.calls.fetch_add(1, std::memory_order_relaxed);  // no lock: tracing is off
    } else {
      // numbered under the lock, so rows stay in call order when several threads trace
      std::lock_guard<std::mutex> g(tr.mu);
      const int64_t call = tr.calls.fetch_add(1, std::memory_order_relaxed);
      if (tr.on.load(std::memory_order_relaxed)) {
        std::vector<char> used(E, 0);
        for (int i = 0; i < S * k; ++i) used[idx[i]] = 1;
        for (int e = 0; e < E; ++e)
          if (used[e]) tr.rows.insert(tr.rows.end(), {(int32_t)call, (int32_t)layer, (int32_t)e});
      }
    }
  }
  if (m.pager) {
    PagedExperts src(m, layer);
    run_experts(m, layer, x, S, idx, wt, src, y);
  } else {
    ResidentExperts src(m.layers[layer]);
    run_experts(m, layer, x, S, idx, wt, src, y);
  }
  prof_lap(P_EXPERTS, t0);  // routed and shared experts
}

}  // namespace cairn

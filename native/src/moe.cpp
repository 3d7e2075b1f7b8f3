// cairn kernel: MoE block (hash or sqrt-softplus top-k routing, clamped SwiGLU experts, one
// shared expert with the same clamp).
//
// Design notes
//  * Prefill groups the chunk's tokens by expert; each expert's ~S*k/E rows run on the packed
//    panels (packed.cpp, packed once at load -- OpenBLAS would re-pack the weight per call);
//    decode (S == 1) takes the same path. act = silu(min(g, L)) * clamp(u, -L, L), applied on
//    the fused gate/up tile.
//  * Routed outputs are accumulated in expert-index order, then the shared expert is added
//    (HF: index_add_ per expert, then routed + shared).
//  * Top-k ties in the router go to the lowest expert index.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <utility>

#include "cairn/expert_cache.h"
#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"

namespace cairn {

static inline float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }

// act[:, p0/2 panels ..] = silu(min(g, lim)) * clamp(u, -lim, lim) for one fused gate/up tile:
// buf [M, ld] holds np panels (gate and up alternating, kPanel columns each); act is [M, Ip].
static void swiglu_tile(const float* buf, int M, int ld, int np, int p0, float lim, float* act, int Ip) {
  for (int i = 0; i < M; ++i) {
    const float* ri = &buf[(size_t)i * ld];
    float* dst = &act[(size_t)i * Ip + (size_t)(p0 / 2) * kPanel];
    for (int q = 0; q < np / 2; ++q) {
      float ga[kPanel], en[kPanel];
      for (int l = 0; l < kPanel; ++l) {
        ga[l] = std::min(ri[(2 * q) * kPanel + l], lim);
        en[l] = -ga[l];
      }
      vexp(en, en, kPanel);
      for (int l = 0; l < kPanel; ++l) {
        const float ub = std::min(std::max(ri[(2 * q + 1) * kPanel + l], -lim), lim);
        dst[q * kPanel + l] = (ga[l] / (1.f + en[l])) * ub;
      }
    }
  }
}

static void moe_paged(const Model& m, int layer, const float* x, int S, const std::vector<int>& idx,
                      const std::vector<float>& wt, float* y);

void moe_block(const Model& m, int layer, const float* x, const int32_t* tokens, int S, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D, E = c.E, k = c.k;
  double t0 = omp_get_wtime();
  std::vector<float> logits((size_t)S * E);  // [S, E]
  linear(x, S, L.gate, logits.data(), m.threads);
  std::vector<int> idx((size_t)S * k);
  std::vector<float> wt((size_t)S * k);
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
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += lg[ix[j]];
    for (int j = 0; j < k; ++j) wt[(size_t)i * k + j] = lg[ix[j]] / (sum + 1e-20f) * c.routed_scale;
  }
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
    moe_paged(m, layer, x, S, idx, wt, y);
    prof_lap(P_EXPERTS, t0);
    return;
  }
  // Active experts (index order) and the shared expert (last) as jobs. Token rows are read in
  // place through row pointers (no gather copy). Two parallel phases on the packed panels:
  //  1. task = (job, kPackN panels of the fused gate/up weight): act = SwiGLU(w1 x, w3 x), gate
  //     and up from neighbouring panels of the same tile, the clamp/SiLU applied on the tile.
  //  2. task = kPackN panels (16 columns each) of y: for each job in order, y[rows] += wt * (w2 act);
  //     every y element is owned by one task, so y accumulates the experts in index order and
  //     then the shared expert, independent of how tokens are grouped into chunks.
  struct Job {
    int M = 0;
    const Linear *w13 = nullptr, *w2 = nullptr;
    std::vector<int> rows;         // [M] token rows in the chunk
    std::vector<float> rw;         // [M] routing weights (empty: shared, weight 1)
    std::vector<const float*> xs;  // [M] input rows
    std::vector<float> act;        // [M, Ip] (Ip = I rounded up to panels; padding stays 0)
    std::vector<const float*> as;  // [M] act rows
  };
  std::vector<Job> jobs;
  jobs.reserve(E + 1);
  {
    std::vector<int> cnt(E, 0), slot(E, -1);
    for (int i = 0; i < S * k; ++i) ++cnt[idx[i]];
    for (int e = 0; e < E; ++e) {
      if (!cnt[e]) continue;
      slot[e] = (int)jobs.size();
      Job j;
      j.rows.reserve(cnt[e]);
      j.rw.reserve(cnt[e]);
      j.w13 = &L.w13[e]; j.w2 = &L.w2[e];
      jobs.push_back(std::move(j));
    }
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a) {
        Job& j = jobs[slot[idx[(size_t)i * k + a]]];
        j.rows.push_back(i);
        j.rw.push_back(wt[(size_t)i * k + a]);
      }
    Job sj;
    sj.w13 = &L.sw13; sj.w2 = &L.sw2;
    sj.rows.resize(S);
    std::iota(sj.rows.begin(), sj.rows.end(), 0);
    jobs.push_back(std::move(sj));
  }
  for (Job& j : jobs) {
    j.M = (int)j.rows.size();
    j.xs.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.xs[a] = x + (size_t)j.rows[a] * D;
    const int Ip = j.w13->out / 2;
    j.act.resize((size_t)j.M * Ip);
    j.as.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.as[a] = &j.act[(size_t)a * Ip];
  }
  static_assert(kPackN % 2 == 0, "fused gate/up tiles take panels in pairs");
  const int nt = m.threads;
  const float lim = c.swiglu_limit;
  std::vector<std::pair<int, int>> t1;  // (job, first fused panel)
  for (int jj = 0; jj < (int)jobs.size(); ++jj)
    for (int p = 0; p < jobs[jj].w13->out / kPanel; p += kPackN) t1.emplace_back(jj, p);
  const int npan2 = (D + kPanel - 1) / kPanel;
  const int nt1 = (int)t1.size(), nt2 = (npan2 + kPackN - 1) / kPackN;
  int64_t work = 0;
  for (const Job& j : jobs) work += (int64_t)3 * j.M * j.w2->in * D;
#pragma omp parallel num_threads(nt) if (work > kParMinWork)
  {
    std::vector<float> buf;  // [M, kPackN*16] one task's tile results
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt1; ++t) {
      Job& j = jobs[t1[t].first];
      const int p0 = t1[t].second, np = std::min(kPackN, j.w13->out / kPanel - p0), ld = np * kPanel;
      const int Ip = j.w13->out / 2;
      buf.resize((size_t)j.M * ld);
      packed_panels(j.xs.data(), j.M, *j.w13, p0, np, buf.data());
      swiglu_tile(buf.data(), j.M, ld, np, p0, lim, j.act.data(), Ip);
    }
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt2; ++t) {
      const int p0 = t * kPackN, np = std::min(kPackN, npan2 - p0), ld = np * kPanel;
      const int c0 = p0 * kPanel, nc = std::min(D, (p0 + np) * kPanel) - c0;
      for (int i = 0; i < S; ++i) std::fill(y + (size_t)i * D + c0, y + (size_t)i * D + c0 + nc, 0.f);
      for (const Job& j : jobs) {
        const bool shared = j.rw.empty();
        buf.resize((size_t)j.M * ld);
        packed_panels(j.as.data(), j.M, *j.w2, p0, np, buf.data());
        for (int i = 0; i < j.M; ++i) {
          float* dst = y + (size_t)j.rows[i] * D + c0;
          const float* ri = &buf[(size_t)i * ld];
          if (shared)
            for (int q = 0; q < nc; ++q) dst[q] = dst[q] + ri[q];
          else
            for (int q = 0; q < nc; ++q) dst[q] += ri[q] * j.rw[i];
        }
      }
    }
  }
  prof_lap(P_EXPERTS, t0);  // routed and shared experts: one pair of parallel phases
}

// ---- paged experts ----------------------------------------------------------------------------
// The same arithmetic as above, pipelined over a sliding window of slots: the call acquires the
// chunk's routed experts in index order and issues each missing one's read as soon as a slot is
// found; it computes (shared expert first) whatever is present, a few experts per parallel round,
// and releases a computed expert's slot (oldest first) when the next acquire needs one, so reads
// stream while compute proceeds and the disk does not idle at wave boundaries. Slots of experts
// still being read or computed are busy, never evicted. Each job's w2 product goes to its own
// buffer; y then accumulates the routed jobs in expert-index order and the shared expert last,
// with the same expressions as the resident phase 2: every y element sees the same operations in
// the same order, so the bits are identical whatever the budget and timing.
namespace {
struct PJob {
  int M = 0;
  int64_t key = -1;  // routed: layer * E + expert; -1 = shared
  Linear w13, w2;
  std::vector<int> rows;         // [M] token rows in the chunk
  std::vector<float> rw;         // [M] routing weights (empty: shared)
  std::vector<const float*> xs;  // [M] input rows
  std::vector<float> act;        // [M, Ip]
  std::vector<const float*> as;  // [M] act rows
  std::vector<float> out;        // [M, D] w2 products
  bool loading = false;
  ExpertPager::Ticket ticket;
  std::atomic<int> p1_left{0};   // phase-1 tasks not finished
};

// phase 1 and phase 2 of `order` (jobs run in this order; a job's reads are awaited by its tasks)
bool run_jobs(const Model& m, ExpertPager& P, const std::vector<PJob*>& order, int64_t work) {
  const int D = m.cfg.D, npan2 = (D + kPanel - 1) / kPanel, nt2 = (npan2 + kPackN - 1) / kPackN;
  const float lim = m.cfg.swiglu_limit;
  struct Task {
    PJob* j;
    int phase, p0;
  };
  std::vector<Task> tasks;
  for (PJob* j : order) {
    int n1 = 0;
    for (int p = 0; p < j->w13.out / kPanel; p += kPackN, ++n1) tasks.push_back({j, 1, p});
    j->p1_left.store(n1);
    for (int t = 0; t < nt2; ++t) tasks.push_back({j, 2, t * kPackN});
  }
  std::atomic<bool> failed{false};
  const int ntask = (int)tasks.size();
#pragma omp parallel num_threads(m.threads) if (work > kParMinWork)
  {
    std::vector<float> buf;  // [M, kPackN*16] one task's tile results
    // dynamic hands tasks out in order: a task only waits for reads and for tasks handed out before it
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; ++t) {
      PJob& j = *tasks[t].j;
      const int p0 = tasks[t].p0;
      const bool ok = !j.loading || P.wait(&j.ticket);  // every task waits: no read outlives the call
      if (!ok) failed.store(true);
      if (tasks[t].phase == 1) {
        if (ok) {
          const int np = std::min(kPackN, j.w13.out / kPanel - p0), ld = np * kPanel, Ip = j.w13.out / 2;
          buf.resize((size_t)j.M * ld);
          packed_panels(j.xs.data(), j.M, j.w13, p0, np, buf.data());
          swiglu_tile(buf.data(), j.M, ld, np, p0, lim, j.act.data(), Ip);
        }
        j.p1_left.fetch_sub(1, std::memory_order_release);
      } else {
        while (j.p1_left.load(std::memory_order_acquire) > 0) std::this_thread::yield();
        if (!ok) continue;
        const int np = std::min(kPackN, npan2 - p0), ld = np * kPanel;
        const int c0 = p0 * kPanel, nc = std::min(D, (p0 + np) * kPanel) - c0;
        buf.resize((size_t)j.M * ld);
        packed_panels(j.as.data(), j.M, j.w2, p0, np, buf.data());
        for (int i = 0; i < j.M; ++i) std::memcpy(&j.out[(size_t)i * D + c0], &buf[(size_t)i * ld], sizeof(float) * nc);
      }
    }
  }
  return !failed.load();
}

// y[rows] += (routed: wt *) out, jobs in the given (expert-index) order, per column tile as in phase 2
void reduce_jobs(const Model& m, const std::vector<PJob*>& jobs, float* y, int64_t work) {
  const int D = m.cfg.D, npan2 = (D + kPanel - 1) / kPanel, nt2 = (npan2 + kPackN - 1) / kPackN;
#pragma omp parallel for num_threads(m.threads) schedule(dynamic, 1) if (work > kParMinWork)
  for (int t = 0; t < nt2; ++t) {
    const int p0 = t * kPackN, np = std::min(kPackN, npan2 - p0);
    const int c0 = p0 * kPanel, nc = std::min(D, (p0 + np) * kPanel) - c0;
    for (const PJob* j : jobs) {
      const bool shared = j->rw.empty();
      for (int i = 0; i < j->M; ++i) {
        float* dst = y + (size_t)j->rows[i] * D + c0;
        const float* ri = &j->out[(size_t)i * D + c0];
        if (shared)
          for (int q = 0; q < nc; ++q) dst[q] = dst[q] + ri[q];
        else
          for (int q = 0; q < nc; ++q) dst[q] += ri[q] * j->rw[i];
      }
    }
  }
}
}  // namespace

static void moe_paged(const Model& m, int layer, const float* x, int S, const std::vector<int>& idx,
                      const std::vector<float>& wt, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D, E = c.E, k = c.k;
  ExpertPager& P = *m.pager;
  std::vector<std::unique_ptr<PJob>> routed;  // index order
  {
    std::vector<int> cnt(E, 0), at(E, -1);
    for (int i = 0; i < S * k; ++i) ++cnt[idx[i]];
    for (int e = 0; e < E; ++e) {
      if (!cnt[e]) continue;
      at[e] = (int)routed.size();
      routed.push_back(std::make_unique<PJob>());
      routed.back()->key = (int64_t)layer * E + e;
      routed.back()->rows.reserve(cnt[e]);
      routed.back()->rw.reserve(cnt[e]);
    }
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a) {
        PJob& j = *routed[at[idx[(size_t)i * k + a]]];
        j.rows.push_back(i);
        j.rw.push_back(wt[(size_t)i * k + a]);
      }
  }
  PJob shared;
  shared.w13 = L.sw13;
  shared.w2 = L.sw2;
  shared.rows.resize(S);
  std::iota(shared.rows.begin(), shared.rows.end(), 0);
  int64_t work = 0;
  auto prepare = [&](PJob& j, int I2) {
    j.M = (int)j.rows.size();
    j.xs.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.xs[a] = x + (size_t)j.rows[a] * D;
    const int Ip = I2 / 2;
    j.act.assign((size_t)j.M * Ip, 0.f);
    j.as.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.as[a] = &j.act[(size_t)a * Ip];
    j.out.resize((size_t)j.M * D);
  };
  for (auto& j : routed) prepare(*j, L.w13[j->key % E].out);
  prepare(shared, L.sw13.out);
  // the resident path's parallel threshold, so small calls stay on one thread alike
  for (auto& j : routed) work += (int64_t)3 * j->M * L.w2[j->key % E].in * D;
  work += (int64_t)3 * shared.M * L.sw2.in * D;

  std::lock_guard<std::mutex> g(P.call_mu);
  P.policy.begin_call();
  std::fill(y, y + (size_t)S * D, 0.f);
  const size_t n = routed.size();
  std::vector<int> slot_of(n, -1);
  std::vector<char> done(n, 0);
  std::deque<size_t> held;  // routed jobs holding a slot, in acquisition order (released FIFO)
  size_t next = 0, ndone = 0;
  bool shared_done = false;
  auto present = [&](size_t i) { return !routed[i]->loading || routed[i]->ticket.state.load() == 1; };
  auto failed = [&](size_t i) { return routed[i]->loading && routed[i]->ticket.state.load() == -1; };
  // a read failed: let every issued read finish (tickets and slots belong to this call), forget
  // the slots that hold no valid expert, and report
  auto fail = [&]() {
    for (size_t i : held)
      if (routed[i]->loading) P.wait(&routed[i]->ticket);
    for (size_t i : held)
      if (failed(i)) P.policy.drop(routed[i]->key);
    P.policy.release_all();
    throw std::runtime_error("expert cache: reading a routed expert from the packed cache file failed");
  };
  // a round computes at most this many routed experts, so freed slots get new reads soon
  const size_t round_max = (size_t)std::max(2, m.threads);
  while (ndone < n || !shared_done) {
    // 1. acquire the next experts while the policy finds slots, issuing the reads of the missing
    //    ones; a full window releases its oldest expert once that one is computed (the policy
    //    sees releases only on a failed acquire: its operations depend on the keys alone)
    while (next < n) {
      PJob& j = *routed[next];
      bool hit = false;
      const int s = P.policy.acquire(j.key, &hit);
      if (s < 0) {
        if (held.empty()) throw std::logic_error("expert cache: no slot for an expert");
        if (!done[held.front()]) break;
        P.policy.release(slot_of[held.front()]);
        held.pop_front();
        continue;
      }
      P.count(hit);
      const int e = (int)(j.key % E);
      j.w13 = paged_linear(L.w13[e], P.w13[j.key], P.slot(s));
      j.w2 = paged_linear(L.w2[e], P.w2[j.key], P.slot(s));
      j.loading = !hit;
      if (!hit) P.submit(s, j.key, &j.ticket);
      slot_of[next] = s;
      held.push_back(next++);
    }
    // 2. compute: the shared expert first, then held experts whose data is present (window order)
    std::vector<PJob*> round;
    std::vector<size_t> ids;
    if (!shared_done) round.push_back(&shared);
    for (size_t i : held) {
      if (failed(i)) fail();
      if (!done[i] && present(i)) {
        ids.push_back(i);
        round.push_back(routed[i].get());
        if (ids.size() == round_max) break;
      }
    }
    if (round.empty()) {
      // nothing to compute: block (condition variable, counted as stall) on the oldest pending read
      for (size_t i : held)
        if (!done[i]) {
          if (!P.wait(&routed[i]->ticket)) fail();
          break;
        }
      continue;
    }
    if (!run_jobs(m, P, round, work)) fail();
    for (size_t i : ids) done[i] = 1;
    ndone += ids.size();
    shared_done = true;
  }
  P.policy.release_all();
  // y accumulates the routed experts in expert-index order, then the shared expert
  std::vector<PJob*> all;
  all.reserve(n + 1);
  for (auto& j : routed) all.push_back(j.get());
  all.push_back(&shared);
  reduce_jobs(m, all, y, work);
}

}  // namespace cairn

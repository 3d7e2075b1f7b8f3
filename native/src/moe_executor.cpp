// cairn kernel: the MoE executor (moe_executor.h).
#include "moe_executor.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "cairn/kernels.h"

namespace cairn {

namespace {

// act[:, p0/2 panels ..] = silu(min(g, lim)) * clamp(u, -lim, lim) for one fused gate/up tile:
// buf [M, ld] holds np panels (gate and up alternating, kPanel columns each); act is [M, Ip].
void swiglu_tile(const float* buf, int M, int ld, int np, int p0, float lim, float* act, int Ip) {
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

// y[rows, c0 .. c0+nc) += one job's w2 product for those columns (src [M, lds]): the shared
// expert adds it as is, a routed one times its routing weight
inline void accumulate(const MoeJob& j, const float* src, size_t lds, int D, int c0, int nc, float* y) {
  const bool shared = j.rw.empty();
  for (int i = 0; i < j.M; ++i) {
    float* dst = y + (size_t)j.rows[i] * D + c0;
    const float* ri = src + (size_t)i * lds;
    if (shared)
      for (int q = 0; q < nc; ++q) dst[q] = dst[q] + ri[q];
    else
      for (int q = 0; q < nc; ++q) dst[q] += ri[q] * j.rw[i];
  }
}

// One parallel round: phase 1 and phase 2 of `round`. Not last: the w2 products go to each job's
// `out`. Last (`all` = every job, expert-index order, shared last): each column tile of y is
// zeroed and accumulates every job's product -- this round's computed now, earlier ones from out.
void run_round(const Model& m, const std::vector<MoeJob*>& round, const std::vector<MoeJob*>* all, int S,
               float* y, int64_t work) {
  static_assert(kPackN % 2 == 0, "fused gate/up tiles take panels in pairs");
  const int D = m.cfg.D, npan2 = (D + kPanel - 1) / kPanel, nt2 = (npan2 + kPackN - 1) / kPackN;
  const float lim = m.cfg.swiglu_limit;
  std::vector<std::pair<MoeJob*, int>> t1;  // (job, first fused panel)
  for (MoeJob* j : round)
    for (int p = 0; p < j->w13.out / kPanel; p += kPackN) t1.emplace_back(j, p);
  if (!all)
    for (MoeJob* j : round) j->out.resize((size_t)j->M * D);
  const int nt1 = (int)t1.size();
  for (MoeJob* j : round)
    if (pow2_format(j->w13)) j->xb13.init(j->xs.data(), j->M, j->w13.in);
#pragma omp parallel num_threads(m.threads) if (work > kParMinWork)
  {
    std::vector<float> buf;  // [M, kPackN*16] one task's tile results
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt1; ++t) {
      MoeJob& j = *t1[t].first;
      const int p0 = t1[t].second, np = std::min(kPackN, j.w13.out / kPanel - p0), ld = np * kPanel;
      const int Ip = j.w13.out / 2;
      buf.resize((size_t)j.M * ld);
      packed_panels(j.xs.data(), j.M, j.w13, p0, np, buf.data(), &j.xb13);
      swiglu_tile(buf.data(), j.M, ld, np, p0, lim, j.act.data(), Ip);
    }
#pragma omp for schedule(static)
    for (size_t r = 0; r < round.size(); ++r)
      if (pow2_format(round[r]->w2)) round[r]->xb2.init(round[r]->as.data(), round[r]->M, round[r]->w2.in);
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt2; ++t) {
      const int p0 = t * kPackN, np = std::min(kPackN, npan2 - p0), ld = np * kPanel;
      const int c0 = p0 * kPanel, nc = std::min(D, (p0 + np) * kPanel) - c0;
      if (!all) {
        for (MoeJob* j : round) {
          buf.resize((size_t)j->M * ld);
          packed_panels(j->as.data(), j->M, j->w2, p0, np, buf.data(), &j->xb2);
          for (int i = 0; i < j->M; ++i)
            std::memcpy(&j->out[(size_t)i * D + c0], &buf[(size_t)i * ld], sizeof(float) * nc);
        }
        continue;
      }
      for (int i = 0; i < S; ++i) std::fill(y + (size_t)i * D + c0, y + (size_t)i * D + c0 + nc, 0.f);
      for (const MoeJob* j : *all) {
        if (j->computed) {  // in an earlier round
          accumulate(*j, &j->out[c0], (size_t)D, D, c0, nc, y);
          continue;
        }
        buf.resize((size_t)j->M * ld);
        packed_panels(j->as.data(), j->M, j->w2, p0, np, buf.data(), &j->xb2);
        accumulate(*j, buf.data(), (size_t)ld, D, c0, nc, y);
      }
    }
  }
}

}  // namespace

void run_experts(const Model& m, int layer, const float* x, int S, const std::vector<int>& idx,
                 const std::vector<float>& wt, ExpertSource& src, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D, E = c.E, k = c.k;
  std::vector<std::unique_ptr<MoeJob>> routed;  // expert-index order
  {
    std::vector<int> cnt(E, 0), at(E, -1);
    for (int i = 0; i < S * k; ++i) ++cnt[idx[i]];
    for (int e = 0; e < E; ++e) {
      if (!cnt[e]) continue;
      at[e] = (int)routed.size();
      routed.push_back(std::make_unique<MoeJob>());
      MoeJob& j = *routed.back();
      j.expert = e;
      j.key = (int64_t)layer * E + e;
      j.rows.reserve(cnt[e]);
      j.rw.reserve(cnt[e]);
    }
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a) {
        MoeJob& j = *routed[at[idx[(size_t)i * k + a]]];
        j.rows.push_back(i);
        j.rw.push_back(wt[(size_t)i * k + a]);
      }
  }
  MoeJob shared;
  shared.w13 = L.sw13;
  shared.w2 = L.sw2;
  shared.rows.resize(S);
  std::iota(shared.rows.begin(), shared.rows.end(), 0);
  auto prepare = [&](MoeJob& j, int I2) {
    j.M = (int)j.rows.size();
    j.xs.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.xs[a] = x + (size_t)j.rows[a] * D;
    const int Ip = I2 / 2;
    j.act.assign((size_t)j.M * Ip, 0.f);
    j.as.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.as[a] = &j.act[(size_t)a * Ip];
  };
  int64_t work = 0;  // multiply-adds of the whole call: its rounds open parallel regions alike
  for (auto& j : routed) {
    prepare(*j, L.w13[j->expert].out);
    work += (int64_t)3 * j->M * L.w2[j->expert].in * D;
  }
  prepare(shared, L.sw13.out);
  work += (int64_t)3 * shared.M * L.sw2.in * D;
  std::vector<MoeJob*> all;  // the order y accumulates in: routed by expert index, shared last
  all.reserve(routed.size() + 1);
  for (auto& j : routed) all.push_back(j.get());
  all.push_back(&shared);

  src.begin();
  const size_t n = routed.size();
  std::deque<size_t> held;  // routed jobs holding a slot, in acquisition order (released FIFO)
  size_t next = 0, ndone = 0;
  auto held_jobs = [&] {
    std::vector<MoeJob*> h;
    for (size_t i : held) h.push_back(routed[i].get());
    return h;
  };
  while (ndone < n || !shared.computed) {
    // 1. acquire the next experts while the source finds slots (issuing the reads of missing
    //    ones); a full window releases its oldest expert once that one is computed (releases
    //    happen only on a failed acquire: the slot policy's operations depend on the keys alone)
    while (next < n) {
      if (src.acquire(*routed[next])) {
        held.push_back(next++);
        continue;
      }
      if (held.empty()) throw std::logic_error("expert cache: no slot for an expert");
      if (!routed[held.front()]->computed) break;
      src.release(*routed[held.front()]);
      held.pop_front();
    }
    // 2. compute: the shared expert first, then held experts that are present (window order)
    std::vector<MoeJob*> round;
    size_t nrouted = 0;
    if (!shared.computed) round.push_back(&shared);
    for (size_t i : held) {
      MoeJob& j = *routed[i];
      const int st = src.state(j);
      if (st < 0) src.fail(held_jobs());
      if (!j.computed && st == 1) {
        round.push_back(&j);
        if (++nrouted == src.round_max()) break;
      }
    }
    if (round.empty()) {
      // nothing to compute: block on the oldest pending read (the next pass sees how it ended)
      for (size_t i : held)
        if (!routed[i]->computed) {
          src.wait(*routed[i]);
          break;
        }
      continue;
    }
    const bool last = ndone + nrouted == n;
    run_round(m, round, last ? &all : nullptr, S, y, work);
    for (MoeJob* j : round) j->computed = true;
    ndone += nrouted;
  }
  src.finish();
}

}  // namespace cairn

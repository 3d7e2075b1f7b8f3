// cairn kernel: model-level precomputation (RoPE inverse frequencies, as HF computes them).
#include <cmath>

#include "cairn/model.h"

namespace cairn {

void init_rope(Model& m) {
  const Config& c = m.cfg;
  const int dim = c.r, half = c.r / 2;
  m.inv_freq_main.resize(half);
  m.inv_freq_comp.resize(half);
  for (int i = 0; i < half; ++i) {
    float e = (float)(2 * i) / (float)dim;
    m.inv_freq_main[i] = 1.0f / (float)std::pow(c.rope_theta, (double)e);
  }
  const double base = c.compress_rope_theta;
  if (!c.compress_yarn) {
    for (int i = 0; i < half; ++i) {
      float e = (float)(2 * i) / (float)dim;
      m.inv_freq_comp[i] = 1.0f / (float)std::pow(base, (double)e);
    }
    return;
  }
  // HF _compute_yarn_parameters (truncate = True, attention_factor 1.0)
  auto corr_dim = [&](double rot) {
    return (dim * std::log(c.yarn_orig / (rot * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = std::floor(corr_dim(c.yarn_beta_fast)), high = std::ceil(corr_dim(c.yarn_beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, (double)(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    float e = (float)(2 * i) / (float)dim;
    float pos_freq = (float)std::pow(base, (double)e);
    float extra = 1.0f / pos_freq;
    float inter = 1.0f / ((float)c.yarn_factor * pos_freq);
    float ramp = (float)(((float)i - (float)low) / (float)(high - low));
    ramp = std::min(1.f, std::max(0.f, ramp));
    float ef = 1.f - ramp;
    m.inv_freq_comp[i] = inter * (1.f - ef) + extra * ef;
  }
}

}  // namespace cairn

// ---- weight packing -------------------------------------------------------------------------
#include <sys/mman.h>

#include <stdexcept>
#include <unordered_set>

#include "cairn/kernels.h"

namespace cairn {

namespace {
struct PackJob {
  Linear* dst;
  std::vector<const float*> rows;  // logical rows (nullptr = zero padding)
  bool bf16;                       // store BF16 panels (every source row holds BF16 values)
  QFmt qf = QFmt::None;            // else: quantized panels of the stored codes from qrows
  std::vector<QRow> qrows;
};

std::vector<QRow> qrows_of(const Linear& L, int r0 = 0, int n = -1) {
  if (n < 0) n = L.out;
  std::vector<QRow> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = {&L, r0 + i};
  return rows;
}

std::vector<QRow> fused_qrows(const Linear& g, const Linear& u) {
  const int np = (g.out + kPanel - 1) / kPanel;
  std::vector<QRow> rows((size_t)2 * np * kPanel, QRow{nullptr, 0});
  for (int q = 0; q < np; ++q)
    for (int l = 0; l < kPanel && q * kPanel + l < g.out; ++l) {
      rows[(size_t)(2 * q) * kPanel + l] = {&g, q * kPanel + l};
      rows[(size_t)(2 * q + 1) * kPanel + l] = {&u, q * kPanel + l};
    }
  return rows;
}

std::vector<const float*> rows_of(const Linear& L, int r0 = 0, int n = -1) {
  if (n < 0) n = L.out;
  std::vector<const float*> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = L.w + (size_t)(r0 + i) * L.in;
  return rows;
}

// 16 gate rows, the same 16 up rows, ... (rows past `out` are zero).
std::vector<const float*> fused_rows(const Linear& g, const Linear& u) {
  const int np = (g.out + kPanel - 1) / kPanel;
  std::vector<const float*> rows((size_t)2 * np * kPanel, nullptr);
  for (int q = 0; q < np; ++q)
    for (int l = 0; l < kPanel && q * kPanel + l < g.out; ++l) {
      rows[(size_t)(2 * q) * kPanel + l] = g.w + (size_t)(q * kPanel + l) * g.in;
      rows[(size_t)(2 * q + 1) * kPanel + l] = u.w + (size_t)(q * kPanel + l) * u.in;
    }
  return rows;
}
}  // namespace

void pack_weights(Model& m, int threads) {
  const Config& c = m.cfg;
  std::vector<PackJob> jobs;
  std::vector<Linear*> sources;  // every Linear whose row-major source is dropped afterwards
  auto bf16 = [&](const Linear& L) { return kBf16Panels && !m.widen_bf16 && m.bf16_sources.count(L.w) > 0; };
  auto plain = [&](Linear& L) {
    if (L.q) jobs.push_back({&L, {}, false, L.qf, qrows_of(L)});
    else if (L.w) jobs.push_back({&L, rows_of(L), bf16(L), QFmt::None, {}});
    else return;
    sources.push_back(&L);
  };
  // gate/up pairs: both quantized alike, or both float
  auto fused = [&](Linear& dst, const Linear& g, const Linear& u) {
    if (g.q || u.q) {
      if (g.qf != u.qf) throw std::runtime_error("gate and up projections of one expert must share a format");
      jobs.push_back({&dst, {}, false, g.qf, fused_qrows(g, u)});
    } else {
      jobs.push_back({&dst, fused_rows(g, u), bf16(g) && bf16(u), QFmt::None, {}});
    }
  };
  plain(m.hc_head);
  plain(m.head);
  for (LayerW& L : m.layers) {
    for (Linear* x : {&L.hc_attn, &L.hc_ffn, &L.wq_a, &L.wq_b, &L.wkv, &L.wo_b, &L.comp.wkv, &L.comp.wgate, &L.icomp.wkv,
                      &L.icomp.wgate, &L.iwq_b, &L.iweights, &L.gate})
      plain(*x);
    const int gin = L.wo_a.in;
    L.wo_a_g.assign(c.G, Linear{});
    for (int g = 0; g < c.G; ++g) {
      L.wo_a_g[g] = Linear{nullptr, nullptr, c.Ro, gin};
      if (L.wo_a.q) jobs.push_back({&L.wo_a_g[g], {}, false, L.wo_a.qf, qrows_of(L.wo_a, g * c.Ro, c.Ro)});
      else jobs.push_back({&L.wo_a_g[g], rows_of(L.wo_a, g * c.Ro, c.Ro), bf16(L.wo_a), QFmt::None, {}});
    }
    sources.push_back(&L.wo_a);
    L.w13.assign(L.w1.size(), Linear{});
    for (size_t e = 0; e < L.w1.size(); ++e) {
      L.w13[e] = Linear{nullptr, nullptr, 2 * ((L.w1[e].out + kPanel - 1) / kPanel) * kPanel, L.w1[e].in};
      fused(L.w13[e], L.w1[e], L.w3[e]);
      plain(L.w2[e]);
      sources.push_back(&L.w1[e]);
      sources.push_back(&L.w3[e]);
    }
    L.sw13 = Linear{nullptr, nullptr, 2 * ((L.sw1.out + kPanel - 1) / kPanel) * kPanel, L.sw1.in};
    fused(L.sw13, L.sw1, L.sw3);
    plain(L.sw2);
    sources.push_back(&L.sw1);
    sources.push_back(&L.sw3);
  }
  std::vector<void*> bufs(jobs.size());
  std::vector<size_t> code_bytes(jobs.size(), 0);  // quantized: where the scales start in bufs[j]
  std::vector<size_t> offsets(jobs.size(), 0);
  size_t total = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PackJob& J = jobs[j];
    size_t bytes;
    if (J.qf != QFmt::None) {
      const int n = (int)J.qrows.size();
      code_bytes[j] = (qpanel_code_bytes(J.qf, n, J.dst->in) + 63) / 64 * 64;
      bytes = code_bytes[j] + qpanel_scale_bytes(J.qf, n, J.dst->in);
    } else {
      bytes = packed_floats((int)J.rows.size(), J.dst->in) * (J.bf16 ? sizeof(uint16_t) : sizeof(float));
    }
    offsets[j] = total;
    total += (bytes + 63) / 64 * 64;
  }
  // One arena for every panel, in 2 MiB pages where the kernel allows (transparent huge pages
  // on madvise): 1/512 of the page faults while packing and of the TLB misses while computing.
  constexpr size_t kHuge = 2u << 20;
  const size_t arena = std::max<size_t>((total + kHuge - 1) / kHuge * kHuge, kHuge);
  void* base = std::aligned_alloc(kHuge, arena);
  if (!base) throw std::bad_alloc();
  m.packed.emplace_back(base);
  madvise(base, arena, MADV_HUGEPAGE);  // advisory: without THP the arena is ordinary pages
  for (size_t j = 0; j < jobs.size(); ++j) bufs[j] = (char*)base + offsets[j];
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PackJob& J = jobs[j];
    if (J.qf != QFmt::None)
      pack_panels_q(J.qf, J.qrows, J.dst->in, (uint8_t*)bufs[j], (uint8_t*)bufs[j] + code_bytes[j]);
    else if (J.bf16) pack_panels_bf16(J.rows, J.dst->in, (uint16_t*)bufs[j]);
    else pack_panels(J.rows, J.dst->in, (float*)bufs[j]);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    Linear& D = *jobs[j].dst;
    if (jobs[j].qf != QFmt::None) {
      D.qf = jobs[j].qf;
      D.pq = (const uint8_t*)bufs[j];
      D.pqs = (const uint8_t*)bufs[j] + code_bytes[j];
    } else if (jobs[j].bf16) {
      D.p16 = (const uint16_t*)bufs[j];
    } else {
      D.p = (const float*)bufs[j];
    }
  }
  // the sources of packed matrices (widened BF16/F16 rows, mapped quantized bytes) are no longer needed
  std::unordered_set<const float*> dropped;
  for (Linear* L : sources) {
    dropped.insert(L->w);
    L->w = nullptr;
    L->q = L->qs = nullptr;
  }
  for (auto& o : m.owned)
    if (o && dropped.count(o->data())) o.reset();
  m.bf16_sources.clear();  // they pointed into buffers freed just above
}

}  // namespace cairn

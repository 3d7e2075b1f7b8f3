// cairn kernel: the panel packer's jobs and layout (pack_plan.h).
#include "pack_plan.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "formats/formats.h"
#include "codecs/codec.h"
#include "packed_file.h"

namespace cairn {

namespace {
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

// Row pointers into a row-major source: L's fp32 rows (L.w) or the same rows' stored BF16 values (w).
template <class T>
std::vector<const T*> rows_of(const Linear& L, const T* w, int r0 = 0, int n = -1) {
  if (n < 0) n = L.out;
  std::vector<const T*> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = w + (size_t)(r0 + i) * L.in;
  return rows;
}

// 16 gate rows, the same 16 up rows, ... (rows past `out` are zero).
template <class T>
std::vector<const T*> fused_rows(const Linear& g, const T* gw, const Linear& u, const T* uw) {
  const int np = (g.out + kPanel - 1) / kPanel;
  std::vector<const T*> rows((size_t)2 * np * kPanel, nullptr);
  for (int q = 0; q < np; ++q)
    for (int l = 0; l < kPanel && q * kPanel + l < g.out; ++l) {
      rows[(size_t)(2 * q) * kPanel + l] = gw + (size_t)(q * kPanel + l) * g.in;
      rows[(size_t)(2 * q + 1) * kPanel + l] = uw + (size_t)(q * kPanel + l) * u.in;
    }
  return rows;
}

// Drops a source range's pages from this process (file-backed pages stay reclaimable in the page
// cache; non-destructive, unlike MADV_DONTNEED on anonymous memory).
void page_out(const void* p, size_t n) {
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
  if (!p || !n) return;
  const uintptr_t a = round_up((uintptr_t)p, kPage), b = ((uintptr_t)p + n) / kPage * kPage;
  if (b > a) madvise((void*)a, b - a, MADV_PAGEOUT);
}

size_t source_bytes(const Linear& L) {
  if (L.q && L.qf == QFmt::Ggml) return (size_t)L.out * (L.in / L.codec->block) * L.codec->bytes;
  if (L.q) return (size_t)L.out * (L.qf == QFmt::E2M1 ? L.in / 2 : L.in);
  return L.w ? (size_t)L.out * L.in * sizeof(float) : 0;
}
size_t scale_bytes(const Linear& L) {
  if (!L.qs) return 0;
  if (L.qf == QFmt::E2M1) return (size_t)L.out * (L.in / kFp4Group);
  return (size_t)((L.out + kFp8Block - 1) / kFp8Block) * ((L.in + kFp8Block - 1) / kFp8Block);
}
}  // namespace

std::vector<const float*> PackJob::rows() const {
  return up ? fused_rows(*src, src->w, *up, up->w) : rows_of(*src, src->w, r0, n);
}
std::vector<const uint16_t*> PackJob::rows16(const PackPlan& P) const {
  const auto w = [&](const Linear* L) { return P.bf16_rows.at(L->w); };
  return up ? fused_rows(*src, w(src), *up, w(up)) : rows_of(*src, w(src), r0, n);
}
std::vector<QRow> PackJob::qrows() const { return up ? fused_qrows(*src, *up) : qrows_of(*src, r0, n); }

PackPlan plan_packing(Model& m) {
  const Config& c = m.cfg;
  PackPlan P;
  std::vector<PackJob>& jobs = P.jobs;
  auto bf16 = [&](const Linear& L) { return kBf16Panels && !m.widen_bf16 && m.bf16_sources.count(L.w) > 0; };
  auto plain = [&](Linear& L) {
    if (L.q) jobs.push_back({&L, &L, nullptr, 0, L.out, false, L.qf});
    else if (L.w) jobs.push_back({&L, &L, nullptr, 0, L.out, bf16(L), QFmt::None});
    else return;
    P.sources.push_back(&L);
  };
  // gate/up pairs: both quantized alike, or both float
  auto fused = [&](Linear& dst, const Linear& g, const Linear& u) {
    if (g.q || u.q) {
      if (g.qf != u.qf || g.codec != u.codec)
        throw std::runtime_error("gate and up projections of one expert must share a format");
      jobs.push_back({&dst, &g, &u, 0, 0, false, g.qf});
    } else {
      jobs.push_back({&dst, &g, &u, 0, 0, bf16(g) && bf16(u), QFmt::None});
    }
  };
  auto tag = [&](int64_t key, int part) {
    P.key.resize(jobs.size(), -1);
    P.part.resize(jobs.size(), 0);
    P.key.back() = key;
    P.part.back() = part;
  };
  plain(m.hc_head);
  plain(m.head);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerW& L = m.layers[l];
    for (Linear* x : {&L.hc_attn, &L.hc_ffn, &L.wq_a, &L.wq_b, &L.wkv, &L.wo_b, &L.comp.wkv, &L.comp.wgate, &L.icomp.wkv,
                      &L.icomp.wgate, &L.iwq_b, &L.iweights, &L.gate})
      plain(*x);
    const int gin = L.wo_a.in;
    L.wo_a_g.assign(c.G, Linear{});
    for (int g = 0; g < c.G; ++g) {
      L.wo_a_g[g] = Linear{nullptr, nullptr, c.Ro, gin};
      if (L.wo_a.q) jobs.push_back({&L.wo_a_g[g], &L.wo_a, nullptr, g * c.Ro, c.Ro, false, L.wo_a.qf});
      else jobs.push_back({&L.wo_a_g[g], &L.wo_a, nullptr, g * c.Ro, c.Ro, bf16(L.wo_a), QFmt::None});
    }
    P.sources.push_back(&L.wo_a);
    L.w13.assign(L.w1.size(), Linear{});
    for (size_t e = 0; e < L.w1.size(); ++e) {
      L.w13[e] = Linear{nullptr, nullptr, 2 * ((L.w1[e].out + kPanel - 1) / kPanel) * kPanel, L.w1[e].in};
      fused(L.w13[e], L.w1[e], L.w3[e]);
      tag((int64_t)l * c.E + (int64_t)e, 0);
      const size_t before = jobs.size();
      plain(L.w2[e]);
      if (jobs.size() == before) throw std::runtime_error("routed expert w2 has no source");
      tag((int64_t)l * c.E + (int64_t)e, 1);
      P.sources.push_back(&L.w1[e]);
      P.sources.push_back(&L.w3[e]);
    }
    L.sw13 = Linear{nullptr, nullptr, 2 * ((L.sw1.out + kPanel - 1) / kPanel) * kPanel, L.sw1.in};
    fused(L.sw13, L.sw1, L.sw3);
    plain(L.sw2);
    P.sources.push_back(&L.sw1);
    P.sources.push_back(&L.sw3);
  }
  const size_t nj = jobs.size();
  P.key.resize(nj, -1);
  P.part.resize(nj, 0);
  P.nkeys = (int64_t)c.n_layers * c.E;
  P.code_bytes.assign(nj, 0);
  P.bytes.assign(nj, 0);
  P.offset.assign(nj, 0);
  P.span.assign(nj, 0);
  for (size_t j = 0; j < nj; ++j) {
    const PackJob& J = jobs[j];
    if (J.qf != QFmt::None) {
      const int n = J.nrows();
      const PanelCodec& C = panel_codec(J.qf);
      P.code_bytes[j] = (C.code_bytes(J.src->codec, n, J.dst->in) + 63) / 64 * 64;
      P.bytes[j] = P.code_bytes[j] + C.scale_bytes(n, J.dst->in);
    } else {
      P.bytes[j] = packed_floats(J.nrows(), J.dst->in) * (J.bf16 ? sizeof(uint16_t) : sizeof(float));
    }
  }
  // dense section, then the expert slots
  size_t dense = 0, slot = 0;
  std::vector<size_t> w13_bytes(P.nkeys, 0);
  int64_t last_dense = -1;
  for (size_t j = 0; j < nj; ++j) {
    if (P.key[j] >= 0) {
      if (P.part[j] == 0) w13_bytes[P.key[j]] = round_up(P.bytes[j], 64);
      else slot = std::max(slot, w13_bytes[P.key[j]] + round_up(P.bytes[j], 64));
      continue;
    }
    P.offset[j] = dense;
    P.span[j] = round_up(P.bytes[j], 64);
    dense += P.span[j];
    last_dense = (int64_t)j;
  }
  dense = round_up(std::max<size_t>(dense, 1), kPage);
  if (last_dense >= 0) P.span[last_dense] = dense - P.offset[last_dense];
  slot = round_up(slot, kPage);
  for (size_t j = 0; j < nj; ++j) {
    if (P.key[j] < 0) continue;
    const size_t base = dense + (size_t)P.key[j] * slot;
    P.offset[j] = base + (P.part[j] ? w13_bytes[P.key[j]] : 0);
    P.span[j] = P.part[j] ? slot - w13_bytes[P.key[j]] : w13_bytes[P.key[j]];
  }
  P.dense = dense;
  P.slot = slot;
  P.experts = (size_t)P.nkeys * slot;
  P.total = dense + P.experts;
  // the format's own key (its layout description), then this model's sections and matrices
  uint64_t layout = fnv(fnv(pack_layout_key(pack_layout()), dense), slot);
  for (size_t j = 0; j < nj; ++j) {
    const PackJob& J = jobs[j];
    const uint64_t codec = J.src->codec ? (uint64_t)J.src->codec->ggml_type + 1 : 0;
    for (uint64_t v : {(uint64_t)J.qf, codec, (uint64_t)J.bf16, (uint64_t)J.nrows(), (uint64_t)J.dst->in, (uint64_t)P.offset[j]})
      layout = fnv(layout, v);
  }
  P.layout = layout;
  // BF16 jobs pack from the stored values; a source no fp32 job reads is never widened
  std::unordered_set<const float*> need_f32;
  for (const PackJob& J : jobs)
    if (J.qf == QFmt::None && !J.bf16)
      for (const Linear* L : {J.src, J.up})
        if (L) need_f32.insert(L->w);
  m.bf16_unwidened.clear();
  for (const PackJob& J : jobs)
    if (J.bf16)
      for (const Linear* L : {J.src, J.up})
        if (L) {
          P.bf16_rows.emplace(L->w, m.bf16_sources.at(L->w));
          if (!need_f32.count(L->w)) m.bf16_unwidened.insert(L->w);
        }
  return P;
}

void pack_job(const PackPlan& plan, size_t j, void* buf) {
  const PackJob& J = plan.jobs[j];
  std::memset(buf, 0, plan.span[j]);  // padding is zero: the file's bytes depend on the weights only
  if (J.qf != QFmt::None)
    panel_codec(J.qf).pack(J.qrows(), J.dst->in, (uint8_t*)buf, (uint8_t*)buf + plan.code_bytes[j]);
  else if (J.bf16) pack_panels_bf16(J.rows16(plan), J.dst->in, (uint16_t*)buf);
  else pack_panels(J.rows(), J.dst->in, (float*)buf);
}

void bind_panels(const PackPlan& plan, const std::vector<void*>& bufs) {
  for (size_t j = 0; j < plan.jobs.size(); ++j) {
    const PackJob& J = plan.jobs[j];
    Linear& D = *J.dst;
    if (J.qf != QFmt::None) {
      D.qf = J.qf;
      D.codec = J.src->codec;
    }
    if (!bufs[j]) continue;  // a paged expert: the Linear keeps its shape and format, a slot has the panels
    if (J.qf != QFmt::None) {
      D.pq = (const uint8_t*)bufs[j];
      D.pqs = (const uint8_t*)bufs[j] + plan.code_bytes[j];
    } else if (J.bf16) {
      D.p16 = (const uint16_t*)bufs[j];
    } else {
      D.p = (const float*)bufs[j];
    }
  }
}

void drop_sources(Model& m, const PackPlan& plan) {
  // the sources of packed matrices (widened BF16/F16 rows, mapped quantized bytes)
  std::unordered_set<const float*> dropped;
  for (Linear* L : plan.sources) {
    dropped.insert(L->w);
    L->w = nullptr;
    L->q = L->qs = nullptr;
  }
  for (auto& o : m.owned)
    if (o && dropped.count(o.get())) o.reset();
  m.bf16_sources.clear();  // they pointed into buffers freed just above
  m.bf16_unwidened.clear();
}

void page_out_sources(const Linear& L) {
  page_out(L.q ? (const void*)L.q : (const void*)L.w, source_bytes(L));
  page_out(L.qs, scale_bytes(L));
}

void page_out_stored(const PackPlan& P, const PackJob& J) {
  for (const Linear* L : {J.src, J.up}) {
    if (!L) continue;
    const uint8_t* s = L->q;
    size_t row = s ? source_bytes(*L) / L->out : 0;
    if (!s && J.bf16) {
      s = (const uint8_t*)P.bf16_rows.at(L->w);
      row = (size_t)L->in * 2;
    }
    if (!s) continue;
    if (J.up) page_out(s, row * L->out);
    else page_out(s + row * J.r0, row * J.n);
  }
}

}  // namespace cairn

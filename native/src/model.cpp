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
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

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

namespace {
// Packed cache file: a 4 KiB header, then the arena exactly as packed (offsets as computed below).
constexpr char kPackMagic[8] = {'C', 'A', 'I', 'R', 'N', 'P', 'K', '1'};
constexpr size_t kPackHeader = 4096;
struct PackHeader {
  char magic[8];
  uint64_t layout;  // hash of every panel's format and shape, in order
  uint64_t total;   // arena bytes
  uint32_t fp_len;
  char fp[256];     // the model fingerprint
};

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

PackHeader make_header(const std::string& fp, uint64_t layout, uint64_t total) {
  PackHeader h{};
  std::memcpy(h.magic, kPackMagic, 8);
  h.layout = layout;
  h.total = total;
  h.fp_len = (uint32_t)std::min<size_t>(fp.size(), sizeof h.fp);
  std::memcpy(h.fp, fp.data(), h.fp_len);
  return h;
}

// The cached panels if the file matches exactly, else null.
void* map_cache(const std::string& path, const PackHeader& want, size_t* len) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  PackHeader got{};
  struct stat st{};
  void* map = nullptr;
  if (pread(fd, &got, sizeof got, 0) == (ssize_t)sizeof got && std::memcmp(&got, &want, sizeof got) == 0 &&
      fstat(fd, &st) == 0 && (uint64_t)st.st_size == kPackHeader + want.total) {
    *len = (size_t)st.st_size;
    map = mmap(nullptr, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) map = nullptr;
  }
  close(fd);
  return map;
}

bool write_cache(const std::string& path, const PackHeader& h, const void* data, size_t n) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::vector<char> head(kPackHeader, 0);
  std::memcpy(head.data(), &h, sizeof h);
  bool ok = write(fd, head.data(), head.size()) == (ssize_t)head.size();
  for (size_t done = 0; ok && done < n;) {
    const ssize_t w = write(fd, (const char*)data + done, std::min<size_t>(n - done, 1u << 30));
    ok = w > 0;
    if (ok) done += (size_t)w;
  }
  ok = ok && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;  // atomic: a reader sees the old file or the whole new one
  if (!ok) unlink(tmp.c_str());
  return ok;
}
}  // namespace

void pack_weights(Model& m, int threads, const std::string& cache_path, const std::function<void()>& prepare_sources) {
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
  uint64_t layout = fnv(14695981039346656037ull, kPanel);
  for (const PackJob& J : jobs)
    for (uint64_t v : {(uint64_t)J.qf, (uint64_t)J.bf16, (uint64_t)(J.qf != QFmt::None ? J.qrows.size() : J.rows.size()),
                       (uint64_t)J.dst->in})
      layout = fnv(layout, v);
  const PackHeader header = make_header(m.fingerprint, layout, total);
  m.packed_bytes = total;
  size_t map_len = 0;
  void* cached = cache_path.empty() ? nullptr : map_cache(cache_path, header, &map_len);
  if (cached) {
    m.packed_map = std::shared_ptr<void>(cached, [map_len](void* p) { munmap(p, map_len); });
    m.packed_from_cache = true;
    for (size_t j = 0; j < jobs.size(); ++j) bufs[j] = (char*)cached + kPackHeader + offsets[j];
  } else {
    if (prepare_sources) prepare_sources();
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
    if (!cache_path.empty()) m.packed_cache_written = write_cache(cache_path, header, base, total);
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
    if (o && dropped.count(o.get())) o.reset();
  m.bf16_sources.clear();  // they pointed into buffers freed just above
}

}  // namespace cairn

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
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <stdexcept>
#include <unordered_set>

#include "cairn/expert_cache.h"
#include "cairn/kernels.h"

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

// One packed matrix: rows r0..r0+n of src, or (up set) src's and up's rows interleaved per panel.
// The row lists are built only when the job is packed (they are ~16 bytes per row: ~1.4 GB for
// all of V4-Flash's experts at once, and nothing at all when the panels come from the cache file).
struct PackJob {
  Linear* dst;
  const Linear* src;
  const Linear* up;     // fused gate/up: src is the gate
  int r0, n;
  bool bf16;            // store BF16 panels (every source row holds BF16 values)
  QFmt qf;              // else: quantized panels of the stored codes
  int nrows() const { return up ? 2 * ((src->out + kPanel - 1) / kPanel) * kPanel : n; }
  std::vector<const float*> rows() const { return up ? fused_rows(*src, *up) : rows_of(*src, r0, n); }
  std::vector<QRow> qrows() const { return up ? fused_qrows(*src, *up) : qrows_of(*src, r0, n); }
};
}  // namespace

namespace {
// Packed cache file: a 4 KiB header, then the arena exactly as packed (offsets as computed below):
// the dense section (every non-expert panel, 64-byte aligned, padded to 4 KiB), then one slot per
// routed expert (key = layer * E + expert; fused w1/w3 panels then w2 panels, codes and scales),
// each slot the same 4 KiB multiple, so one aligned read loads one expert (O_DIRECT).
// Padding bytes are zero, so a streaming pack and a resident pack write the same file.
constexpr char kPackMagic[8] = {'C', 'A', 'I', 'R', 'N', 'P', 'K', '2'};
constexpr size_t kPackHeader = 4096, kPage = 4096;
struct PackHeader {
  char magic[8];
  uint64_t layout;  // hash of every panel's format, shape and place, in order
  uint64_t total;   // arena bytes
  uint64_t dense;   // dense section bytes (the expert slots start at kPackHeader + dense)
  uint64_t slot;    // bytes of one expert slot
  uint32_t fp_len;
  char fp[256];     // the model fingerprint
};

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

PackHeader make_header(const std::string& fp, uint64_t layout, uint64_t total, uint64_t dense, uint64_t slot) {
  PackHeader h{};
  std::memcpy(h.magic, kPackMagic, 8);
  h.layout = layout;
  h.total = total;
  h.dense = dense;
  h.slot = slot;
  h.fp_len = (uint32_t)std::min<size_t>(fp.size(), sizeof h.fp);
  std::memcpy(h.fp, fp.data(), h.fp_len);
  return h;
}

// The first map_len bytes of the cached file if it matches exactly, else null.
void* map_cache(const std::string& path, const PackHeader& want, size_t map_len) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  PackHeader got{};
  struct stat st{};
  void* map = nullptr;
  if (pread(fd, &got, sizeof got, 0) == (ssize_t)sizeof got && std::memcmp(&got, &want, sizeof got) == 0 &&
      fstat(fd, &st) == 0 && (uint64_t)st.st_size == kPackHeader + want.total) {
    map = mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) map = nullptr;
  }
  close(fd);
  return map;
}

bool write_at(int fd, const void* data, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = pwrite(fd, (const char*)data + done, std::min<size_t>(n - done, 1u << 30), (off_t)(off + done));
    if (w <= 0) return false;
    done += (size_t)w;
  }
  return true;
}

// A temporary file beside path with the header written; -1 on failure.
int open_tmp(const std::string& tmp, const PackHeader& h) {
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  std::vector<char> head(kPackHeader, 0);
  std::memcpy(head.data(), &h, sizeof h);
  if (!write_at(fd, head.data(), head.size(), 0)) {
    close(fd);
    unlink(tmp.c_str());
    return -1;
  }
  return fd;
}

// fsync, close and rename: atomic, a reader sees the old file or the whole new one
bool finish_tmp(int fd, bool ok, const std::string& tmp, const std::string& path) {
  ok = ok && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) unlink(tmp.c_str());
  return ok;
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
  if (L.q) return (size_t)L.out * (L.qf == QFmt::E2M1 ? L.in / 2 : L.in);
  return L.w ? (size_t)L.out * L.in * sizeof(float) : 0;
}
size_t scale_bytes(const Linear& L) {
  if (!L.qs) return 0;
  if (L.qf == QFmt::E2M1) return (size_t)L.out * (L.in / kFp4Group);
  return (size_t)((L.out + kFp8Block - 1) / kFp8Block) * ((L.in + kFp8Block - 1) / kFp8Block);
}
}  // namespace

void pack_weights(Model& m, int threads, const std::string& cache_path, const std::function<void()>& prepare_sources,
                  const PagingOptions& opt) {
  const Config& c = m.cfg;
  m.trace = std::make_shared<RouteTrace>();
  std::vector<PackJob> jobs;
  std::vector<int64_t> job_key;  // [jobs] routed expert key (layer * E + e), -1 = dense
  std::vector<int> job_part;     // [jobs] 0 = fused w1/w3, 1 = w2
  std::vector<Linear*> sources;  // every Linear whose row-major source is dropped afterwards
  auto bf16 = [&](const Linear& L) { return kBf16Panels && !m.widen_bf16 && m.bf16_sources.count(L.w) > 0; };
  auto plain = [&](Linear& L) {
    if (L.q) jobs.push_back({&L, &L, nullptr, 0, L.out, false, L.qf});
    else if (L.w) jobs.push_back({&L, &L, nullptr, 0, L.out, bf16(L), QFmt::None});
    else return;
    sources.push_back(&L);
  };
  // gate/up pairs: both quantized alike, or both float
  auto fused = [&](Linear& dst, const Linear& g, const Linear& u) {
    if (g.q || u.q) {
      if (g.qf != u.qf) throw std::runtime_error("gate and up projections of one expert must share a format");
      jobs.push_back({&dst, &g, &u, 0, 0, false, g.qf});
    } else {
      jobs.push_back({&dst, &g, &u, 0, 0, bf16(g) && bf16(u), QFmt::None});
    }
  };
  auto tag = [&](int64_t key, int part) {
    job_key.resize(jobs.size(), -1);
    job_part.resize(jobs.size(), 0);
    job_key.back() = key;
    job_part.back() = part;
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
    sources.push_back(&L.wo_a);
    L.w13.assign(L.w1.size(), Linear{});
    for (size_t e = 0; e < L.w1.size(); ++e) {
      L.w13[e] = Linear{nullptr, nullptr, 2 * ((L.w1[e].out + kPanel - 1) / kPanel) * kPanel, L.w1[e].in};
      fused(L.w13[e], L.w1[e], L.w3[e]);
      tag((int64_t)l * c.E + (int64_t)e, 0);
      const size_t before = jobs.size();
      plain(L.w2[e]);
      if (jobs.size() == before) throw std::runtime_error("routed expert w2 has no source");
      tag((int64_t)l * c.E + (int64_t)e, 1);
      sources.push_back(&L.w1[e]);
      sources.push_back(&L.w3[e]);
    }
    L.sw13 = Linear{nullptr, nullptr, 2 * ((L.sw1.out + kPanel - 1) / kPanel) * kPanel, L.sw1.in};
    fused(L.sw13, L.sw1, L.sw3);
    plain(L.sw2);
    sources.push_back(&L.sw1);
    sources.push_back(&L.sw3);
  }
  job_key.resize(jobs.size(), -1);
  job_part.resize(jobs.size(), 0);
  const int64_t nkeys = (int64_t)c.n_layers * c.E;
  std::vector<size_t> code_bytes(jobs.size(), 0);  // quantized: where the scales start in bufs[j]
  std::vector<size_t> bytes(jobs.size(), 0), offsets(jobs.size(), 0), span(jobs.size(), 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PackJob& J = jobs[j];
    if (J.qf != QFmt::None) {
      const int n = J.nrows();
      code_bytes[j] = (qpanel_code_bytes(J.qf, n, J.dst->in) + 63) / 64 * 64;
      bytes[j] = code_bytes[j] + qpanel_scale_bytes(J.qf, n, J.dst->in);
    } else {
      bytes[j] = packed_floats(J.nrows(), J.dst->in) * (J.bf16 ? sizeof(uint16_t) : sizeof(float));
    }
  }
  // dense section, then the expert slots
  size_t dense = 0, slot = 0;
  std::vector<size_t> w13_bytes(nkeys, 0);
  int64_t last_dense = -1;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (job_key[j] >= 0) {
      if (job_part[j] == 0) w13_bytes[job_key[j]] = round_up(bytes[j], 64);
      else slot = std::max(slot, w13_bytes[job_key[j]] + round_up(bytes[j], 64));
      continue;
    }
    offsets[j] = dense;
    span[j] = round_up(bytes[j], 64);
    dense += span[j];
    last_dense = (int64_t)j;
  }
  dense = round_up(std::max<size_t>(dense, 1), kPage);
  if (last_dense >= 0) span[last_dense] = dense - offsets[last_dense];
  slot = round_up(slot, kPage);
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (job_key[j] < 0) continue;
    const size_t base = dense + (size_t)job_key[j] * slot;
    offsets[j] = base + (job_part[j] ? w13_bytes[job_key[j]] : 0);
    span[j] = job_part[j] ? slot - w13_bytes[job_key[j]] : w13_bytes[job_key[j]];
  }
  const size_t experts = (size_t)nkeys * slot, total = dense + experts;
  uint64_t layout = fnv(14695981039346656037ull, kPanel);
  layout = fnv(fnv(fnv(layout, 2 /* expert-slot layout */), dense), slot);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PackJob& J = jobs[j];
    for (uint64_t v : {(uint64_t)J.qf, (uint64_t)J.bf16, (uint64_t)J.nrows(),
                       (uint64_t)J.dst->in, (uint64_t)offsets[j]})
      layout = fnv(layout, v);
  }
  const PackHeader header = make_header(m.fingerprint, layout, total, dense, slot);
  m.packed_bytes = total;
  m.dense_bytes = dense;
  m.expert_slot_bytes = slot;
  m.expert_bytes_total = experts;

  const bool paging = opt.budget > 0 && opt.budget < experts;
  int slots = 0;
  SlotPolicy::Kind kind = SlotPolicy::parse(opt.policy);
  if (paging) {
    if (cache_path.empty())
      throw std::invalid_argument("expert_cache_bytes=" + std::to_string(opt.budget) +
                                  " pages routed experts from the packed cache file, but packed_cache is empty: "
                                  "pass packed_cache=<file path>");
    const size_t need = (size_t)c.k * slot;
    if (opt.budget < need)
      throw std::invalid_argument("expert_cache_bytes=" + std::to_string(opt.budget) + " is below the minimum of " +
                                  std::to_string(need) + " bytes (num_experts_per_tok=" + std::to_string(c.k) +
                                  " expert slots of " + std::to_string(slot) + " bytes)");
    slots = (int)std::min<size_t>(opt.budget / slot, (size_t)nkeys);
    m.expert_budget = opt.budget;
  }
  auto pack_job = [&](size_t j, void* buf) {
    const PackJob& J = jobs[j];
    std::memset(buf, 0, span[j]);  // padding is zero: the file's bytes depend on the weights only
    if (J.qf != QFmt::None) pack_panels_q(J.qf, J.qrows(), J.dst->in, (uint8_t*)buf, (uint8_t*)buf + code_bytes[j]);
    else if (J.bf16) pack_panels_bf16(J.rows(), J.dst->in, (uint16_t*)buf);
    else pack_panels(J.rows(), J.dst->in, (float*)buf);
  };
  // One arena in 2 MiB pages where the kernel allows (transparent huge pages on madvise): 1/512 of
  // the page faults while packing and of the TLB misses while computing.
  auto new_arena = [&](size_t n) {
    constexpr size_t kHuge = 2u << 20;
    const size_t arena = std::max<size_t>((n + kHuge - 1) / kHuge * kHuge, kHuge);
    void* base = std::aligned_alloc(kHuge, arena);
    if (!base) throw std::bad_alloc();
    m.packed.emplace_back(base);
    madvise(base, arena, MADV_HUGEPAGE);  // advisory: without THP the arena is ordinary pages
    return (char*)base;
  };
  std::vector<void*> bufs(jobs.size(), nullptr);
  const size_t map_len = kPackHeader + (paging ? dense : total);  // paging never maps the experts
  void* cached = cache_path.empty() ? nullptr : map_cache(cache_path, header, map_len);
  if (cached) {
    m.packed_map = std::shared_ptr<void>(cached, [map_len](void* p) { munmap(p, map_len); });
    m.packed_from_cache = true;
    for (size_t j = 0; j < jobs.size(); ++j)
      if (!paging || job_key[j] < 0) bufs[j] = (char*)cached + kPackHeader + offsets[j];
  } else if (paging) {
    // Streaming: the dense panels into the arena, each batch of experts through a scratch buffer
    // written at its file offset; the experts' sources are paged out as they are packed.
    if (prepare_sources) prepare_sources();
    char* base = new_arena(dense);
    std::vector<size_t> dj;
    for (size_t j = 0; j < jobs.size(); ++j)
      if (job_key[j] < 0) {
        dj.push_back(j);
        bufs[j] = base + offsets[j];
      }
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
    for (size_t i = 0; i < dj.size(); ++i) pack_job(dj[i], bufs[dj[i]]);
    const std::string tmp = cache_path + ".tmp." + std::to_string(getpid());
    const int fd = open_tmp(tmp, header);
    if (fd < 0) throw std::runtime_error("cannot write the packed cache file '" + tmp + "': " + std::strerror(errno));
    bool ok = write_at(fd, base, dense, kPackHeader);
    std::vector<std::pair<size_t, size_t>> kj(nkeys, {SIZE_MAX, SIZE_MAX});  // key -> (w13 job, w2 job)
    for (size_t j = 0; j < jobs.size(); ++j)
      if (job_key[j] >= 0) (job_part[j] ? kj[job_key[j]].second : kj[job_key[j]].first) = j;
    const int64_t batch = std::max(2 * std::max(1, threads), (int)std::min<size_t>(64, (256u << 20) / slot + 1));
    void* scratch = std::aligned_alloc(kPage, (size_t)batch * slot);
    if (!scratch) throw std::bad_alloc();
    for (int64_t k0 = 0; ok && k0 < nkeys; k0 += batch) {
      const int64_t nb = std::min<int64_t>(batch, nkeys - k0);
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
      for (int64_t t = 0; t < 2 * nb; ++t) {
        const size_t j = t % 2 ? kj[k0 + t / 2].second : kj[k0 + t / 2].first;
        pack_job(j, (char*)scratch + (offsets[j] - dense - (size_t)k0 * slot));
      }
      const uint64_t off = kPackHeader + dense + (uint64_t)k0 * slot;
      ok = write_at(fd, scratch, (size_t)nb * slot, off);
      // written back now and dropped from the page cache: the file is larger than memory
      sync_file_range(fd, (off_t)off, (off_t)nb * slot,
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      posix_fadvise(fd, (off_t)off, (off_t)nb * slot, POSIX_FADV_DONTNEED);
      for (int64_t key = k0; key < k0 + nb; ++key) {
        const LayerW& L = m.layers[key / c.E];
        const int e = (int)(key % c.E);
        for (const Linear* s : {&L.w1[e], &L.w3[e], &L.w2[e]}) {
          page_out(s->q ? (const void*)s->q : (const void*)s->w, source_bytes(*s));
          page_out(s->qs, scale_bytes(*s));
        }
      }
    }
    std::free(scratch);
    if (!finish_tmp(fd, ok, tmp, cache_path))
      throw std::runtime_error("cannot write the packed cache file '" + cache_path + "' (needed for expert paging): " +
                               std::strerror(errno));
    m.packed_cache_written = true;
  } else {
    if (prepare_sources) prepare_sources();
    char* base = new_arena(total);
    for (size_t j = 0; j < jobs.size(); ++j) bufs[j] = base + offsets[j];
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
    for (size_t j = 0; j < jobs.size(); ++j) pack_job(j, bufs[j]);
    if (!cache_path.empty()) {
      const std::string tmp = cache_path + ".tmp." + std::to_string(getpid());
      const int fd = open_tmp(tmp, header);
      m.packed_cache_written = fd >= 0 && finish_tmp(fd, write_at(fd, base, total, kPackHeader), tmp, cache_path);
    }
  }
  if (paging)
    m.pager = std::make_shared<ExpertPager>(cache_path, nkeys, slot, kPackHeader + dense, slots, kind, c.k, dense,
                                            opt.readers);
  for (size_t j = 0; j < jobs.size(); ++j) {
    Linear& D = *jobs[j].dst;
    if (jobs[j].qf != QFmt::None) D.qf = jobs[j].qf;
    if (!bufs[j]) {  // a paged expert: the Linear keeps its shape and format, the slot has the panels
      ExpertPart& P = (job_part[j] ? m.pager->w2 : m.pager->w13)[job_key[j]];
      P = {offsets[j] - dense - (size_t)job_key[j] * slot, code_bytes[j], jobs[j].qf, jobs[j].bf16};
      continue;
    }
    if (jobs[j].qf != QFmt::None) {
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

// Binds one paged expert matrix's panels in a slot to a copy of its Linear.
Linear paged_linear(const Linear& tmpl, const ExpertPart& P, const uint8_t* slot) {
  Linear D = tmpl;
  const uint8_t* b = slot + P.rel;
  if (P.qf != QFmt::None) {
    D.pq = b;
    D.pqs = b + P.code_bytes;
  } else if (P.bf16) {
    D.p16 = (const uint16_t*)b;
  } else {
    D.p = (const float*)b;
  }
  return D;
}

}  // namespace cairn

// cairn kernel: a Model's panels at load (pack_weights) -- mapped from a matching packed cache
// file, packed into one arena (and written to the file), or, with expert paging, the dense panels
// packed and the experts streamed to the file.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "cairn/expert_cache.h"
#include "cairn/kernels.h"
#include "pack_plan.h"
#include "packed_file.h"
#include "pager_setup.h"

namespace cairn {

namespace {
// One arena in 2 MiB pages where the kernel allows (transparent huge pages on madvise): 1/512 of
// the page faults while packing and of the TLB misses while computing.
char* new_arena(Model& m, size_t n) {
  constexpr size_t kHuge = 2u << 20;
  const size_t arena = std::max<size_t>((n + kHuge - 1) / kHuge * kHuge, kHuge);
  void* base = std::aligned_alloc(kHuge, arena);
  if (!base) throw std::bad_alloc();
  m.packed.emplace_back(base);
  madvise(base, arena, MADV_HUGEPAGE);  // advisory: without THP the arena is ordinary pages
  return (char*)base;
}

// Streaming: the dense panels into the arena, each batch of experts through a scratch buffer
// written at its file offset; every source is paged out as it is packed.
void pack_streaming(Model& m, const PackPlan& plan, int threads, const std::string& cache_path,
                    const PackHeader& header, std::vector<void*>& bufs) {
  const Config& c = m.cfg;
  const size_t dense = plan.dense, slot = plan.slot;
  const int64_t nkeys = plan.nkeys;
  char* base = new_arena(m, dense);
  std::vector<size_t> dj;
  for (size_t j = 0; j < plan.jobs.size(); ++j)
    if (plan.key[j] < 0) {
      dj.push_back(j);
      bufs[j] = base + plan.offset[j];
    }
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
  for (size_t i = 0; i < dj.size(); ++i) {
    pack_job(plan, dj[i], bufs[dj[i]]);
    page_out_stored(plan, plan.jobs[dj[i]]);
  }
  const std::string tmp = tmp_name(cache_path);
  const int fd = open_tmp(tmp, header);
  if (fd < 0) throw std::runtime_error("cannot write the packed cache file '" + tmp + "': " + std::strerror(errno));
  bool ok = write_at(fd, base, dense, kPackHeader);
  std::vector<std::pair<size_t, size_t>> kj(nkeys, {SIZE_MAX, SIZE_MAX});  // key -> (w13 job, w2 job)
  for (size_t j = 0; j < plan.jobs.size(); ++j)
    if (plan.key[j] >= 0) (plan.part[j] ? kj[plan.key[j]].second : kj[plan.key[j]].first) = j;
  const int64_t batch = std::max(2 * std::max(1, threads), (int)std::min<size_t>(64, (256u << 20) / slot + 1));
  void* scratch = std::aligned_alloc(kPage, (size_t)batch * slot);
  if (!scratch) {
    finish_tmp(fd, false, tmp, cache_path);  // closes and removes it
    throw std::bad_alloc();
  }
  for (int64_t k0 = 0; ok && k0 < nkeys; k0 += batch) {
    const int64_t nb = std::min<int64_t>(batch, nkeys - k0);
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
    for (int64_t t = 0; t < 2 * nb; ++t) {
      const size_t j = t % 2 ? kj[k0 + t / 2].second : kj[k0 + t / 2].first;
      pack_job(plan, j, (char*)scratch + (plan.offset[j] - dense - (size_t)k0 * slot));
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
      for (const Linear* s : {&L.w1[e], &L.w3[e], &L.w2[e]}) page_out_sources(*s);
    }
  }
  std::free(scratch);
  if (!finish_tmp(fd, ok, tmp, cache_path))
    throw std::runtime_error("cannot write the packed cache file '" + cache_path + "' (needed for expert paging): " +
                             std::strerror(errno));
  m.packed_cache_written = true;
}

// Every panel into one arena (each job's stored bytes paged out once packed), then (with a path) the
// arena written as the cache file.
void pack_resident(Model& m, const PackPlan& plan, int threads, const std::string& cache_path,
                   const PackHeader& header, std::vector<void*>& bufs) {
  // the temporary file exists (and is locked) for the whole pack: a crash at any point leaves it
  // for sweep_stale_tmps to recognise
  const std::string tmp = cache_path.empty() ? "" : tmp_name(cache_path);
  const int fd = tmp.empty() ? -1 : open_tmp(tmp, header);
  char* base;
  try {
    base = new_arena(m, plan.total);
  } catch (...) {
    if (fd >= 0) finish_tmp(fd, false, tmp, cache_path);  // closes and removes it
    throw;
  }
  for (size_t j = 0; j < plan.jobs.size(); ++j) bufs[j] = base + plan.offset[j];
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1)
  for (size_t j = 0; j < plan.jobs.size(); ++j) {
    pack_job(plan, j, bufs[j]);
    page_out_stored(plan, plan.jobs[j]);
  }
  if (fd >= 0) m.packed_cache_written = finish_tmp(fd, write_at(fd, base, plan.total, kPackHeader), tmp, cache_path);
}
}  // namespace

void pack_weights(Model& m, int threads, const std::string& cache_path, const std::function<void()>& prepare_sources,
                  const PagingOptions& opt) {
  m.trace = std::make_shared<RouteTrace>();
  PackPlan plan = plan_packing(m);
  const PackHeader header = make_header(m.fingerprint, plan.layout, plan.total, plan.dense, plan.slot);
  m.packed_bytes = plan.total;
  m.packed_layout = plan.layout;
  m.dense_bytes = plan.dense;
  m.expert_slot_bytes = plan.slot;
  m.expert_bytes_total = plan.experts;
  const int slots = paging_slots(m, plan, cache_path, opt);
  const bool paging = slots > 0;

  std::vector<void*> bufs(plan.jobs.size(), nullptr);
  const size_t map_len = kPackHeader + (paging ? plan.dense : plan.total);  // paging never maps the experts
  auto map_held = [&]() -> void* {  // held before it is checked: trimming cannot remove it meanwhile
    m.cache_hold = hold_cache(cache_path);
    void* p = m.cache_hold ? map_cache(cache_path, header, map_len) : nullptr;
    if (!p) m.cache_hold.reset();
    return p;
  };
  void* cached = cache_path.empty() ? nullptr : map_held();
  std::unique_ptr<PackLock> lock;
  if (!cached && !cache_path.empty()) {
    // one packer per file: wait for whoever packs it now, then look again (it may be done)
    lock = std::make_unique<PackLock>(cache_path);
    cached = map_held();
    if (!cached) sweep_stale_tmps(cache_path);
  }
  if (cached) {
    m.packed_map = std::shared_ptr<void>(cached, [map_len](void* p) { munmap(p, map_len); });
    m.packed_from_cache = true;
    for (size_t j = 0; j < plan.jobs.size(); ++j)
      if (!paging || plan.key[j] < 0) bufs[j] = (char*)cached + kPackHeader + plan.offset[j];
  } else {
    if (prepare_sources) prepare_sources();
    if (paging) pack_streaming(m, plan, threads, cache_path, header, bufs);
    else pack_resident(m, plan, threads, cache_path, header, bufs);
    if (m.packed_cache_written) m.cache_hold = hold_cache(cache_path);
  }
  lock.reset();
  if (paging) setup_pager(m, plan, bufs, cache_path, slots, opt);
  bind_panels(plan, bufs);
  drop_sources(m, plan);
}

}  // namespace cairn

// cairn kernel: cheap section timers (always on; a few omp_get_wtime calls per layer).
#pragma once
#include <omp.h>

#include <atomic>
#include <cstdint>

namespace cairn {
// The shared expert runs in the same parallel phases as the routed ones, so its time is in P_EXPERTS
// (a separate bucket could only ever read ~0).
enum Section { P_HC, P_QKV, P_COMPRESS, P_INDEXER, P_ATTN, P_OUT, P_ROUTER, P_EXPERTS, P_HEAD, P_N };
extern double g_prof[P_N];
extern const char* const g_prof_names[P_N];
struct ProfScope {
  Section s;
  double t0;
  explicit ProfScope(Section sec) : s(sec), t0(omp_get_wtime()) {}
  ~ProfScope() { g_prof[s] += omp_get_wtime() - t0; }
};
inline void prof_lap(Section s, double& t0) {
  double t = omp_get_wtime();
  g_prof[s] += t - t0;
  t0 = t;
}

// What the CSA indexer did (process-wide; _kernel._indexer_stats reads and resets it), so tests can
// assert which path ran: key floats packed into panels per call (0 where the page groups keep them
// as panels), and decode (S = 1) scorings that ran on more than one thread.
struct IndexerStats {
  std::atomic<int64_t> packed_floats{0}, parallel_decode{0};
};
extern IndexerStats g_indexer_stats;

// What attention did (process-wide; _kernel._attn_stats reads and resets it): key floats packed
// into panels (none for a block of one query, which reads its keys in place), blocks of one query
// and those split over threads, and calls whose segments (a batched decode's states) ran side by side.
struct AttnStats {
  std::atomic<int64_t> keys_packed{0}, one_query{0}, one_query_parallel{0}, segment_parallel{0};
};
extern AttnStats g_attn_stats;
}  // namespace cairn

// cairn kernel: cheap section timers (always on; a few omp_get_wtime calls per layer).
#pragma once
#include <omp.h>

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
}  // namespace cairn

// cairn kernel: the MoE executor -- one two-phase computation of a layer's routed experts and its
// shared expert, whether the experts are resident or paged from the packed cache file.
//
// Design notes
//  * Jobs: the chunk's active routed experts (expert-index order) and the shared expert. Token
//    rows are read in place through row pointers (no gather copy).
//  * Phase 1, task = (job, kPackN panels of the fused gate/up weight): act = SwiGLU(w1 x, w3 x),
//    gate and up from neighbouring panels of the same tile, the clamp/SiLU applied on the tile.
//    Phase 2, task = kPackN panels (16 columns each) of y: per job, the w2 product of its act rows.
//  * The executor acquires the routed experts in index order from an ExpertSource (the hook that
//    says whether an expert's panels are present) and computes, in parallel rounds, the shared
//    expert (first round) and the acquired experts that are present. When a source has no slot
//    for the next expert, the executor releases its oldest computed one (FIFO) and asks again: a
//    sliding window, so reads stream while compute proceeds. Resident experts are always present:
//    one round computes everything.
//  * Bit identity: in the last round, each phase-2 task owns a column tile of y, zeroes it and adds
//    every job's w2 product in expert-index order, the shared expert last -- computed now, or kept
//    (w2 product only) from an earlier round. So every y element sees the same operations in the
//    same order whatever the source, its budget and the timing of reads.
#pragma once
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cairn/expert_cache.h"
#include "cairn/model.h"
#include "formats/pow2_rows.h"

namespace cairn {

struct MoeJob {
  int M = 0;
  int expert = -1;   // routed expert index; -1 = shared
  int64_t key = -1;  // routed: layer * E + expert
  Linear w13, w2;    // routed: bound to the expert's panels by the source's acquire
  std::vector<int> rows;         // [M] token rows in the chunk
  std::vector<float> rw;         // [M] routing weights (empty: shared, weight 1)
  std::vector<const float*> xs;  // [M] input rows
  std::vector<float> act;        // [M, Ip] (Ip = I rounded up to panels; padding stays 0)
  std::vector<const float*> as;  // [M] act rows
  Pow2Rows xb13, xb2;            // bounds of xs / as for the products' scaled chain (formats/pow2_rows.h)
  std::vector<float> out;        // [M, D] w2 product, kept when computed before the last round
  bool computed = false;
  int slot = -1;  // paged: the slot holding the expert (its read's ticket is the slot's)
};

// Where the executor's routed experts come from: whether an expert's panels are present.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void begin() {}  // the call's jobs are built; acquires follow
  // Binds j.w13 / j.w2 to j's expert, starting its read when missing; false when no slot can take
  // it now (nothing changed: the executor releases its oldest computed expert and asks again).
  virtual bool acquire(MoeJob& j) = 0;
  virtual void release(MoeJob& j) {}  // j is computed and no longer needs its slot
  virtual int state(const MoeJob& j) const { return 1; }  // 1 present, 0 being read, -1 read failed
  virtual void wait(MoeJob& j) {}  // blocks until j is no longer being read
  // A read failed: settle the jobs still holding slots (every issued read finished) and throw.
  [[noreturn]] virtual void fail(const std::vector<MoeJob*>& held);
  virtual void finish() {}  // the call is done (releases every slot it held)
  virtual size_t round_max() const = 0;  // routed experts per parallel round
};

// Every expert resident: always present, one round.
class ResidentExperts final : public ExpertSource {
 public:
  explicit ResidentExperts(const LayerW& L) : L_(L) {}
  bool acquire(MoeJob& j) override;
  size_t round_max() const override { return SIZE_MAX; }

 private:
  const LayerW& L_;
};

// Routed experts read from the packed cache file into the pager's slots (expert_pager.cpp); the
// call owns the policy and the slots (call_mu) from begin() to its end.
class PagedExperts final : public ExpertSource {
 public:
  PagedExperts(const Model& m, int layer)
      : m_(m), P_(*m.pager), L_(m.layers[layer]), layer_(layer), round_(std::max(2, m.threads)) {}
  void begin() override;
  bool acquire(MoeJob& j) override;
  void release(MoeJob& j) override;
  int state(const MoeJob& j) const override;
  void wait(MoeJob& j) override;
  [[noreturn]] void fail(const std::vector<MoeJob*>& held) override;
  void finish() override;
  // a round computes at most this many routed experts, so freed slots get new reads soon
  size_t round_max() const override { return round_; }

 private:
  const Model& m_;
  ExpertPager& P_;
  const LayerW& L_;
  int layer_;
  size_t round_;
  std::unique_lock<std::mutex> call_;
};

// y [S, D] = routed experts (idx/wt [S, k]: chosen experts and weights per token) + shared expert.
void run_experts(const Model& m, int layer, const float* x, int S, const std::vector<int>& idx,
                 const std::vector<float>& wt, ExpertSource& src, float* y);

}  // namespace cairn

// cairn kernel: expert paging set-up at load (pager_setup.h).
#include "pager_setup.h"

#include <algorithm>
#include <stdexcept>

#include "cairn/expert_cache.h"
#include "packed_file.h"

namespace cairn {

int paging_slots(Model& m, const PackPlan& plan, const std::string& cache_path, const PagingOptions& opt) {
  if (!(opt.budget > 0 && opt.budget < plan.experts)) return 0;
  if (cache_path.empty())
    throw std::invalid_argument("expert_cache_bytes=" + std::to_string(opt.budget) +
                                " pages routed experts from the packed cache file, but packed_cache is empty: "
                                "pass packed_cache=<file path>");
  const size_t need = (size_t)m.cfg.k * plan.slot;
  if (opt.budget < need)
    throw std::invalid_argument("expert_cache_bytes=" + std::to_string(opt.budget) + " is below the minimum of " +
                                std::to_string(need) + " bytes (num_experts_per_tok=" + std::to_string(m.cfg.k) +
                                " expert slots of " + std::to_string(plan.slot) + " bytes)");
  m.expert_budget = opt.budget;
  return (int)std::min<size_t>(opt.budget / plan.slot, (size_t)plan.nkeys);
}

void setup_pager(Model& m, const PackPlan& plan, const std::vector<void*>& bufs, const std::string& cache_path,
                 int slots, const PagingOptions& opt) {
  m.pager = std::make_shared<ExpertPager>(cache_path, plan.nkeys, plan.slot, kPackHeader + plan.dense, slots,
                                          SlotPolicy::parse(opt.policy), m.cfg.k, plan.dense, opt.readers);
  m.pager->policy.set_layers(m.cfg.n_layers, m.cfg.E);  // keys are layer * E + expert
  for (size_t j = 0; j < plan.jobs.size(); ++j) {
    if (bufs[j]) continue;
    const int64_t key = plan.key[j];
    ExpertPart& P = (plan.part[j] ? m.pager->w2 : m.pager->w13)[key];
    P = {plan.offset[j] - plan.dense - (size_t)key * plan.slot, plan.code_bytes[j], plan.jobs[j].qf, plan.jobs[j].bf16};
  }
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

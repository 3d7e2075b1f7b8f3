// cairn kernel: expert paging set-up at load -- the budget's slot count, the pager over the packed
// cache file, and where each paged expert's two matrices sit in a slot.
#pragma once
#include <string>
#include <vector>

#include "cairn/model.h"
#include "pack_plan.h"

namespace cairn {

// Slots for routed experts under opt.budget; 0 when every expert stays resident (no budget, or one
// of at least every expert's bytes). Throws std::invalid_argument for a budget below one decode
// step's experts or paging without a packed cache path.
int paging_slots(Model& m, const PackPlan& plan, const std::string& cache_path, const PagingOptions& opt);
// The pager reading the experts (the jobs with no buffer) from the written cache file.
void setup_pager(Model& m, const PackPlan& plan, const std::vector<void*>& bufs, const std::string& cache_path,
                 int slots, const PagingOptions& opt);

}  // namespace cairn

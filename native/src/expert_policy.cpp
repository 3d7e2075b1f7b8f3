// cairn kernel: expert slot replacement policy (synchronous, no I/O).
//
// LRFU: every key keeps a decayed access count crf (each access adds 1, the count halves every
// `half_life` accesses of the whole cache); the victim is the unpinned, non-busy slot of lowest
// decayed count (ties: least recently used). Experts that routing returns to often outlive a
// burst of one-off experts (a long prefill sweeping many experts once), which plain LRU lets
// flush the hot ones. Every `slots` accesses the quarter of resident keys with the highest counts
// are pinned: never evicted while an unpinned slot can go. Counts persist for non-resident keys,
// so a once-hot expert that was evicted comes back with its history.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cairn/expert_cache.h"

namespace cairn {

SlotPolicy::Kind SlotPolicy::parse(const std::string& name) {
  if (name == "lru") return LRU;
  if (name == "lrfu") return LRFU;
  throw std::invalid_argument("expert cache policy '" + name + "' is unknown (allowed: 'lru', 'lrfu')");
}

SlotPolicy::SlotPolicy(int slots, Kind kind)
    : kind_(kind), n_(slots), key_(slots, -1), tick_(slots, 0), busy_(slots, 0), pin_(slots, 0), free_(slots),
      half_life_(2.0 * std::max(slots, 1)) {
  if (slots < 1) throw std::invalid_argument("expert cache needs at least one slot");
}

void SlotPolicy::begin_call() { release_all(); }

double SlotPolicy::decayed(const Score& s) const { return s.crf * std::exp2(-(double)(now_ - s.at) / half_life_); }

int SlotPolicy::pinned() const { return (int)std::count(pin_.begin(), pin_.end(), 1); }

void SlotPolicy::repin() {
  std::fill(pin_.begin(), pin_.end(), 0);
  std::vector<std::pair<double, int>> r;
  for (int s = 0; s < n_; ++s)
    if (key_[s] >= 0) r.emplace_back(decayed(score_[key_[s]]), s);
  const size_t keep = std::min(r.size(), (size_t)n_ / 4);
  std::partial_sort(r.begin(), r.begin() + keep, r.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < keep; ++i) pin_[r[i].second] = 1;
}

int SlotPolicy::victim() const {
  int best = -1;
  double bs = 0;
  for (int pass = 0; pass < 2 && best < 0; ++pass)  // unpinned first; pinned only if nothing else can go
    for (int s = 0; s < n_; ++s) {
      if (busy_[s] || (pass == 0 && pin_[s])) continue;
      const double v = kind_ == LRFU ? decayed(score_.at(key_[s])) : 0.0;
      if (best < 0 || v < bs || (v == bs && tick_[s] < tick_[best])) best = s, bs = v;
    }
  return best;
}

int SlotPolicy::acquire(int64_t key, bool* hit) {
  auto it = where_.find(key);
  int s;
  if (it != where_.end()) {
    s = it->second;
    *hit = true;
  } else {
    if (free_ > 0) {
      s = (int)(std::find(key_.begin(), key_.end(), (int64_t)-1) - key_.begin());
      --free_;
    } else {
      s = victim();
      if (s < 0) return -1;
      where_.erase(key_[s]);
      ++evictions_;
    }
    *hit = false;
    key_[s] = key;
    pin_[s] = 0;
    where_[key] = s;
  }
  if (busy_[s]) return s;  // the same key twice in one call
  ++now_;
  tick_[s] = now_;
  busy_[s] = 1;
  busy_list_.push_back(s);
  if (kind_ == LRFU) {
    Score& sc = score_[key];
    sc.crf = decayed(sc) + 1.0;
    sc.at = now_;
    if (now_ % (uint64_t)n_ == 0) repin();
  }
  return s;
}

void SlotPolicy::drop(int64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  key_[it->second] = -1;
  pin_[it->second] = 0;
  where_.erase(it);
  ++free_;
}

void SlotPolicy::release_all() {
  for (int s : busy_list_) busy_[s] = 0;
  busy_list_.clear();
}

}  // namespace cairn

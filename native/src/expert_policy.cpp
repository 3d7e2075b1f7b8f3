// cairn kernel: expert slot replacement policy (synchronous, no I/O).
//
// LRFU: every key keeps a decayed access count crf (each access adds 1, the count halves every
// `half_life` accesses of the whole cache); the victim is the unpinned, non-busy slot of lowest
// decayed count (ties: least recently used). Experts that routing returns to often outlive a
// burst of one-off experts (a long prefill sweeping many experts once), which plain LRU lets
// flush the hot ones. Every `slots` accesses the quarter of resident keys with the highest counts
// are pinned: never evicted while an unpinned slot can go. Counts persist for non-resident keys,
// so a once-hot expert that was evicted comes back with its history.
//
// HOTPIN (the default before CYCLE, expert_policy_cycle.cpp): LRU over unpinned slots, plus up
// to 7/8 of the slots (leaving at least `unpinned`) pinned for the keys of highest decayed count
// (half-life 8x the slots in accesses).
// Pinned slots are not evicted to make room in a call: when the unpinned slots are busy the call
// releases its oldest held slot and retries. A key takes the place of the
// coldest pinned one only when its count exceeds that one's by 25%. The hysteresis is what
// matters for MoE traffic: a prefill chunk touches nearly every expert of every layer, a cyclic
// sweep larger than the cache on which LRU (and LRFU, whose counts are then all alike) hits
// nothing; a stable pinned set hits on every one of its members per sweep, and with skewed routing
// the pinned set is the hot experts. The unpinned quarter catches short-term reuse (decode steps).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cairn/expert_cache.h"

namespace cairn {

SlotPolicy::Kind SlotPolicy::parse(const std::string& name) {
  if (name == "lru") return LRU;
  if (name == "lrfu") return LRFU;
  if (name == "hotpin") return HOTPIN;
  if (name == "cycle") return CYCLE;
  throw std::invalid_argument("expert cache policy '" + name +
                              "' is unknown (allowed: 'lru', 'lrfu', 'hotpin', 'cycle')");
}

SlotPolicy::SlotPolicy(int slots, Kind kind, int unpinned)
    : kind_(kind), n_(slots), key_(slots, -1), tick_(slots, 0), busy_(slots, 0), pin_(slots, 0), reserved_(slots, 0),
      k_(unpinned), free_(slots),
      half_life_((kind == HOTPIN ? 8.0 : 2.0) * std::max(slots, 1)), pin_max_(kind == HOTPIN ? std::min(slots * 7 / 8, slots - unpinned) : 0) {
  if (slots < 1) throw std::invalid_argument("expert cache needs at least one slot");
}

void SlotPolicy::begin_call() {
  if (kind_ == CYCLE) cycle_end_call();
  release_all();
}

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

int SlotPolicy::victim(bool take_reserved) const {
  int best = -1;
  double bs = 0;
  // unpinned first; pinned ones only if nothing else can go (never for HOTPIN: the call releases a
  // slot); reserved ones only when asked (a call that holds no slot of its own)
  for (int pass = 0; pass < (kind_ == HOTPIN ? 1 : 2) && best < 0; ++pass)
    for (int s = 0; s < n_; ++s) {
      if (busy_[s] || (pass == 0 && pin_[s]) || (reserved_[s] && !take_reserved)) continue;
      const double v = kind_ == LRFU ? decayed(score_.at(key_[s])) : 0.0;  // HOTPIN: LRU among unpinned
      if (best < 0 || v < bs || (v == bs && tick_[s] < tick_[best])) best = s, bs = v;
    }
  return best;
}

void SlotPolicy::reserve(int s) {
  reserved_[s] = 1;
  reserved_list_.push_back(s);
}

void SlotPolicy::unreserve(int s) {
  if (!reserved_[s]) return;
  reserved_[s] = 0;
  *std::find(reserved_list_.begin(), reserved_list_.end(), s) = reserved_list_.back();
  reserved_list_.pop_back();
}

int SlotPolicy::acquire(int64_t key, bool* hit) {
  auto it = where_.find(key);
  int s;
  if (kind_ == CYCLE) {
    if (experts_ < 1) throw std::logic_error("expert cache policy 'cycle' needs set_layers before use");
    if (key >= (int64_t)use_.size())
      throw std::invalid_argument("expert cache policy 'cycle': key " + std::to_string(key) + " is beyond " +
                                  std::to_string(layers_) + " layers x " + std::to_string(experts_) + " experts");
    if (call_keys_.empty()) cur_layer_ = (int)(key / experts_);
  }
  if (it != where_.end()) {
    s = it->second;
    *hit = true;
    unreserve(s);
  } else {
    if (free_ > 0) {
      s = (int)(std::find(key_.begin(), key_.end(), (int64_t)-1) - key_.begin());
      --free_;
    } else {
      // reservations must not starve a call: it takes a reserved slot only when it holds none
      s = kind_ == CYCLE ? cycle_victim(key, cur_layer_, false) : victim(false);
      if (s < 0 && busy_list_.empty()) s = kind_ == CYCLE ? cycle_victim(key, cur_layer_, true) : victim(true);
      if (s < 0) return -1;
      where_.erase(key_[s]);
      unreserve(s);
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
  if (kind_ == CYCLE) {
    call_keys_.push_back(key);
  } else if (kind_ == LRFU) {
    Score& sc = score_[key];
    sc.crf = decayed(sc) + 1.0;
    sc.at = now_;
    if (now_ % (uint64_t)n_ == 0) repin();
  } else if (kind_ == HOTPIN) {
    Score& sc = score_[key];
    sc.crf = decayed(sc) + 1.0;
    sc.at = now_;
    if (!pin_[s]) promote(s);
  }
  return s;
}

int SlotPolicy::prefetch(int64_t key) {
  auto it = where_.find(key);
  if (it != where_.end()) {
    const int s = it->second;
    if (!reserved_[s] && !busy_[s] && !pin_[s]) reserve(s);  // a pinned slot needs no reservation
    return -2;
  }
  // room: reservations leave at least one unpinned slot unreserved, so the call they are for can
  // start with an expert nobody guessed without evicting one that was; and they take at most the
  // streaming share of the cache (prefetch_window), so reading a whole prefill chunk's next layer
  // ahead does not flush the keys the policy keeps through a sweep (it would read them again)
  if (reserved() + 1 >= n_ - pinned() || reserved() >= prefetch_window()) return -1;
  int s;
  if (free_ > 0) {
    s = (int)(std::find(key_.begin(), key_.end(), (int64_t)-1) - key_.begin());
    --free_;
  } else if (kind_ == CYCLE) {
    // as if the target call were running and had acquired nothing yet: its layer's keys are the
    // nearest, the layer that just ran the furthest
    if (key >= (int64_t)use_.size()) throw std::invalid_argument("expert cache policy 'cycle': prefetch key out of range");
    s = cycle_victim(-1, (int)(key / experts_), false);
    if (s < 0) return -1;
    where_.erase(key_[s]);
    ++evictions_;
  } else {
    s = -1;  // LRU among unpinned, non-busy, unreserved slots (never a pinned one, whatever the kind)
    for (int t = 0; t < n_; ++t)
      if (!busy_[t] && !pin_[t] && !reserved_[t] && (s < 0 || tick_[t] < tick_[s])) s = t;
    if (s < 0) return -1;
    where_.erase(key_[s]);
    ++evictions_;
  }
  key_[s] = key;
  pin_[s] = 0;
  tick_[s] = now_;  // as recent as the last access, so it outlives older unpinned keys until used
  where_[key] = s;
  reserve(s);
  return s;
}

int SlotPolicy::end_reservations(int64_t lo, int64_t hi) {
  int unused = 0;
  for (size_t i = reserved_list_.size(); i-- > 0;) {
    const int s = reserved_list_[i];
    if (key_[s] >= lo && key_[s] < hi) {
      unreserve(s);
      ++unused;
    }
  }
  return unused;
}

void SlotPolicy::promote(int s) {
  if (pin_max_ <= 0) return;
  int pinned = 0, coldest = -1;
  double cv = 0;
  for (int t = 0; t < n_; ++t) {
    if (!pin_[t]) continue;
    ++pinned;
    const double v = decayed(score_.at(key_[t]));
    if (coldest < 0 || v < cv) coldest = t, cv = v;
  }
  if (pinned < pin_max_) {
    pin_[s] = 1;
    return;
  }
  if (decayed(score_.at(key_[s])) > cv + 1.0) {
    pin_[coldest] = 0;  // back to the LRU part, as recent as its last use
    pin_[s] = 1;
  }
}

void SlotPolicy::drop(int64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  key_[it->second] = -1;
  pin_[it->second] = 0;
  unreserve(it->second);
  where_.erase(it);
  ++free_;
}

void SlotPolicy::release(int s) {
  if (s < 0 || s >= n_ || !busy_[s]) return;
  busy_[s] = 0;
  busy_list_.erase(std::find(busy_list_.begin(), busy_list_.end(), s));
}

void SlotPolicy::release_all() {
  for (int s : busy_list_) busy_[s] = 0;
  busy_list_.clear();
}

}  // namespace cairn

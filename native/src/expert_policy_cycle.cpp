// cairn kernel: the CYCLE expert slot policy (the default), Belady's rule with the future estimated online.
//
// MoE calls come round in a fixed layer cycle (layer 0, 1, ..., n_layers - 1, 0, ...), so the
// number of calls until a key's layer runs again is known exactly; whether that call routes to
// the key is not, and is estimated by the key's use rate p: a decayed average (weight kAlpha per
// call of its layer) of "the layer's call used this expert". A key that is used with probability
// p per turn of its layer is next used, on average, after
//     d + (1/p - 1) * n_layers   calls,
// d the calls until its layer's next call. The victim is the key with the largest such expected
// next use (Belady's MIN evicts the key of furthest next use). So the experts of the layer that
// just ran go before those of the next layer, and a rarely used expert before a common one.
//
// Within the running call (experts acquired in index order), a key of this layer above the one
// being acquired may still come in this call (d = 0); one below it did not (d = n_layers). The
// call's own held keys are scored too: when one of them is the better victim (its expected next
// use the furthest), acquire answers -1 and the call releases its oldest held slot rather than
// evicting a better key. That is what a prefill chunk needs: it sweeps every expert of every
// layer, more than the cache holds, and the optimum keeps a fixed set resident through the sweep
// while the sweep itself streams through the rest, as MIN does. LRU keeps the most recent keys
// instead and hits nothing.
//
// Only keys and calls feed the scores (no timing), like every SlotPolicy, so replay_expert_policy
// reproduces the model's counters.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cairn/expert_cache.h"

namespace cairn {

namespace {
constexpr double kAlpha = 0.1;     // weight of the latest call in a key's use rate
constexpr double kMinRate = 1e-3;  // a never-used key: used within 1000 turns of its layer
}  // namespace

void SlotPolicy::set_layers(int n_layers, int experts) {
  if (n_layers < 1 || experts < 1)
    throw std::invalid_argument("expert cache policy: n_layers and experts must be >= 1, got " +
                                std::to_string(n_layers) + " and " + std::to_string(experts));
  layers_ = n_layers;
  experts_ = experts;
  use_.assign((size_t)n_layers * experts, 0.0);
}

double SlotPolicy::cycle_score(int64_t key, int cur, int64_t acquiring) const {
  const int layer = (int)(key / experts_);
  int d = ((layer - cur) % layers_ + layers_) % layers_;
  if (d == 0 && key <= acquiring) d = layers_;  // not (or no longer) wanted by this call
  const double p = std::max(use_[key], kMinRate);
  return d + (1.0 / p - 1.0) * layers_;
}

int SlotPolicy::cycle_victim(int64_t acquiring, int cur, bool take_reserved) const {
  int best = -1;
  double bs = 0;
  for (int s = 0; s < n_; ++s) {
    if (busy_[s] || (reserved_[s] && !take_reserved)) continue;
    const double v = cycle_score(key_[s], cur, acquiring);
    if (best < 0 || v > bs || (v == bs && tick_[s] < tick_[best])) best = s, bs = v;
  }
  // the call's held experts (all below `acquiring`): give one of those up instead? From the first
  // held one on: the next read then waits for that expert's compute (a window of one read), the
  // price of the hits; from the k-th on, a decode step's k reads would overlap as under hotpin,
  // with fewer hits (docs/benchmarks/expert-cache.md).
  for (int s : busy_list_)
    if (best < 0 || cycle_score(key_[s], cur, acquiring) > bs) return -1;
  return best;
}

void SlotPolicy::cycle_end_call() {
  if (call_keys_.empty()) return;
  const size_t base = (size_t)cur_layer_ * experts_;
  for (int e = 0; e < experts_; ++e) use_[base + e] *= 1.0 - kAlpha;
  for (int64_t k : call_keys_) use_[k] += kAlpha;
  call_keys_.clear();
}

}  // namespace cairn

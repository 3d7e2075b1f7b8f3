// cairn kernel: routed experts paged from the packed cache file under a byte budget.
//
// Design notes
//  * SlotPolicy (expert_policy.cpp) is the whole replacement policy: synchronous, no I/O, shared
//    by the kernel and by replay_expert_policy (benches measure hit rates with the same code).
//    Keys are layer * E + expert. A MoE call acquires its distinct experts in index order; a
//    slot it holds is busy (never evicted) until released. When acquire finds every evictable
//    slot busy, the call releases its oldest held slot (FIFO, once that expert's compute is done)
//    and retries: a sliding window of in-flight experts. Releases happen only on a failed acquire,
//    so the sequence of policy operations depends on the keys alone, never on timing, and
//    replay_expert_policy reproduces the model's counters exactly.
//  * Prefetch (forward.cpp): before a layer's call, the keys it will (hash layers: surely) or
//    probably (router lookahead) acquire are read ahead into slots the policy *reserves* for the
//    call; only the next call ever has reservations. A prefetch never evicts a busy, pinned or
//    reserved slot, leaves one unpinned slot unreserved and reserves at most prefetch_window(). As the call acquires in index order, a
//    reserved key below the one it acquires was guessed wrong: its reservation ends
//    (end_reservations(layer start, key)), so the slot joins the call's window; a call evicts a
//    still-reserved slot only when it holds none of its own. The call's end ends the rest.
//    Prefetches are policy operations issued at fixed points with keys computed from the chunk's
//    numbers, so the sequence still depends on the inputs alone, never on timing.
//  * CYCLE (expert_policy_cycle.cpp) may also answer -1 while a slot could go: when one of the
//    call's own held experts is the better victim (a prefill sweep), the release frees it.
//  * ExpertPager (expert_pager.cpp) owns the slot pool (one 4 KiB-aligned allocation), the file
//    (O_DIRECT, else buffered reads + POSIX_FADV_DONTNEED), a few reader threads and the counters.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cairn/model.h"

namespace cairn {

class SlotPolicy {
 public:
  enum Kind { LRU = 0, LRFU = 1, HOTPIN = 2, CYCLE = 3 };
  // "lru" | "lrfu" | "hotpin" | "cycle"; std::invalid_argument otherwise
  static Kind parse(const std::string& name);
  // unpinned: slots HOTPIN never pins (one decode step's experts, k, are acquired without a release)
  SlotPolicy(int slots, Kind kind, int unpinned = 1);
  // CYCLE needs the layer cycle (keys are layer * experts + expert; calls run layers 0..n_layers-1
  // in turn); set before the first acquire. The other kinds ignore it.
  void set_layers(int n_layers, int experts);
  void begin_call();  // a new MoE call (releases whatever the last one held)
  // The slot holding key (hit) or a slot to load it into (miss, possibly evicting), now busy.
  // -1: no slot to give (nothing changed: release the call's oldest slot, retry). Every evictable
  // slot is busy, or (CYCLE) one of the call's held experts is a better victim than any free one.
  // A key resident under a prefetch's reservation is a hit (the reservation ends here).
  int acquire(int64_t key, bool* hit);
  // Reserve key ahead of its call (no access: recency and counts are untouched). Returns the slot
  // to read it into (a free or evicted one), -2 when it is resident already (now reserved), -1
  // when no slot may take it (every candidate is busy, pinned or reserved, or the room is used).
  int prefetch(int64_t key);
  // The call for keys [lo, hi) has run: their reservations end. Returns how many were never acquired.
  int end_reservations(int64_t lo, int64_t hi);
  int reserved() const { return (int)reserved_list_.size(); }
  // most slots reserved at once: one decode step's experts (k), or an eighth of the cache (the
  // share hotpin leaves unpinned), whichever is more
  int prefetch_window() const { return std::max(k_, n_ / 8); }
  void release(int s);  // slot s is no longer busy (its expert's compute is done)
  void release_all();
  void drop(int64_t key);  // forget a resident key (its slot's contents are invalid)
  int slots() const { return n_; }
  int pinned() const;
  int64_t evictions() const { return evictions_; }

 private:
  struct Score {
    double crf = 0;   // decayed access count at `at`
    uint64_t at = 0;  // access clock of the last access
  };
  double decayed(const Score& s) const;
  void repin();
  void promote(int s);  // HOTPIN: pin slot s if its key is hot enough
  int victim(bool take_reserved) const;
  void reserve(int s);
  void unreserve(int s);
  // CYCLE (expert_policy_cycle.cpp)
  // expected calls until key's next use, the call of layer `cur` acquiring `acquiring` (-1: none yet)
  double cycle_score(int64_t key, int cur, int64_t acquiring) const;
  int cycle_victim(int64_t acquiring, int cur, bool take_reserved) const;
  void cycle_end_call();  // fold the finished call's experts into their layer's use rates
  Kind kind_;
  int n_;
  std::vector<int64_t> key_;    // [slots] resident key, -1 = empty
  std::vector<uint64_t> tick_;  // [slots] access clock of the last use (recency)
  std::vector<char> busy_, pin_, reserved_;
  std::vector<int> reserved_list_;  // the reserved slots, unordered
  int k_;                            // the `unpinned` argument: experts per token
  std::vector<int> busy_list_;
  std::unordered_map<int64_t, int> where_;    // key -> slot
  std::unordered_map<int64_t, Score> score_;  // LRFU: every key seen (history outlives residency)
  uint64_t now_ = 0;
  int free_ = 0;
  int64_t evictions_ = 0;
  double half_life_;  // LRFU decay, in accesses
  int pin_max_;       // HOTPIN: at most this many pinned slots
  int layers_ = 0, experts_ = 0;  // CYCLE: the layer cycle (set_layers)
  int cur_layer_ = 0;             // CYCLE: the running call's layer (its first key's)
  std::vector<double> use_;       // CYCLE: [layers * experts] decayed rate of use in the layer's calls
  std::vector<int64_t> call_keys_;  // CYCLE: the running call's distinct keys
};

// Where one of an expert's two matrices (fused w1/w3, w2) sits inside its slot.
struct ExpertPart {
  size_t rel = 0;         // from the slot start
  size_t code_bytes = 0;  // quantized: scales start at rel + code_bytes
  QFmt qf = QFmt::None;
  bool bf16 = false;
};

class ExpertPager {
 public:
  struct Ticket {
    std::atomic<int> state{1};  // 0 pending, 1 loaded (or never read), -1 failed
  };
  ExpertPager(const std::string& path, int64_t nkeys, size_t slot_bytes, uint64_t expert_base, int slots,
              SlotPolicy::Kind kind, int k, size_t dense_bytes, int readers = 4);
  ~ExpertPager();
  ExpertPager(const ExpertPager&) = delete;
  ExpertPager& operator=(const ExpertPager&) = delete;

  std::mutex call_mu;  // one MoE call (or prefetch) at a time owns the policy and the slots
  SlotPolicy policy;
  std::vector<ExpertPart> w13, w2;  // [nkeys]

  uint8_t* slot(int s) const { return pool_ + (size_t)s * slot_bytes_; }
  Ticket& ticket(int s) const { return tickets_[s]; }  // slot s's last read
  // Read key's range into slot s (reader threads). A call's reads go before every prefetch's.
  void submit(int s, int64_t key, bool ahead = false);
  void expedite(int s);   // a call needs slot s's queued prefetch: move it to the calls' queue
  void settle(int s);     // slot s is about to be reused: drop its queued read or wait for it
  bool wait(Ticket* t);   // blocks until loaded; false on a read error
  void count(bool hit, bool prefetched = false);
  // whether slot s holds a prefetch's read no call has used yet (and now one has)
  bool take_ahead(int s) {
    const bool a = ahead_read_[s];
    ahead_read_[s] = 0;
    return a;
  }
  // Read keys (one layer's, ascending) ahead of the layer's call, as far as the policy gives
  // room (holding call_mu). guess: the keys come from router lookahead, not the tokens. Returns
  // how many keys were offered to the policy (up to the first it had no room for).
  size_t prefetch(int layer, const std::vector<int64_t>& keys, bool guess);
  void end_call(int layer, int64_t E);  // the layer's call has run: its reservations end
  void count_guess(int layer, int64_t key);  // a call acquired key: was it guessed?

  int readers() const { return (int)threads_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t dense_bytes() const { return dense_bytes_; }
  int64_t nkeys() const { return nkeys_; }
  bool direct_io() const { return direct_; }
  std::atomic<bool> prefetch_on{true};  // Model.expert_prefetch
  struct Stats {
    int64_t hits = 0, misses = 0, bytes_read = 0, evictions = 0;
    double read_seconds = 0, stall_seconds = 0;
    double busy_seconds = 0;  // wall time with at least one read in flight (the disk kept busy)
    int64_t prefetch_reads = 0;     // reads issued ahead of a call (in bytes_read once performed)
    int64_t prefetch_used = 0;      // of those, acquired by their call (counted as hits)
    int64_t prefetch_dropped = 0;   // of those, dropped before they started (their slot was reused)
    int64_t lookahead_guesses = 0;  // keys the router lookahead predicted for its layer's next call
    int64_t lookahead_right = 0;    // of those, acquired by that call
    int64_t lookahead_keys = 0;     // keys acquired by calls that had a lookahead guess
  };
  Stats stats();

 private:
  struct Req {
    int slot;
    uint64_t off;
  };
  void reader();
  int fd_ = -1;
  bool direct_ = false;
  uint8_t* pool_ = nullptr;
  std::unique_ptr<Ticket[]> tickets_;  // [slots]
  std::vector<char> ahead_read_;       // [slots] holds a prefetch read no call has acquired yet
  std::vector<std::vector<int64_t>> guess_;  // [layer] the lookahead's keys for its next call (ascending)
  size_t slot_bytes_, dense_bytes_;
  uint64_t base_;
  int64_t nkeys_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Req> queue_, ahead_;  // calls' reads, prefetches (readers take calls' first)
  bool stop_ = false;
  std::vector<std::thread> threads_;
  Stats stats_;
  int waiters_ = 0;  // compute threads in wait()
  int inflight_ = 0;  // reads being performed
  double busy_t0_ = 0;
  double stall_t0_ = 0;
};

// A copy of tmpl (a paged expert matrix: shape and format) reading its panels from a slot.
Linear paged_linear(const Linear& tmpl, const ExpertPart& P, const uint8_t* slot);

// MoE calls' distinct experts, for benches to replay real routing: rows (call, layer, expert);
// a prefetch offered to the policy before call `call` is a row (call, layer, -1 - expert).
// Bench-only: a MoE call reads `on` without the lock and takes `mu` only while tracing is on.
// Every call counts in `calls` (tracing on or off), so a trace's call numbers keep their place in
// the layer cycle (call % n_layers == layer) whenever tracing starts.
struct RouteTrace {
  std::mutex mu;                     // guards rows; set_route_trace stores `on` under it
  std::atomic<bool> on{false};
  std::atomic<int64_t> calls{0};
  std::vector<int32_t> rows;         // [n, 3]
};

}  // namespace cairn

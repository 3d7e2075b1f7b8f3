// cairn kernel: expert slot pool, reader threads and counters (the effects of expert paging;
// the policy is expert_policy.cpp).
//
// One expert = one contiguous 4 KiB-aligned range of the packed cache file, read with one pread
// into its slot. The file is opened O_DIRECT (no page-cache copy of what the pool already holds);
// where the filesystem refuses (EINVAL, e.g. tmpfs) or CAIRN_EXPERT_DIRECT_IO=0, reads are
// buffered and each range is dropped from the page cache after the copy (POSIX_FADV_DONTNEED).
// Reader threads (expert_readers, default 4) mostly block in pread, so they do not compete with
// OpenMP for cores; more than one keeps several reads in flight (the disk gains from queue depth).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cairn/expert_cache.h"

namespace cairn {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool read_all(int fd, uint8_t* dst, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    const ssize_t r = pread(fd, dst + done, n - done, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += (size_t)r;
  }
  return true;
}
}  // namespace

ExpertPager::ExpertPager(const std::string& path, int64_t nkeys, size_t slot_bytes, uint64_t expert_base, int slots,
                         SlotPolicy::Kind kind, int k, size_t dense_bytes, int readers)
    : policy(slots, kind, k), w13(nkeys), w2(nkeys), tickets_(new Ticket[slots]), ahead_read_(slots, 0),
      slot_bytes_(slot_bytes), dense_bytes_(dense_bytes), base_(expert_base), nkeys_(nkeys) {
  pool_ = (uint8_t*)std::aligned_alloc(4096, (size_t)slots * slot_bytes);
  if (!pool_) throw std::bad_alloc();
  const char* env = std::getenv("CAIRN_EXPERT_DIRECT_IO");
  const bool want_direct = !(env && std::strcmp(env, "0") == 0);
  if (want_direct) {
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    // some filesystems accept the flag and refuse the read: probe one expert
    if (fd_ >= 0 && !read_all(fd_, pool_, slot_bytes, base_)) {
      close(fd_);
      fd_ = -1;
    }
    direct_ = fd_ >= 0;
  }
  if (fd_ < 0) fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    std::free(pool_);
    throw std::runtime_error("cannot open the packed cache file '" + path + "' for expert paging: " +
                             std::strerror(errno));
  }
  for (int i = 0; i < readers; ++i) threads_.emplace_back([this] { reader(); });
}

ExpertPager::~ExpertPager() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (fd_ >= 0) close(fd_);
  std::free(pool_);
}

void ExpertPager::submit(int s, int64_t key, bool ahead) {
  tickets_[s].state.store(0);
  ahead_read_[s] = ahead;
  {
    std::lock_guard<std::mutex> g(mu_);
    (ahead ? ahead_ : queue_).push_back({s, base_ + (uint64_t)key * slot_bytes_});
    if (ahead) stats_.prefetch_reads += 1;
  }
  work_cv_.notify_one();
}

void ExpertPager::expedite(int s) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = ahead_.begin(); it != ahead_.end(); ++it)
    if (it->slot == s) {
      queue_.push_back(*it);
      ahead_.erase(it);
      return;
    }
}

void ExpertPager::settle(int s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto* q : {&queue_, &ahead_})
      for (auto it = q->begin(); it != q->end(); ++it)
        if (it->slot == s) {
          q->erase(it);
          tickets_[s].state.store(1);  // never read: the slot is about to be read again
          stats_.prefetch_dropped += 1;  // only a prefetch can be queued for a slot that is not busy
          return;
        }
  }
  wait(&tickets_[s]);  // in flight: the reader still writes the slot
}

void ExpertPager::reader() {
  for (;;) {
    Req r;
    double t0;
    {
      std::unique_lock<std::mutex> g(mu_);
      work_cv_.wait(g, [&] { return stop_ || !queue_.empty() || !ahead_.empty(); });
      if (stop_) return;  // queued reads are dropped: nothing waits for them any more
      std::deque<Req>& q = queue_.empty() ? ahead_ : queue_;
      r = q.front();
      q.pop_front();
      t0 = now_s();  // taken under the lock: busy periods start in the order reads start
      if (inflight_++ == 0) busy_t0_ = t0;
    }
    const bool ok = read_all(fd_, slot(r.slot), slot_bytes_, r.off);
    if (ok && !direct_) posix_fadvise(fd_, (off_t)r.off, (off_t)slot_bytes_, POSIX_FADV_DONTNEED);
    const double t1 = now_s();
    {
      std::lock_guard<std::mutex> g(mu_);
      stats_.read_seconds += t1 - t0;
      if (ok) stats_.bytes_read += (int64_t)slot_bytes_;
      // the same instants as read_seconds, so busy (their union) <= read_seconds up to lock latency
      if (--inflight_ == 0) stats_.busy_seconds += t1 - busy_t0_;
      tickets_[r.slot].state.store(ok ? 1 : -1);
    }
    done_cv_.notify_all();
  }
}

size_t ExpertPager::prefetch(int layer, const std::vector<int64_t>& keys, bool guess) {
  std::lock_guard<std::mutex> call(call_mu);
  size_t offered = 0;
  for (int64_t key : keys) {
    ++offered;
    const int s = policy.prefetch(key);
    if (s == -1) break;  // no room: later keys would not be reached before the call frees slots
    if (s < 0) continue;  // resident already
    settle(s);
    submit(s, key, true);
  }
  if (guess) {
    if ((int)guess_.size() <= layer) guess_.resize(layer + 1);
    guess_[layer] = keys;
    std::lock_guard<std::mutex> g(mu_);
    stats_.lookahead_guesses += (int64_t)keys.size();
  }
  return offered;
}

void ExpertPager::count_guess(int layer, int64_t key) {
  if (layer >= (int)guess_.size() || guess_[layer].empty()) return;
  const bool right = std::binary_search(guess_[layer].begin(), guess_[layer].end(), key);
  std::lock_guard<std::mutex> g(mu_);
  stats_.lookahead_keys += 1;
  stats_.lookahead_right += right;
}

void ExpertPager::end_call(int layer, int64_t E) {
  policy.end_reservations((int64_t)layer * E, (int64_t)(layer + 1) * E);
  if (layer < (int)guess_.size()) guess_[layer].clear();
}

// stall_seconds: wall time during which at least one compute thread waits for a read
bool ExpertPager::wait(Ticket* t) {
  if (t->state.load() == 0) {
    std::unique_lock<std::mutex> g(mu_);
    if (waiters_++ == 0) stall_t0_ = now_s();
    done_cv_.wait(g, [&] { return t->state.load() != 0; });
    if (--waiters_ == 0) stats_.stall_seconds += now_s() - stall_t0_;
  }
  return t->state.load() == 1;
}

void ExpertPager::count(bool hit, bool prefetched) {
  std::lock_guard<std::mutex> g(mu_);
  (hit ? stats_.hits : stats_.misses) += 1;
  if (prefetched) stats_.prefetch_used += 1;
}

ExpertPager::Stats ExpertPager::stats() {
  std::lock_guard<std::mutex> g(mu_);
  Stats s = stats_;
  s.evictions = policy.evictions();  // read between calls (the policy belongs to the call holding call_mu)
  return s;
}

}  // namespace cairn

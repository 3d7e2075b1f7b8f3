// cairn kernel: the MoE executor's expert sources (moe_executor.h) -- resident panels, or slots
// of the expert pager filled from the packed cache file.
#include <stdexcept>

#include "moe_executor.h"

namespace cairn {

void ExpertSource::fail(const std::vector<MoeJob*>&) {
  throw std::runtime_error("expert cache: reading a routed expert from the packed cache file failed");
}

bool ResidentExperts::acquire(MoeJob& j) {
  j.w13 = L_.w13[j.expert];
  j.w2 = L_.w2[j.expert];
  return true;
}

void PagedExperts::begin() {
  call_ = std::unique_lock<std::mutex>(P_.call_mu);
  P_.policy.begin_call();
}

bool PagedExperts::acquire(MoeJob& j) {
  bool hit = false;
  // reservations of this layer's keys below j's were guesses this call passes over (index order)
  P_.policy.end_reservations(j.key - j.expert, j.key);
  const int s = P_.policy.acquire(j.key, &hit);
  if (s < 0) return false;
  P_.count_guess(layer_, j.key);
  ExpertPager::Ticket& t = P_.ticket(s);
  if (hit && t.state.load() == -1) hit = false;  // a prefetch's read failed: read it again, for this call
  if (hit) {
    P_.count(true, P_.take_ahead(s));
    if (t.state.load() == 0) P_.expedite(s);  // still queued as a prefetch: the call needs it now
  } else {
    P_.count(false);
    P_.settle(s);  // the evicted key's read may still be queued or in flight
    P_.submit(s, j.key);
  }
  j.w13 = paged_linear(L_.w13[j.expert], P_.w13[j.key], P_.slot(s));
  j.w2 = paged_linear(L_.w2[j.expert], P_.w2[j.key], P_.slot(s));
  j.slot = s;
  return true;
}

void PagedExperts::release(MoeJob& j) { P_.policy.release(j.slot); }

int PagedExperts::state(const MoeJob& j) const { return P_.ticket(j.slot).state.load(); }

void PagedExperts::wait(MoeJob& j) { P_.wait(&P_.ticket(j.slot)); }

// tickets and slots belong to this call: let every issued read finish, forget the slots that hold
// no valid expert, and report
void PagedExperts::fail(const std::vector<MoeJob*>& held) {
  for (MoeJob* j : held) wait(*j);
  for (MoeJob* j : held)
    if (state(*j) == -1) P_.policy.drop(j->key);
  P_.policy.release_all();
  P_.end_call(layer_, m_.cfg.E);
  ExpertSource::fail(held);
}

void PagedExperts::finish() {
  P_.policy.release_all();
  P_.end_call(layer_, m_.cfg.E);
}

}  // namespace cairn

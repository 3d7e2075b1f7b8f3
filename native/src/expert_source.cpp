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
  const int s = P_.policy.acquire(j.key, &hit);
  if (s < 0) return false;
  P_.count(hit);
  j.w13 = paged_linear(L_.w13[j.expert], P_.w13[j.key], P_.slot(s));
  j.w2 = paged_linear(L_.w2[j.expert], P_.w2[j.key], P_.slot(s));
  j.loading = !hit;
  if (!hit) P_.submit(s, j.key, &j.ticket);
  j.slot = s;
  return true;
}

void PagedExperts::release(MoeJob& j) { P_.policy.release(j.slot); }

int PagedExperts::state(const MoeJob& j) const { return j.loading ? j.ticket.state.load() : 1; }

void PagedExperts::wait(MoeJob& j) {
  if (j.loading) P_.wait(&j.ticket);
}

// tickets and slots belong to this call: let every issued read finish, forget the slots that hold
// no valid expert, and report
void PagedExperts::fail(const std::vector<MoeJob*>& held) {
  for (MoeJob* j : held) wait(*j);
  for (MoeJob* j : held)
    if (state(*j) == -1) P_.policy.drop(j->key);
  P_.policy.release_all();
  ExpertSource::fail(held);
}

void PagedExperts::finish() { P_.policy.release_all(); }

}  // namespace cairn

// cairn kernel: forward-pass entry points for every family (internal; the bindings call these).
// A family's own layer code is declared in its folder (families/<name>/).
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "cairn/model.h"
#include "cairn/state.h"

namespace cairn {

// Runs tokens[0..S) (S <= MAX_CHUNK) at positions st.n.., updates st (window, compressors,
// tokens, last_logits). logits_out: [S, V] if all_logits else [V] (may be null).
void forward_chunk(State& st, const int32_t* tokens, int S, float* logits_out, bool all_logits);

// Prefill in chunks; checks *abort between chunks. Returns tokens completed.
// logits_all (if non-null) receives [n_done, V] rows.
int64_t prefill(State& st, const int32_t* tokens, int64_t n, int chunk, const std::atomic<bool>* abort,
                float* logits_all);

// One decode step for B distinct states of the same model, token b fed to states[b]:
// bit-identical to forward_chunk(*states[b], &tokens[b], 1, ...) for each b alone, but every
// dense weight is read once for all B rows. logits_out: [B, V] (may be null).
void forward_batch(State* const* states, const int32_t* tokens, int B, float* logits_out);

// A speculative call (drafts under verification): lens[b] tokens fed to states[b] (the tokens of
// all states back to back), every row's logits into logits_out [sum lens, V]: the same bits as
// feeding them one by one. Each state keeps a journal of the call (state.h) until its next call,
// so rewind can take back any number of the tokens it fed.
void verify_batch(State* const* states, const int32_t* tokens, const int* lens, int B, float* logits_out);
// Drop the last k tokens of the state's journaled call (0 <= k <= the tokens of it still kept):
// afterwards its snapshot is byte for byte that of plain decoding of the tokens it keeps, and
// last_logits are theirs. Throws std::invalid_argument when there is no such call or k is too large.
void rewind(State& st, int64_t k);

// Fault injection for tests (_kernel._fail_worker_step): a StepWorker step that fails midway, as a
// real fault would (no kernel input fails inside a step once the step's checks passed). Armed with
// skip = k, the (k+1)-th worker step from then on throws std::runtime_error after the family's
// layers wrote the state and before n advanced: what they wrote stays, so the daemon must discard it.
struct StepFault {
  static std::atomic<int> skip;        // worker steps still to let pass; -1: disarmed
  static thread_local bool in_worker;  // set by the StepWorker job around its forward_chunk
  static void check();                 // in forward_chunk: fire when armed and due
};

}  // namespace cairn

// cairn kernel: forward-pass entry points (internal; the bindings call these).
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

// Rows r0..r0+S-1 of a multi-sequence call: S tokens of one state at positions pos0..
struct AttnSeg {
  State* st;       // its entries live in st->pages
  LayerState* ls;
  int64_t pos0;
  int r0, S;
};
// The attention block over several segments (each its own state), Stot = sum of their S.
void attention_rows(const Model& m, int layer, const AttnSeg* segs, int nseg, const float* x /*[Stot,D]*/,
                    int Stot, float* y /*[Stot,D]*/);
// Paged experts: read the layer's experts ahead of its call -- from the tokens (hash layers) or
// guessed by the layer's router on x [S, D], a hidden state before the layer's own input.
void prefetch_experts(const Model& m, int layer, const float* x, const int32_t* tokens, int S);
void moe_block(const Model& m, int layer, const float* x /*[S,D]*/, const int32_t* tokens, int S,
               float* y /*[S,D]*/);
// Feed S raw projection rows (kv, gate: [S, cs.cw]) at positions pos0..; emits finished
// compressed entries into st's pages. overlap=true => CSA two-series windows.
void compressor_feed(const Model& m, const CompressorW& w, State& st, CompState& cs, bool overlap,
                     const float* kv, const float* gate, int S, int64_t pos0);

}  // namespace cairn

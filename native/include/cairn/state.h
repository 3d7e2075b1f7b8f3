// cairn kernel: mutable per-sequence state (what HF's DynamicCache holds, digest §3).
//
// Design notes
//  * Position of the next token is n. Window rows live in a ring of W-1 rows where the row of
//    absolute position p sits in slot p % (W-1); no head index is needed, n determines it.
//  * Compressor partial buffers hold raw projections for positions (n - n%rate) .. n-1, slot
//    i = position % rate; gates are stored WITHOUT position bias (HF's buffer_gate convention).
//  * CSA overlap = Ca half of the last completed window, gate INCLUDING ape[:, :dim]; valid iff
//    n >= rate.
//  * Nothing is recomputed on restore: the snapshot carries exactly these tensors.
#pragma once
#include <cstdint>
#include <vector>

#include "cairn/model.h"

namespace cairn {

struct CompState {
  int rate = 0, dim = 0, cw = 0;   // cw = width of raw projection (2*dim for CSA, dim for HCA)
  std::vector<float> entries;      // [n/rate, dim] final (normed + RoPE'd) compressed rows
  std::vector<float> buf_kv, buf_gate;  // [rate, cw] raw projections (gate without ape)
  std::vector<float> ov_kv, ov_gate;    // [rate, dim] overlap (CSA only; gate includes ape)
  int64_t n_entries() const { return dim ? (int64_t)entries.size() / dim : 0; }
};

struct LayerState {
  std::vector<float> win;  // [W-1, Dh] ring, post kv_norm + RoPE
  CompState comp;          // CSA / HCA compressor (unused for sliding)
  CompState icomp;         // CSA indexer compressor (keys, dim = Di)
};

struct State {
  const Model* model = nullptr;
  int64_t n = 0;
  std::vector<int32_t> tokens;      // [n]
  std::vector<float> last_logits;   // [V] or empty
  std::vector<LayerState> layers;

  explicit State(const Model& m);
  int64_t payload_bytes() const;
};

// Snapshot blob: see state.cpp for the layout.
constexpr uint32_t SNAPSHOT_VERSION = 2;  // 2: word-wise blob checksum (1: byte-wise FNV-1a)
size_t snapshot_size(const State& s);
void snapshot_into(const State& s, uint8_t* out);  // out has snapshot_size(s) bytes
// Throws std::invalid_argument with a clear message on any malformed input.
State restore(const Model& m, const uint8_t* data, size_t size);

}  // namespace cairn

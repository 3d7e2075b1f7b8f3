// cairn kernel, DeepSeek-V4 family: its state tail and the decoder it gives the shared code
// (cairn/family.h). The layer code (attention, compressor, MoE, hyper-connections) is in this folder.
#pragma once
#include <memory>
#include <vector>

#include "cairn/family.h"
#include "cairn/forward.h"
#include "cairn/state.h"

namespace cairn {

// V4's tail: per layer the window ring and the compressors' buffers (cairn/state.h, LayerState).
struct Dsv4Tail final : StateTail {
  const Model* model;
  std::vector<LayerState> layers;
  Dsv4Tail(const Model& m, int64_t used);  // buffers sized for `used` tokens (< 0: full size)
  std::unique_ptr<StateTail> clone() const override { return std::make_unique<Dsv4Tail>(*this); }
  std::unique_ptr<StateTail> snapshot(int64_t n) const override;
  std::unique_ptr<StateTail> live(const Model& m, int64_t n) const override;
  int64_t floats(int64_t n) const override;
  void write(TailWriter& w, int64_t n) const override;
  void read(TailReader& r, int64_t n) override;
  int64_t held_floats() const override;
  int64_t shape_bytes(bool allocated) const override;
};

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

namespace dsv4 {
std::vector<float> run(const Model& m, const Seg* segs, int nseg, const int32_t* tokens, int S, int r0);
}

}  // namespace cairn

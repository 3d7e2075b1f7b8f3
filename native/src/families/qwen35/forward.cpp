// cairn kernel, Qwen3.5: the decoder over one call's rows and the head (FamilyOps::run).
//
// x = embed[t]; per layer: x += mixer(rms(x; 1+w_in)); x += mlp(rms(x; 1+w_post)); logits = head(rms(x; 1+w)).
// Rows of several states (a batched decode step) share the norms, the MLP and the head; each
// state's mixer runs on its own rows, its own tail and pages. Every step is row by row or per
// state, so a row's bits do not depend on the other rows of the call.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "model.h"

namespace cairn::qwen35 {

std::vector<float> run(const cairn::Model& M, const Seg* segs, int nseg, const int32_t* tokens, int S, int r0) {
  const Model& m = of(M);
  const Config& c = m.cfg;
  const int D = c.D;
  std::vector<float> x((size_t)S * D), h((size_t)S * D), y((size_t)S * D);  // [S, D] residual, block input, output
  for (int i = 0; i < S; ++i) std::memcpy(&x[(size_t)i * D], m.embed + (size_t)tokens[i] * D, sizeof(float) * D);
  auto norm_rows = [&](const float* w, int i0) {
    for (int i = i0; i < S; ++i) rmsnorm(&x[(size_t)i * D], w, &h[(size_t)i * D], D, c.rms_eps);
  };
  auto add = [&] {
    for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] + y[i];
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerW& L = m.layers[l];
    norm_rows(L.in_norm.data(), 0);
    for (int g = 0; g < nseg; ++g) {
      const Seg& sg = segs[g];
      const float* hs = &h[(size_t)sg.r0 * D];
      float* ys = &y[(size_t)sg.r0 * D];
      if (L.kind == Mixer::Linear) gdn_block(m, l, sg.st->tail_as<Tail>().layers[l], hs, sg.S, ys);
      else attention_block(m, l, sg.st->pages, sg.pos0, hs, sg.S, ys);
    }
    add();
    norm_rows(L.post_norm.data(), 0);
    mlp_block(m, l, h.data(), S, y.data());
    add();
  }
  norm_rows(m.norm.data(), r0);
  std::vector<float> logits((size_t)(S - r0) * c.vocab);  // [S - r0, V]
  linear(&h[(size_t)r0 * D], S - r0, m.head, logits.data(), m.threads);
  return logits;
}

}  // namespace cairn::qwen35

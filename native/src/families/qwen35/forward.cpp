// cairn kernel, Qwen3.5: the decoder over one call's rows and the head.
//
// x = embed[t]; per layer: x += mixer(rms(x; 1+w_in)); x += mlp(rms(x; 1+w_post)); logits = head(rms(x; 1+w)).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "model.h"

namespace cairn::qwen35 {

void forward(const Model& m, Cache& cache, const int32_t* tokens, int S, float* logits) {
  const Config& c = m.cfg;
  const int D = c.D;
  if (S <= 0) return;
  for (int i = 0; i < S; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab)
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  std::vector<float> x((size_t)S * D), h((size_t)S * D), y((size_t)S * D);  // [S, D] residual, block input, output
  for (int i = 0; i < S; ++i) std::memcpy(&x[(size_t)i * D], m.embed + (size_t)tokens[i] * D, sizeof(float) * D);
  auto norm_rows = [&](const float* w) {
    for (int i = 0; i < S; ++i) rmsnorm(&x[(size_t)i * D], w, &h[(size_t)i * D], D, c.rms_eps);
  };
  auto add = [&] {
    for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] + y[i];
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerW& L = m.layers[l];
    norm_rows(L.in_norm.data());
    if (L.kind == Mixer::Linear) gdn_block(m, l, cache.layers[l], h.data(), S, y.data());
    else attention_block(m, l, cache.layers[l], cache.n, h.data(), S, y.data());
    add();
    norm_rows(L.post_norm.data());
    mlp_block(m, l, h.data(), S, y.data());
    add();
  }
  cache.n += S;
  if (!logits) return;
  norm_rows(m.norm.data());
  linear(h.data(), S, m.head, logits, m.threads);
}

}  // namespace cairn::qwen35

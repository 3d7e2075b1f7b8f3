// cairn kernel: RoPE inverse frequencies (main and compressed, the latter with YaRN), as HF computes them.
#include <cmath>

#include "cairn/model.h"

namespace cairn {

void init_rope(Model& m) {
  const Config& c = m.cfg;
  const int dim = c.r, half = c.r / 2;
  m.inv_freq_main.resize(half);
  m.inv_freq_comp.resize(half);
  for (int i = 0; i < half; ++i) {
    float e = (float)(2 * i) / (float)dim;
    m.inv_freq_main[i] = 1.0f / (float)std::pow(c.rope_theta, (double)e);
  }
  const double base = c.compress_rope_theta;
  if (!c.compress_yarn) {
    for (int i = 0; i < half; ++i) {
      float e = (float)(2 * i) / (float)dim;
      m.inv_freq_comp[i] = 1.0f / (float)std::pow(base, (double)e);
    }
    return;
  }
  // HF _compute_yarn_parameters (truncate = True, attention_factor 1.0)
  auto corr_dim = [&](double rot) {
    return (dim * std::log(c.yarn_orig / (rot * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = std::floor(corr_dim(c.yarn_beta_fast)), high = std::ceil(corr_dim(c.yarn_beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, (double)(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    float e = (float)(2 * i) / (float)dim;
    float pos_freq = (float)std::pow(base, (double)e);
    float extra = 1.0f / pos_freq;
    float inter = 1.0f / ((float)c.yarn_factor * pos_freq);
    float ramp = (float)(((float)i - (float)low) / (float)(high - low));
    ramp = std::min(1.f, std::max(0.f, ramp));
    float ef = 1.f - ramp;
    m.inv_freq_comp[i] = inter * (1.f - ef) + extra * ef;
  }
}

}  // namespace cairn

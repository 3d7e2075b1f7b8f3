// cairn kernel, Qwen3.5: the Gated DeltaNet block (HF Qwen3_5MoeGatedDeltaNet, docs/design/families.md §2).
//
// Design notes
//  * Projections are batched over the S rows (the shared packed product); everything after them
//    is per token in sequence order: the causal conv reads the K-1 previous raw rows (the cache's
//    tail, then this call's rows), and the delta rule is the per-token recurrence, not HF's
//    chunked form -- so a token's bits depend only on the tokens before it, never on how the
//    sequence was split into calls.
//  * Every multiply-add that meets another rounding is an explicit fmadd (kernels.h), never left
//    to the compiler's contraction; exp is fexp: one rounding on every ISA with FMA.
//  * Heads: v head h reads k head h / (nv/nk) (HF's repeat_interleave, grouped order). With
//    out_tiled (a GGUF's quantized ssm_out) head h's output goes to llama.cpp's tiled slot
//    (h % rep) * nk + h / rep, where out's columns expect it.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model.h"

namespace cairn::qwen35 {

namespace {
// HF's F.softplus (threshold 20). log1p in double: glibc's float log1pf rounds differently on
// x86-64 and aarch64 (as V4's moe.cpp).
inline float softplus(float v) { return v > 20.f ? v : (float)std::log1p((double)std::exp(v)); }

// x [n] <- x / sqrt(sum x^2 + 1e-6) (HF's l2norm, the FLA convention)
inline void l2norm(float* x, int n) {
  const float inv = 1.f / std::sqrt(dot(x, x, n) + 1e-6f);
  for (int i = 0; i < n; ++i) x[i] = x[i] * inv;
}

// One token of one v head: S [dk, dv] decays by eg, takes the delta-rule update for (k, v, beta),
// and o [dv] = S^T q. kv and o accumulate over the dk rows in ascending order.
void delta_step(float* S, const float* q, const float* k, const float* v, float beta, float eg, int dk, int dv,
                float* o, float* tmp /*[dv]*/) {
  float* kv = tmp;
  std::fill(kv, kv + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* row = S + (size_t)i * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      const float s = row[j] * eg;
      row[j] = s;
      kv[j] = fmadd(s, ki, kv[j]);
    }
  }
  float* d = tmp;  // delta overwrites kv in place
  for (int j = 0; j < dv; ++j) d[j] = (v[j] - kv[j]) * beta;
  std::fill(o, o + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* row = S + (size_t)i * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      const float s = fmadd(ki, d[j], row[j]);
      row[j] = s;
      o[j] = fmadd(s, qi, o[j]);
    }
  }
}
}  // namespace

void gdn_block(const Model& m, int layer, LayerCache& lc, const float* x, int S, float* y) {
  const Config& c = m.cfg;
  const GdnW& g = m.layers[layer].gdn;
  const int cd = c.conv_dim(), vd = c.value_dim(), kd = c.key_dim(), K = c.K;
  const int nv = c.nv, nk = c.nk, dk = c.dk, dv = c.dv, rep = nv / nk;
  std::vector<float> mix((size_t)S * cd), z((size_t)S * vd), b((size_t)S * nv), a((size_t)S * nv);  // projections
  linear(x, S, g.qkv, mix.data(), m.threads);
  linear(x, S, g.z, z.data(), m.threads);
  linear(x, S, g.b, b.data(), m.threads);
  linear(x, S, g.a, a.data(), m.threads);

  // causal depthwise conv + SiLU: u[t] = silu(sum_j w[j] * row[t-K+1+j]); rows before the call from the
  // cache's tail [K-1, cd] (oldest first)
  std::vector<float> u((size_t)S * cd);  // [S, cd]: q | k | v channels
  auto raw = [&](int t) -> const float* {  // raw row t of the call (t < 0: the tail)
    return t >= 0 ? &mix[(size_t)t * cd] : &lc.conv[(size_t)(K - 1 + t) * cd];
  };
#pragma omp parallel for num_threads(m.threads) schedule(static) if ((int64_t)S * cd * K > kParMinWork)
  for (int t = 0; t < S; ++t) {
    float* ut = &u[(size_t)t * cd];
    const float* r0 = raw(t - K + 1);
    const float* w0 = &g.conv[0];
    for (int ch = 0; ch < cd; ++ch) ut[ch] = w0[ch] * r0[ch];
    for (int j = 1; j < K; ++j) {
      const float* rj = raw(t - K + 1 + j);
      const float* wj = &g.conv[(size_t)j * cd];
      for (int ch = 0; ch < cd; ++ch) ut[ch] = fmadd(wj[ch], rj[ch], ut[ch]);
    }
    for (int ch = 0; ch < cd; ++ch) ut[ch] = silu(ut[ch]);
  }
  // the tail keeps the last K-1 raw rows
  if (K > 1) {
    std::vector<float> tail((size_t)(K - 1) * cd);
    for (int i = 0; i < K - 1; ++i) std::memcpy(&tail[(size_t)i * cd], raw(S - (K - 1) + i), sizeof(float) * cd);
    lc.conv.swap(tail);
  }

  // per token: q, k l2-normalised (q also / sqrt(dk), as HF divides), beta = sigmoid(b),
  // decay exp(g) with g = -exp(A_log) * softplus(a + dt_bias)
  const float qdiv = (float)std::sqrt((double)dk);
  std::vector<float> beta((size_t)S * nv), eg((size_t)S * nv);
  for (int t = 0; t < S; ++t) {
    float* ut = &u[(size_t)t * cd];
    for (int h = 0; h < nk; ++h) {
      float* q = ut + (size_t)h * dk;
      l2norm(q, dk);
      for (int i = 0; i < dk; ++i) q[i] = q[i] / qdiv;
      l2norm(ut + kd + (size_t)h * dk, dk);
    }
    for (int h = 0; h < nv; ++h) {
      const size_t i = (size_t)t * nv + h;
      beta[i] = sigmoid(b[i]);
      eg[i] = fexp(g.neg_A[h] * softplus(a[i] + g.dt_bias[h]));
    }
  }

  // the recurrence, heads in parallel, tokens in order; then the gated norm per head:
  // o <- norm_w * (o * rsqrt(mean(o^2) + eps)) * silu(z)
  std::vector<float> o((size_t)S * vd);  // [S, nv, dv] (heads in out's column order)
#pragma omp parallel num_threads(m.threads) if ((int64_t)S * nv * dk * dv * 4 > kParMinWork)
  {
    std::vector<float> tmp(dv);
#pragma omp for schedule(static)
    for (int h = 0; h < nv; ++h) {
      float* St = &lc.rec[(size_t)h * dk * dv];
      const int kh = h / rep, slot = g.out_tiled ? (h % rep) * nk + kh : h;
      for (int t = 0; t < S; ++t) {
        const float* ut = &u[(size_t)t * cd];
        float* ot = &o[(size_t)t * vd + (size_t)slot * dv];
        delta_step(St, ut + (size_t)kh * dk, ut + kd + (size_t)kh * dk, ut + 2 * kd + (size_t)h * dv,
                   beta[(size_t)t * nv + h], eg[(size_t)t * nv + h], dk, dv, ot, tmp.data());
        rmsnorm(ot, g.norm.data(), ot, dv, c.rms_eps);
        const float* zt = &z[(size_t)t * vd + (size_t)h * dv];
        for (int j = 0; j < dv; ++j) ot[j] = ot[j] * silu(zt[j]);
      }
    }
  }
  linear(o.data(), S, g.out, y, m.threads);
}

}  // namespace cairn::qwen35

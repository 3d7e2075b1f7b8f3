// cairn kernel: decoder forward over one chunk, hyper-connections, head, chunked prefill.
//
// Design notes
//  * Residual stream h [S, N, D]: N hyper-connection copies per token, all starting at embed[t].
//  * HC (per sub-block): x = rms(flatten h) unweighted; mix = fn x; pre = sigmoid(.)+eps,
//    post = 2 sigmoid(.), comb = softmax_row(.)+eps then Sinkhorn (column first, then
//    iters-1 x (row, column)); block input = sum_n pre_n h_n; new h_k = post_k y + sum_j comb[j,k] h_j.
//  * State is only mutated layer by layer inside forward_chunk; the abort flag is checked
//    between chunks, so a State always reflects a whole number of completed chunks.
#include <cmath>
#include <cstring>

#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"

namespace cairn {

double g_prof[P_N] = {};
const char* const g_prof_names[P_N] = {"hc", "qkv", "compress", "indexer", "attn", "out",
                                      "router", "experts", "shared", "head"};

static inline float sigmoidf(float v) { return 1.f / (1.f + std::exp(-v)); }

// HC pre-mix: returns collapsed [S, D], post [S, N], comb [S, N, N].
// The mix is a small-M GEMM on the dot-form tiles (decode included, so a token's numbers do not
// depend on how many tokens share its chunk); the per-token Sinkhorn and collapse follow.
static void hc_pre(const Model& m, const float* fn, const float* base, const float* scale,
                   const float* h, int S, float* collapsed, float* post, float* comb) {
  ProfScope ps(P_HC);
  const Config& c = m.cfg;
  const int N = c.N, D = c.D, ND = N * D, NM = (2 + N) * N;
  std::vector<float> xn((size_t)S * ND), mix((size_t)S * NM);  // [S, N*D], [S, (2+N)N]
  // mix = fn xn: register tiles of (4 tokens x kTileN rows of fn), same reduction for any S
  // (so a token's mix does not depend on its chunk); tasks = (token tile, fn row group).
  const int ntile = (S + kTileM - 1) / kTileM, ngrp = (NM + kTileN - 1) / kTileN;
  std::vector<const float*> xs(S);
  for (int i = 0; i < S; ++i) xs[i] = &xn[(size_t)i * ND];
#pragma omp parallel num_threads(m.threads) if ((int64_t)S * ND * NM >= kParMinWork / 2)
  {
#pragma omp for schedule(static)
    for (int i = 0; i < S; ++i) rmsnorm(h + (size_t)i * ND, nullptr, &xn[(size_t)i * ND], ND, c.rms_eps);
#pragma omp for schedule(static)
    for (int t = 0; t < ntile * ngrp; ++t) {
      const int a = (t / ngrp) * kTileM, o = (t % ngrp) * kTileN;
      const int mr = std::min(kTileM, S - a), nr = std::min(kTileN, NM - o);
      const float* w[kTileN];
      for (int q = 0; q < nr; ++q) w[q] = fn + (size_t)(o + q) * ND;
      float r[kTileM * kTileN];
      dot_tile_any(mr, nr, &xs[a], w, ND, r);
      for (int i = 0; i < mr; ++i)
        for (int q = 0; q < nr; ++q) mix[(size_t)(a + i) * NM + o + q] = r[i * nr + q];
    }
  }
#pragma omp parallel for num_threads(m.threads) schedule(static) if (S > 1 && (int64_t)S * NM * N * 64 > kParMinWork)
  for (int i = 0; i < S; ++i) {
    float* mx = &mix[(size_t)i * NM];
    float pre[64];
    float* po = post + (size_t)i * N;
    float* cb = comb + (size_t)i * N * N;
    for (int n = 0; n < N; ++n) pre[n] = sigmoidf(mx[n] * scale[0] + base[n]) + c.hc_eps;
    for (int n = 0; n < N; ++n) po[n] = 2.f * sigmoidf(mx[N + n] * scale[1] + base[N + n]);
    for (int a = 0; a < N; ++a) {
      float* row = cb + a * N;
      float mxv = -INFINITY;
      for (int b = 0; b < N; ++b) {
        row[b] = mx[2 * N + a * N + b] * scale[2] + base[2 * N + a * N + b];
        mxv = std::max(mxv, row[b]);
      }
      float s = 0.f;
      for (int b = 0; b < N; ++b) { row[b] = std::exp(row[b] - mxv); s += row[b]; }
      for (int b = 0; b < N; ++b) row[b] = row[b] / s + c.hc_eps;
    }
    auto colnorm = [&]() {
      for (int b = 0; b < N; ++b) {
        float s = 0.f;
        for (int a = 0; a < N; ++a) s += cb[a * N + b];
        for (int a = 0; a < N; ++a) cb[a * N + b] /= (s + c.hc_eps);
      }
    };
    colnorm();
    for (int it = 0; it < c.sinkhorn_iters - 1; ++it) {
      for (int a = 0; a < N; ++a) {
        float s = 0.f;
        for (int b = 0; b < N; ++b) s += cb[a * N + b];
        for (int b = 0; b < N; ++b) cb[a * N + b] /= (s + c.hc_eps);
      }
      colnorm();
    }
    float* out = collapsed + (size_t)i * D;
    const float* hi = h + (size_t)i * ND;
    std::memset(out, 0, sizeof(float) * D);
    for (int n = 0; n < N; ++n) axpy(pre[n], hi + (size_t)n * D, out, D);
  }
}

// h[k] = post[k] * y + sum_j comb[j,k] h[j]
static void hc_post(const Model& m, float* h, const float* y, const float* post, const float* comb, int S) {
  ProfScope ps(P_HC);
  const int N = m.cfg.N, D = m.cfg.D;
#pragma omp parallel num_threads(m.threads) if (S > 1 && (int64_t)S * N * N * D > kParMinWork)
  {
    std::vector<float> tmp((size_t)N * D), acc(D);
#pragma omp for schedule(static)
    for (int i = 0; i < S; ++i) {
      float* hi = h + (size_t)i * N * D;
      const float* yi = y + (size_t)i * D;
      const float* cb = comb + (size_t)i * N * N;
      for (int k = 0; k < N; ++k) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = 0; j < N; ++j) axpy(cb[j * N + k], hi + (size_t)j * D, acc.data(), D);
        float* t = &tmp[(size_t)k * D];
        const float pk = post[(size_t)i * N + k];
        for (int d = 0; d < D; ++d) t[d] = pk * yi[d] + acc[d];
      }
      std::memcpy(hi, tmp.data(), sizeof(float) * N * D);
    }
  }
}

void forward_chunk(State& st, const int32_t* tokens, int S, float* logits_out, bool all_logits) {
  const Model& m = *st.model;
  const Config& c = m.cfg;
  const int N = c.N, D = c.D, ND = N * D, V = c.vocab;
  const int64_t pos0 = st.n;
  std::vector<float> h((size_t)S * ND);  // [S, N, D] residual streams
  for (int i = 0; i < S; ++i)
    for (int n = 0; n < N; ++n)
      std::memcpy(&h[(size_t)i * ND + (size_t)n * D], m.embed + (size_t)tokens[i] * D, sizeof(float) * D);
  std::vector<float> col((size_t)S * D), x((size_t)S * D), y((size_t)S * D);  // [S, D]
  std::vector<float> post((size_t)S * N), comb((size_t)S * N * N);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerW& L = m.layers[l];
    hc_pre(m, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, h.data(), S, col.data(), post.data(), comb.data());
    for (int i = 0; i < S; ++i) rmsnorm(&col[(size_t)i * D], L.attn_norm, &x[(size_t)i * D], D, c.rms_eps);
    attention_block(m, l, st.layers[l], x.data(), S, pos0, y.data());
    hc_post(m, h.data(), y.data(), post.data(), comb.data(), S);
    hc_pre(m, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, h.data(), S, col.data(), post.data(), comb.data());
    for (int i = 0; i < S; ++i) rmsnorm(&col[(size_t)i * D], L.ffn_norm, &x[(size_t)i * D], D, c.rms_eps);
    moe_block(m, l, x.data(), tokens, S, y.data());
    hc_post(m, h.data(), y.data(), post.data(), comb.data(), S);
  }
  // hyper-head: only the rows whose logits are needed
  ProfScope ps(P_HEAD);
  const int r0 = all_logits ? 0 : S - 1, nr = S - r0;
  std::vector<float> xn((size_t)nr * ND), mix((size_t)nr * N), out((size_t)nr * D);
  for (int i = 0; i < nr; ++i) rmsnorm(&h[(size_t)(r0 + i) * ND], nullptr, &xn[(size_t)i * ND], ND, c.rms_eps);
  matmul(xn.data(), nr, ND, ND, m.hc_head_fn, N, mix.data(), N, m.threads);
  for (int i = 0; i < nr; ++i) {
    float pre[64];
    for (int n = 0; n < N; ++n) pre[n] = sigmoidf(mix[(size_t)i * N + n] * m.hc_head_scale[0] + m.hc_head_base[n]) + c.hc_eps;
    const float* hi = &h[(size_t)(r0 + i) * ND];
    float* o = &out[(size_t)i * D];
    for (int d = 0; d < D; ++d) {
      float acc = 0.f;
      for (int n = 0; n < N; ++n) acc += pre[n] * hi[(size_t)n * D + d];
      o[d] = acc;
    }
    rmsnorm(o, m.norm, o, D, c.rms_eps);
  }
  std::vector<float> logits((size_t)nr * V);  // [nr, V]
  matmul(out.data(), nr, D, D, m.head, V, logits.data(), V, m.threads);
  st.n += S;
  st.tokens.insert(st.tokens.end(), tokens, tokens + S);
  st.last_logits.assign(logits.end() - V, logits.end());
  if (logits_out) std::memcpy(logits_out, logits.data(), sizeof(float) * logits.size());
}

int64_t prefill(State& st, const int32_t* tokens, int64_t n, int chunk, const std::atomic<bool>* abort,
                float* logits_all) {
  const int V = st.model->cfg.vocab;
  int64_t done = 0;
  while (done < n) {
    if (abort && abort->load(std::memory_order_relaxed)) break;
    const int S = (int)std::min<int64_t>(chunk, n - done);
    forward_chunk(st, tokens + done, S, logits_all ? logits_all + (size_t)done * V : nullptr, logits_all != nullptr);
    done += S;
  }
  return done;
}

}  // namespace cairn

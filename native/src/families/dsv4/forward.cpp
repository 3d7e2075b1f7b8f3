// cairn kernel, DeepSeek-V4: the decoder over a call's rows (hyper-connections, layers, hyper-head).
//
// Design notes
//  * Residual stream h [S, N, D]: N hyper-connection copies per token, all starting at embed[t].
//  * HC (per sub-block): x = rms(flatten h) unweighted; mix = fn x; pre = sigmoid(.)+eps,
//    post = 2 sigmoid(.), comb = softmax_row(.)+eps then Sinkhorn (column first, then
//    iters-1 x (row, column)); block input = sum_n pre_n h_n; new h_k = post_k y + sum_j comb[j,k] h_j.
//    Closing one sub-block and opening the next is one fused pass (hc_step).
//  * The shared entry points (forward.cpp: forward_chunk, forward_batch, verify_batch, prefill) call
//    dsv4::run through the family table; it leaves n, tokens and logits to them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cairn/forward.h"
#include "dsv4.h"
#include "../../codecs/codec.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"

namespace cairn {

static inline float sigmoidf(float v) { return 1.f / (1.f + std::exp(-v)); }

// The sub-block an HC step opens: its mixing weights and the RMSNorm weight of its input.
struct HcOpen {
  const Linear* fn;  // [(2+N)N, N*D] packed
  const float *base, *scale, *norm_w;
};

// One HC step over the chunk, in blocks of kTB tokens so a block's residual rows (kTB x N*D
// floats) stay in cache across all of it (the whole [S, N, D] residual does not):
//  1. y != null: close the previous sub-block: h_k = post_k y + sum_j comb[j,k] h_j;
//  2. open != null: open the next one: mix = fn rms(flatten h); pre = sigmoid(.)+eps,
//     post = 2 sigmoid(.), comb = softmax_row(.)+eps then Sinkhorn (column first, then
//     iters-1 x (row, column)); x = norm_w * rms(sum_n pre_n h_n).
// Sinkhorn runs with the block's tokens side by side (each lane does one token's scalar
// sequence), and every other step is per token, so a token's numbers do not depend on its
// block or chunk.
static constexpr int kTB = 16;

static void hc_step(const Model& m, float* h, int S, const float* y, float* post, float* comb, const HcOpen* open,
                    float* x) {
  ProfScope ps(P_HC);
  const Config& c = m.cfg;
  const int N = c.N, D = c.D, ND = N * D, NM = (2 + N) * N, NN = N * N;
  const int nblk = (S + kTB - 1) / kTB;
#pragma omp parallel num_threads(m.threads) if (nblk > 1)
  {
    std::vector<float> tmp((size_t)ND), xn((size_t)kTB * ND), mix((size_t)kTB * NM), cbt((size_t)NN * kTB);
    std::vector<const float*> xr(kTB);
#pragma omp for schedule(static)
    for (int b = 0; b < nblk; ++b) {
      const int i0 = b * kTB, nb = std::min(kTB, S - i0);
      if (y)
        for (int i = i0; i < i0 + nb; ++i) {
          float* hi = h + (size_t)i * ND;
          const float* yi = y + (size_t)i * D;
          const float* cb = comb + (size_t)i * NN;
          for (int k = 0; k < N; ++k) {
            float* t = &tmp[(size_t)k * D];
            std::fill(t, t + D, 0.f);
            for (int j = 0; j < N; ++j) axpy(cb[j * N + k], hi + (size_t)j * D, t, D);
            const float pk = post[(size_t)i * N + k];
            for (int d = 0; d < D; ++d) t[d] = pk * yi[d] + t[d];
          }
          std::memcpy(hi, tmp.data(), sizeof(float) * ND);
        }
      if (!open) continue;
      for (int a = 0; a < nb; ++a) {
        rmsnorm(h + (size_t)(i0 + a) * ND, nullptr, &xn[(size_t)a * ND], ND, c.rms_eps);
        xr[a] = &xn[(size_t)a * ND];
      }
      linear_rows(xr.data(), nb, *open->fn, mix.data(), NM);
      const float *base = open->base, *scale = open->scale;
      float pre[kTB][8];
      for (int a = 0; a < nb; ++a) {
        const float* mx = &mix[(size_t)a * NM];
        float* po = post + (size_t)(i0 + a) * N;
        for (int n = 0; n < N; ++n) pre[a][n] = sigmoidf(mx[n] * scale[0] + base[n]) + c.hc_eps;
        for (int n = 0; n < N; ++n) po[n] = 2.f * sigmoidf(mx[N + n] * scale[1] + base[N + n]);
        for (int r = 0; r < N; ++r) {
          float row[8], mxv = -INFINITY;
          for (int q = 0; q < N; ++q) {
            row[q] = mx[2 * N + r * N + q] * scale[2] + base[2 * N + r * N + q];
            mxv = std::max(mxv, row[q]);
          }
          float s = 0.f;
          for (int q = 0; q < N; ++q) { row[q] = std::exp(row[q] - mxv); s += row[q]; }
          for (int q = 0; q < N; ++q) cbt[(size_t)(r * N + q) * kTB + a] = row[q] / s + c.hc_eps;
        }
      }
      // Sinkhorn, lanes = tokens: cbt[(r*N + q)][a]. normalize(so, si) divides each line u
      // (entries u*so + v*si, v ascending) by its sum + eps: rows (N, 1), columns (1, N).
      auto normalize = [&](int so, int si) {
        for (int u = 0; u < N; ++u) {
          float sum[kTB] = {};
          for (int v = 0; v < N; ++v)
            for (int a = 0; a < kTB; ++a) sum[a] += cbt[(size_t)(u * so + v * si) * kTB + a];
          for (int v = 0; v < N; ++v)
            for (int a = 0; a < kTB; ++a) cbt[(size_t)(u * so + v * si) * kTB + a] /= (sum[a] + c.hc_eps);
        }
      };
      normalize(1, N);
      for (int it = 0; it < c.sinkhorn_iters - 1; ++it) {
        normalize(N, 1);
        normalize(1, N);
      }
      for (int a = 0; a < nb; ++a) {
        const int i = i0 + a;
        float* cb = comb + (size_t)i * NN;
        for (int e = 0; e < NN; ++e) cb[e] = cbt[(size_t)e * kTB + a];
        float* xi = x + (size_t)i * D;
        const float* hi = h + (size_t)i * ND;
        std::fill(xi, xi + D, 0.f);
        for (int n = 0; n < N; ++n) axpy(pre[a][n], hi + (size_t)n * D, xi, D);
        rmsnorm(xi, open->norm_w, xi, D, c.rms_eps);
      }
    }
  }
}

// The decoder over S rows split into segments (each its own state and positions): embed, every
// layer, and the residual streams left in h [S, N, D]. Only attention looks at a segment's state.
static void run_layers(const Model& m, const AttnSeg* segs, int nseg, const int32_t* tokens, int S,
                       std::vector<float>& h) {
  const Config& c = m.cfg;
  const int N = c.N, D = c.D, ND = N * D;
  h.assign((size_t)S * ND, 0.f);  // [S, N, D] residual streams
  for (int i = 0; i < S; ++i) {
    float* h0 = &h[(size_t)i * ND];
    if (m.embed16) {  // BF16 table used from the mapping: a row is widened when it is looked up
      const uint16_t* e = m.embed16 + (size_t)tokens[i] * D;
      for (int d = 0; d < D; ++d) {
        const uint32_t b = (uint32_t)e[d] << 16;
        std::memcpy(&h0[d], &b, 4);
      }
    } else if (m.embedq) {  // GGUF blocks used from the mapping: a row is decoded when it is looked up
      const BlockCodec& c = *m.embed_codec;
      c.decode_blocks(m.embedq + (size_t)tokens[i] * (D / c.block) * c.bytes, D / c.block, h0);
    } else {
      std::memcpy(h0, m.embed + (size_t)tokens[i] * D, sizeof(float) * D);
    }
    for (int n = 1; n < N; ++n) std::memcpy(h0 + (size_t)n * D, h0, sizeof(float) * D);
  }
  std::vector<float> x((size_t)S * D), y((size_t)S * D);  // [S, D]
  std::vector<float> post((size_t)S * N), comb((size_t)S * N * N);
  auto attn_open = [&](int l) {
    const LayerW& L = m.layers[l];
    return HcOpen{&L.hc_attn, L.hc_attn_base, L.hc_attn_scale, L.attn_norm};
  };
  // a hash layer routes by token id: its experts are known before the step
  if (m.pager && c.hash_moe[0]) prefetch_experts(m, 0, nullptr, tokens, S);
  HcOpen open = attn_open(0);
  hc_step(m, h.data(), S, nullptr, post.data(), comb.data(), &open, x.data());
  std::vector<AttnSeg> ls(segs, segs + nseg);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerW& L = m.layers[l];
    for (int g = 0; g < nseg; ++g) ls[g].ls = &segs[g].ls[l];  // segs[g].ls points at layer 0
    attention_rows(m, l, ls.data(), nseg, x.data(), S, y.data());
    open = HcOpen{&L.hc_ffn, L.hc_ffn_base, L.hc_ffn_scale, L.ffn_norm};
    hc_step(m, h.data(), S, y.data(), post.data(), comb.data(), &open, x.data());
    moe_block(m, l, x.data(), tokens, S, y.data());
    if (l + 1 < c.n_layers) open = attn_open(l + 1);
    hc_step(m, h.data(), S, y.data(), post.data(), comb.data(), l + 1 < c.n_layers ? &open : nullptr, x.data());
    // the next layer's experts, read while its attention runs: a hash layer's from the token ids,
    // others guessed by its router on its attention input (router lookahead; only the reads are
    // speculative). Reservations are only ever the next call's.
    if (m.pager && l + 1 < c.n_layers) prefetch_experts(m, l + 1, x.data(), tokens, S);
  }
}

// hyper-head over residual rows r0..r0+nr-1 of h: logits [nr, V]
static std::vector<float> head_rows(const Model& m, const std::vector<float>& h, int r0, int nr) {
  ProfScope ps(P_HEAD);
  const Config& c = m.cfg;
  const int N = c.N, D = c.D, ND = N * D, V = c.vocab;
  std::vector<float> xn((size_t)nr * ND), mix((size_t)nr * N), out((size_t)nr * D);
  for (int i = 0; i < nr; ++i) rmsnorm(&h[(size_t)(r0 + i) * ND], nullptr, &xn[(size_t)i * ND], ND, c.rms_eps);
  linear(xn.data(), nr, m.hc_head, mix.data(), m.threads);
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
  linear(out.data(), nr, m.head, logits.data(), m.threads);
  return logits;
}

std::vector<float> dsv4::run(const Model& m, const Seg* segs, int nseg, const int32_t* tokens, int S, int r0) {
  std::vector<AttnSeg> as((size_t)nseg);
  for (int g = 0; g < nseg; ++g)
    as[g] = AttnSeg{segs[g].st, segs[g].st->tail_as<Dsv4Tail>().layers.data(), segs[g].pos0, segs[g].r0, segs[g].S};
  std::vector<float> h;
  run_layers(m, as.data(), nseg, tokens, S, h);
  return head_rows(m, h, r0, S - r0);
}

}  // namespace cairn

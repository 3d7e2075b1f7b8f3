// Built by test_isa_paths.py, with the kernel's sources, for each x86-64 level and for aarch64 (run
// under qemu): the whole forward pass of a small random-weight model (every attention and router
// kind of the tiny preset), prefilled with 300 tokens in chunks of 64. It prints a digest of every
// logit, so builds for different CPUs can be compared bit for bit.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/state.h"
using namespace cairn;

namespace {
// splitmix64: the same numbers on every target (std's distributions are not specified bit for bit)
uint64_t seed = 7;
float uniform() {  // [-1, 1)
  uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (float)((z ^ (z >> 31)) >> 40) * 0x1p-23f - 1.f;
}
std::deque<std::vector<float>> store;  // the weights; a deque keeps them in place
const float* vec(size_t n, float mean, float spread) {
  store.emplace_back(n);
  for (float& v : store.back()) v = mean + spread * uniform();
  return store.back().data();
}
Linear lin(int out, int in) { return Linear{vec((size_t)out * in, 0.f, 1.7f / std::sqrt((float)in)), nullptr, out, in}; }
CompressorW comp(int D, int dim, int rate, bool two) {
  const int cw = two ? 2 * dim : dim;
  return CompressorW{lin(cw, D), lin(cw, D), vec((size_t)rate * cw, 0.f, .8f), vec(dim, 1.f, .2f)};
}
}  // namespace

int main() {
  Model m;
  Config& c = m.cfg;  // the tiny preset (daemon/modelgen/make_model.py)
  c.vocab = 512, c.D = 64, c.H = 4, c.Dh = 32, c.r = 8, c.Rq = 32, c.G = 2, c.Ro = 16, c.W = 16;
  c.layer_types = {AttnType::Sliding, AttnType::CSA, AttnType::HCA, AttnType::CSA, AttnType::HCA};
  c.hash_moe = {true, true, false, false, false};
  c.n_layers = 5, c.csa_rate = 4, c.hca_rate = 16, c.nI = 16, c.Di = 16, c.topk = 8;
  c.E = 4, c.k = 2, c.I = 32, c.n_shared = 1;
  m.fingerprint = "forward_harness";
  m.threads = 2;
  m.page_layout = make_page_layout(c, 0);
  const int D = c.D, N = c.N, NM = (2 + N) * N, V = c.vocab;
  m.embed = vec((size_t)V * D, 0.f, 1.7f);
  m.head = lin(V, D);
  m.norm = vec(D, 1.f, .2f);
  m.hc_head = Linear{vec((size_t)N * N * D, 0.f, 1.7f / std::sqrt((float)(N * D))), nullptr, N, N * D};
  m.hc_head_base = vec(N, 0.f, .8f);
  m.hc_head_scale = vec(1, 1.f, .3f);
  m.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerW& L = m.layers[l];
    L.attn_norm = vec(D, 1.f, .2f);
    L.ffn_norm = vec(D, 1.f, .2f);
    for (auto [fn, base, scale] : {std::tuple{&L.hc_attn, &L.hc_attn_base, &L.hc_attn_scale},
                                   std::tuple{&L.hc_ffn, &L.hc_ffn_base, &L.hc_ffn_scale}}) {
      *fn = Linear{vec((size_t)NM * N * D, 0.f, 1.7f / std::sqrt((float)(N * D))), nullptr, NM, N * D};
      *base = vec(NM, 0.f, .8f);
      *scale = vec(3, 1.f, .3f);
    }
    L.wq_a = lin(c.Rq, D);
    L.q_norm = vec(c.Rq, 1.f, .2f);
    L.wq_b = lin(c.H * c.Dh, c.Rq);
    L.wkv = lin(c.Dh, D);
    L.kv_norm = vec(c.Dh, 1.f, .2f);
    L.wo_a = lin(c.G * c.Ro, c.H * c.Dh / c.G);
    L.wo_b = lin(D, c.G * c.Ro);
    L.sink = vec(c.H, 0.f, 1.7f);
    if (c.layer_types[l] == AttnType::HCA) L.comp = comp(D, c.Dh, c.hca_rate, false);
    if (c.layer_types[l] == AttnType::CSA) {
      L.comp = comp(D, c.Dh, c.csa_rate, true);
      L.icomp = comp(D, c.Di, c.csa_rate, true);
      L.iwq_b = lin(c.nI * c.Di, c.Rq);
      L.iweights = lin(c.nI, D);
    }
    L.gate = lin(c.E, D);
    if (c.hash_moe[l])
      for (int t = 0; t < V; ++t) {
        const int e0 = (t * 7 + l) % c.E;  // k distinct experts per token
        for (int j = 0; j < c.k; ++j) L.tid2eid.push_back((e0 + j) % c.E);
      }
    else
      L.gate_bias = vec(c.E, 0.f, .2f);
    for (int e = 0; e < c.E; ++e) {
      L.w1.push_back(lin(c.I, D));
      L.w2.push_back(lin(D, c.I));
      L.w3.push_back(lin(c.I, D));
    }
    L.sw1 = lin(c.I, D);
    L.sw2 = lin(D, c.I);
    L.sw3 = lin(c.I, D);
  }
  pack_weights(m, 1);
  init_rope(m);

  const int64_t n = 300;
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = (int32_t)((uniform() + 1.f) * 0.5f * V) % V;
  std::vector<float> logits((size_t)n * V);
  State st(m);
  if (prefill(st, ids.data(), n, 64, nullptr, logits.data()) != n) return 2;
  uint64_t digest = 1469598103934665603ull;
  bool finite = true;
  for (float v : logits) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    digest = (digest ^ b) * 1099511628211ull;
    finite = finite && std::isfinite(v);
  }
  std::printf("logit[0][0..3] %.9g %.9g %.9g\n", logits[0], logits[1], logits[2]);
  std::printf("digest %016llx\n%s\n", (unsigned long long)digest, finite ? "finite" : "NOT FINITE");
  return finite ? 0 : 1;
}

// Built by test_isa_paths.py, with the kernel's sources, for each x86-64 level and for aarch64 (run
// under qemu): the whole forward pass of two small random-weight models, each prefilled with 300
// tokens in chunks of 64 -- DeepSeek-V4 (every attention and router kind of the tiny preset) and
// Qwen3.5 (Gated DeltaNet and gated attention layers, MoE, a Q8_0 ssm_out in llama.cpp's tiled
// order). It prints a digest of every logit of each ("digest", "qwen35"), so builds for different
// CPUs can be compared bit for bit.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/state.h"
#include "../../native/src/codecs/codec.h"
#include "../../native/src/families/qwen35/model.h"
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

// FNV-1a over the logits' bits; false when one is not finite
bool digest_of(const std::vector<float>& logits, uint64_t& digest) {
  digest = 1469598103934665603ull;
  bool finite = true;
  for (float v : logits) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    digest = (digest ^ b) * 1099511628211ull;
    finite = finite && std::isfinite(v);
  }
  return finite;
}

// The Qwen3.5 model (the qwen35moe-tiny preset's shape, four layers) through the family's own load.
bool qwen35_logits(int64_t n, const std::vector<int32_t>& ids, std::vector<float>& logits) {
  namespace q = cairn::qwen35;
  q::Config c;
  c.vocab = 512, c.D = 64, c.n_layers = 4;
  c.layer_types = {q::Mixer::Linear, q::Mixer::Linear, q::Mixer::Full, q::Mixer::Linear};
  c.H = 4, c.Hkv = 2, c.Dh = 32, c.r = 8;
  c.K = 4, c.dk = 16, c.dv = 16, c.nk = 2, c.nv = 4;
  c.E = 4, c.k = 2, c.I = 32, c.Is = 32;
  const int D = c.D;
  q::WeightMap w;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, float mean, float spread) {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    w[name] = q::TensorView{vec(n, mean, spread), shape};
  };
  auto mat = [&](const std::string& name, int out, int in) { put(name, {out, in}, 0.f, 1.7f / std::sqrt((float)in)); };
  mat("embed_tokens.weight", c.vocab, D);
  mat("lm_head.weight", c.vocab, D);
  put("norm.weight", {D}, 0.f, .2f);  // zero-centred: the kernel folds 1 + w
  std::deque<std::vector<uint8_t>> blocks;
  const BlockCodec* q8 = find_codec("Q8_0");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    put(p + "input_layernorm.weight", {D}, 0.f, .2f);
    put(p + "post_attention_layernorm.weight", {D}, 0.f, .2f);
    if (c.layer_types[l] == q::Mixer::Linear) {
      const std::string a = p + "linear_attn.";
      mat(a + "in_proj_qkv.weight", c.conv_dim(), D);
      mat(a + "in_proj_z.weight", c.value_dim(), D);
      mat(a + "in_proj_b.weight", c.nv, D);
      mat(a + "in_proj_a.weight", c.nv, D);
      put(a + "conv1d.weight", {c.conv_dim(), 1, c.K}, 0.f, .5f);
      put(a + "dt_bias", {c.nv}, 0.f, .5f);
      put(a + "A_log", {c.nv}, 1.f, 1.f);
      put(a + "norm.weight", {c.dv}, 1.f, .2f);
      if (l == 0) {  // Q8_0 blocks (a half scale, 32 codes) in the tiled column order
        const int nb = c.value_dim() / q8->block;
        blocks.emplace_back((size_t)D * nb * q8->bytes);
        for (size_t i = 0; i < blocks.back().size(); i += q8->bytes) {
          blocks.back()[i] = 0x00, blocks.back()[i + 1] = 0x20;  // 2^-7
          for (int j = 2; j < q8->bytes; ++j) blocks.back()[i + j] = (uint8_t)(int8_t)(uniform() * 127.f);
        }
        w[a + "out_proj.weight:tiled"] = q::TensorView{nullptr, {D, c.value_dim()}, blocks.back().data(), q8};
      } else {
        mat(a + "out_proj.weight", D, c.value_dim());
      }
    } else {
      const std::string a = p + "self_attn.";
      mat(a + "q_proj.weight", 2 * c.H * c.Dh, D);
      mat(a + "k_proj.weight", c.Hkv * c.Dh, D);
      mat(a + "v_proj.weight", c.Hkv * c.Dh, D);
      mat(a + "o_proj.weight", D, c.H * c.Dh);
      put(a + "q_norm.weight", {c.Dh}, 0.f, .2f);
      put(a + "k_norm.weight", {c.Dh}, 0.f, .2f);
    }
    const std::string f = p + "mlp.";
    mat(f + "gate.weight", c.E, D);
    for (int e = 0; e < c.E; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      mat(x + "gate_proj.weight", c.I, D);
      mat(x + "up_proj.weight", c.I, D);
      mat(x + "down_proj.weight", D, c.I);
    }
    mat(f + "shared_expert.gate_proj.weight", c.Is, D);
    mat(f + "shared_expert.up_proj.weight", c.Is, D);
    mat(f + "shared_expert.down_proj.weight", D, c.Is);
    mat(f + "shared_expert_gate.weight", 1, D);
  }
  Model M;
  M.fingerprint = "forward_harness qwen35";
  q::attach(M, q::load(c, w, 2), 0);
  logits.assign((size_t)n * c.vocab, 0.f);
  State st(M);
  return prefill(st, ids.data(), n, 64, nullptr, logits.data()) == n;
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
  uint64_t digest, qdigest;
  bool finite = digest_of(logits, digest);
  std::printf("logit[0][0..3] %.9g %.9g %.9g\n", logits[0], logits[1], logits[2]);
  std::vector<float> qlogits;
  if (!qwen35_logits(n, ids, qlogits)) return 2;
  finite = digest_of(qlogits, qdigest) && finite;
  std::printf("digest %016llx\nqwen35 %016llx\n%s\n", (unsigned long long)digest, (unsigned long long)qdigest,
              finite ? "finite" : "NOT FINITE");
  return finite ? 0 : 1;
}

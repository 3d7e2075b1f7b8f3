// cairn kernel, Qwen3.5: its state tail, page layout and family table (cairn/family.h).
//
// Snapshot (the shared header, tokens and logits before it, the partial page group's rows after
// it: native/src/state.cpp), version 1. Shape guard: u32 x 11 ("Q35\0" tag, vocab, D, n_layers,
// a hash of the layer kinds, K, conv_dim, nv, dk, dv, Hkv*Dh). The tail, per GDN layer in order:
//   conv rows min(n, K-1) x conv_dim (raw, pre-conv, oldest first)
//   the recurrent state nv x dk x dv (only when n > 0)
// Pages: per full-attention layer l, array 2l holds K rows and 2l+1 V rows (Hkv*Dh floats a token,
// row-major; K after k_norm and RoPE). A page group of P tokens is 2 * P * Hkv*Dh * 4 bytes per
// full-attention layer.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model.h"

namespace cairn::qwen35 {

namespace {
int64_t conv_rows(const Config& c, int64_t used) {
  const int64_t k1 = std::max(c.K - 1, 0);
  return used < 0 ? k1 : std::min<int64_t>(used, k1);
}
int64_t rec_floats(const Config& c, int64_t used) { return used != 0 ? (int64_t)c.nv * c.dk * c.dv : 0; }
}  // namespace

Tail::Tail(const cairn::Model& M, int64_t used) : model(&M) {
  const Config& c = of(M).cfg;
  layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l)
    if (c.layer_types[l] == Mixer::Linear) {
      layers[l].conv.assign((size_t)(conv_rows(c, used) * c.conv_dim()), 0.f);
      layers[l].rec.assign((size_t)rec_floats(c, used), 0.f);
    }
}

std::unique_ptr<StateTail> Tail::snapshot(int64_t n) const {
  const Config& c = of(*model).cfg;
  auto s = std::make_unique<Tail>(*model, 0);
  const size_t keep = (size_t)(conv_rows(c, n) * c.conv_dim());
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerCache& f = layers[l];
    if (f.conv.size() < keep) continue;  // a full-attention layer
    s->layers[l].conv.assign(f.conv.end() - (std::ptrdiff_t)keep, f.conv.end());  // the last rows: the used ones
    if (n > 0) s->layers[l].rec = f.rec;
  }
  return s;
}

std::unique_ptr<StateTail> Tail::live(const cairn::Model& M, int64_t n) const {
  auto s = std::make_unique<Tail>(M, -1);
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerCache& t = s->layers[l];
    const LayerCache& f = layers[l];
    std::copy(f.conv.begin(), f.conv.end(), t.conv.end() - (std::ptrdiff_t)f.conv.size());  // zeros before them
    std::copy(f.rec.begin(), f.rec.end(), t.rec.begin());
  }
  return s;
}

int64_t Tail::floats(int64_t n) const {
  const Config& c = of(*model).cfg;
  int64_t f = 0;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.layer_types[l] == Mixer::Linear) f += conv_rows(c, n) * c.conv_dim() + rec_floats(c, n);
  return f;
}

void Tail::write(TailWriter& w, int64_t n) const {
  const Config& c = of(*model).cfg;
  const int64_t k = conv_rows(c, n) * c.conv_dim();
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.layer_types[l] != Mixer::Linear) continue;
    const LayerCache& lc = layers[l];
    w.floats(lc.conv.data() + (lc.conv.size() - (size_t)k), k);  // a live tail's last rows, a snapshot's all
    w.floats(lc.rec.data(), rec_floats(c, n));
  }
}

void Tail::read(TailReader& r, int64_t n) {
  const Config& c = of(*model).cfg;
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.layer_types[l] != Mixer::Linear) continue;
    LayerCache& lc = layers[l];
    r.floats(lc.conv.data(), (int64_t)lc.conv.size());
    r.floats(lc.rec.data(), (int64_t)lc.rec.size());
  }
}

int64_t Tail::held_floats() const {
  int64_t f = 0;
  for (const LayerCache& lc : layers) f += (int64_t)(lc.conv.capacity() + lc.rec.capacity());
  return f;
}

namespace {
int n_full(const Config& c) { return (int)std::count(c.layer_types.begin(), c.layer_types.end(), Mixer::Full); }

std::unique_ptr<StateTail> make_tail(const cairn::Model& M, int64_t used) { return std::make_unique<Tail>(M, used); }

std::vector<uint32_t> shape_guard(const cairn::Model& M) {
  const Config& c = of(M).cfg;
  uint32_t kinds = 2166136261u;  // FNV-1a over the layer kinds
  for (Mixer t : c.layer_types) kinds = (kinds ^ (uint32_t)t) * 16777619u;
  return {kTag, (uint32_t)c.vocab, (uint32_t)c.D, (uint32_t)c.n_layers, kinds, (uint32_t)c.K,
          (uint32_t)c.conv_dim(), (uint32_t)c.nv, (uint32_t)c.dk, (uint32_t)c.dv, (uint32_t)(c.Hkv * c.Dh)};
}

int64_t entry_floats(const cairn::Model& M, int64_t n) {
  const Config& c = of(M).cfg;
  return n * n_full(c) * 2 * (int64_t)c.Hkv * c.Dh;
}

std::string version_note(uint32_t) { return ""; }

std::shared_ptr<const PageLayout> page_layout(const Config& c, int64_t page_tokens) {
  const int64_t P = page_tokens ? page_tokens : DEFAULT_PAGE_TOKENS;
  if (P < 1 || P > (int64_t)1 << 24)
    throw std::invalid_argument("page_tokens must be in 1..2^24 for qwen3_5 (0: the default, " +
                                std::to_string(DEFAULT_PAGE_TOKENS) + "), got " + std::to_string(page_tokens));
  auto L = std::make_shared<PageLayout>();
  L->page_tokens = P;
  L->arrays.resize(2 * (size_t)c.n_layers);
  int64_t off = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.layer_types[l] != Mixer::Full) continue;
    for (int k = 0; k < 2; ++k) {  // K rows, V rows
      PageLayout::Array& a = L->arrays[2 * l + k];
      a.off = off;
      a.dim = c.Hkv * c.Dh;
      a.rows = (int)P;
      off += P * a.dim;
    }
  }
  L->group_floats = off;
  return L;
}
}  // namespace

void attach(cairn::Model& M, std::shared_ptr<const Model> m, int64_t page_tokens) {
  M.page_layout = page_layout(m->cfg, page_tokens);
  M.cfg.vocab = m->cfg.vocab;
  M.cfg.D = m->cfg.D;
  M.cfg.n_layers = m->cfg.n_layers;
  M.threads = m->threads;
  M.family = &kOps;
  M.family_model = std::move(m);
}

const FamilyOps kOps = {"qwen3_5", 1, kTag, false, make_tail, shape_guard, entry_floats, run, version_note};

}  // namespace cairn::qwen35

// cairn kernel, DeepSeek-V4: its state tail (window ring, compressor buffers), the journal's bounds,
// its page layout's shape guard and the family table (cairn/family.h).
//
// The tail's part of the snapshot blob (the shared header, tokens and logits before it, the
// partial page group's rows after it: state.cpp), per layer, in order:
//   window rows min(n, W-1) x Dh, oldest first
//   CSA/HCA: buf_kv and buf_gate (n%rate) x cw, CSA and n >= rate: overlap kv, gate rate x Dh
//   CSA indexer: the same at Di
// Shape guard: 8 x u32 (vocab, D, n_layers, W, Dh, Di, csa_rate, hca_rate); version 4 (the CSA
// indexer's keys as panels in their groups; 3: paged, rows row-major; 2: one whole blob).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dsv4.h"

namespace cairn {

// Floats of each buffer a state of `used` tokens reads: a prefix (state.h); used < 0: all of it.
static size_t win_used(const Config& c, int64_t used) {
  const int64_t ring = c.W - 1;
  return (size_t)((used < 0 ? ring : std::min(used, ring)) * c.Dh);
}
static size_t buf_used(const CompState& cs, int64_t used) {
  return (size_t)((used < 0 ? cs.rate : used % cs.rate) * cs.cw);
}
static size_t ov_used(const CompState& cs, bool overlap, int64_t used) {
  return overlap && (used < 0 || used >= cs.rate) ? (size_t)cs.rate * cs.dim : 0;
}

static void init_comp(CompState& cs, int arr, int rate, int dim, bool overlap, int64_t used) {
  cs.arr = arr;
  cs.rate = rate;
  cs.dim = dim;
  cs.cw = overlap ? 2 * dim : dim;
  cs.buf_kv.assign(buf_used(cs, used), 0.f);
  cs.buf_gate.assign(buf_used(cs, used), 0.f);
  cs.ov_kv.assign(ov_used(cs, overlap, used), 0.f);
  cs.ov_gate.assign(ov_used(cs, overlap, used), 0.f);
}

Dsv4Tail::Dsv4Tail(const Model& m, int64_t used) : model(&m) {
  const Config& c = m.cfg;
  layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerState& ls = layers[l];
    ls.win.assign(win_used(c, used), 0.f);
    if (c.layer_types[l] == AttnType::HCA) init_comp(ls.comp, 2 * l, c.hca_rate, c.Dh, false, used);
    if (c.layer_types[l] == AttnType::CSA) {
      init_comp(ls.comp, 2 * l, c.csa_rate, c.Dh, true, used);
      init_comp(ls.icomp, 2 * l + 1, c.csa_rate, c.Di, true, used);
    }
  }
}

// dst (a prefix-sized buffer) <- the same prefix of src
static void copy_prefix(std::vector<float>& dst, const std::vector<float>& src, size_t k) {
  dst.assign(src.begin(), src.begin() + (std::ptrdiff_t)k);
}

std::unique_ptr<StateTail> Dsv4Tail::snapshot(int64_t n) const {
  auto s = std::make_unique<Dsv4Tail>(*model, 0);  // every buffer empty: nothing allocated before it is copied
  const Config& c = model->cfg;
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerState& from = layers[l];
    LayerState& to = s->layers[l];
    copy_prefix(to.win, from.win, win_used(c, n));
    for (auto [t, f] : {std::pair{&to.comp, &from.comp}, std::pair{&to.icomp, &from.icomp}}) {
      if (!f->rate) continue;
      t->rows = f->rows;
      copy_prefix(t->buf_kv, f->buf_kv, buf_used(*f, n));
      copy_prefix(t->buf_gate, f->buf_gate, buf_used(*f, n));
      copy_prefix(t->ov_kv, f->ov_kv, ov_used(*f, !f->ov_kv.empty(), n));
      copy_prefix(t->ov_gate, f->ov_gate, ov_used(*f, !f->ov_gate.empty(), n));
    }
  }
  return s;
}

std::unique_ptr<StateTail> Dsv4Tail::live(const Model& m, int64_t) const {
  auto s = std::make_unique<Dsv4Tail>(m, -1);
  auto into = [](std::vector<float>& dst, const std::vector<float>& src) { std::copy(src.begin(), src.end(), dst.begin()); };
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerState& from = layers[l];
    LayerState& to = s->layers[l];
    into(to.win, from.win);
    for (auto [t, f] : {std::pair{&to.comp, &from.comp}, std::pair{&to.icomp, &from.icomp}}) {
      t->rows = f->rows;
      into(t->buf_kv, f->buf_kv);
      into(t->buf_gate, f->buf_gate);
      into(t->ov_kv, f->ov_kv);
      into(t->ov_gate, f->ov_gate);
    }
  }
  return s;
}

// floats of one compressor's mutable buffers for n tokens
static int64_t buffer_floats(const CompState& cs, int64_t n) {
  if (!cs.rate) return 0;
  int64_t f = 2 * (n % cs.rate) * cs.cw;
  if (!cs.ov_kv.empty() && n >= cs.rate) f += 2 * (int64_t)cs.rate * cs.dim;
  return f;
}

// floats of the tail's per-layer part: window rows and compressor buffers
int64_t Dsv4Tail::floats(int64_t n) const {
  const Config& c = model->cfg;
  int64_t f = 0;
  for (const LayerState& ls : layers)
    f += std::min<int64_t>(n, c.W - 1) * c.Dh + buffer_floats(ls.comp, n) + buffer_floats(ls.icomp, n);
  return f;
}

int64_t Dsv4Tail::held_floats() const {
  int64_t f = 0;
  for (const LayerState& ls : layers) {
    f += (int64_t)ls.win.capacity();
    for (const CompState* cs : {&ls.comp, &ls.icomp})
      f += (int64_t)(cs->buf_kv.capacity() + cs->buf_gate.capacity() + cs->ov_kv.capacity() + cs->ov_gate.capacity());
  }
  return f;
}

// Bookkeeping besides its floats: one LayerState per layer.
int64_t Dsv4Tail::shape_bytes(bool allocated) const {
  return (int64_t)((allocated ? layers.capacity() : layers.size()) * sizeof(LayerState));
}

static int64_t entry_floats(const Model& m, int64_t n) {
  const Config& c = m.cfg;
  int64_t f = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.layer_types[l] == AttnType::HCA) f += (n / c.hca_rate) * c.Dh;
    if (c.layer_types[l] == AttnType::CSA) f += (n / c.csa_rate) * c.Dh + (n / c.csa_rate) * c.Di;
  }
  return f;
}

JournalBound journal_bound(const Config& c, int64_t S) {
  JournalBound b;
  auto comp = [&](int rate, int cw, int dim, bool overlap) {
    const int64_t windows = (S + rate - 1) / rate;  // completed among S consecutive positions
    b.writes += 2 * S + (overlap ? 2 * windows : 0);
    b.floats += 2 * S * cw + (overlap ? 2 * windows * rate * dim : 0);
    b.appends += windows;
  };
  for (int l = 0; l < c.n_layers; ++l) {
    b.writes += S;
    b.floats += S * c.Dh;
    if (c.layer_types[l] == AttnType::HCA) comp(c.hca_rate, c.Dh, c.Dh, false);
    if (c.layer_types[l] == AttnType::CSA) {
      comp(c.csa_rate, 2 * c.Dh, c.Dh, true);
      comp(c.csa_rate, 2 * c.Di, c.Di, true);
    }
  }
  b.logits = (S + 1) * (int64_t)c.vocab;
  return b;
}

int64_t journal_bytes(const Config& c, int64_t S) {
  const JournalBound b = journal_bound(c, S);
  return (int64_t)sizeof(Journal) + b.writes * (int64_t)sizeof(Journal::Write) + 4 * b.floats +
         b.appends * (int64_t)sizeof(std::pair<CompState*, int64_t>) + 4 * b.logits;
}

void Journal::reserve(const Config& c, int64_t S) {
  const JournalBound b = journal_bound(c, S);
  writes.reserve((size_t)b.writes);
  saved.reserve((size_t)b.floats);
  appends.reserve((size_t)b.appends);
  logits.reserve((size_t)(b.logits - c.vocab));
  logits_before.reserve((size_t)c.vocab);
}

int64_t Journal::held_bytes() const {
  return (int64_t)(sizeof(Journal) + writes.capacity() * sizeof(Write) + saved.capacity() * sizeof(float) +
                   appends.capacity() * sizeof(appends[0]) + (logits.capacity() + logits_before.capacity()) * sizeof(float));
}

namespace {
void write_comp(TailWriter& w, const CompState& cs, int64_t n) {
  if (!cs.rate) return;
  w.floats(cs.buf_kv.data(), (n % cs.rate) * cs.cw);
  w.floats(cs.buf_gate.data(), (n % cs.rate) * cs.cw);
  if (!cs.ov_kv.empty() && n >= cs.rate) {
    w.floats(cs.ov_kv.data(), (int64_t)cs.rate * cs.dim);
    w.floats(cs.ov_gate.data(), (int64_t)cs.rate * cs.dim);
  }
}
void read_comp(TailReader& r, CompState& cs, int64_t n) {
  if (!cs.rate) return;
  cs.rows = n / cs.rate;
  r.floats(cs.buf_kv.data(), (n % cs.rate) * cs.cw);
  r.floats(cs.buf_gate.data(), (n % cs.rate) * cs.cw);
  if (!cs.ov_kv.empty() && n >= cs.rate) {
    r.floats(cs.ov_kv.data(), (int64_t)cs.rate * cs.dim);
    r.floats(cs.ov_gate.data(), (int64_t)cs.rate * cs.dim);
  }
}
std::vector<uint32_t> shape_guard(const Model& m) {
  const Config& c = m.cfg;
  return {(uint32_t)c.vocab, (uint32_t)c.D, (uint32_t)c.n_layers, (uint32_t)c.W,
          (uint32_t)c.Dh, (uint32_t)c.Di, (uint32_t)c.csa_rate, (uint32_t)c.hca_rate};
}
std::string version_note(uint32_t ver) {
  return ver < 3   ? "; it was written before paged state and must be recomputed"
         : ver < 4 ? "; it was written before the indexer's keys were kept as panels and must be recomputed"
                   : "";
}
std::unique_ptr<StateTail> make_tail(const Model& m, int64_t used) { return std::make_unique<Dsv4Tail>(m, used); }
}  // namespace

void Dsv4Tail::write(TailWriter& w, int64_t n) const {
  const Config& c = model->cfg;
  const int ring = c.W - 1;
  for (const LayerState& ls : layers) {
    for (int64_t p = n - std::min<int64_t>(n, ring); p < n; ++p) w.floats(&ls.win[(size_t)(p % ring) * c.Dh], c.Dh);
    write_comp(w, ls.comp, n);
    write_comp(w, ls.icomp, n);
  }
}

void Dsv4Tail::read(TailReader& r, int64_t n) {
  const Config& c = model->cfg;
  const int ring = c.W - 1;
  for (LayerState& ls : layers) {
    for (int64_t p = n - std::min<int64_t>(n, ring); p < n; ++p) r.floats(&ls.win[(size_t)(p % ring) * c.Dh], c.Dh);
    read_comp(r, ls.comp, n);
    read_comp(r, ls.icomp, n);
  }
}

const FamilyOps kDsv4Ops = {"deepseek_v4", SNAPSHOT_VERSION, 0, true, make_tail, shape_guard, entry_floats, dsv4::run,
                            version_note};

}  // namespace cairn

// cairn kernel: State construction and the snapshot tail blob.
//
// Tail layout (little-endian, version SNAPSHOT_VERSION = 4, cairn/state.h):
//   magic "CAIRNSNP" (8) | u32 version | u32 fingerprint length | fingerprint bytes
//   | 8 x u32 shape guard (vocab, D, n_layers, W, Dh, Di, csa_rate, hca_rate) | u64 page_tokens
//   | i64 n | i32 tokens[n] | u8 has_logits | f32 logits[V] if has_logits
//   | per layer, in order:
//       window rows min(n, W-1) x Dh, oldest first
//       CSA/HCA: buf_kv and buf_gate (n%rate) x cw, CSA and n >= rate: overlap kv, gate rate x Dh
//       CSA indexer: the same at Di
//   | the partial page group's rows (group n/P): each array's used rows, in layout order, as
//     [used, dim] rows whatever the array's layout in the group (no padding lanes)
//   | u64 blob_checksum of everything before it
// The full groups 0 .. n/P-1 are not in the tail: they travel as page references (in memory) or
// as their own bytes (on disk, each group_bytes long, in the group's layout: the indexer's keys
// as panels where pages.h says so; version 4, 3 had them row-major). Every size is derived from (config, n), so
// restore checks the exact total length before reading, then the checksum, then the contents:
// random, truncated or foreign blobs are rejected with std::invalid_argument and never touch
// memory out of bounds.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cairn/state.h"

namespace cairn {

static const char kMagic[8] = {'C', 'A', 'I', 'R', 'N', 'S', 'N', 'P'};

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

State::State(const Model& m, int64_t used) : model(&m) {
  const Config& c = m.cfg;
  pages.layout = m.page_layout;
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

State::State(const Model& m) : State(m, -1) {}

State State::shell(const Model& m, int64_t n) { return State(m, n); }

// dst (a prefix-sized buffer) <- the same prefix of src
static void copy_prefix(std::vector<float>& dst, const std::vector<float>& src, size_t k) {
  dst.assign(src.begin(), src.begin() + (std::ptrdiff_t)k);
}

State State::snapshot() const {
  State s(*model, 0);  // every buffer empty: nothing allocated before it is copied
  const Config& c = model->cfg;
  s.n = n;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.last_logits.assign(last_logits.begin(), last_logits.end());
  s.pages.groups.assign(pages.groups.begin(), pages.groups.end());  // shared, not copied
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerState& from = layers[l];
    LayerState& to = s.layers[l];
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

State State::live(const Model& m) const {
  State s(m);
  s.n = n;
  s.tokens = tokens;
  s.last_logits = last_logits;
  s.pages = pages;  // shared; the state copies a group before it writes it
  auto into = [](std::vector<float>& dst, const std::vector<float>& src) { std::copy(src.begin(), src.end(), dst.begin()); };
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerState& from = layers[l];
    LayerState& to = s.layers[l];
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

void State::append_entry(CompState& cs, const float* row) {
  pages.write_row(cs.arr, cs.rows, row);
  cs.rows += 1;
}

// floats of one compressor's mutable buffers for n tokens
static int64_t buffer_floats(const CompState& cs, int64_t n) {
  if (!cs.rate) return 0;
  int64_t f = 2 * (n % cs.rate) * cs.cw;
  if (!cs.ov_kv.empty() && n >= cs.rate) f += 2 * (int64_t)cs.rate * cs.dim;
  return f;
}

// floats of the tail's per-layer part: window rows and compressor buffers
static int64_t layer_tail_floats(const State& s, int64_t n) {
  const Config& c = s.model->cfg;
  int64_t f = 0;
  for (const LayerState& ls : s.layers)
    f += std::min<int64_t>(n, c.W - 1) * c.Dh + buffer_floats(ls.comp, n) + buffer_floats(ls.icomp, n);
  return f;
}

static int64_t entry_floats(const State& s, int64_t n) {
  int64_t f = 0;
  for (const LayerState& ls : s.layers)
    for (const CompState* cs : {&ls.comp, &ls.icomp})
      if (cs->rate) f += (n / cs->rate) * cs->dim;
  return f;
}

int64_t State::payload_bytes() const { return 4 * (layer_tail_floats(*this, n) + entry_floats(*this, n)); }

// Bookkeeping a State holds besides its floats: one LayerState per layer, one pointer per group.
static int64_t shape_bytes(size_t layers, size_t groups) {
  return (int64_t)(layers * sizeof(LayerState) + groups * sizeof(std::shared_ptr<PageGroup>));
}

int64_t State::held_bytes() const {
  int64_t f = (int64_t)last_logits.capacity();
  for (const LayerState& ls : layers) {
    f += (int64_t)ls.win.capacity();
    for (const CompState* cs : {&ls.comp, &ls.icomp})
      f += (int64_t)(cs->buf_kv.capacity() + cs->buf_gate.capacity() + cs->ov_kv.capacity() + cs->ov_gate.capacity());
  }
  return 4 * f + 4 * (int64_t)tokens.capacity() + shape_bytes(layers.capacity(), pages.groups.capacity());
}

int64_t State::snapshot_bytes() const {
  return 4 * (layer_tail_floats(*this, n) + (int64_t)tokens.size() + (int64_t)last_logits.size()) +
         shape_bytes(layers.size(), pages.groups.size());
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
struct Writer {
  uint8_t* out;
  size_t off = 0;
  void raw(const void* p, size_t n) {
    if (n) std::memcpy(out + off, p, n);  // an empty buffer's data() may be null: memcpy(…, nullptr, 0) is UB
    off += n;
  }
  template <class T> void put(T v) { raw(&v, sizeof v); }
  void floats(const float* p, int64_t n) { raw(p, sizeof(float) * (size_t)n); }
};
struct Reader {
  const uint8_t* p;
  size_t n, off = 0;
  void raw(void* dst, size_t k) {
    if (k > n - off) throw std::invalid_argument("snapshot is truncated");
    if (k) std::memcpy(dst, p + off, k);
    off += k;
  }
  template <class T> T get() { T v; raw(&v, sizeof v); return v; }
  void floats(float* dst, int64_t k) { raw(dst, sizeof(float) * (size_t)k); }
};
// Blob checksum: four independent multiply-xorshift lanes over 8-byte words. A byte-wise FNV-1a
// (one dependent multiply per byte) ran at ~0.6 GB/s and dominated restore; this runs at memory
// speed. It detects corruption, not an adversary. Words are read little-endian (x86-64, AArch64).
}  // namespace
uint64_t blob_checksum(const uint8_t* p, size_t n) {
  constexpr uint64_t K = 0x9E3779B97F4A7C15ull, M = 0xFF51AFD7ED558CCDull;
  uint64_t h[4] = {K, K ^ 1, K ^ 2, K ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * M;
      h[l] ^= h[l] >> 29;
    }
  }
  uint64_t r = (uint64_t)n;
  for (; i < n; ++i) r = (r ^ p[i]) * 1099511628211ull;
  for (uint64_t x : h) {
    r = (r ^ x) * K;
    r ^= r >> 31;
  }
  return r;
}
namespace {
void write_comp(Writer& w, const CompState& cs, int64_t n) {
  if (!cs.rate) return;
  w.floats(cs.buf_kv.data(), (n % cs.rate) * cs.cw);
  w.floats(cs.buf_gate.data(), (n % cs.rate) * cs.cw);
  if (!cs.ov_kv.empty() && n >= cs.rate) {
    w.floats(cs.ov_kv.data(), (int64_t)cs.rate * cs.dim);
    w.floats(cs.ov_gate.data(), (int64_t)cs.rate * cs.dim);
  }
}
void read_comp(Reader& r, CompState& cs, int64_t n) {
  if (!cs.rate) return;
  cs.rows = n / cs.rate;
  r.floats(cs.buf_kv.data(), (n % cs.rate) * cs.cw);
  r.floats(cs.buf_gate.data(), (n % cs.rate) * cs.cw);
  if (!cs.ov_kv.empty() && n >= cs.rate) {
    r.floats(cs.ov_kv.data(), (int64_t)cs.rate * cs.dim);
    r.floats(cs.ov_gate.data(), (int64_t)cs.rate * cs.dim);
  }
}
std::vector<uint32_t> shape_guard(const Config& c) {
  return {(uint32_t)c.vocab, (uint32_t)c.D, (uint32_t)c.n_layers, (uint32_t)c.W,
          (uint32_t)c.Dh, (uint32_t)c.Di, (uint32_t)c.csa_rate, (uint32_t)c.hca_rate};
}
// The partial group's rows of every array, in layout order: [used rows, dim] each.
template <class F> void each_partial_span(const PageLayout& L, int64_t n, F&& f) {
  const int64_t g = n / L.page_tokens;
  for (size_t a = 0; a < L.arrays.size(); ++a) {
    const PageLayout::Array& ar = L.arrays[a];
    if (!ar.rows) continue;
    const int64_t rate = L.page_tokens / ar.rows;
    const int64_t used = std::clamp<int64_t>(n / rate - g * ar.rows, 0, ar.rows);
    if (used) f(ar, used);
  }
}
}  // namespace

static size_t header_size(const Model& m, int64_t n, bool logits) {
  return 8 + 4 + 4 + m.fingerprint.size() + 4 * shape_guard(m.cfg).size() + 8 + 8 + 4 * (size_t)n + 1 +
         (logits ? 4 * (size_t)m.cfg.vocab : 0);
}

size_t tail_size(const State& s) {
  return header_size(*s.model, s.n, !s.last_logits.empty()) +
         4 * (size_t)(layer_tail_floats(s, s.n) + s.pages.layout->used_floats(s.full_groups(), s.n)) + 8;
}

void tail_into(const State& s, uint8_t* out) {
  const Config& c = s.model->cfg;
  const PageLayout& L = *s.pages.layout;
  Writer w{out};
  w.raw(kMagic, 8);
  w.put<uint32_t>(SNAPSHOT_VERSION);
  w.put<uint32_t>((uint32_t)s.model->fingerprint.size());
  w.raw(s.model->fingerprint.data(), s.model->fingerprint.size());
  for (uint32_t v : shape_guard(c)) w.put<uint32_t>(v);
  w.put<uint64_t>((uint64_t)L.page_tokens);
  w.put<int64_t>(s.n);
  w.raw(s.tokens.data(), sizeof(int32_t) * s.tokens.size());
  w.put<uint8_t>(s.last_logits.empty() ? 0 : 1);
  if (!s.last_logits.empty()) w.floats(s.last_logits.data(), c.vocab);
  const int ring = c.W - 1;
  for (const LayerState& ls : s.layers) {
    for (int64_t p = s.n - std::min<int64_t>(s.n, ring); p < s.n; ++p)
      w.floats(&ls.win[(size_t)(p % ring) * c.Dh], c.Dh);
    write_comp(w, ls.comp, s.n);
    write_comp(w, ls.icomp, s.n);
  }
  const int64_t g = s.full_groups();
  std::vector<float> row;
  each_partial_span(L, s.n, [&](const PageLayout::Array& ar, int64_t used) {
    const float* base = s.pages.groups[(size_t)g]->data.get() + ar.off;
    if (!ar.panels) return w.floats(base, used * ar.dim);
    row.resize(ar.dim);
    for (int r = 0; r < (int)used; ++r) {  // gathered from its panel lane
      for (int c = 0; c < ar.dim; ++c) row[c] = base[ar.at(r) + (int64_t)c * ar.stride()];
      w.floats(row.data(), ar.dim);
    }
  });
  uint64_t h = blob_checksum(out, w.off);
  w.put<uint64_t>(h);
}

namespace {
// Reads and checks the tail's header up to and including n; returns n.
int64_t read_header(const Model& m, Reader& r) {
  const Config& c = m.cfg;
  char magic[8];
  if (r.n < 8) throw std::invalid_argument("not a cairn snapshot (too short)");
  r.raw(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0) throw std::invalid_argument("not a cairn snapshot (bad magic)");
  uint32_t ver = r.get<uint32_t>();
  if (ver != SNAPSHOT_VERSION)
    throw std::invalid_argument("unsupported snapshot version " + std::to_string(ver) + " (this build reads " +
                                std::to_string(SNAPSHOT_VERSION) +
                                (ver < 3   ? "; it was written before paged state and must be recomputed)"
                                 : ver < 4 ? "; it was written before the indexer's keys were kept as panels and must "
                                             "be recomputed)"
                                           : ")"));
  uint32_t flen = r.get<uint32_t>();
  if (flen > 4096 || flen > r.n - r.off) throw std::invalid_argument("snapshot is truncated or corrupt (fingerprint)");
  std::string fp(flen, '\0');
  r.raw(fp.data(), flen);
  if (fp != m.fingerprint)
    throw std::invalid_argument("snapshot belongs to a different model (fingerprint '" + fp + "', model '" +
                                m.fingerprint + "')");
  for (uint32_t v : shape_guard(c))
    if (r.get<uint32_t>() != v) throw std::invalid_argument("snapshot model shape does not match this model");
  const uint64_t P = r.get<uint64_t>();
  if ((int64_t)P != m.page_layout->page_tokens)
    throw std::invalid_argument("snapshot pages hold " + std::to_string(P) + " tokens, this model's hold " +
                                std::to_string(m.page_layout->page_tokens));
  int64_t n = r.get<int64_t>();
  if (n < 0 || n > ((int64_t)1 << 40)) throw std::invalid_argument("snapshot is corrupt (token count)");
  return n;
}
}  // namespace

int64_t tail_full_groups(const Model& m, const uint8_t* tail, size_t size) {
  Reader r{tail, size};
  return m.page_layout->full_groups(read_header(m, r));
}

State restore(const Model& m, const uint8_t* data, size_t size, const uint8_t* const* pages,
              const size_t* page_sizes, size_t npages) {
  const Config& c = m.cfg;
  Reader r{data, size};
  const int64_t n = read_header(m, r);
  State s = State::shell(m, n);  // a snapshot's buffers: only what n tokens use
  const PageLayout& L = *m.page_layout;
  // exact expected size: header so far + tokens + flag + [logits] + tail floats + checksum
  const size_t after_tokens = r.off + 4 * (size_t)n;
  if (after_tokens + 1 > size) throw std::invalid_argument("snapshot is truncated");
  const uint8_t has_logits = data[after_tokens];
  if (has_logits > 1) throw std::invalid_argument("snapshot is corrupt (logits flag)");
  const int64_t full = L.full_groups(n);
  const size_t expect = after_tokens + 1 + (has_logits ? 4 * (size_t)c.vocab : 0) +
                        4 * (size_t)(layer_tail_floats(s, n) + L.used_floats(full, n)) + 8;
  if (size < expect) throw std::invalid_argument("snapshot is truncated");
  if (size > expect) throw std::invalid_argument("snapshot has trailing bytes (corrupt)");
  uint64_t stored;
  std::memcpy(&stored, data + size - 8, 8);
  if (stored != blob_checksum(data, size - 8)) throw std::invalid_argument("snapshot checksum mismatch (corrupt)");
  if ((n > 0) != (has_logits == 1)) throw std::invalid_argument("snapshot is corrupt (logits flag)");
  if ((int64_t)npages != full)
    throw std::invalid_argument("snapshot of " + std::to_string(n) + " tokens needs " + std::to_string(full) +
                                " page groups, got " + std::to_string(npages));
  for (size_t k = 0; k < npages; ++k)
    if (page_sizes[k] != (size_t)L.group_bytes())
      throw std::invalid_argument("page group " + std::to_string(k) + " has " + std::to_string(page_sizes[k]) +
                                  " bytes, expected " + std::to_string(L.group_bytes()));
  s.n = n;
  s.tokens.resize(n);
  r.raw(s.tokens.data(), 4 * (size_t)n);
  for (int32_t t : s.tokens)
    if (t < 0 || t >= c.vocab) throw std::invalid_argument("snapshot is corrupt (token id out of range)");
  r.off += 1;
  if (has_logits) {
    s.last_logits.resize(c.vocab);
    r.floats(s.last_logits.data(), c.vocab);
  }
  const int ring = c.W - 1;
  for (LayerState& ls : s.layers) {
    for (int64_t p = n - std::min<int64_t>(n, ring); p < n; ++p) r.floats(&ls.win[(size_t)(p % ring) * c.Dh], c.Dh);
    read_comp(r, ls.comp, n);
    read_comp(r, ls.icomp, n);
  }
  for (size_t k = 0; k < npages; ++k) {
    auto g = std::make_shared<PageGroup>(L.group_floats, L.arrays.size());
    std::memcpy(g->data.get(), pages[k], page_sizes[k]);
    for (size_t a = 0; a < L.arrays.size(); ++a) g->fill[a] = L.arrays[a].rows;
    s.pages.groups.push_back(std::move(g));
  }
  // The partial group: its rows appended as the compressors did (the first allocates the group),
  // so each array lands in its own layout.
  std::vector<float> row;
  each_partial_span(L, n, [&](const PageLayout::Array& ar, int64_t used) {
    const int arr = (int)(&ar - L.arrays.data());
    row.resize(ar.dim);
    for (int64_t k = 0; k < used; ++k) {
      r.floats(row.data(), ar.dim);
      s.pages.write_row(arr, full * ar.rows + k, row.data());
    }
  });
  return s;
}

}  // namespace cairn

// cairn kernel: State construction and the snapshot tail blob, for every family (cairn/family.h).
//
// Tail layout (little-endian):
//   magic "CAIRNSNP" (8) | u32 version (the family's) | u32 fingerprint length | fingerprint bytes
//   | u32 shape guard words (the family's) | u64 page_tokens
//   | i64 n | i32 tokens[n] | u8 has_logits | f32 logits[V] if has_logits
//   | the family's tail (families/<name>/: DeepSeek-V4's window rows and compressor buffers,
//     Qwen3.5's conv rows and recurrent states)
//   | the partial page group's rows (group n/P): each array's used rows, in layout order, as
//     [used, dim] rows whatever the array's layout in the group (no padding lanes)
//   | u64 blob_checksum of everything before it
// The full groups 0 .. n/P-1 are not in the tail: they travel as page references (in memory) or
// as their own bytes (on disk, each group_bytes long, in the group's layout: V4's indexer keys
// as panels where pages.h says so). Every size is derived from (config, n), so
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

State::State(const Model& m, int64_t used) : model(&m), tail(m.family->make_tail(m, used)) {
  pages.layout = m.page_layout;
}

State::State(const Model& m) : State(m, -1) {}

State State::shell(const Model& m, int64_t n) { return State(m, n); }

State State::snapshot() const {
  State s(*model, 0);
  s.n = n;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.last_logits.assign(last_logits.begin(), last_logits.end());
  s.pages.groups.assign(pages.groups.begin(), pages.groups.end());  // shared, not copied
  s.tail = TailSlot(tail->snapshot(n));
  return s;
}

State State::live(const Model& m) const {
  State s(m, 0);
  s.n = n;
  s.tokens = tokens;
  s.last_logits = last_logits;
  s.pages = pages;  // shared; the state copies a group before it writes it
  s.tail = TailSlot(tail->live(m, n));
  return s;
}

void State::append_entry(CompState& cs, const float* row) {
  pages.write_row(cs.arr, cs.rows, row);
  cs.rows += 1;
}

int64_t State::payload_bytes() const { return 4 * (tail->floats(n) + model->family->entry_floats(*model, n)); }

// Bookkeeping a State holds besides its floats: the tail's, one pointer per group.
static int64_t shape_bytes(const StateTail& t, bool allocated, size_t groups) {
  return t.shape_bytes(allocated) + (int64_t)(groups * sizeof(std::shared_ptr<PageGroup>));
}

int64_t State::held_bytes() const {
  const int64_t f = (int64_t)last_logits.capacity() + tail->held_floats();
  return 4 * f + 4 * (int64_t)tokens.capacity() + shape_bytes(*tail, true, pages.groups.capacity());
}

int64_t State::snapshot_bytes() const {
  return 4 * (tail->floats(n) + (int64_t)tokens.size() + (int64_t)last_logits.size()) +
         shape_bytes(*tail, false, pages.groups.size());
}

// Blob checksum: four independent multiply-xorshift lanes over 8-byte words. A byte-wise FNV-1a
// (one dependent multiply per byte) ran at ~0.6 GB/s and dominated restore; this runs at memory
// speed. It detects corruption, not an adversary. Words are read little-endian (x86-64, AArch64).
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
  return 8 + 4 + 4 + m.fingerprint.size() + 4 * m.family->shape_guard(m).size() + 8 + 8 + 4 * (size_t)n + 1 +
         (logits ? 4 * (size_t)m.cfg.vocab : 0);
}

size_t tail_size(const State& s) {
  return header_size(*s.model, s.n, !s.last_logits.empty()) +
         4 * (size_t)(s.tail->floats(s.n) + s.pages.layout->used_floats(s.full_groups(), s.n)) + 8;
}

void tail_into(const State& s, uint8_t* out) {
  const Model& m = *s.model;
  const PageLayout& L = *s.pages.layout;
  TailWriter w{out};
  w.raw(kMagic, 8);
  w.put<uint32_t>(m.family->snapshot_version);
  w.put<uint32_t>((uint32_t)m.fingerprint.size());
  w.raw(m.fingerprint.data(), m.fingerprint.size());
  for (uint32_t v : m.family->shape_guard(m)) w.put<uint32_t>(v);
  w.put<uint64_t>((uint64_t)L.page_tokens);
  w.put<int64_t>(s.n);
  w.raw(s.tokens.data(), sizeof(int32_t) * s.tokens.size());
  w.put<uint8_t>(s.last_logits.empty() ? 0 : 1);
  if (!s.last_logits.empty()) w.floats(s.last_logits.data(), m.cfg.vocab);
  s.tail->write(w, s.n);
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
// A blob of another version: when its first shape word is another family's tag, or this family
// has a tag the blob lacks, the error names the families (not only the versions).
[[noreturn]] void version_error(const Model& m, TailReader r, uint32_t ver) {
  const FamilyOps& f = *m.family;
  uint32_t first = 0;
  bool have = false;
  try {
    const uint32_t flen = r.get<uint32_t>();
    if (flen <= 4096 && flen <= r.n - r.off) {
      r.off += flen;
      first = r.get<uint32_t>();
      have = true;
    }
  } catch (const std::invalid_argument&) {
  }
  if (have)
    for (const FamilyOps* const* o = kFamilies; *o; ++o)
      if ((*o)->tag && (*o)->tag == first && *o != &f)
        throw std::invalid_argument(std::string("snapshot is of model family ") + (*o)->name + ", this model is " +
                                    f.name + " (it cannot be restored here)");
  if (f.tag && (!have || first != f.tag))
    throw std::invalid_argument(std::string("snapshot is not a ") + f.name + " snapshot (version " +
                                std::to_string(ver) + ", no " + f.name + " tag: another model family's); this "
                                "model is " + f.name + " (snapshot version " + std::to_string(f.snapshot_version) + ")");
  throw std::invalid_argument("unsupported snapshot version " + std::to_string(ver) + " (this build reads " +
                              std::to_string(f.snapshot_version) + f.version_note(ver) + ")");
}

// Reads and checks the tail's header up to and including n; returns n.
int64_t read_header(const Model& m, TailReader& r) {
  char magic[8];
  if (r.n < 8) throw std::invalid_argument("not a cairn snapshot (too short)");
  r.raw(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0) throw std::invalid_argument("not a cairn snapshot (bad magic)");
  uint32_t ver = r.get<uint32_t>();
  if (ver != m.family->snapshot_version) version_error(m, r, ver);
  uint32_t flen = r.get<uint32_t>();
  if (flen > 4096 || flen > r.n - r.off) throw std::invalid_argument("snapshot is truncated or corrupt (fingerprint)");
  std::string fp(flen, '\0');
  r.raw(fp.data(), flen);
  if (fp != m.fingerprint)
    throw std::invalid_argument("snapshot belongs to a different model (fingerprint '" + fp + "', model '" +
                                m.fingerprint + "')");
  const std::vector<uint32_t> guard = m.family->shape_guard(m);
  for (size_t i = 0; i < guard.size(); ++i) {
    const uint32_t v = r.get<uint32_t>();
    if (v == guard[i]) continue;
    if (i == 0 && m.family->tag)
      throw std::invalid_argument(std::string("snapshot is not a ") + m.family->name + " snapshot (no " +
                                  m.family->name + " tag in its shape guard: another model family's)");
    throw std::invalid_argument("snapshot model shape does not match this model");
  }
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
  TailReader r{tail, size};
  return m.page_layout->full_groups(read_header(m, r));
}

State restore(const Model& m, const uint8_t* data, size_t size, const uint8_t* const* pages,
              const size_t* page_sizes, size_t npages) {
  const int V = m.cfg.vocab;
  TailReader r{data, size};
  const int64_t n = read_header(m, r);
  State s = State::shell(m, n);  // a snapshot's buffers: only what n tokens use
  const PageLayout& L = *m.page_layout;
  // exact expected size: header so far + tokens + flag + [logits] + tail floats + checksum
  const size_t after_tokens = r.off + 4 * (size_t)n;
  if (after_tokens + 1 > size) throw std::invalid_argument("snapshot is truncated");
  const uint8_t has_logits = data[after_tokens];
  if (has_logits > 1) throw std::invalid_argument("snapshot is corrupt (logits flag)");
  const int64_t full = L.full_groups(n);
  const size_t expect = after_tokens + 1 + (has_logits ? 4 * (size_t)V : 0) +
                        4 * (size_t)(s.tail->floats(n) + L.used_floats(full, n)) + 8;
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
    if (t < 0 || t >= V) throw std::invalid_argument("snapshot is corrupt (token id out of range)");
  r.off += 1;
  if (has_logits) {
    s.last_logits.resize(V);
    r.floats(s.last_logits.data(), V);
  }
  s.tail->read(r, n);
  for (size_t k = 0; k < npages; ++k) {
    auto g = std::make_shared<PageGroup>(L.group_floats, L.arrays.size());
    std::memcpy(g->data.get(), pages[k], page_sizes[k]);
    for (size_t a = 0; a < L.arrays.size(); ++a) g->fill[a] = L.arrays[a].rows;
    s.pages.groups.push_back(std::move(g));
  }
  // The partial group: its rows appended as the family did (the first allocates the group),
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

// cairn kernel: mutable per-sequence state (what HF's DynamicCache holds, digest §3).
//
// Design notes
//  * Position of the next token is n. Window rows live in a ring of W-1 rows where the row of
//    absolute position p sits in slot p % (W-1); no head index is needed, n determines it.
//  * Compressor partial buffers hold raw projections for positions (n - n%rate) .. n-1, slot
//    i = position % rate; gates are stored WITHOUT position bias (HF's buffer_gate convention).
//  * CSA overlap = Ca half of the last completed window, gate INCLUDING ape[:, :dim]; valid iff
//    n >= rate.
//  * Compressed rows (entries) are append-only and live in shared page groups (cairn/pages.h);
//    everything else here is the small mutable tail, owned by one state.
//  * Nothing is recomputed on restore: the snapshot carries exactly these tensors.
//  * What a state of n tokens reads of each buffer is a prefix: window rows 0..n-1 while n < W-1
//    (position p sits in row p), compressor slots 0..n%rate-1, the overlap once n >= rate. A
//    snapshot holds only those prefixes (its memory is what it counts, whatever W and the rates);
//    live() gives a state the full buffers back, zeros past the prefixes, as restore from a blob
//    always did (nothing past them is read before it is written).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cairn/family.h"
#include "cairn/model.h"
#include "cairn/pages.h"

namespace cairn {

struct CompState {
  int rate = 0, dim = 0, cw = 0;   // cw = width of raw projection (2*dim for CSA, dim for HCA)
  int arr = -1;                    // this compressor's array in the page layout
  int64_t rows = 0;                // entries: [rows = n/rate, dim] final (normed + RoPE'd) rows, in pages
  std::vector<float> buf_kv, buf_gate;  // [rate, cw] raw projections (gate without ape)
  std::vector<float> ov_kv, ov_gate;    // [rate, dim] overlap (CSA only; gate includes ape)
  int64_t n_entries() const { return rows; }
};

// DeepSeek-V4's tail: one per layer (families/dsv4/dsv4.h: Dsv4Tail).
struct LayerState {
  std::vector<float> win;  // [W-1, Dh] ring, post kv_norm + RoPE
  CompState comp;          // CSA / HCA compressor (unused for sliding)
  CompState icomp;         // CSA indexer compressor (keys, dim = Di)
};

// The undo record of one speculative call (verify): what its tokens overwrote in the state's own
// tail and which compressed rows they appended, each tagged with the position of the token that
// did it. Undoing, newest first, everything tagged >= n' leaves every location as the last write of
// a position < n' left it: the state plain decoding of the first n' tokens gives, because a token's
// writes are the same bits whatever the chunk (forward.h). Bounded by the call's length.
struct Journal {
  int64_t n0 = 0, n1 = 0;                     // the call fed positions [n0, n1); rewind keeps >= n0
  struct Write {
    float* dst;
    int64_t pos, off, len;                    // saved[off, off + len) held dst's floats before
  };
  std::vector<Write> writes;
  std::vector<float> saved;
  std::vector<std::pair<CompState*, int64_t>> appends;  // (compressor, position) per appended row
  std::vector<float> logits;                  // [n1 - n0, V]: last_logits after each position
  std::vector<float> logits_before;           // last_logits before the call
  void save(float* dst, int64_t len, int64_t pos) {
    writes.push_back({dst, pos, (int64_t)saved.size(), len});
    saved.insert(saved.end(), dst, dst + len);
  }
  // Reserve the most a call of S tokens records (journal_bound), so the record never reallocates
  // and holds no more than journal_bytes(c, S): no geometric growth past the figure.
  void reserve(const Config& c, int64_t S);
  int64_t held_bytes() const;  // bytes its buffers hold as allocated
};

// The most a verify of S tokens records, per buffer. Per token and layer: its window row
// (Dh floats) and each compressor's two buffer slots (2 cw); per compressor window it completes
// (at most ceil(S / rate) in S consecutive positions): one appended row and, for CSA, the two
// overlap arrays (2 rate dim); and S + 1 rows of logits (after each token, and before the call).
struct JournalBound {
  int64_t writes = 0, floats = 0, appends = 0, logits = 0;
};
JournalBound journal_bound(const Config& c, int64_t S);
// Bytes of the undo record a verify of S tokens keeps until the state's next call (exact upper
// bound of Journal::held_bytes): about 1 MB per token at V4-Flash width, half of it logits.
int64_t journal_bytes(const Config& c, int64_t S);

// Owns a state's journal; a copy (a snapshot, a restored state) starts without one.
struct JournalSlot {
  std::unique_ptr<Journal> j;
  JournalSlot() = default;
  JournalSlot(const JournalSlot&) {}
  JournalSlot(JournalSlot&&) = default;
  JournalSlot& operator=(const JournalSlot&) { j.reset(); return *this; }
  JournalSlot& operator=(JournalSlot&&) = default;
};

// Owns a state's family tail; copying a state copies its tail.
struct TailSlot {
  std::unique_ptr<StateTail> p;
  TailSlot() = default;
  explicit TailSlot(std::unique_ptr<StateTail> t) : p(std::move(t)) {}
  TailSlot(const TailSlot& o) : p(o.p ? o.p->clone() : nullptr) {}
  TailSlot(TailSlot&&) = default;
  TailSlot& operator=(const TailSlot& o) { p = o.p ? o.p->clone() : nullptr; return *this; }
  TailSlot& operator=(TailSlot&&) = default;
  StateTail* operator->() const { return p.get(); }
  StateTail& operator*() const { return *p; }
};

// A State: a live one (full-size buffers) or a snapshot's (State::snapshot: only the used prefixes).
// Copying one copies its buffers as they are and shares every page group.
struct State {
  const Model* model = nullptr;
  int64_t n = 0;
  std::vector<int32_t> tokens;      // [n]
  std::vector<float> last_logits;   // [V] or empty
  TailSlot tail;                    // the family's mutable part (cairn/family.h)
  PageTable pages;                  // every append-only row the family pages, in token order
  JournalSlot journal;              // set only by a speculative call (forward.h: verify), until the next call

  explicit State(const Model& m);  // a live state: no tokens, every buffer at full size (zeros)
  // A snapshot's empty shell for n tokens: each buffer only the prefix n tokens use (zeros); n,
  // tokens, logits and pages are left empty for the caller (restore) to fill.
  static State shell(const Model& m, int64_t n);
  // A snapshot of this state: its buffers' used prefixes, tokens and logits copied, every page
  // group shared, no journal. Allocates only what it copies.
  State snapshot() const;
  // A live state of model m equal to this snapshot: full-size buffers, the prefixes copied in.
  State live(const Model& m) const;
  template <class T> T& tail_as() const { return static_cast<T&>(*tail); }
  const float* entry(const CompState& cs, int64_t i) const { return pages.row(cs.arr, i); }
  void append_entry(CompState& cs, const float* row);
  int64_t payload_bytes() const;  // the live state: tail and rows, as the digest counts them
  int64_t held_bytes() const;     // what its own buffers hold as allocated (all but page groups)
  int64_t snapshot_bytes() const; // held_bytes() of snapshot(), without taking it
  int64_t full_groups() const { return pages.layout->full_groups(n); }
  // Journaled writes: the hooks attention and the compressors call before they overwrite
  // (no-ops outside a speculative call).
  void will_write(float* dst, int64_t len, int64_t pos) {
    if (journal.j) journal.j->save(dst, len, pos);
  }
  void will_append(CompState& cs, int64_t pos) {
    if (journal.j) journal.j->appends.emplace_back(&cs, pos);
  }

 private:
  State(const Model& m, int64_t used);  // buffers sized for `used` tokens (< 0: full size)
};

// Serialized snapshot: a tail blob (everything a state holds but its full page groups) plus the
// full groups' bytes, each exactly group_bytes, in order. See state.cpp for the tail's layout.
// 4: the CSA indexer's keys as panels in their groups (3: paged, rows row-major; 2: one whole blob)
// (DeepSeek-V4's; each family has its own, FamilyOps::snapshot_version.)
constexpr uint32_t SNAPSHOT_VERSION = 4;
size_t tail_size(const State& s);
void tail_into(const State& s, uint8_t* out);  // out has tail_size(s) bytes
// Throws std::invalid_argument with a clear message on any malformed input. pages[k] has
// page_sizes[k] bytes; there must be exactly as many as the tail says, each group_bytes long.
State restore(const Model& m, const uint8_t* tail, size_t size, const uint8_t* const* pages,
              const size_t* page_sizes, size_t npages);
// Four-lane multiply-xorshift checksum over 8-byte words (corruption, not an adversary).
uint64_t blob_checksum(const uint8_t* p, size_t n);
// The number of full page groups a tail blob says it needs (validates the header only).
int64_t tail_full_groups(const Model& m, const uint8_t* tail, size_t size);

}  // namespace cairn

// cairn kernel: what a model family provides to the shared state, snapshot and forward code.
//
// Design notes (docs/design/families.md §1, docs/architecture.md "What a family provides")
//  * A family is a table of plain functions (FamilyOps) plus one virtual class, its StateTail: the
//    small mutable part of a state it owns (V4: window ring and compressor buffers; Qwen3.5: conv
//    rows and recurrent states). Everything append-only goes in the shared page groups (pages.h).
//  * The shared code (forward.cpp, state.cpp, bind_state.cpp) keeps the bookkeeping every family has
//    alike: tokens, last logits, page groups, the snapshot header and checksum, the partial group's
//    rows. It asks the family for the rest, so a third family is a new folder, not edits elsewhere.
//  * Model::family defaults to DeepSeek-V4's table: a Model built field by field (the ISA harness)
//    is a V4 one, as before.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace cairn {

struct Model;
struct State;

// The snapshot tail's cursors. Writer: into a buffer sized from the family's floats(n) beforehand.
// Reader: every read is bounds-checked ("snapshot is truncated").
struct TailWriter {
  uint8_t* out;
  size_t off = 0;
  void raw(const void* p, size_t n) {
    if (n) std::memcpy(out + off, p, n);  // an empty buffer's data() may be null: memcpy(…, nullptr, 0) is UB
    off += n;
  }
  template <class T> void put(T v) { raw(&v, sizeof v); }
  void floats(const float* p, int64_t n) { raw(p, sizeof(float) * (size_t)n); }
};
struct TailReader {
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

// A state's family-owned tail. A live one has full-size buffers; a snapshot's holds only what its
// n tokens read (a prefix), so its memory is what it counts.
class StateTail {
 public:
  virtual ~StateTail() = default;
  virtual std::unique_ptr<StateTail> clone() const = 0;                    // as is
  virtual std::unique_ptr<StateTail> snapshot(int64_t n) const = 0;        // the used prefixes of n tokens
  virtual std::unique_ptr<StateTail> live(const Model& m, int64_t n) const = 0;  // full size, prefixes copied in
  virtual int64_t floats(int64_t n) const = 0;         // floats write(n) puts in the blob
  virtual void write(TailWriter& w, int64_t n) const = 0;
  virtual void read(TailReader& r, int64_t n) = 0;     // into a tail made for n tokens
  virtual int64_t held_floats() const = 0;             // its buffers as allocated
  virtual int64_t shape_bytes(bool allocated) const = 0;  // its bookkeeping besides the floats
};

// Rows r0..r0+S-1 of a multi-state call: S tokens of one state at positions pos0..
struct Seg {
  State* st;
  int64_t pos0;
  int r0, S;
};

struct FamilyOps {
  const char* name;           // "deepseek_v4", "qwen3_5"
  uint32_t snapshot_version;  // of its tail blob (V4: 4)
  // The first shape-guard word when it is a tag (0: none, V4's guard starts with the vocabulary
  // size): a reader of another family names the blob's family instead of a version mismatch.
  uint32_t tag;
  bool supports_verify;       // speculative calls (verify/rewind) journal this family's writes
  // A tail for `used` tokens' prefixes (used < 0: a live state's full-size buffers, zeros).
  std::unique_ptr<StateTail> (*make_tail)(const Model& m, int64_t used);
  // The snapshot header's shape words: a reader refuses a blob whose words differ.
  std::vector<uint32_t> (*shape_guard)(const Model& m);
  // Floats of the page rows n tokens append (State::payload_bytes).
  int64_t (*entry_floats)(const Model& m, int64_t n);
  // The decoder over nseg segments (tokens back to back, S rows in all): updates each segment's
  // state tail and pages (not n, tokens or logits: the caller's), returns the logits of rows
  // r0..S-1 [S - r0, V].
  std::vector<float> (*run)(const Model& m, const Seg* segs, int nseg, const int32_t* tokens, int S, int r0);
  // Why a blob of another version cannot be read (appended to the version error), or "".
  std::string (*version_note)(uint32_t version);
};

extern const FamilyOps kDsv4Ops;  // families/dsv4/family.cpp
// Every family this build has (families/registry.cpp), null-terminated.
extern const FamilyOps* const kFamilies[];

}  // namespace cairn

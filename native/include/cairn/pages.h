// cairn kernel: the append-only part of a state in immutable, shared pages.
//
// Design notes
//  * A state's compressed KV rows and indexer keys only ever grow, and a row never changes once
//    written. They live in page groups: group k holds, for every compressor of every layer, the
//    rows that tokens [k*P, (k+1)*P) emit (P = page_tokens, a multiple of every compress rate, so
//    each array's group k fills exactly when the state reaches (k+1)*P tokens). One group is one
//    allocation, one unit of sharing, accounting and disk storage.
//  * Groups are reference-counted (shared_ptr) and shared between live states and snapshots. A
//    write goes through PageTable::write_row, which first copies the group when anyone else holds
//    it (copy on write). Rows are append-only, so in practice only a state's last, partial group
//    is ever copied, and a full group is never written again: nothing can change a row another
//    state or snapshot sees, and a group in use cannot be freed while a reference exists.
//  * Every live group is counted in one process-wide pool (page_pool_stats), which is what the
//    daemon's memory plan reads: live states and checkpoints share one pool.
//  * The CSA indexer's keys (arrays 2*layer + 1) are kept in the panel layout the packed
//    micro-kernel reads, [rows/16][dim][16], when a group holds a multiple of 16 of them (V4's
//    defaults: 64), so the indexer scores them in place and nothing is re-packed per token. A
//    panel is final once its 16 rows are written; the lanes of the last, partial one past the fill
//    are zero (zeroed when the panel is started, and again when a row is dropped), so the bytes of
//    a group depend only on the rows written. Every other array is row-major [rows][dim].
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace cairn {

struct Config;

// Where each append-only array sits inside a page group. Arrays are indexed 2*layer + k,
// k = 0 the attention compressor (CSA / HCA), k = 1 the CSA indexer's compressor; rows == 0 for
// arrays a layer does not have.
struct PageLayout {
  int64_t page_tokens = 0;  // P
  struct Array {
    int64_t off = 0;  // floats from the group's start
    int dim = 0;      // floats per row
    int rows = 0;     // rows per group = P / rate
    bool panels = false;  // [rows/16][dim][16] (kPanel-row panels, k-major) instead of [rows][dim]
    // Offset of row r's column 0 inside the array, and the step between its columns.
    int64_t at(int r) const { return panels ? (int64_t)(r / 16) * dim * 16 + r % 16 : (int64_t)r * dim; }
    int stride() const { return panels ? 16 : 1; }
    // Floats from the array's start that hold rows [0, used): whole panels in the panel layout.
    int64_t span(int used) const { return panels ? (int64_t)(used + 15) / 16 * 16 * dim : (int64_t)used * dim; }
  };
  std::vector<Array> arrays;  // [2 * n_layers]
  int64_t group_floats = 0;
  int64_t group_bytes() const { return 4 * group_floats; }
  // Full groups a state of n tokens holds. A model without compressed layers has no arrays, so no
  // group is ever written: it holds none, however long the state.
  int64_t full_groups(int64_t n) const { return group_floats ? n / page_tokens : 0; }
  // Floats of the arrays' rows that a state of n tokens holds in group k (k's fill).
  int64_t used_floats(int64_t group, int64_t n) const;
};

// Default page size in tokens: the smallest multiple of every compress rate that is >= 256, so a
// V4-Flash group (20 CSA + 20 HCA layers) is ~3.3 MB and a partial one costs little to copy.
constexpr int64_t DEFAULT_PAGE_TOKENS = 256;
// page_tokens 0 picks the default; otherwise it must be a multiple of every compress rate.
std::shared_ptr<const PageLayout> make_page_layout(const Config& c, int64_t page_tokens);

// One page group: rows of every array for one token span. Immutable once shared (see notes).
struct PageGroup {
  const uint64_t id;                    // unique in the process (accounting key), never reused
  const int64_t nfloats;
  std::unique_ptr<float[]> data;        // [group_floats], uninitialised past each array's fill
  std::vector<int> fill;                // [arrays] rows written so far (a copy copies only these)
  PageGroup(int64_t nfloats, size_t narrays);
  PageGroup(const PageGroup&) = delete;
  PageGroup& operator=(const PageGroup&) = delete;
  ~PageGroup();
};

struct PagePoolStats {
  int64_t groups, bytes;
};
PagePoolStats page_pool_stats();

// A state's page table: its groups in token order. Copying a table shares every group.
struct PageTable {
  std::shared_ptr<const PageLayout> layout;
  std::vector<std::shared_ptr<PageGroup>> groups;

  // Array arr's row i: its column c is at row(arr, i)[c * layout->arrays[arr].stride()].
  const float* row(int arr, int64_t i) const {
    const PageLayout::Array& a = layout->arrays[arr];
    return groups[i / a.rows]->data.get() + a.off + a.at((int)(i % a.rows));
  }
  // Array arr's rows in group g (its layout's start: [rows][dim], or panels).
  const float* group_rows(int arr, int64_t g) const { return groups[g]->data.get() + layout->arrays[arr].off; }
  // Writes array arr's row i (dim floats): allocates the group when it is new, copies it first
  // when another table or snapshot holds it.
  void write_row(int arr, int64_t i, const float* src);
  // Forget array arr's row i, its last (a rewound speculative token's): the group's fill drops to
  // i (a shared group is copied first, so no other holder sees it), and a trailing group left with
  // no rows is released, as if the row had never been written.
  void drop_last_row(int arr, int64_t i);
  // Replace every group with a private copy (a snapshot that shares nothing: today's full copy).
  void unshare();
};

}  // namespace cairn

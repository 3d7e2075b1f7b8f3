// cairn kernel: the panel packer -- every packed matrix as a job, where its panels go in the arena
// (= the packed cache file's payload, packed_file.h), how a job is packed and how the Linears are
// bound to their panels afterwards.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cairn/kernels.h"
#include "cairn/model.h"

namespace cairn {

// One packed matrix: rows r0..r0+n of src, or (up set) src's and up's rows interleaved per panel.
// The row lists are built only when the job is packed (they are ~16 bytes per row: ~1.4 GB for
// all of V4-Flash's experts at once, and nothing at all when the panels come from the cache file).
struct PackPlan;
struct PackJob {
  Linear* dst;
  const Linear* src;
  const Linear* up;     // fused gate/up: src is the gate
  int r0, n;
  bool bf16;            // store BF16 panels (every source row holds BF16 values)
  QFmt qf;              // else: quantized panels of the stored codes
  int nrows() const { return up ? 2 * ((src->out + kPanel - 1) / kPanel) * kPanel : n; }
  std::vector<const float*> rows() const;
  std::vector<const uint16_t*> rows16(const PackPlan& P) const;  // bf16: the stored values' rows
  std::vector<QRow> qrows() const;
};

struct PackPlan {
  std::vector<PackJob> jobs;
  std::vector<int64_t> key;      // [jobs] routed expert key (layer * E + e), -1 = dense
  std::vector<int> part;         // [jobs] 0 = fused w1/w3, 1 = w2
  std::vector<Linear*> sources;  // every Linear whose row-major source is dropped afterwards
  // the sources of BF16 jobs: fp32 buffer -> stored values (a buffer no fp32 job reads is never
  // widened: Model::bf16_unwidened)
  std::unordered_map<const float*, const uint16_t*> bf16_rows;
  std::vector<size_t> code_bytes;  // [jobs] quantized: where the scales start in the job's bytes
  std::vector<size_t> bytes;       // [jobs] panel bytes
  std::vector<size_t> offset;      // [jobs] from the arena start (experts: dense + key * slot + ...)
  std::vector<size_t> span;        // [jobs] bytes the job owns (its panels + zero padding)
  size_t dense = 0;    // dense section bytes (a multiple of kPage)
  size_t slot = 0;     // bytes of one expert slot (a multiple of kPage)
  size_t experts = 0;  // nkeys * slot
  size_t total = 0;    // dense + experts
  int64_t nkeys = 0;   // n_layers * E
  uint64_t layout = 0; // the header's layout hash: the format's key, then every job's format, shape, offset
};

// Collects every Linear to pack (and the fused expert gate/up pairs) and lays them out; sets the
// Linears' fused and grouped shapes (w13, sw13, wo_a_g) but reads no weight.
PackPlan plan_packing(Model& m);
// Packs job j into buf (span[j] bytes, zeroed first: the file's bytes depend on the weights only).
void pack_job(const PackPlan& plan, size_t j, void* buf);
// Points every job's Linear at its panels in bufs[j] (null: a paged expert, bound per call).
void bind_panels(const PackPlan& plan, const std::vector<void*>& bufs);
// The row-major sources of packed matrices are no longer needed: forget and free them.
void drop_sources(Model& m, const PackPlan& plan);
// Drops a routed expert's source pages from this process (streaming pack, after it is written).
void page_out_sources(const Linear& L);
// Drops the stored bytes job J has packed (quantized codes, BF16 values: pages of the weight files'
// mappings) from this process: otherwise every source page packing read stays resident until the load
// ends, and the load peaks at stored + packed bytes. Widened fp32 rows are freed by drop_sources.
void page_out_stored(const PackPlan& P, const PackJob& J);

}  // namespace cairn

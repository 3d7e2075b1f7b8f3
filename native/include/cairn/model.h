// cairn kernel: immutable model (config + weights) for the DeepSeek-V4 forward pass.
//
// Design notes
//  * All compute is fp32. F32 tensors are zero-copy views of the caller's memory-mapped arrays
//    (the binding layer keeps the owning Python objects alive); BF16/F16 ones are widened to
//    fp32 once at load into buffers owned by `Model::owned`.
//  * Weight matrices arrive in the PyTorch nn.Linear convention, W[out, in], and are then packed
//    (pack_weights) into 16-row panels, the only form compute reads: a once-per-load copy that
//    spares every GEMM call from re-packing (and frees the widened BF16/F16 rows). BF16
//    matrices keep BF16 panels (half the bytes; widening to fp32 is exact, so results are the
//    same as fp32 panels of the widened values) unless widen_bf16 is set. Quantized matrices
//    (FP8 e4m3 / FP4 e2m1 with ue8m0 scales) keep panels of their stored codes, widened and
//    scaled exactly in registers: the bits of fp32 panels of the dequantized weights.
//    All panels share one arena, or are mapped from a packed cache file written at an earlier start.
//    The embedding stays row-major (row lookups; a BF16 one is read from the mapping).
//  * Threading: OpenMP is the single thread pool (no BLAS library, no second pool), and every
//    parallel region says `num_threads(model.threads)` explicitly, because the compute runs on
//    whatever Python thread calls in (the OMP ICV is per thread).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "cairn/family.h"
#include "cairn/pages.h"

namespace cairn {

class ExpertPager;  // expert_cache.h
struct RouteTrace;

constexpr int MAX_CHUNK = 512;

enum class AttnType { Sliding = 0, CSA = 1, HCA = 2 };

struct Config {
  int vocab = 0, D = 0, n_layers = 0, H = 0, Dh = 0, r = 0, Rq = 0, G = 0, Ro = 0, W = 0;
  std::vector<AttnType> layer_types;
  std::vector<bool> hash_moe;
  int csa_rate = 4, hca_rate = 128;
  double rope_theta = 1e4, compress_rope_theta = 1.6e5;
  bool compress_yarn = true;
  double yarn_factor = 16, yarn_orig = 65536, yarn_beta_fast = 32, yarn_beta_slow = 1;
  int N = 4, sinkhorn_iters = 20;
  float hc_eps = 1e-6f, rms_eps = 1e-6f;
  int E = 0, k = 0, I = 0, n_shared = 1;
  float routed_scale = 1.5f, swiglu_limit = 10.f;
  int nI = 0, Di = 0, topk = 0;
};

// A dense fp32 tensor view. `data` points either into caller memory or into Model::owned.
struct Tensor {
  const float* data = nullptr;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

// Stored weight formats besides fp32/BF16/F16 (the official DeepSeek-V4 quantization).
enum class QFmt : uint8_t {
  None = 0,
  E4M3 = 1,  // FP8 e4m3fn, one ue8m0 scale per 128x128 block
  E2M1 = 2,  // FP4 e2m1, two per byte (low nibble = even column), one ue8m0 scale per row per 32
  Ggml = 3,  // a GGUF block format (Linear::codec): rows of blocks as llama.cpp stores them
  E4M3F = 4,  // FP8 e4m3fn, one float scale per 128x128 block (Qwen's FP8 releases, `weight_scale_inv`)
};
struct BlockCodec;  // codecs/codec.h
constexpr int kFp8Block = 128, kFp4Group = 32;
// Scale group along k in quantized panels (one scale byte per lane per group).
constexpr int qgroup(QFmt f) { return f == QFmt::E2M1 ? kFp4Group : kFp8Block; }

struct Linear {  // W [out, in]
  const float* w = nullptr;  // row-major source; only read while packing (null afterwards)
  const float* p = nullptr;  // packed panels [ceil(out/16)][in][16] (packed.cpp), what compute reads
  int out = 0, in = 0;
  const uint16_t* p16 = nullptr;  // instead of p: the same panels holding BF16 bit patterns
  // Instead of p: quantized panels as stored (packed.cpp): codes [ceil(out/16)][in][16] bytes
  // (E4M3) or [..][in][8] (E2M1, lane pairs in a byte) and per-lane scale exponents
  // [ceil(out/16)][ceil(in/group)][16].
  QFmt qf = QFmt::None;
  // Ggml: pq holds panels of 16 rows' blocks byte-interleaved, [ceil(out/16)][in/block][bytes][16], no scales.
  const uint8_t* pq = nullptr;
  const uint8_t* pqs = nullptr;
  const BlockCodec* codec = nullptr;  // Ggml: the GGUF block format of q / pq
  // Quantized row-major source (only while packing): codes [out][in] or [out][in/2], scales
  // [ceil(out/128)][ceil(in/128)] (E4M3) or [out][in/32] (E2M1), ue8m0 bytes; Ggml: the stored
  // rows [out][in/block*bytes], no scales.
  const uint8_t* q = nullptr;
  const uint8_t* qs = nullptr;
  const float* qfs = nullptr;  // E4M3F: float block scales [ceil(out/128)][ceil(in/128)] (only while packing)
};

struct CompressorW {
  Linear wkv, wgate;        // [cw, D] each; cw = 2*dim (CSA/indexer) or dim (HCA)
  const float* ape = nullptr;   // [rate, cw] position bias
  const float* norm = nullptr;  // [dim]
};

struct LayerW {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;         // [D]
  Linear hc_attn, hc_ffn;  // HC mixing fn [(2+N)N, N*D]
  const float *hc_attn_base = nullptr, *hc_attn_scale = nullptr;  // [(2+N)N], [3]
  const float *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;  // [Rq,D] [H*Dh,Rq] [Dh,D] [G*Ro, H*Dh/G] [D, G*Ro]
  std::vector<Linear> wo_a_g;          // wo_a split per output group: G x [Ro, H*Dh/G]
  const float *q_norm = nullptr, *kv_norm = nullptr, *sink = nullptr;  // [Rq] [Dh] [H]
  CompressorW comp;   // CSA / HCA
  CompressorW icomp;  // CSA indexer
  Linear iwq_b, iweights;  // [nI*Di, Rq], [nI, D]
  // MoE
  Linear gate;                     // [E, D]
  const float* gate_bias = nullptr;  // [E] (topk layers)
  std::vector<int32_t> tid2eid;      // [V, k] (hash layers)
  std::vector<Linear> w1, w2, w3;    // per expert: [I,D], [D,I], [I,D]
  Linear sw1, sw2, sw3;              // shared expert (width I * n_shared)
  // gate and up fused for one pass: packed rows are 16 w1 rows, the same 16 w3 rows, ...
  // ([2*ceil(I/16)*16, D]); the SwiGLU reads gate and up from neighbouring panels.
  std::vector<Linear> w13;
  Linear sw13;
};

struct Model {
  // The family's table (cairn/family.h); its config and weights are cfg/layers for DeepSeek-V4, and
  // family_model for the others (cfg then holds only vocab, D and n_layers: what the shared code reads).
  const FamilyOps* family = &kDsv4Ops;
  std::shared_ptr<const void> family_model;
  Config cfg;
  std::string fingerprint;
  int threads = 1;
  bool batched_indexer = true;
  std::shared_ptr<const PageLayout> page_layout;  // how states page their entries (cairn/pages.h)
  const float *embed = nullptr, *norm = nullptr;  // [V,D] [D]
  const uint16_t* embed16 = nullptr;  // instead of embed: BF16 rows, widened per lookup (the mapping)
  const uint8_t* embedq = nullptr;    // instead of embed: GGUF block rows [V][D/block*bytes], decoded per lookup
  const BlockCodec* embed_codec = nullptr;
  Linear head;                                    // [V,D]
  Linear hc_head;  // [N, N*D]
  const float *hc_head_base = nullptr, *hc_head_scale = nullptr;  // [N] [1]
  std::vector<LayerW> layers;
  std::vector<float> inv_freq_main, inv_freq_comp;  // [r/2]
  // widened BF16/F16 weights; uninitialised until widened, so a matrix source that is never
  // widened (panels from the packed cache) never touches its pages
  std::vector<std::unique_ptr<float[]>> owned;
  // those of `owned` that were BF16 -> their stored values (alive while packing): a matrix packed as
  // BF16 panels is packed from these, and its fp32 buffer is never written
  std::unordered_map<const float*, const uint16_t*> bf16_sources;
  std::unordered_set<const float*> bf16_unwidened;  // set by the packing plan: no reader needs their fp32
  bool widen_bf16 = false;  // pack BF16 matrices as fp32 panels instead of bf16 ones
  struct FreeDeleter { void operator()(void* p) const { std::free(p); } };
  std::vector<std::unique_ptr<void, FreeDeleter>> packed;  // the arena of every Linear's panels (2 MiB aligned)
  std::shared_ptr<void> packed_map;  // instead: the panels mapped from a packed cache file
  bool packed_from_cache = false, packed_cache_written = false;
  size_t packed_bytes = 0;
  uint64_t packed_layout = 0;  // the packed file header's layout key for these panels
  // a shared flock on the packed cache file while this Model lives (null: none): the daemon's
  // cache trimming never removes a file in use
  std::shared_ptr<void> cache_hold;
  // Packed layout: the dense section, then one 4 KiB-aligned slot per routed expert (key = layer*E+e).
  size_t dense_bytes = 0, expert_slot_bytes = 0, expert_bytes_total = 0;
  size_t expert_budget = 0;  // expert_cache_bytes when paging, else 0
  // Routed experts paged from the packed cache file (null: every expert resident or mapped).
  std::shared_ptr<ExpertPager> pager;
  std::shared_ptr<RouteTrace> trace;  // always set (pack_weights)
};

// Routed experts under a byte budget (0, or at least every expert's bytes: all resident).
struct PagingOptions {
  size_t budget = 0;
  std::string policy = "cycle";
  int readers = 4;  // reader threads (1..16); they block in pread, so more than cores is fine
};

void init_rope(Model& m);
// Packs every Linear (and the fused expert gate/up pairs) into panels; `threads` pack in parallel.
// cache_path: when that file holds these panels (same fingerprint and layout), map it instead of
// packing, and prepare_sources (which fills the row-major sources) is never called; else pack
// and write the file atomically (failures to write leave packed_cache_written false).
// With paging (opt.budget below the experts' bytes), the cache file is required: routed experts
// are read from it into the slot pool on demand and never kept resident or mapped; a missing file
// is written by a streaming pack (dense arena, then each expert through a scratch buffer).
void pack_weights(Model& m, int threads, const std::string& cache_path = "",
                  const std::function<void()>& prepare_sources = {}, const PagingOptions& opt = {});

}  // namespace cairn

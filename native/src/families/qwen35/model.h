// cairn kernel, Qwen3.5 family (qwen3_5 dense, qwen3_5_moe): config, weights and the forward pass.
//
// Design notes (docs/design/families.md §2-§4)
//  * Hybrid stack: each layer is Gated DeltaNet ("linear_attention") or gated full attention, then
//    a MoE (softmax top-k + a gated shared expert) or a dense SwiGLU MLP. All compute is fp32.
//  * Weights are folded once at load so compute reads them as stored: every RMSNorm weight except
//    the GDN output norm becomes 1+w (HF's `1.0 + w.float()`, the same fp32 bits), A_log becomes
//    -exp(A_log) (in double, rounded once), conv1d is transposed to [K, conv_dim]. A GGUF stores
//    both already folded (`1 + w`, ssm_a = -exp(A_log), from the converter's fp32): those are taken
//    as stored (names `<norm>+1` and `linear_attn.ssm_a`), so compute reads the file's own values.
//    Matrices are packed into the shared panels (kernels.h `Linear`, packed.cpp) -- the product V4
//    uses: fp32 rows as fp32 panels, BF16 as BF16 panels (half the bytes, widened exactly), a GGUF
//    block format as its own blocks (formats/ggml_blocks.cpp), FP8 with float block scales as its
//    codes and scales (formats/fp8_e4m3_float_scale.cpp); each gives the same bits as fp32 panels
//    of the widened / dequantized weights.
//  * Per-token state (the shared cairn::State: Tail + pages): every write is per token -- one conv
//    row, one recurrence step, one K/V row -- so any split of a sequence into calls gives the same
//    bits (no chunked delta rule), and a snapshot between any two tokens is exact.
//  * This file and the others of the folder, except bind_qwen35.cpp, do not include pybind11: the
//    ISA harness (tests/native/test_isa_paths.py) compiles them as plain C++.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cairn/kernels.h"
#include "cairn/family.h"
#include "cairn/model.h"
#include "cairn/state.h"

namespace cairn::qwen35 {

enum class Mixer : uint8_t { Linear = 0, Full = 1 };

struct Config {
  int vocab = 0, D = 0, n_layers = 0;
  std::vector<Mixer> layer_types;
  float rms_eps = 1e-6f;
  bool tied = false;
  // full attention
  int H = 0, Hkv = 0, Dh = 0, r = 0;  // r: rotated channels (Dh * partial_rotary_factor, even)
  double rope_theta = 1e7;
  // Gated DeltaNet
  int K = 0, dk = 0, dv = 0, nk = 0, nv = 0;
  // MLP: E == 0 is the dense MLP of width I; else E routed experts (top k, width I) + a shared one (Is)
  int E = 0, k = 0, I = 0, Is = 0;
  int key_dim() const { return nk * dk; }
  int value_dim() const { return nv * dv; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  bool moe() const { return E > 0; }
  // Throws std::invalid_argument naming the field and what is allowed.
  void validate() const;
};

struct GdnW {
  Linear qkv, z, b, a;                    // [conv_dim, D] [value_dim, D] [nv, D] [nv, D]
  std::vector<float> conv;                // [K, conv_dim] (conv1d.weight [conv_dim, 1, K] transposed)
  std::vector<float> dt_bias, neg_A;      // [nv]: dt_bias, -exp(A_log)
  std::vector<float> norm;                // [dv] gated output norm, plain w (not 1+w)
  Linear out;                             // [D, value_dim]
  // out's columns in llama.cpp's tiled v-head order (k head fastest; a GGUF's quantized ssm_out,
  // whose blocks cannot be permuted): the core output is written in that order before out.
  bool out_tiled = false;
};

struct AttnW {
  Linear q, k, v, o;                      // [2*H*Dh, D] (query|gate per head) [Hkv*Dh, D] x2 [D, H*Dh]
  std::vector<float> q_norm, k_norm;      // [Dh], folded 1+w
};

// SwiGLU MLP: gate and up fused (per 16-row panel: 16 gate rows, the same 16 up rows), as V4's w13.
struct MlpW {
  Linear w13;                             // [2*Ip, D], Ip = I rounded up to 16
  Linear down;                            // [D, I]
  int I = 0;
};

struct LayerW {
  Mixer kind = Mixer::Linear;
  std::vector<float> in_norm, post_norm;  // [D], folded 1+w
  GdnW gdn;
  AttnW attn;
  // MoE
  Linear router;                          // [E, D]
  std::vector<MlpW> experts;              // [E]
  MlpW shared;                            // shared expert (MoE) or the dense MLP
  Linear shared_gate;                     // [1, D] (MoE only)
};

// A named tensor the loader reads (row-major, the caller keeps it alive while loading and, for the
// ones it says, for the model's life): float32 values; or BF16 bit patterns in bf16; or (codec set)
// a GGUF block format's stored rows [rows..., in / block * bytes] in q; or (fp8) FP8 e4m3fn codes
// [out, in] in q, whose block scales are the tensor `<name>_scale_inv` [ceil(out/128), ceil(in/128)]
// (Qwen's FP8 releases). shape is the logical one.
struct TensorView {
  const float* data = nullptr;
  std::vector<int64_t> shape;
  const uint8_t* q = nullptr;
  const BlockCodec* codec = nullptr;
  const uint16_t* bf16 = nullptr;
  bool fp8 = false;
};
using WeightMap = std::map<std::string, TensorView>;

struct FreeBytes {
  void operator()(void* p) const { std::free(p); }
};

// Immutable after load. Every matrix is packed into `arena`; `keep` holds the folded vectors.
struct Model {
  Config cfg;
  int threads = 1;
  const float* embed = nullptr;           // [V, D] row lookups (the caller's array, or `decoded`)
  std::vector<float> norm;                // [D], folded 1+w
  Linear head;                            // [V, D] (embed_tokens when tied)
  std::vector<LayerW> layers;
  std::vector<float> inv_freq;            // [r/2]
  std::vector<std::unique_ptr<void, FreeBytes>> arena;  // packed panels, one 64-byte aligned buffer a matrix
  std::vector<std::unique_ptr<float[]>> decoded;       // block-format tensors read as floats (embed, vectors)
  std::map<std::string, int> panel_formats;            // matrices by panel format ("F32", "BF16", "Q4_K", ...)
};

// Builds the model from canonical names (HF's without the `model.` / `model.language_model.`
// prefix; experts per expert `mlp.experts.{e}.{gate,up,down}_proj.weight` or fused
// `mlp.experts.gate_up_proj` [E, 2I, D] + `mlp.experts.down_proj` [E, D, I]). Throws
// std::invalid_argument naming a missing or misshapen tensor and the shape expected. `embed`
// (embed_tokens.weight) is used in place: it must outlive the model.
std::unique_ptr<Model> load(const Config& c, const WeightMap& w, int threads);

// A state's tail (families/qwen35/state.cpp): per GDN layer the last K-1 raw conv input rows and the
// recurrent state. The attention layers' K and V rows live in the state's page groups (arrays 2l and
// 2l+1, one row of Hkv*Dh floats a token; K after k_norm and RoPE).
struct LayerCache {
  std::vector<float> conv;  // [K-1, conv_dim] pre-conv rows, oldest first (zero before the sequence);
                            // a snapshot's: only its last min(n, K-1) rows
  std::vector<float> rec;   // [nv, dk, dv] (a snapshot of 0 tokens: empty)
};
struct Tail final : StateTail {
  const cairn::Model* model;
  std::vector<LayerCache> layers;  // [n_layers]; full-attention layers' stay empty
  Tail(const cairn::Model& M, int64_t used);  // buffers for `used` tokens (< 0: a live state's, zeros)
  std::unique_ptr<StateTail> clone() const override { return std::make_unique<Tail>(*this); }
  std::unique_ptr<StateTail> snapshot(int64_t n) const override;
  std::unique_ptr<StateTail> live(const cairn::Model& M, int64_t n) const override;
  int64_t floats(int64_t n) const override;
  void write(TailWriter& w, int64_t n) const override;
  void read(TailReader& r, int64_t n) override;
  int64_t held_floats() const override;
  int64_t shape_bytes(bool allocated) const override { return 0; }  // a few vector headers, not counted
};

// The family table (state.cpp) and what the shared Model holds for this family.
extern const FamilyOps kOps;
constexpr int64_t DEFAULT_PAGE_TOKENS = 64;  // 2.5 MiB a group at 35B-A3B (10 layers x 2 x 512 floats a token)
constexpr uint32_t kTag = 0x00353351u;        // "Q35\0": the shape guard's first word
// Makes M a Qwen3.5 model around m: its family table, cfg.vocab/D/n_layers, threads and page layout
// (page_tokens 0: DEFAULT_PAGE_TOKENS; any positive count up to 2^24).
void attach(cairn::Model& M, std::shared_ptr<const Model> m, int64_t page_tokens);
inline const Model& of(const cairn::Model& M) { return *static_cast<const Model*>(M.family_model.get()); }
// The decoder over the rows of nseg states (FamilyOps::run): logits of rows r0..S-1.
std::vector<float> run(const cairn::Model& M, const Seg* segs, int nseg, const int32_t* tokens, int S, int r0);

// The pieces (one file each), x/y [S, D]; y is the block's output (the residual is added by forward).
void gdn_block(const Model& m, int layer, LayerCache& lc, const float* x, int S, float* y);
void attention_block(const Model& m, int layer, PageTable& pages, int64_t pos0, const float* x, int S, float* y);
void mlp_block(const Model& m, int layer, const float* x, int S, float* y);

// 1/(1+e^-v) through the kernel's own exp (fexp): the same bits on every ISA, unlike libm's expf.
inline float sigmoid(float v) { return 1.f / (1.f + fexp(-v)); }
inline float silu(float v) { return v / (1.f + fexp(-v)); }
}  // namespace cairn::qwen35

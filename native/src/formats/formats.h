// cairn kernel: the stored formats of packed matrices, one file each (docs/architecture.md,
// "Weight formats"). packed.cpp has the one matrix product, over fp32 panels; every other format
// is a codec that lays its stored bytes out in panels of 16 rows at load and widens a k-span of
// them back to fp32 panels at compute time, exactly: the value it gives is the weight the
// format's reference dequantizer gives (HF's for FP8/FP4/BF16, gguf.quants.dequantize for GGUF
// blocks), so the product is the fp32 path's on the dequantized weights, bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/kernels.h"
#include "cairn/model.h"

namespace cairn {

// One codec's entry points. A format is one file defining one of these.
struct PanelCodec {
  const char* name;
  // Panel bytes of an N x K matrix: codes (or whole blocks), then scales (0 if the codes carry
  // them). c: the GGUF block codec (QFmt::Ggml only).
  size_t (*code_bytes)(const BlockCodec* c, int N, int K);
  size_t (*scale_bytes)(int N, int K);
  // rows (nullptr src = a zero row) -> codes and scales (the sizes above, zeroed by the caller).
  void (*pack)(const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t* scales);
  // out[j][k][l] (j < np, k < kc, l < 16) = the weight of row (p0 + j)*16 + l, column k0 + k;
  // k0 and kc are multiples of step(L) (kc may end at K).
  void (*decode)(const Linear& L, int p0, int np, int k0, int kc, float* out);
  int (*step)(const Linear& L);
};

// The codec of a quantized Linear's format (L.qf != None), or of BF16 panels (bf16 = true).
const PanelCodec& panel_codec(QFmt f);
const PanelCodec& bf16_codec();
// QFmt::E4M3F: throws std::invalid_argument naming `name` unless every scale is in [2^-100, 2^100].
void check_fp8_float_scales(const std::string& name, const float* s, size_t n);

// The per-lane scale bytes FP8 and FP4 panels share: [ceil(N/16)][ceil(K/group)][16], each the
// row's ue8m0 exponent + bias (the widened code carries 2^-bias).
void pack_lane_scales(QFmt f, const std::vector<QRow>& rows, int K, uint8_t* scales);
}  // namespace cairn

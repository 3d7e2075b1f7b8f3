// cairn kernel: FP8 e4m3fn panels with one float scale per 128 x 128 block (Qwen's FP8 releases:
// `weight_scale_inv`, BF16, any value -- not a power of two, so not the ue8m0 lanes of fp8_e4m3.cpp).
// Panels hold the code bytes as stored, one per lane per k ([ceil(N/16)][K][16], as fp8_e4m3.cpp),
// and each lane's scale per 128 columns as a float ([ceil(N/16)][ceil(K/128)][16]) times 2^8, which
// the widened code's 2^-8 (lanes.h) takes back. A code (4 significant bits) times a BF16 scale (8)
// is exact in fp32, so the widened weight is the dequantized weight's fp32 bits and the product is
// the fp32 panels' on those weights, bit for bit (Fp8FloatWiden, widen.h).
#include <cmath>
#include <stdexcept>
#include <string>

#include "formats.h"
#include "widen.h"

namespace cairn {
namespace {

size_t code_bytes(const BlockCodec*, int N, int K) { return (size_t)((N + kPanel - 1) / kPanel) * K * kPanel; }
size_t scale_bytes(int N, int K) {
  return (size_t)((N + kPanel - 1) / kPanel) * ((K + kFp8Block - 1) / kFp8Block) * kPanel * sizeof(float);
}

void pack(const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t* scale_bytes_) {
  const int np = (int)((rows.size() + kPanel - 1) / kPanel), ng = (K + kFp8Block - 1) / kFp8Block;
  float* scales = (float*)scale_bytes_;
  for (int p = 0; p < np; ++p) {
    uint8_t* cd = codes + (size_t)p * K * kPanel;
    float* sd = scales + (size_t)p * ng * kPanel;
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      if (n >= rows.size() || !rows[n].src) {
        for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = 0.f;  // a zero row: codes 0 = +0.0
        continue;
      }
      const Linear& L = *rows[n].src;
      const float* sc = L.qfs + (size_t)(rows[n].r / kFp8Block) * ng;
      for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = std::ldexp(sc[g], 8);
      const uint8_t* src = L.q + (size_t)rows[n].r * K;
      for (int k = 0; k < K; ++k) cd[(size_t)k * kPanel + l] = src[k];
    }
  }
}

int step(const Linear&) { return kFp8Block; }

}  // namespace

void check_fp8_float_scales(const std::string& name, const float* s, size_t n) {
  // Normal and far from both ends: code x scale stays a normal fp32 (the exactness above), and
  // scale x 2^8 in the panels cannot overflow.
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(s[i]) >= 0x1p-100f && std::fabs(s[i]) <= 0x1p100f))
      throw std::invalid_argument("weight '" + name + "' holds block scale " + std::to_string(s[i]) + " at " +
                                  std::to_string(i) + "; FP8 block scales must be finite and in [2^-100, 2^100] in magnitude");
}

extern const PanelCodec kFp8E4M3F{"F8_E4M3 (float block scales)", code_bytes, scale_bytes, pack,
                                  decode_with<Fp8FloatWiden>, step};

}  // namespace cairn

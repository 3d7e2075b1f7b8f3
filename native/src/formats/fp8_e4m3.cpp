// cairn kernel: FP8 e4m3fn panels (the official checkpoints' linears), one ue8m0 scale per 128 x 128
// block. Panels hold the code bytes as stored, one per lane per k ([ceil(N/16)][K][16]), and each
// lane's scale per 128 columns (lane_scales.cpp).
#include <algorithm>
#include <cstring>

#include "formats.h"
#include "widen.h"

namespace cairn {
namespace {

constexpr int kStride = kPanel;  // code bytes per k

size_t code_bytes(const BlockCodec*, int N, int K) { return (size_t)((N + kPanel - 1) / kPanel) * K * kStride; }
size_t scale_bytes(int N, int K) {
  return (size_t)((N + kPanel - 1) / kPanel) * ((K + kFp8Block - 1) / kFp8Block) * kPanel;
}

void pack(const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t* scales) {
  pack_lane_scales(QFmt::E4M3, rows, K, scales);
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    uint8_t* cd = codes + (size_t)p * K * kStride;
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      if (n >= rows.size() || !rows[n].src) continue;  // a zero row: codes 0 = +0.0 (zeroed by the caller)
      const uint8_t* src = rows[n].src->q + (size_t)rows[n].r * K;
      for (int k = 0; k < K; ++k) cd[(size_t)k * kStride + l] = src[k];
    }
  }
}

int step(const Linear&) { return kFp8Block; }

}  // namespace

extern const PanelCodec kFp8E4M3{"F8_E4M3", code_bytes, scale_bytes, pack, decode_with<Fp8Widen>, step};

}  // namespace cairn

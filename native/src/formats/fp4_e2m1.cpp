// cairn kernel: FP4 e2m1 panels (the official checkpoints' routed experts), one ue8m0 scale per
// row per 32 columns. Two lanes to a code byte ([ceil(N/16)][K][8]: lanes 2j low, 2j+1 high
// nibble in byte j), each lane's scale per 32 columns (lane_scales.cpp).
#include <algorithm>
#include <cstring>

#include "formats.h"
#include "widen.h"

namespace cairn {
namespace {

constexpr int kStride = kPanel / 2;  // code bytes per k

size_t code_bytes(const BlockCodec*, int N, int K) { return (size_t)((N + kPanel - 1) / kPanel) * K * kStride; }
size_t scale_bytes(int N, int K) {
  return (size_t)((N + kPanel - 1) / kPanel) * ((K + kFp4Group - 1) / kFp4Group) * kPanel;
}

void pack(const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t* scales) {
  pack_lane_scales(QFmt::E2M1, rows, K, scales);
  static const uint8_t zeros[1] = {0};
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    uint8_t* cd = codes + (size_t)p * K * kStride;
    const uint8_t* src[kPanel];
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      src[l] = n < rows.size() && rows[n].src ? rows[n].src->q + (size_t)rows[n].r * (K / 2) : nullptr;
    }
    // lanes 2j and 2j+1 share a byte; a source byte holds columns 2k' and 2k'+1
    for (int j = 0; j < kPanel / 2; ++j) {
      const uint8_t *a = src[2 * j], *c = src[2 * j + 1];
      const int sa = a ? 1 : 0, sb = c ? 1 : 0;  // stride 0 over a one-byte zero row
      if (!a) a = zeros;
      if (!c) c = zeros;
      for (int k2 = 0; k2 < K / 2; ++k2) {
        const uint8_t x = a[k2 * sa], y = c[k2 * sb];
        cd[(size_t)(2 * k2) * kStride + j] = (uint8_t)((x & 15) | (y << 4));
        cd[(size_t)(2 * k2 + 1) * kStride + j] = (uint8_t)((x >> 4) | (y & 0xF0));
      }
    }
  }
}

int step(const Linear&) { return kFp4Group; }

}  // namespace

extern const PanelCodec kFp4E2M1{"FP4_E2M1", code_bytes, scale_bytes, pack, decode_with<Fp4Widen>, step};

}  // namespace cairn

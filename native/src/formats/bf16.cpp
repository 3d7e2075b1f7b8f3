// cairn kernel: BF16 panels, the same [ceil(N/16)][K][16] layout as fp32 panels holding bit
// patterns (half the bytes); widening is exact.
#include <cstring>

#include "formats.h"
#include "widen.h"

namespace cairn {

void pack_panels_bf16(const std::vector<const uint16_t*>& rows, int K, uint16_t* P) {
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    uint16_t* dst = P + (size_t)p * K * kPanel;  // [K][16]
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      const uint16_t* src = n < rows.size() ? rows[n] : nullptr;
      for (int k = 0; k < K; ++k) dst[(size_t)k * kPanel + l] = src ? src[k] : 0;
    }
  }
}

namespace {

int step(const Linear&) { return 1; }

}  // namespace

extern const PanelCodec kBf16Panels_{"BF16", nullptr, nullptr, nullptr, decode_with<Bf16Widen>, step};

}  // namespace cairn

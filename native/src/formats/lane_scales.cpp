// cairn kernel: the per-lane scale bytes of FP8 and FP4 panels (formats.h).
#include "formats.h"

namespace cairn {

int qscale_max(QFmt f) { return 254 - qbias(f); }

void pack_lane_scales(QFmt f, const std::vector<QRow>& rows, int K, uint8_t* scales) {
  const int G = qgroup(f), ng = (K + G - 1) / G, b = qbias(f);
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    uint8_t* sd = scales + (size_t)p * ng * kPanel;
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      const QRow q = n < rows.size() ? rows[n] : QRow{nullptr, 0};
      if (!q.src) {
        for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = 127;  // any valid scale: the codes are 0
        continue;
      }
      const Linear& L = *q.src;
      const uint8_t* sc = f == QFmt::E4M3 ? L.qs + (size_t)(q.r / kFp8Block) * ng : L.qs + (size_t)q.r * ng;
      for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = (uint8_t)(sc[g] + b);
    }
  }
}

}  // namespace cairn

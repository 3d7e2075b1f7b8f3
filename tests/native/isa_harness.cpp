// Built by test_isa_paths.py for each x86-64 level: the quantized panels (packed.cpp, formats/) must give
// the same bits as fp32 panels of the dequantized weights on the AVX2 and scalar paths too, which
// the AVX-512 build the rest of the suite uses never runs. Exit status 0 = bit-identical.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cairn/kernels.h"
#include "../../native/src/formats/formats.h"
using namespace cairn;
static float e4m3(uint8_t c) { int e = (c >> 3) & 15, m = c & 7; float v = e ? std::ldexp(8.f + m, e - 10) : std::ldexp((float)m, -9); return c & 0x80 ? -v : v; }
static const float E2M1[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
int main() {
  std::mt19937 rng(1);
  int bad = 0;
  for (int fmt = 1; fmt <= 2; ++fmt) {
    const QFmt f = (QFmt)fmt;
    const int N = 72, K = f == QFmt::E4M3 ? 1100 : 1088;
    std::vector<uint8_t> q(f == QFmt::E4M3 ? (size_t)N * K : (size_t)N * K / 2), qs;
    for (auto& b : q) { b = rng() & 0xff; if (f == QFmt::E4M3 && (b & 0x7f) == 0x7f) b = 0x10; }
    const int sr = f == QFmt::E4M3 ? (N + 127) / 128 : N, sc = f == QFmt::E4M3 ? (K + 127) / 128 : K / 32;
    qs.resize((size_t)sr * sc);
    for (auto& b : qs) b = 110 + rng() % 20;
    std::vector<float> W((size_t)N * K);
    for (int r = 0; r < N; ++r)
      for (int k = 0; k < K; ++k) {
        float v; float s;
        if (f == QFmt::E4M3) { v = e4m3(q[(size_t)r * K + k]); s = std::ldexp(1.f, qs[(r / 128) * sc + k / 128] - 127); }
        else { int c = (q[(size_t)r * K / 2 + k / 2] >> (4 * (k & 1))) & 15; v = (c & 8 ? -1 : 1) * E2M1[c & 7]; s = std::ldexp(1.f, qs[r * sc + k / 32] - 127); }
        W[(size_t)r * K + k] = v * s;
      }
    Linear src{nullptr, nullptr, N, K}; src.qf = f; src.q = q.data(); src.qs = qs.data();
    std::vector<QRow> rows; std::vector<const float*> frows;
    for (int r = 0; r < N; ++r) { rows.push_back({&src, r}); frows.push_back(&W[(size_t)r * K]); }
    const PanelCodec& C = panel_codec(f);
    std::vector<uint8_t> codes(C.code_bytes(nullptr, N, K) + 64), scales(C.scale_bytes(N, K) + 64);
    C.pack(rows, K, codes.data(), scales.data());
    std::vector<float> P(packed_floats(N, K));
    pack_panels(frows, K, P.data());
    Linear LQ{nullptr, nullptr, N, K}; LQ.qf = f; LQ.pq = codes.data(); LQ.pqs = scales.data();
    Linear LF{nullptr, P.data(), N, K};
    for (int M : {1, 2, 3, 7, 13}) {
      std::vector<float> X((size_t)M * K), Y1((size_t)M * N), Y2((size_t)M * N);
      std::normal_distribution<float> nd;
      for (auto& x : X) x = nd(rng);
      linear(X.data(), M, LQ, Y1.data(), 1);
      linear(X.data(), M, LF, Y2.data(), 1);
      if (std::memcmp(Y1.data(), Y2.data(), Y1.size() * 4)) { ++bad; std::printf("fmt %d M %d differs: %g vs %g\n", fmt, M, Y1[0], Y2[0]); }
    }
  }
  std::printf("%s\n", bad ? "FAIL" : "bit-identical");
  return bad;
}

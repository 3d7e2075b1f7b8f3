// Built by test_isa_paths.py for each x86-64 level and for aarch64 (run under qemu): every stored
// format's panels (packed.cpp, formats/, codecs/) must give the same bits as fp32 panels of the
// dequantized weights, on paths the suite's own build never runs. It prints a digest of every
// product, so builds for different CPUs can be compared too. Exit status 0 = bit-identical.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../../native/src/codecs/codec.h"
#include "../../native/src/formats/formats.h"
#include "cairn/kernels.h"
using namespace cairn;

static float e4m3(uint8_t c) { int e = (c >> 3) & 15, m = c & 7; float v = e ? std::ldexp(8.f + m, e - 10) : std::ldexp((float)m, -9); return c & 0x80 ? -v : v; }
static const float E2M1[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
static uint64_t digest = 1469598103934665603ull;
static void mix(const std::vector<float>& y) {
  for (float v : y) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    digest = (digest ^ b) * 1099511628211ull;
  }
}

// Y = X W^T through the quantized Linear and through fp32 panels of W; counts differences.
static int compare(const char* what, const Linear& LQ, const std::vector<float>& W, int N, int K, std::mt19937& rng) {
  std::vector<const float*> frows;
  for (int r = 0; r < N; ++r) frows.push_back(&W[(size_t)r * K]);
  std::vector<float> P(packed_floats(N, K));
  pack_panels(frows, K, P.data());
  Linear LF{nullptr, P.data(), N, K};
  int bad = 0;
  for (int M : {1, 2, 3, 4, 5, 6, 7, 13}) {  // 1..kPackM rows: decode's in-register paths; more: the tiles
    std::vector<float> X((size_t)M * K), Y1((size_t)M * N), Y2((size_t)M * N);
    std::normal_distribution<float> nd;
    for (auto& x : X) x = nd(rng);
    linear(X.data(), M, LQ, Y1.data(), 1);
    linear(X.data(), M, LF, Y2.data(), 1);
    mix(Y1);
    if (std::memcmp(Y1.data(), Y2.data(), Y1.size() * 4)) {
      ++bad;
      std::printf("%s M %d differs: %g vs %g\n", what, M, Y1[0], Y2[0]);
    }
  }
  return bad;
}

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
    std::vector<QRow> rows;
    for (int r = 0; r < N; ++r) rows.push_back({&src, r});
    const PanelCodec& C = panel_codec(f);
    std::vector<uint8_t> codes(C.code_bytes(nullptr, N, K) + 64), scales(C.scale_bytes(N, K) + 64);
    C.pack(rows, K, codes.data(), scales.data());
    Linear LQ{nullptr, nullptr, N, K}; LQ.qf = f; LQ.pq = codes.data(); LQ.pqs = scales.data();
    bad += compare(f == QFmt::E4M3 ? "F8_E4M3" : "FP4", LQ, W, N, K, rng);
  }
  {  // vexp's vector lanes give fexp's bits (normal, subnormal and clamped results alike)
    std::vector<float> x, y;
    for (int i = 0; i <= 400000; ++i) x.push_back(-100.f + i * 5e-4f);
    for (float v : {-103.97f, -87.5f, -87.33655f, -0.f, 1e-30f, 88.72f, 1e30f, -1e30f}) x.push_back(v);
    y.resize(x.size());
    vexp(x.data(), y.data(), (int)x.size());
    int diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float f = fexp(x[i]);
      if (std::memcmp(&f, &y[i], 4)) ++diff;
    }
    if (diff) std::printf("vexp differs from fexp at %d of %zu values\n", diff, x.size());
    bad += diff != 0;
  }
  {  // FP8 with float block scales (Qwen's FP8 releases): BF16 scales of any value, its own digest line
    const uint64_t saved = digest;
    digest = 1469598103934665603ull;
    std::mt19937 rng(2);  // its own: the formats after it draw what they drew before it existed
    const int N = 72, K = 1100, sr = (N + 127) / 128, sc = (K + 127) / 128;
    std::vector<uint8_t> q((size_t)N * K);
    for (auto& b : q) { b = rng() & 0xff; if ((b & 0x7f) == 0x7f) b = 0x10; }
    std::vector<float> fs((size_t)sr * sc), W((size_t)N * K);
    for (auto& v : fs) {  // a random BF16 value in [2^-12, 2^-4)
      uint32_t bits;
      const uint32_t m = rng() % 128, e = rng() % 8;  // two statements: argument order is unspecified
      const float x = std::ldexp(1.f + m / 128.f, -12 + (int)e);
      std::memcpy(&bits, &x, 4);
      bits &= 0xffff0000u;
      std::memcpy(&v, &bits, 4);
    }
    for (int r = 0; r < N; ++r)
      for (int k = 0; k < K; ++k) W[(size_t)r * K + k] = e4m3(q[(size_t)r * K + k]) * fs[(r / 128) * sc + k / 128];
    Linear src{nullptr, nullptr, N, K}; src.qf = QFmt::E4M3F; src.q = q.data(); src.qfs = fs.data();
    std::vector<QRow> rows;
    for (int r = 0; r < N; ++r) rows.push_back({&src, r});
    const PanelCodec& C = panel_codec(QFmt::E4M3F);
    std::vector<float> panel((C.code_bytes(nullptr, N, K) + C.scale_bytes(N, K)) / 4 + 16);  // float-aligned scales
    uint8_t* codes = (uint8_t*)panel.data();
    C.pack(rows, K, codes, codes + C.code_bytes(nullptr, N, K));
    Linear LQ{nullptr, nullptr, N, K}; LQ.qf = QFmt::E4M3F; LQ.pq = codes; LQ.pqs = codes + C.code_bytes(nullptr, N, K);
    bad += compare("F8_E4M3 (float scales)", LQ, W, N, K, rng);
    std::printf("fp8_float %016llx\n", (unsigned long long)digest);
    digest = saved;
  }
  // GGUF block formats: random blocks, kept only where every weight decodes finite
  // (N = 24, 40, 72: 1 to 4 panels in a micro-tile; K = 768: a 512-column span and a shorter one)
  for (const BlockCodec* c : all_codecs()) {
    for (int N : {24, 40, 72}) {
      const int K = 3 * 256 + (c->block < 256 ? c->block : 0) * 3, nb = K / c->block;
      std::vector<uint8_t> q((size_t)N * nb * c->bytes);
      std::vector<float> W((size_t)N * K), tmp(c->block);
      for (int b = 0; b < N * nb; ++b) {
        uint8_t* blk = &q[(size_t)b * c->bytes];
        for (int tries = 0;; ++tries) {
          for (int i = 0; i < c->bytes; ++i) blk[i] = rng() & 0xff;
          c->decode(blk, tmp.data());
          bool ok = true;
          for (float v : tmp) ok = ok && std::isfinite(v) && std::fabs(v) < 1e4f;
          if (ok) break;
        }
        c->decode(blk, &W[(size_t)b * c->block]);
      }
      Linear src{nullptr, nullptr, N, K}; src.qf = QFmt::Ggml; src.codec = c; src.q = q.data();
      std::vector<QRow> rows;
      for (int r = 0; r < N; ++r) rows.push_back({&src, r});
      const PanelCodec& C = panel_codec(QFmt::Ggml);
      std::vector<uint8_t> codes(C.code_bytes(c, N, K));
      C.pack(rows, K, codes.data(), nullptr);
      Linear LQ{nullptr, nullptr, N, K}; LQ.qf = QFmt::Ggml; LQ.codec = c; LQ.pq = codes.data();
      bad += compare(c->name, LQ, W, N, K, rng);
    }
  }
  std::printf("digest %016llx\n%s\n", (unsigned long long)digest, bad ? "FAIL" : "bit-identical");
  return bad;
}

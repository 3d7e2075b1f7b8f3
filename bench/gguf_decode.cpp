// One matrix product in decode: linear() of M = 1, 2, 6 rows over a 1024 x 4096 matrix of random
// GGUF blocks of each 256-weight type, against fp32 panels of the same dequantized weights (one
// thread, the calling thread's CPU time, best of 5; "same": the two outputs are bit-identical).
// Built against a source tree, outside the extension (so two trees can be compared):
//
//   g++ -std=gnu++17 -O3 -march=x86-64-v4 -mtune=generic -ffp-contract=off -fopenmp -Wno-psabi \
//     -Inative/include -Inative/src bench/gguf_decode.cpp native/src/packed.cpp \
//     native/src/formats/*.cpp native/src/codecs/*.cpp -o /tmp/gguf_decode && /tmp/gguf_decode
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cairn/kernels.h"
#include "codecs/codec.h"
#include "formats/formats.h"
using namespace cairn;

static double cpu() {  // this thread's CPU time: least disturbed by other work on the machine
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main() {
  const int N = 1024, K = 4096;
  std::mt19937 rng(1);
  for (const char* name : {"Q4_K", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ2_XXS"}) {
    const BlockCodec* c = find_codec(std::string(name));
    const int nb = K / c->block;
    std::vector<uint8_t> q((size_t)N * nb * c->bytes);
    std::vector<float> W((size_t)N * K), tmp(256);
    for (int b = 0; b < N * nb; ++b) {
      uint8_t* blk = &q[(size_t)b * c->bytes];
      for (;;) { for (int i = 0; i < c->bytes; ++i) blk[i] = rng() & 0xff; c->decode(blk, tmp.data()); bool ok = true; for (float v : tmp) ok = ok && std::isfinite(v) && std::fabs(v) < 1e4f; if (ok) break; }
      c->decode(blk, &W[(size_t)b * c->block]);
    }
    Linear src{nullptr, nullptr, N, K}; src.qf = QFmt::Ggml; src.codec = c; src.q = q.data();
    std::vector<QRow> rows; for (int r = 0; r < N; ++r) rows.push_back({&src, r});
    const PanelCodec& C = panel_codec(QFmt::Ggml);
    std::vector<uint8_t> codes(C.code_bytes(c, N, K)); C.pack(rows, K, codes.data(), nullptr);
    Linear LQ{nullptr, nullptr, N, K}; LQ.qf = QFmt::Ggml; LQ.codec = c; LQ.pq = codes.data();
    std::vector<const float*> fr; for (int r = 0; r < N; ++r) fr.push_back(&W[(size_t)r * K]);
    std::vector<float> P(packed_floats(N, K)); pack_panels(fr, K, P.data());
    Linear LF{nullptr, P.data(), N, K};
    for (int M : {1, 2, 6}) {
      std::vector<float> X((size_t)M * K), Y1((size_t)M * N), Y2((size_t)M * N);
      std::normal_distribution<float> nd; for (auto& x : X) x = nd(rng);
      double best[2] = {1e9, 1e9};
      for (int rep = 0; rep < 5; ++rep)
        for (int s = 0; s < 2; ++s) {
          double t0 = cpu();
          for (int i = 0; i < 10; ++i) linear(X.data(), M, s ? LF : LQ, (s ? Y2 : Y1).data(), 1);
          double dt = (cpu() - t0) / 10;
          if (dt < best[s]) best[s] = dt;
        }
      std::printf("%s M=%d  q %.3f ms (%.1f Gw/s)  f32 %.3f ms  ratio %.2f  %s\n", name, M, best[0] * 1e3, (double)N * K / best[0] / 1e9, best[1] * 1e3, best[1] / best[0], std::memcmp(Y1.data(), Y2.data(), Y1.size() * 4) ? "DIFF" : "same");
    }
  }
}

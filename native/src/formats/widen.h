// cairn kernel: the register-level widening of each panel format: W(L, p0, k0)(j, k) is the 16
// weights of panel p0 + j at column k0 + k, as fp32 lanes. packed.cpp's micro-kernel is written
// once over W; a format's file (formats/) packs its panels, and its W here is the only place its
// codes are turned into numbers.
#pragma once
#include "../codecs/mxfp4_lanes.h"
#include "formats.h"
#include "lanes.h"

namespace cairn {

// fp32 panels, or a codec's widened tile laid out like them
struct PanelLoad {
  const float* p;  // panel 0 at the span's first column
  size_t ps;       // floats from one panel to the next
  lanes::f32x16 operator()(int j, int k) const { return lanes::load_f32(p + j * ps + (size_t)k * kPanel); }
};
struct F32Panels : PanelLoad {
  F32Panels(const Linear& L, int p0, int k0, int, int)
      : PanelLoad{L.p + ((size_t)p0 * L.in + k0) * kPanel, (size_t)L.in * kPanel} {}
};

// BF16 panels: the bit patterns shifted into place (exact)
struct Bf16Widen {
  const uint16_t* p;
  size_t ps;
  Bf16Widen(const Linear& L, int p0, int k0, int, int) : p(L.p16 + ((size_t)p0 * L.in + k0) * kPanel), ps((size_t)L.in * kPanel) {}
  lanes::f32x16 operator()(int j, int k) const {
    return lanes::bits(lanes::load_u16(p + j * ps + (size_t)k * kPanel) << 16);
  }
};

// Scale vectors of a span, widened once per span (a load per use inside the micro-kernel):
// [j][group - first group] for np <= kPackN panels and kSpanCols columns.
constexpr int kSpanCols = 512;
template <int G>
struct SpanScales {
  lanes::f32x16 v[kPackN][(kSpanCols + G - 1) / G + 1];
  int g0;
  SpanScales(const uint8_t* s, size_t ss, int k0, int kc, int np) : g0(k0 / G) {
    for (int j = 0; j < np; ++j)
      for (int g = g0; g * G < k0 + kc; ++g) v[j][g - g0] = lanes::exp2_bytes(s + j * ss + (size_t)g * kPanel);
  }
  const lanes::f32x16& at(int j, int col) const { return v[j][col / G - g0]; }
};

// FP8 e4m3fn codes (one byte a lane) times the lane's scale for its 128 columns; the widened code
// carries 2^-8 (lanes.h), the stored scale 2^8.
struct Fp8Widen {
  const uint8_t* c;
  size_t cs;
  int k0;
  SpanScales<kFp8Block> sc;
  Fp8Widen(const Linear& L, int p0, int k0_, int kc, int np)
      : c(L.pq + ((size_t)p0 * L.in + k0_) * kPanel), cs((size_t)L.in * kPanel), k0(k0_),
        sc(L.pqs + (size_t)p0 * ((L.in + kFp8Block - 1) / kFp8Block) * kPanel,
           (size_t)((L.in + kFp8Block - 1) / kFp8Block) * kPanel, k0_, kc, np) {}
  lanes::f32x16 operator()(int j, int k) const {
    return lanes::e4m3_x256(c + j * cs + (size_t)k * kPanel) * sc.at(j, k0 + k);
  }
};

// FP8 e4m3fn codes times the lane's float scale for its 128 columns (fp8_e4m3_float_scale.cpp): the
// widened code carries 2^-8, the stored scale 2^8; code x scale is exact in fp32.
struct Fp8FloatWiden {
  const uint8_t* c;
  size_t cs;
  const float* s;  // panel p0's scales [group][16]
  size_t ss;       // floats from one panel's scales to the next
  int k0;
  Fp8FloatWiden(const Linear& L, int p0, int k0_, int, int)
      : c(L.pq + ((size_t)p0 * L.in + k0_) * kPanel), cs((size_t)L.in * kPanel),
        s((const float*)L.pqs + (size_t)p0 * ((L.in + kFp8Block - 1) / kFp8Block) * kPanel),
        ss((size_t)((L.in + kFp8Block - 1) / kFp8Block) * kPanel), k0(k0_) {}
  lanes::f32x16 operator()(int j, int k) const {
    return lanes::e4m3_x256(c + j * cs + (size_t)k * kPanel) *
           lanes::load_f32(s + j * ss + (size_t)((k0 + k) / kFp8Block) * kPanel);
  }
};

// FP4 e2m1 codes (lanes 2i, 2i+1 in byte i's low, high nibble) times the lane's scale for its 32
// columns: the code's value / 2 from a table (the stored scale carries the 2 back); code 8 is
// +0.0 as in the official decoder.
struct Fp4Widen {
  const uint8_t* c;
  size_t cs;
  int k0;
  SpanScales<kFp4Group> sc;
  Fp4Widen(const Linear& L, int p0, int k0_, int kc, int np)
      : c(L.pq + ((size_t)p0 * L.in + k0_) * (kPanel / 2)), cs((size_t)L.in * (kPanel / 2)), k0(k0_),
        sc(L.pqs + (size_t)p0 * (L.in / kFp4Group) * kPanel, (size_t)(L.in / kFp4Group) * kPanel, k0_, kc, np) {}
  lanes::f32x16 operator()(int j, int k) const {
    const uint8_t* p = c + j * cs + (size_t)k * (kPanel / 2);
    if constexpr (lanes::kLookupPermutes) {
      const lanes::f32x16 halves = {0.f, .25f, .5f, .75f, 1.f, 1.5f, 2.f, 3.f, 0.f, -.25f, -.5f, -.75f, -1.f, -1.5f, -2.f, -3.f};
      return lanes::lookup(halves, lanes::load_nibbles(p)) * sc.at(j, k0 + k);
    } else {  // MXFP4's doubled values from a byte shuffle, / 4 (exact): the same halves
      return codecs::mxfp4::kvalue_bytes(lanes::nibbles8(p)) * 0.25f * sc.at(j, k0 + k);
    }
  }
};

// A PanelCodec's decode from its W: the span widened into out[j][k][16].
template <class W>
void decode_with(const Linear& L, int p0, int np, int k0, int kc, float* out) {
  const W w(L, p0, k0, kc, np);
  for (int j = 0; j < np; ++j)
    for (int k = 0; k < kc; ++k) lanes::store(out + ((size_t)j * kc + k) * kPanel, w(j, k));
}

}  // namespace cairn

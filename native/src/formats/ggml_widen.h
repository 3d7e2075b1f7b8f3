// cairn kernel: GGUF K-quant panels (ggml_blocks.cpp's byte-interleaved layout) widened in
// registers, for decode (M <= kPackM rows). The tile path (packed.cpp, packed_tiled) writes a
// block step of np panels to memory, 64 KB for 256-weight blocks, and reads it back from L2; at one
// row tile that store and load cost as much as the widening. Here the micro-kernel takes each
// column's 16 weights straight from the code bytes, a sub-block ("group") at a time: the group's
// D and M vectors are widened once per span (kSpanCols, two blocks) like widen.h's SpanScales.
//
// Each format's numbers are its lane decoder's (codecs/*.cpp, decode_lanes), operation for
// operation: D = fl(d * sc), w = fl(fl(D * q) - M) (or fl(D * q)). packed.cpp, which inlines these,
// is compiled with -ffp-contract=off (native/CMakeLists.txt) so D * q - M is never one fused
// rounding; the micro-kernel's accumulate is an explicit fma and stays one.
#pragma once
#include "../codecs/codec.h"
#include "../codecs/q_k_scales.h"
#include "formats.h"
#include "lanes.h"
#include "widen.h"

namespace cairn {
namespace kq {

using lanes::f32x16;
using lanes::u32x16;
using lanes::i32x16;

// The value of a 4-bit / 2-bit field at the bottom of each lane (higher bits ignored) as a float:
// one vpermps on AVX-512 (it reads only an index's low 4 bits), a mask and a convert elsewhere.
inline f32x16 nibble(u32x16 x) {
  if constexpr (lanes::kLookupPermutes) {
    const f32x16 t = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return lanes::lookup(t, x);
  } else {
    return lanes::to_f32(x & 0xFu);
  }
}
inline f32x16 crumb(u32x16 x) {
  if constexpr (lanes::kLookupPermutes) {
    const f32x16 t = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    return lanes::lookup(t, x);
  } else {
    return lanes::to_f32(x & 3u);
  }
}

// Q4_K (codecs/q4_k.cpp): sub-block s of 32 columns is nibble s & 1 of code bytes 16 + 32(s / 2) + l.
struct Q4K {
  static constexpr int kBytes = 144, kGroup = 32;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b)), dmin = lanes::half_to_f32(lanes::load_le16(b + 16 * 2));
    codecs::k_scale_min_lanes(b + 16 * 4, d, dmin, D, M);
  }
  struct Group {
    const uint8_t* q;
    int sh;
    f32x16 D, M;
    f32x16 operator()(int l) const { return D * nibble(lanes::load_u8(q + 16 * l) >> sh) - M; }
  };
  static Group group(const uint8_t* b, int r, f32x16 D, f32x16 M) {
    const int s = r / 32;
    return {b + 16 * (16 + 32 * (s / 2)), 4 * (s & 1), D, M};
  }
};

// Q5_K (codecs/q5_k.cpp): Q4_K's nibbles, and bit s of byte 16 + l on top.
struct Q5K {
  static constexpr int kBytes = 176, kGroup = 32;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) { Q4K::scales(b, D, M); }
  struct Group {
    const uint8_t *q, *h;
    int sh, s;
    f32x16 D, M;
    f32x16 operator()(int l) const {
      const u32x16 v = ((lanes::load_u8(q + 16 * l) >> sh) & 0xFu) | (((lanes::load_u8(h + 16 * l) >> s) & 1u) << 4);
      return D * lanes::to_f32(v) - M;
    }
  };
  static Group group(const uint8_t* b, int r, f32x16 D, f32x16 M) {
    const int s = r / 32;
    return {b + 16 * (48 + 32 * (s / 2)), b + 16 * 16, 4 * (s & 1), s, D, M};
  }
};

// The 2-bit layouts (Q2_K, Q3_K, Q6_K): column r = 128h + 32j + 16t + l' of a block, sub-block
// r / 16, is field j of byte 32h + 16t + l' of its code array.
// Q2_K (codecs/q2_k.cpp): codes at 16, scale bytes at 0 (scale low nibble, min high), d, dmin at 80, 82.
struct Q2K {
  static constexpr int kBytes = 84, kGroup = 16;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 80)), dmin = lanes::half_to_f32(lanes::load_le16(b + 16 * 82));
    for (int s = 0; s < 16; ++s) {
      const u32x16 sc = lanes::load_u8(b + 16 * s);
      D[s] = d * lanes::to_f32(sc & 0xFu);
      M[s] = dmin * lanes::to_f32(sc >> 4);
    }
  }
  struct Group {
    const uint8_t* q;
    int sh;
    f32x16 D, M;
    f32x16 operator()(int l) const { return D * crumb(lanes::load_u8(q + 16 * l) >> sh) - M; }
  };
  static Group group(const uint8_t* b, int r, f32x16 D, f32x16 M) {
    return {b + 16 * (16 + 32 * (r / 128) + 16 * ((r / 16) & 1)), 2 * ((r / 32) & 3), D, M};
  }
};

// Q3_K (codecs/q3_k.cpp): low 2 bits at 32, mask bit 4h + j of byte 16t + l' (set: no -4), sixteen
// 6-bit scales at 96, d at 108; w = fl(D * q), no min.
struct Q3K {
  static constexpr int kBytes = 110, kGroup = 16;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const uint8_t* sb = b + 16 * 96;
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 108));
    for (int i = 0; i < 16; ++i) {
      const u32x16 lo = (lanes::load_u8(sb + 16 * (i % 8)) >> (4 * (i / 8))) & 0xFu;
      const u32x16 hi = (lanes::load_u8(sb + 16 * (8 + i % 4)) >> (2 * (i / 4))) & 3u;
      D[i] = d * lanes::to_f32((i32x16)((lo | (hi << 4)) - 32u));
    }
  }
  struct Group {
    const uint8_t *q, *m;
    int sh, bit;
    f32x16 D;
    f32x16 operator()(int l) const {
      const u32x16 v = ((lanes::load_u8(q + 16 * l) >> sh) & 3u) - ((((lanes::load_u8(m + 16 * l) >> bit) & 1u) ^ 1u) << 2);
      return D * lanes::to_f32((i32x16)v);
    }
  };
  static Group group(const uint8_t* b, int r, f32x16 D, f32x16) {
    const int h = r / 128, j = (r / 32) & 3, t = (r / 16) & 1;
    return {b + 16 * (32 + 32 * h + 16 * t), b + 16 * (16 * t), 2 * j, 4 * h + j, D};
  }
};

// Q6_K (codecs/q6_k.cpp): low nibble j / 2 of byte 64h + 32(j % 2) + 16t + l', high 2 bits at 128
// + 32h + 16t + l', int8 scales at 192, d at 208; q = (low | high << 4) - 32, w = fl(D * q).
struct Q6K {
  static constexpr int kBytes = 210, kGroup = 16;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 208));
    for (int s = 0; s < 16; ++s) D[s] = d * lanes::to_f32(lanes::load_i8(b + 16 * (192 + s)));
  }
  struct Group {
    const uint8_t *lo, *hi;
    int sl, sh;
    f32x16 D;
    f32x16 operator()(int l) const {
      const u32x16 q = (((lanes::load_u8(lo + 16 * l) >> sl) & 0xFu) | (((lanes::load_u8(hi + 16 * l) >> sh) & 3u) << 4)) - 32u;
      return D * lanes::to_f32((i32x16)q);
    }
  };
  static Group group(const uint8_t* b, int r, f32x16 D, f32x16) {
    const int h = r / 128, j = (r / 32) & 3, t = (r / 16) & 1;
    return {b + 16 * (64 * h + 32 * (j & 1) + 16 * t), b + 16 * (128 + 32 * h + 16 * t), 4 * (j >> 1), 2 * j, D};
  }
};

}  // namespace kq

// One span (k0 a multiple of kSpanCols, kc of 256) of np panels of a K-quant Q, for packed.cpp's
// micro-kernel: group(j, k) is the sub-block of panel j holding span column k.
template <class Q>
struct KQuantWiden {
  static constexpr int kBlock = 256, kGroup = Q::kGroup, kGroups = kSpanCols / kGroup;
  using Group = typename Q::Group;
  const uint8_t* c;  // panel p0's block at k0
  size_t ps;         // bytes from one panel to the next
  lanes::f32x16 D[kPackN][kGroups], M[kPackN][kGroups];  // per group; M unused without mins
  KQuantWiden(const Linear& L, int p0, int k0, int kc, int np)
      : ps((size_t)(L.in / kBlock) * Q::kBytes * kPanel) {
    c = L.pq + (size_t)p0 * ps + (size_t)(k0 / kBlock) * Q::kBytes * kPanel;
    for (int j = 0; j < np; ++j)
      for (int b = 0; b < kc / kBlock; ++b)
        Q::scales(blk(j, b), &D[j][b * (kBlock / kGroup)], &M[j][b * (kBlock / kGroup)]);
  }
  const uint8_t* blk(int j, int b) const { return c + j * ps + (size_t)b * Q::kBytes * kPanel; }
  Group group(int j, int k) const { return Q::group(blk(j, k / kBlock), k % kBlock, D[j][k / kGroup], M[j][k / kGroup]); }
};

}  // namespace cairn

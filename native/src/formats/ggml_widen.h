// cairn kernel: GGUF panels (ggml_blocks.cpp's byte-interleaved layout) widened in registers, for
// decode (M <= kPackM rows). The tile path (packed.cpp, packed_tiled) writes a block step of np
// panels to memory and reads it back; at one row tile that store and load cost as much as the
// widening (a 2048 x 4096 MXFP4 matrix at M = 1 ran at 9 GB/s of its bytes through the tile, under a
// quarter of the memory's rate). Here the micro-kernel takes each column's 16 weights straight from
// the code bytes, a group of columns at a time (packed.cpp, columns()): a group's pointers are set up
// once and each of its parts (a sub-block: one scale, one bit field) runs as its own loop, so shift
// counts are immediates; the D and M vectors are widened once per span (kSpanCols) like widen.h's
// SpanScales.
//
// Each format's numbers are its lane decoder's (codecs/*.cpp, decode_lanes), operation for
// operation: D = fl(d * sc), w = fl(fl(D * q) - M) (or fl(D * q)). packed.cpp, which inlines these,
// is compiled with -ffp-contract=off (native/CMakeLists.txt), so nothing is fused behind our back;
// the micro-kernel's accumulate is an explicit fma. One fusion is explicit: in Q2_K, Q4_K and Q5_K
// D * q is exact in fp32 (an f16 d, 11 significant bits, times a scale of at most 6 and a code of
// at most 5 bits: <= 22 bits, far from fp32's range limits), so fl(D * q - M) in one rounding is
// fl(fl(D * q) - M), and AVX-512 and FMA3 take it as one fused multiply-subtract (lanes::fmsub_exact). One
// product is dropped: IQ2_XXS's sign goes onto the magnitude's bits (the same bits, see there).
#pragma once
#include <utility>

#include "../codecs/codec.h"
#include "../codecs/grid_lanes.h"
#include "../codecs/iq2_xxs_grid.h"
#include "../codecs/mxfp4_lanes.h"
#include "../codecs/q_k_scales.h"
#include "../codecs/tables.h"
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

// x << S for S >= 0, x >> -S otherwise
template <int S>
inline u32x16 shift(u32x16 x) {
  if constexpr (S >= 0) return x << S;
  else return x >> -S;
}

// A format Q: kBlock weights in kBytes a block; scales(b, D, M): the D (and M) vectors of a block's
// kBlock / kSub sub-blocks; group(b, r, D, M): the Group of kGroup columns from block column r, kParts
// sub-blocks, whose at<P>(l) is the weights of its part P's column l (or, where a part has state of
// its own, part<P>() gives the object whose at<P>(l) does).

// Q4_K (codecs/q4_k.cpp): sub-block s of 32 columns is nibble s & 1 of code bytes 16 + 32(s / 2) + l:
// a group is the 64 columns of 32 code bytes, held as words (codec.h, lane_byte): column l's codes
// are a shift of word l / 4, one load for four columns (packed.cpp, group_part).
struct Q4K {
  static constexpr int kBlock = 256, kBytes = 144, kSub = 32, kGroup = 64, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b)), dmin = lanes::half_to_f32(lanes::load_le16(b + 16 * 2));
    codecs::k_scale_min_lanes(b + 16 * 4, d, dmin, D, M);
  }
  struct Group {
    const uint8_t* q;
    const f32x16 *D, *M;
    static constexpr int kWordCols = 4;
    template <int P, int S>  // column l + S, l a multiple of 4
    f32x16 at(int l) const { return lanes::fmsub_exact(D[P], nibble(lanes::load_words(q + 16 * l) >> (8 * S + 4 * P)), M[P]); }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (16 + 32 * (r / 64)), D, M};
  }
};

// Q5_K (codecs/q5_k.cpp): Q4_K's nibbles, and bit s of byte 16 + l on top.
struct Q5K {
  static constexpr int kBlock = 256, kBytes = 176, kSub = 32, kGroup = 64, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) { Q4K::scales(b, D, M); }
  struct Group {
    const uint8_t *q, *h;
    int s;  // the bit of part 0 (2 * (r / 64)); part 1's is s + 1
    const f32x16 *D, *M;
    template <int P>
    f32x16 at(int l) const {
      const u32x16 c = lanes::load_u8(q + 16 * l), hb = lanes::load_u8(h + 16 * l) >> s;
      const u32x16 v = P == 0 ? (c & 0xFu) | ((hb << 4) & 16u) : (c >> 4) | ((hb << 3) & 16u);
      return lanes::fmsub_exact(D[P], lanes::to_f32(v), M[P]);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (48 + 32 * (r / 64)), b + 16 * 16, 2 * (r / 64), D, M};
  }
};

// The 2-bit layouts (Q2_K, Q3_K, Q6_K): column r = 128h + 32j + 16t + l (l < 16) of a block,
// sub-block r / 16, is field j of byte 32h + 16t + l of its code array. A group is the 128 columns
// of one h, its part P = 2j + t (Q3_K: the block).
// Q2_K (codecs/q2_k.cpp): codes at 16, scale bytes at 0 (scale low nibble, min high), d, dmin at 80, 82.
struct Q2K {
  static constexpr int kBlock = 256, kBytes = 84, kSub = 16, kGroup = 128, kParts = 8;
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
    const f32x16 *D, *M;
    template <int P>
    f32x16 at(int l) const {
      return lanes::fmsub_exact(D[P], crumb(lanes::load_u8(q + 16 * (16 * (P & 1) + l)) >> (2 * (P / 2))), M[P]);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (16 + 32 * (r / 128)), D, M};
  }
};

// Q3_K (codecs/q3_k.cpp): low 2 bits at 32, mask bit 4h + j of byte 16t + l (set: no -4), sixteen
// 6-bit scales at 96, d at 108; w = fl(D * q), no min. A group is the whole block (part 8h + 2j + t),
// so the mask's bit is a constant too. On AVX-512 q comes from a table indexed by low | mask << 2,
// like nibble().
struct Q3K {
  static constexpr int kBlock = 256, kBytes = 110, kSub = 16, kGroup = 256, kParts = 16;
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
    const uint8_t* b;
    const f32x16* D;
    template <int P>
    f32x16 at(int l) const {
      constexpr int h = P / 8, j = (P / 2) & 3, bit = 4 * h + j, o = 16 * (P & 1);
      const u32x16 lo = lanes::load_u8(b + 16 * (32 + 32 * h + o + l)) >> (2 * j), hm = lanes::load_u8(b + 16 * (o + l));
      f32x16 v;
      if constexpr (lanes::kLookupPermutes) {
        const f32x16 t = {-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3};
        v = lanes::lookup(t, (lo & 3u) | (shift<2 - bit>(hm) & 4u));
      } else {
        v = lanes::to_f32((i32x16)((lo & 3u) - ((((hm >> bit) & 1u) ^ 1u) << 2)));
      }
      return D[P] * v;
    }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b, D}; }
};

// Q6_K (codecs/q6_k.cpp): low nibble j / 2 of byte 64h + 32(j % 2) + 16t + l, high 2 bits j of
// byte 128 + 32h + 16t + l, int8 scales at 192, d at 208; q = (low | high << 4) - 32, w = fl(D * q).
struct Q6K {
  static constexpr int kBlock = 256, kBytes = 210, kSub = 16, kGroup = 128, kParts = 8;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 208));
    for (int s = 0; s < 16; ++s) D[s] = d * lanes::to_f32(lanes::load_i8(b + 16 * (192 + s)));
  }
  struct Group {
    const uint8_t *lo, *hi;
    const f32x16* D;
    template <int P>
    f32x16 at(int l) const {
      constexpr int j = P / 2, t = P & 1;
      const u32x16 a = lanes::load_u8(lo + 16 * (32 * (j & 1) + 16 * t + l)) >> (4 * (j >> 1));
      const u32x16 c = lanes::load_u8(hi + 16 * (16 * t + l));
      const u32x16 q = ((a & 0xFu) | (shift<4 - 2 * j>(c) & 0x30u)) - 32u;
      return D[P] * lanes::to_f32((i32x16)q);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int h = r / 128;
    return {b + 16 * (64 * h), b + 16 * (128 + 32 * h), D};
  }
};

// IQ2_XXS (codecs/iq2_xxs.cpp): group g of 32 columns (8 bytes at 2 + 8g) is four grid points of
// 8 columns (part i: the packed grid's 2-bit magnitude codes, looked up once per group) and their
// signs; w = fl(fl(db * magnitude) * (+-1)), db = fl(fl(d * (0.5 + s)) * 0.25) per group. Each
// part's signs are made when the part starts (part()): all four parts' codes and signs of 4
// panels at once were 36 vectors, which spilled.
struct IQ2XXS {
  static constexpr int kBlock = 256, kBytes = 66, kSub = 32, kGroup = 32, kParts = 4;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int g = 0; g < 8; ++g) D[g] = d * (0.5f + lanes::to_f32(lanes::load_le32(b + 16 * (2 + 8 * g + 4)) >> 28)) * 0.25f;
  }
  struct Part {
    u32x16 code, neg;
    f32x16 db;
    template <int P>
    f32x16 at(int m) const {
      const u32x16 c = code >> (2 * m);
      f32x16 mag;
      if constexpr (lanes::kLookup8Permutes) {  // the permute reads c's low 3 or 4 bits: the next code is ignored
        const f32x16 t = {8, 25, 43, 0, 8, 25, 43, 0, 8, 25, 43, 0, 8, 25, 43, 0};
        mag = lanes::lookup8(t, c);
      } else {
        const u32x16 c3 = c & 3u;
        mag = lanes::to_f32((c3 << 4) + c3 + (c3 >> 1) + 8u);
      }
      // fl(fl(db * mag) * -1) = fl(db * -mag): negation is exact and rounding is symmetric, so the
      // sign goes onto the magnitude's bits and one product is left.
      return db * lanes::bits(lanes::bits(mag) ^ ((neg << (31 - m)) & 0x80000000u));
    }
  };
  struct Group {
    u32x16 code[4], aux1;
    f32x16 db;
    template <int P>
    Part part() const { return {code[P], codecs::ksign((aux1 >> (7 * P)) & 0x7Fu), db}; }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const uint8_t* p = b + 16 * (2 + 8 * (r / 32));  // the four parts' grid indexes: 64 bytes
    Group g;
#if defined(__AVX512BW__)
    lanes::lookup256_u16(codecs::kGrid2Words.code, p, g.code[0], g.code[1]);
    lanes::lookup256_u16(codecs::kGrid2Words.code, p + 32, g.code[2], g.code[3]);
#else
    for (int i = 0; i < 4; ++i) g.code[i] = lanes::gather_u32(codecs::kGrid2.code, lanes::load_u8(p + 16 * i));
#endif
    g.aux1 = lanes::load_le32(p + 16 * 4);
    g.db = D[0];
    return g;
  }
};

// The 32-weight blocks. Q8_0 (codecs/q8_0.cpp): f16 d at 0, int8 codes at 2; w = fl(d * q).
struct Q80 {
  static constexpr int kBlock = 32, kBytes = 34, kSub = 32, kGroup = 32, kParts = 1;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) { D[0] = lanes::half_to_f32(lanes::load_le16(b)); }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    template <int P>
    f32x16 at(int l) const { return d * lanes::to_f32(lanes::load_i8(q + 16 * l)); }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b + 16 * 2, D[0]}; }
};

// MXFP4 (codecs/mxfp4.cpp): e8m0 byte at 0, codes at 1 as words (like Q4_K's); column l < 16 is the
// low nibble of code byte l, column 16 + l its high nibble (part 1); w = fl(d * kvalue).
struct MXFP4 {
  static constexpr int kBlock = 32, kBytes = 17, kSub = 32, kGroup = 32, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) { D[0] = codecs::mxfp4::e8m0_half_lanes(lanes::load_u8(b)); }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    static constexpr int kWordCols = 4;
    template <int P, int S>  // column l + S, l a multiple of 4
    f32x16 at(int l) const { return d * codecs::mxfp4::kvalue_words<8 * S + 4 * P>(q + 16 * l); }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b + 16, D[0]}; }
};

// llama.cpp's first 32-weight formats (codecs/legacy.cpp): a group is the block, part 0 its columns
// 0-15 (low nibbles), part 1 columns 16-31 (high nibbles), the fifth bit (Q5_*) column j's bit of
// the u32 at 2 (4 with a min). Q4_0 / Q5_0: w = fl(d * (q - offset)); the value q - offset is exact
// in fp32, so on AVX-512 Q4_0's comes from a table (like Q3K's) and Q5_0's by a convert and an exact
// subtraction. Q4_1 / Q5_1: w = fl(fl(d * q) + m), d * q exact (an f16 d times 4-5 bits), so one
// fused multiply-add.
template <bool kMin, bool kHigh>
struct Legacy {
  static constexpr int kHighAt = kMin ? 4 : 2, kCodesAt = kHighAt + (kHigh ? 4 : 0);
  static constexpr int kBlock = 32, kBytes = kCodesAt + 16, kSub = 32, kGroup = 32, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    D[0] = lanes::half_to_f32(lanes::load_le16(b));
    if constexpr (kMin) M[0] = lanes::half_to_f32(lanes::load_le16(b + 16 * 2));
  }
  struct Group {
    const uint8_t* q;
    u32x16 qh;
    f32x16 d, m;
    template <int P>
    f32x16 at(int l) const {
      const u32x16 lo = lanes::load_u8(q + 16 * l) >> (4 * P);
      if constexpr (!kHigh && !kMin && lanes::kLookupPermutes) {
        const f32x16 t = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
        return d * lanes::lookup(t, lo);
      } else {
        u32x16 c = lo & 0xFu;
        if constexpr (kHigh) c |= ((qh >> (l + 16 * P)) & 1u) << 4;
        if constexpr (kMin) return lanes::fmadd_exact(d, lanes::to_f32(c), m);
        else return d * (lanes::to_f32(c) - (kHigh ? 16.f : 8.f));
      }
    }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16* M) {
    return {b + 16 * kCodesAt, kHigh ? lanes::load_le32(b + 16 * kHighAt) : u32x16{}, D[0], kMin ? M[0] : f32x16{}};
  }
};
using Q40 = Legacy<false, false>;
using Q41 = Legacy<true, false>;
using Q50 = Legacy<false, true>;
using Q51 = Legacy<true, true>;

// IQ4_NL and IQ4_XS (codecs/iq4.cpp): a group is a 32-column run of 16 code bytes, parts low / high
// nibble; w = fl(dl * kvalue), the kvalue a float table's entry on AVX-512, a byte shuffle elsewhere.
template <size_t... I>
constexpr f32x16 iq4_table(std::index_sequence<I...>) { return f32x16{(float)codec_tables::iq4nl_kvalues[I]...}; }
inline f32x16 iq4_value(const uint8_t* p, int shift) {
  if constexpr (lanes::kLookupPermutes) {
    constexpr f32x16 t = iq4_table(std::make_index_sequence<16>{});
    return lanes::lookup(t, lanes::load_u8(p) >> shift);
  } else {
    lanes::u8x16 t;
    std::memcpy(&t, codec_tables::iq4nl_kvalues, 16);
    return lanes::lookup_i8(t, lanes::load_bytes(p) >> shift);
  }
}
template <int kBlock_, int kCodesAt>
struct IQ4 {
  static constexpr int kBlock = kBlock_, kBytes = kBlock == 32 ? 18 : 136, kSub = 32, kGroup = 32, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    if constexpr (kBlock == 32) {
      D[0] = d;
    } else {
      const u32x16 hi = lanes::load_le16(b + 16 * 2);
      for (int s = 0; s < 8; ++s) {
        const u32x16 lo = (lanes::load_u8(b + 16 * (4 + s / 2)) >> (4 * (s % 2))) & 0xFu;
        D[s] = d * lanes::to_f32((i32x16)(lo | (((hi >> (2 * s)) & 3u) << 4)) - 32);
      }
    }
  }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    template <int P>
    f32x16 at(int l) const { return d * iq4_value(q + 16 * l, 4 * P); }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    return {b + 16 * (kCodesAt + 16 * (r / 32)), D[0]};
  }
};
using IQ4NL = IQ4<32, 2>;
using IQ4XS = IQ4<256, 8>;

// The other grid types (codecs/iq3.cpp, iq2_s.cpp, iq1.cpp): a group is a scale's columns (32, or 16),
// a part 8 of them, whose grid points group.part<P>() gathers (codecs/grid_lanes.h) when the part
// starts, as IQ2XXS does; D holds each group's db (or dl).
struct IQ3XXS {
  static constexpr int kBlock = 256, kBytes = 98, kSub = 32, kGroup = 32, kParts = 4;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s) D[s] = d * (0.5f + lanes::to_f32(lanes::load_le32(b + 16 * (66 + 4 * s)) >> 28)) * 0.5f;
  }
  struct Group {
    const uint8_t* q;  // the group's 8 grid indexes
    u32x16 aux;
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 a = lanes::load_u8(q + 16 * 2 * P), c = lanes::load_u8(q + 16 * (2 * P + 1));
      return codecs::grid4x2(codec_tables::iq3xxs_grid, a, c, codecs::ksign((aux >> (7 * P)) & 0x7Fu), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 8 * s), lanes::load_le32(b + 16 * (66 + 4 * s)), D[0]};
  }
};
struct IQ3S {
  static constexpr int kBlock = 256, kBytes = 110, kSub = 32, kGroup = 32, kParts = 4;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s)
      D[s] = d * lanes::to_f32(1u + 2u * ((lanes::load_u8(b + 16 * (106 + s / 2)) >> (4 * (s % 2))) & 0xFu));
  }
  struct Group {
    const uint8_t *q, *signs;  // the group's 8 low index bytes and 4 sign bytes
    u32x16 qh;                 // their ninth bits
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 a = lanes::load_u8(q + 16 * 2 * P) | (((qh >> (2 * P)) & 1u) << 8);
      const u32x16 c = lanes::load_u8(q + 16 * (2 * P + 1)) | (((qh >> (2 * P + 1)) & 1u) << 8);
      return codecs::grid4x2(codec_tables::iq3s_grid, a, c, lanes::load_u8(signs + 16 * P), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 8 * s), b + 16 * (74 + 4 * s), lanes::load_u8(b + 16 * (66 + s)), D[0]};
  }
};
// IQ2_XS and IQ2_S: one 4-bit scale per 16 columns.
inline void iq2_scales16(const uint8_t* b, const uint8_t* scales, f32x16* D) {
  const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
  for (int s = 0; s < 16; ++s) D[s] = codecs::iq2_db(d, scales, s);
}
struct IQ2XS {
  static constexpr int kBlock = 256, kBytes = 74, kSub = 16, kGroup = 16, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) { iq2_scales16(b, b + 16 * 66, D); }
  struct Group {
    const uint8_t* q;  // the group's two u16
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 v = lanes::load_le16(q + 16 * 2 * P);
      return codecs::grid8(codec_tables::iq2xs_grid, v & 511u, codecs::ksign(v >> 9), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    return {b + 16 * (2 + 4 * (r / 16)), D[0]};
  }
};
struct IQ2S {
  static constexpr int kBlock = 256, kBytes = 82, kSub = 16, kGroup = 16, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) { iq2_scales16(b, b + 16 * 74, D); }
  struct Group {
    const uint8_t* b;
    int k;  // the group's first 8-column index (2 a group)
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const int i = k + P;
      const u32x16 top = (lanes::load_u8(b + 16 * (66 + i / 4)) >> (2 * (i % 4))) & 3u;
      const u32x16 idx = lanes::load_u8(b + 16 * (2 + i)) | (top << 8);
      return codecs::grid8(codec_tables::iq2s_grid, idx, lanes::load_u8(b + 16 * (34 + i)), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) { return {b, 2 * (r / 16), D[0]}; }
};
struct IQ1S {
  static constexpr int kBlock = 256, kBytes = 50, kSub = 32, kGroup = 32, kParts = 4;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s)
      D[s] = d * lanes::to_f32(2u * ((lanes::load_le16(b + 16 * (34 + 2 * s)) >> 12) & 7u) + 1u);
  }
  struct Group {
    const uint8_t* q;  // the group's 4 low index bytes
    u32x16 qh;
    f32x16 dl;
    template <int P>
    codecs::Iq1Octet part() const {
      return codecs::iq1_octet(lanes::load_u8(q + 16 * P) | (((qh >> (3 * P)) & 7u) << 8), qh >> 15, dl);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 4 * s), lanes::load_le16(b + 16 * (34 + 2 * s)), D[0]};
  }
};
struct IQ1M {
  static constexpr int kBlock = 256, kBytes = 56, kSub = 16, kGroup = 16, kParts = 2;
  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    u32x16 sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = lanes::load_le16(b + 16 * (48 + 2 * i));
    const f32x16 d = codecs::iq1m_d(sc);
    for (int s = 0; s < 16; ++s) D[s] = d * lanes::to_f32(2u * ((sc[s / 4] >> (3 * (s % 4))) & 7u) + 1u);
  }
  struct Group {
    const uint8_t* q;  // the group's 2 low index bytes
    u32x16 h;          // their nibbles: 3 index top bits and delta's sign each
    f32x16 dl;
    template <int P>
    codecs::Iq1Octet part() const {
      const u32x16 n = (h >> (4 * P)) & 0xFu;
      return codecs::iq1_octet(lanes::load_u8(q + 16 * P) | ((n & 7u) << 8), n >> 3, dl);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int g = r / 16;
    return {b + 16 * 2 * g, lanes::load_u8(b + 16 * (32 + g)), D[0]};
  }
};

}  // namespace kq

// One span (k0 a multiple of kSpanCols, kc of Q::kBlock) of np panels of a format Q, for packed.cpp's
// micro-kernel: group(j, k) is panel j's group starting at span column k.
template <class Q>
struct GgmlWiden {
  static constexpr int kBlock = Q::kBlock, kGroup = Q::kGroup, kParts = Q::kParts, kSubs = kSpanCols / Q::kSub;
  // Decode streams np panels at once, each from its own place in memory; the hardware prefetcher
  // keeps too few of those streams ahead (a 2048 x 4096 MXFP4 matrix at M = 1, 2 Zen 5 cores: 27
  // Gw/s without this, 40-45 with it). Each group asks for its share of the same block one span
  // further along its panel (spread over the groups: a whole K-quant block's 36 lines at once
  // measured no better than none).
  static constexpr int kStep = Q::kBytes * kPanel;  // one block of a panel (16 rows)
  static constexpr int kPrefetchBytes = kStep * (kSpanCols / kBlock), kShare = kStep / (kBlock / kGroup);
  using Group = typename Q::Group;
  const uint8_t* c;  // panel p0's block at k0
  size_t ps;         // bytes from one panel to the next
  lanes::f32x16 D[kPackN][kSubs], M[kPackN][kSubs];  // per sub-block; M unused without mins
  GgmlWiden(const Linear& L, int p0, int k0, int kc, int np)
      : ps((size_t)(L.in / kBlock) * Q::kBytes * kPanel) {
    c = L.pq + (size_t)p0 * ps + (size_t)(k0 / kBlock) * kStep;
    for (int j = 0; j < np; ++j)
      for (int b = 0; b < kc / kBlock; ++b) Q::scales(blk(j, b), &D[j][b * (kBlock / Q::kSub)], &M[j][b * (kBlock / Q::kSub)]);
  }
  const uint8_t* blk(int j, int b) const { return c + j * ps + (size_t)b * kStep; }
  Group group(int j, int k) const {
    const uint8_t* b = blk(j, k / kBlock);
    const uintptr_t from = (uintptr_t)b + kPrefetchBytes + (k % kBlock) / kGroup * kShare;
    for (uintptr_t a = from & ~(uintptr_t)63; a < from + kShare; a += 64) __builtin_prefetch((const void*)a);
    return Q::group(b, k % kBlock, &D[j][k / Q::kSub], &M[j][k / Q::kSub]);
  }
};

}  // namespace cairn

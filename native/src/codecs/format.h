// A GGUF block format, defined once (codecs/<format>.h), and the lane decoder every format gets from
// that definition. The same definition is inlined by decode's in-register widening (formats/ggml_widen.h,
// packed.cpp), so the byte offsets and the per-lane arithmetic are written in one place.
//
// A format Q is a struct of static members:
//   kName, kType              GGML type name and GGMLQuantizationType value ("Q4_K", 12)
//   kBlock, kBytes            weights per block, bytes per block (llama.cpp's layout)
//   kSub, kGroup, kParts      weights per scale (sub-block); columns of a group; equal parts of a group
//   kWordsLo, kWordsHi        (optional) bytes held as 4-byte words in a panel (codec.h, lane_byte)
//   decode(blk, out)          one block -> out[kBlock], scalar, bit-identical to gguf.quants.dequantize
//   scales(b, D, M)           16 interleaved blocks at b -> D[kBlock / kSub] (and M: the mins) vectors
//   group(b, r, D, M)         the Group of columns r .. r + kGroup (D, M: its first sub-block's)
//   Group::at<P>(l)           16 lanes' weight of column r + P * kGroup / kParts + l, or, where a part
//                             has state of its own, Group::part<P>() is the object whose at<P>(l) does;
//                             where kWordCols is defined, at<P, S>(l) is column l + S, l a multiple of 4
// and one line in codecs/all.h. Nothing else names a format.
//
// Every number is gguf.quants' dequantize_blocks, operation by operation in float32: each numpy
// product or difference is one rounding here. Every file that instantiates these (codecs/registry.cpp,
// packed.cpp) is compiled with -ffp-contract=off (native/CMakeLists.txt) so `a * b - c` is never fused
// behind our back; the only fusions are explicit ones proven exact at the format (lanes::fmsub_exact,
// fmadd_exact).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::kq {

using lanes::f32x16;
using lanes::i32x16;
using lanes::u32x16;

// The list of formats (codecs/all.h): a type list, data only.
template <class... Q>
struct Formats {};

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

// The part interface's two forms (above): part_of<P>(g) is the object whose at<P> gives part P's
// columns; has_words: a part whose codes are words gives its columns in fours (at<P, S>).
template <class G, class = void>
struct has_parts : std::false_type {};
template <class G>
struct has_parts<G, std::void_t<decltype(std::declval<G>().template part<0>())>> : std::true_type {};
template <int P, class G>
__attribute__((always_inline)) inline auto part_of(const G& g) {
  if constexpr (has_parts<G>::value) return g.template part<P>();
  else return g;
}
template <class Q, class = void>
struct has_words : std::false_type {};
template <class Q>
struct has_words<Q, std::void_t<decltype(Q::kWordCols)>> : std::true_type {};

// The byte range a format keeps as words in a panel ([0, 0): none).
template <class Q, class = void>
struct word_range {
  static constexpr int lo = 0, hi = 0;
};
template <class Q>
struct word_range<Q, std::void_t<decltype(Q::kWordsLo)>> {
  static constexpr int lo = Q::kWordsLo, hi = Q::kWordsHi;
};

// The lane decoder (codec.h, decode_lanes) of any format: its definition walked column by column,
// the same walk as packed.cpp's columns_in, each column stored instead of multiplied.
// out[k * 16 + l]: weight k of lane l.
template <int P, class G>
__attribute__((always_inline)) inline void lane_part(const G& g, int len, float* __restrict out) {
  const auto q = part_of<P>(g);
  using Part = std::remove_const_t<decltype(q)>;
  if constexpr (has_words<Part>::value) {
    for (int l = 0; l < len; l += 4) {
      lanes::store(out + 16 * l, q.template at<P, 0>(l));
      lanes::store(out + 16 * (l + 1), q.template at<P, 1>(l));
      lanes::store(out + 16 * (l + 2), q.template at<P, 2>(l));
      lanes::store(out + 16 * (l + 3), q.template at<P, 3>(l));
    }
  } else {
    for (int l = 0; l < len; ++l) lanes::store(out + 16 * l, q.template at<P>(l));
  }
}
template <class Q, class G, int... P>
__attribute__((always_inline)) inline void lane_parts(const G& g, float* __restrict out, std::integer_sequence<int, P...>) {
  constexpr int len = Q::kGroup / Q::kParts;
  (lane_part<P>(g, len, out + 16 * P * len), ...);
}
template <class Q>
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  f32x16 D[Q::kBlock / Q::kSub], M[Q::kBlock / Q::kSub];  // per sub-block; M unused without mins
  Q::scales(b, D, M);
  for (int r = 0; r < Q::kBlock; r += Q::kGroup)
    lane_parts<Q>(Q::group(b, r, D + r / Q::kSub, M + r / Q::kSub), out + 16 * r,
                  std::make_integer_sequence<int, Q::kParts>{});
}

}  // namespace cairn::kq

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
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
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

// One column into the tile. Below AVX-512 a 16-lane value is two halves, and GCC 12 lowers the store
// of a joined pair (lanes::join, as fmsub_exact returns one) as 16 element extracts: stored as its
// halves it is two plain stores (the Q4_K lane decoder ran at 1.2 G weights/s against 5.6 before).
__attribute__((always_inline)) inline void store_column(float* p, f32x16 v) {
#if defined(__AVX512F__)
  lanes::store(p, v);
#else
  const lanes::f32x8 a = lanes::half<0>(v), b = lanes::half<1>(v);
  std::memcpy(p, &a, 32);
  std::memcpy(p + 8, &b, 32);
#endif
}
// The lane decoder (codec.h, decode_lanes) of any format: its definition walked into memory,
// out[k * 16 + l] = weight k of lane l. A group's parts are walked column by column across the parts
// (all parts' column l, then l + 1), every value of a step computed before any is stored, so parts
// that read the same code byte (Q2_K's four 2-bit fields, Q4_K's two nibbles of a word) load it once.
// Parts with state of their own (the grid types) go part after part, as their decoders always did:
// four grid parts' state at once is 16 vectors, which spilled (IQ3_XXS at 0.6x).
// Parts P... (consecutive, from P0) of a group: q holds their part objects in order, out is part
// P0's first column.
template <class Q, class Parts, int... P>
__attribute__((always_inline)) inline void lane_columns(const Parts& q, float* __restrict out,
                                                        std::integer_sequence<int, P...>) {
  constexpr int len = Q::kGroup / Q::kParts, P0 = std::min({P...}), n = sizeof...(P);
  using Part0 = std::remove_cv_t<std::remove_reference_t<decltype(std::get<0>(q))>>;
  if constexpr (has_words<Part0>::value) {
    for (int l = 0; l < len; l += 4) {
      const f32x16 v[4][n] = {{std::get<P - P0>(q).template at<P, 0>(l)...},
                              {std::get<P - P0>(q).template at<P, 1>(l)...},
                              {std::get<P - P0>(q).template at<P, 2>(l)...},
                              {std::get<P - P0>(q).template at<P, 3>(l)...}};
      for (int s = 0; s < 4; ++s)
        for (int p = 0; p < n; ++p) store_column(out + 16 * (p * len + l + s), v[s][p]);
    }
  } else {
    for (int l = 0; l < len; ++l) {
      const f32x16 v[n] = {std::get<P - P0>(q).template at<P>(l)...};
      for (int p = 0; p < n; ++p) store_column(out + 16 * (p * len + l), v[p]);
    }
  }
}
template <class Q, class G, int... P>
__attribute__((always_inline)) inline void lane_group(const G& g, float* __restrict out, std::integer_sequence<int, P...> ps) {
  if constexpr (has_parts<G>::value) {
    constexpr int len = Q::kGroup / Q::kParts;
    (lane_columns<Q>(std::tuple{g.template part<P>()}, out + 16 * P * len, std::integer_sequence<int, P>{}), ...);
  } else {
    lane_columns<Q>(std::tuple{part_of<P>(g)...}, out, ps);
  }
}
template <class Q>
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  f32x16 D[Q::kBlock / Q::kSub], M[Q::kBlock / Q::kSub];  // per sub-block; M unused without mins
  Q::scales(b, D, M);
  for (int r = 0; r < Q::kBlock; r += Q::kGroup)
    lane_group<Q>(Q::group(b, r, D + r / Q::kSub, M + r / Q::kSub), out + 16 * r,
                  std::make_integer_sequence<int, Q::kParts>{});
}

}  // namespace cairn::kq

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
// The formats themselves (byte offsets, sub-blocks, per-lane arithmetic) are defined once in
// codecs/<format>.h (codecs/format.h: the interface); their lane decoders (codec.h, decode_lanes) are
// the same definitions walked into memory, so the two paths cannot disagree. packed.cpp, which
// inlines them, is compiled with -ffp-contract=off (native/CMakeLists.txt), so nothing is fused
// behind our back; the micro-kernel's accumulate is an explicit fma.
#pragma once
#include "../codecs/all.h"
#include "../codecs/codec.h"
#include "formats.h"
#include "lanes.h"
#include "widen.h"

namespace cairn {

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

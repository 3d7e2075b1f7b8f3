// cairn kernel: GGUF block formats (codecs/: Q8_0, the K-quants, IQ2_XXS, MXFP4, ...). A panel is
// 16 stored rows back to back, [ceil(N/16)][16][K/block*bytes]: the file's bytes, regrouped only
// where rows are interleaved (fused gate/up), so resident memory is the stored bytes. A k-span is
// widened a row at a time by the block codec, then laid into the fp32 panel tile.
#include <algorithm>
#include <cstring>

#include "../codecs/codec.h"
#include "formats.h"

namespace cairn {
namespace {

size_t row_bytes(const BlockCodec* c, int K) { return (size_t)(K / c->block) * c->bytes; }

size_t code_bytes(const BlockCodec* c, int N, int K) {
  return (size_t)((N + kPanel - 1) / kPanel) * kPanel * row_bytes(c, K);
}
size_t scale_bytes(int, int) { return 0; }

void pack(const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t*) {
  for (size_t n = 0; n < rows.size(); ++n) {
    if (!rows[n].src) continue;  // a zero row: zero bytes decode to 0 in every block format
    const Linear& L = *rows[n].src;
    const size_t rb = row_bytes(L.codec, K);
    std::memcpy(codes + n * rb, L.q + (size_t)rows[n].r * rb, rb);
  }
}

void decode(const Linear& L, int p0, int np, int k0, int kc, float* out) {
  const BlockCodec& c = *L.codec;
  const size_t rb = row_bytes(&c, L.in), b0 = (size_t)(k0 / c.block) * c.bytes;
  thread_local std::vector<float> row;
  row.resize((size_t)kc);
  for (int j = 0; j < np; ++j) {
    float* o = out + (size_t)j * kc * kPanel;
    for (int l = 0; l < kPanel; ++l) {
      c.decode_blocks(L.pq + ((size_t)(p0 + j) * kPanel + l) * rb + b0, kc / c.block, row.data());
      for (int k = 0; k < kc; ++k) o[(size_t)k * kPanel + l] = row[k];
    }
  }
}

int step(const Linear& L) { return L.codec->block; }

}  // namespace

extern const PanelCodec kGgmlBlocks{"GGML", code_bytes, scale_bytes, pack, decode, step};

}  // namespace cairn

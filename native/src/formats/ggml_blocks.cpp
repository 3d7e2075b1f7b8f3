// cairn kernel: GGUF block formats (codecs/: Q8_0, the K-quants, IQ2_XXS, MXFP4, ...). A panel holds
// its 16 rows' blocks interleaved, [ceil(N/16)][K/block][bytes * 16]: byte i of every lane's block b
// side by side (or, in a codec's word range, 4-byte words side by side: codec.h, lane_byte), a
// permutation of the stored bytes (resident memory is the stored bytes). A
// codec's lane decoder then widens 16 rows' block at once into the fp32 tile, one vector per column
// (every codec has one: codecs/format.h, decode_lanes).
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
    const BlockCodec& c = *L.codec;
    const size_t rb = row_bytes(&c, K), p = n / kPanel, l = n % kPanel;
    const uint8_t* src = L.q + (size_t)rows[n].r * rb;
    uint8_t* dst = codes + p * kPanel * rb;
    for (size_t b = 0; b < rb / c.bytes; ++b, src += c.bytes, dst += (size_t)c.bytes * kPanel) place_block(c, src, dst, (int)l);
  }
}

void decode(const Linear& L, int p0, int np, int k0, int kc, float* out) {
  const BlockCodec& c = *L.codec;
  const size_t rb = row_bytes(&c, L.in), stride = (size_t)c.bytes * kPanel;  // bytes of one 16-lane block
  for (int j = 0; j < np; ++j) {
    const uint8_t* blk = L.pq + (size_t)(p0 + j) * kPanel * rb + (size_t)(k0 / c.block) * stride;
    float* o = out + (size_t)j * kc * kPanel;
    for (int k = 0; k < kc; k += c.block, blk += stride, o += (size_t)c.block * kPanel) c.decode_lanes(blk, o);
  }
}

int step(const Linear& L) { return L.codec->block; }

}  // namespace

extern const PanelCodec kGgmlBlocks{"GGML", code_bytes, scale_bytes, pack, decode, step};

}  // namespace cairn

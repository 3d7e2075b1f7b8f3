#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
namespace cairn {
// One GGUF storage format: blocks of `block` consecutive weights of a row, `bytes` bytes each, as
// llama.cpp writes them. decode() writes the block's `block` weights as fp32, bit-identical to
// gguf.quants.dequantize (the reference).
struct BlockCodec {
  const char* name;     // GGML type name, "Q4_K"
  int ggml_type;        // GGMLQuantizationType value, 12 for Q4_K
  int block;            // weights per block (256 for K-quants, 32 for Q8_0/MXFP4)
  int bytes;            // bytes per block
  void (*decode)(const uint8_t* blk, float* out);  // out[block]
  // Decode n consecutive blocks (a whole row, or a span of one) into out[n*block]; may be faster.
  void (*decode_blocks)(const uint8_t* blk, int n, float* out);
  // 16 rows' blocks interleaved as a panel holds them (lane_byte below) -> out[k*16 + l] = weight k
  // of row l (block x 16 floats), the same bits as decode() of each row's block.
  void (*decode_lanes)(const uint8_t* blk16, float* out);
  // Bytes [words_lo, words_hi) of a block (a multiple of 4 long: the 4-bit codes) are interleaved as
  // 4-byte words, so one 64-byte load is a word of every lane and a column's codes are a shift of
  // it; a widening byte load per column costs a cross-lane shuffle that bounded decode on Zen 4.
  int words_lo = 0, words_hi = 0;
};
// Where byte i of lane l's block sits among 16 interleaved blocks: byte by byte (16i + l), or in
// the word range, lane l's 4-byte word beside the other lanes' words.
inline int lane_byte(const BlockCodec& c, int i, int l) {
  if (i < c.words_lo || i >= c.words_hi) return 16 * i + l;
  const int o = i - c.words_lo;
  return 16 * c.words_lo + 64 * (o / 4) + 4 * l + o % 4;
}
// Lane l's block (c.bytes at src) into its places among 16 interleaved blocks at dst16 (lane_byte;
// a word's 4 bytes sit together, so they go at once: packing a model is this per block).
inline void place_block(const BlockCodec& c, const uint8_t* src, uint8_t* dst16, int l) {
  for (int i = 0, n; i < c.bytes; i += n) {
    n = i >= c.words_lo && i < c.words_hi ? 4 : 1;
    std::memcpy(dst16 + lane_byte(c, i, l), src + i, n);
  }
}
const BlockCodec* find_codec(int ggml_type);        // nullptr: not supported
const BlockCodec* find_codec(const std::string& name);
const std::vector<const BlockCodec*>& all_codecs();  // in a fixed order, for error messages
}  // namespace cairn

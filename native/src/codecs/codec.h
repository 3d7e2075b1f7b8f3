#pragma once
#include <cstdint>
#include <string>
#include <vector>
namespace cairn {
// One GGUF storage format: blocks of `block` consecutive weights of a row, `bytes` bytes each, as
// llama.cpp writes them. decode() writes the block's `block` weights as fp32, bit-identical to
// gguf.quants.dequantize (the reference).
struct BlockCodec {
  const char* name;     // GGML type name, "Q4_K"
  int ggml_type;        // GGMLQuantizationType value, 12 for Q4_K
  int block;            // weights per block (256 for K-quants, 32 for Q8_0/MXFP4, 1 for F32/F16/BF16)
  int bytes;            // bytes per block
  void (*decode)(const uint8_t* blk, float* out);  // out[block]
  // Decode n consecutive blocks (a whole row, or a span of one) into out[n*block]; may be faster.
  void (*decode_blocks)(const uint8_t* blk, int n, float* out);
  // 16 rows' blocks byte-interleaved (blk16[i*16 + l] = byte i of row l's block) -> out[k*16 + l]
  // = weight k of row l (block x 16 floats), the same bits as decode() of each row's block.
  void (*decode_lanes)(const uint8_t* blk16, float* out);
};
const BlockCodec* find_codec(int ggml_type);        // nullptr: not supported
const BlockCodec* find_codec(const std::string& name);
const std::vector<const BlockCodec*>& all_codecs();  // in a fixed order, for error messages
}  // namespace cairn

// The codec table: every GGUF block-quantized format the kernel can compute on, by GGML type and
// name. GGUF's F32/F16/BF16 tensors are not here: the loader passes them as the float types they
// are (daemon/weights/gguf_dir.py), so no Linear ever holds them as blocks. Every codec has a lane
// decoder (formats/ggml_blocks.cpp calls it unconditionally) and an in-register form for decode
// (packed.cpp, packed_panels).
#include <cstring>

#include "codec_impl.h"

namespace cairn {

const std::vector<const BlockCodec*>& all_codecs() {
  // GGML type order; the codec objects are constant-initialised, so no static-order hazard.
  static const std::vector<const BlockCodec*> table = {
      &codecs::Q4_0,    &codecs::Q4_1,   &codecs::Q5_0,    &codecs::Q5_1,  &codecs::Q8_0,   &codecs::Q2_K,
      &codecs::Q3_K,    &codecs::Q4_K,   &codecs::Q5_K,    &codecs::Q6_K,  &codecs::IQ2_XXS, &codecs::IQ2_XS,
      &codecs::IQ3_XXS, &codecs::IQ1_S,  &codecs::IQ4_NL,  &codecs::IQ3_S, &codecs::IQ2_S,  &codecs::IQ4_XS,
      &codecs::IQ1_M,   &codecs::MXFP4};
  return table;
}

const BlockCodec* find_codec(int ggml_type) {
  for (const BlockCodec* c : all_codecs())
    if (c->ggml_type == ggml_type) return c;
  return nullptr;
}

const BlockCodec* find_codec(const std::string& name) {
  for (const BlockCodec* c : all_codecs())
    if (name == c->name) return c;
  return nullptr;
}

}  // namespace cairn

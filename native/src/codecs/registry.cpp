// The codec table: every GGUF block-quantized format the kernel can compute on (codecs/all.h), by
// GGML type and name. GGUF's F32/F16/BF16 tensors are not here: the loader passes them as the float
// types they are (daemon/weights/gguf_dir.py), so no Linear ever holds them as blocks. Each entry is
// made from its format's one definition (codecs/format.h): the scalar decoder, and the lane decoder
// walked from the same lane arithmetic decode's in-register widening inlines (packed.cpp). This file
// is compiled with -ffp-contract=off (native/CMakeLists.txt): the decoders round like numpy.
#include <cstring>

#include "all.h"
#include "codec_impl.h"

namespace cairn {
namespace {

template <class Q>
constexpr BlockCodec codec_of() {
  return {Q::kName,
          Q::kType,
          Q::kBlock,
          Q::kBytes,
          Q::decode,
          codecs::decode_each<Q::decode, Q::kBlock, Q::kBytes>,
          kq::decode_lanes<Q>,
          kq::word_range<Q>::lo,
          kq::word_range<Q>::hi};
}
template <class... Q>
const std::vector<const BlockCodec*>& table(kq::Formats<Q...>) {
  static const BlockCodec codecs[] = {codec_of<Q>()...};
  static const std::vector<const BlockCodec*> t = [] {
    std::vector<const BlockCodec*> v;
    for (const BlockCodec& c : codecs) v.push_back(&c);
    return v;
  }();
  return t;
}

}  // namespace

const std::vector<const BlockCodec*>& all_codecs() { return table(kq::AllFormats{}); }

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

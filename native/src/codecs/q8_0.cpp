// Q8_0: 32 weights per 34-byte block: f16 scale d, then 32 int8 codes. w = fl(d * q).
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* blk, float* out) {
  const float d = f16_at(blk);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * (float)q[i];
}

}  // namespace

const BlockCodec Q8_0{"Q8_0", 8, 32, 34, decode, decode_each<decode, 32, 34>};

}  // namespace cairn::codecs

// Q8_0: 32 weights per 34-byte block: f16 scale d, then 32 int8 codes. w = fl(d * q).
#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* blk, float* out) {
  const float d = f16_at(blk);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * (float)q[i];
}

// 16 rows at once (codec.h, decode_lanes): the same product, one lane per row.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int i = 0; i < 32; ++i) store(out + 16 * i, d * to_f32(load_i8(b + 16 * (2 + i))));
}

}  // namespace

const BlockCodec Q8_0{"Q8_0", 8, 32, 34, decode, decode_each<decode, 32, 34>, decode_lanes};

}  // namespace cairn::codecs

// TEMPORARY (replaced by the codecs branch): Q8_0 only, to test the panel path.
#include <cstring>
#include "codec.h"
namespace cairn {
static float h2f(uint16_t h) { return (float)*(const _Float16*)&h; }
static void dec(const uint8_t* b, float* o) {
  uint16_t h; std::memcpy(&h, b, 2); const float d = h2f(h);
  for (int i = 0; i < 32; ++i) o[i] = d * (float)(int8_t)b[2 + i];
}
static void decn(const uint8_t* b, int n, float* o) { for (int i = 0; i < n; ++i) dec(b + 34 * i, o + 32 * i); }
static const BlockCodec kQ8{"Q8_0", 8, 32, 34, dec, decn};
const std::vector<const BlockCodec*>& all_codecs() { static std::vector<const BlockCodec*> v{&kQ8}; return v; }
const BlockCodec* find_codec(int t) { for (auto c : all_codecs()) if (c->ggml_type == t) return c; return nullptr; }
const BlockCodec* find_codec(const std::string& n) { for (auto c : all_codecs()) if (n == c->name) return c; return nullptr; }
}

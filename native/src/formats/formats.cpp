// cairn kernel: which codec a format is (formats.h).
#include <stdexcept>

#include "formats.h"

namespace cairn {

extern const PanelCodec kFp8E4M3, kFp8E4M3F, kFp4E2M1, kGgmlBlocks, kBf16Panels_;

const PanelCodec& panel_codec(QFmt f) {
  switch (f) {
    case QFmt::E4M3: return kFp8E4M3;
    case QFmt::E4M3F: return kFp8E4M3F;
    case QFmt::E2M1: return kFp4E2M1;
    case QFmt::Ggml: return kGgmlBlocks;
    default: throw std::logic_error("fp32 panels have no codec");
  }
}
const PanelCodec& bf16_codec() { return kBf16Panels_; }

}  // namespace cairn

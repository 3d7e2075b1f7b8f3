// Every GGUF block-quantized format the kernel computes on (codecs/format.h: a format is one file),
// in GGML type order. This list is the only place a format is registered: the codec table
// (registry.cpp) and decode's in-register widening (packed.cpp) are both made from it.
#pragma once
#include "format.h"
#include "iq1.h"
#include "iq2_s.h"
#include "iq2_xxs.h"
#include "iq3.h"
#include "iq4.h"
#include "legacy.h"
#include "mxfp4.h"
#include "q2_k.h"
#include "q3_k.h"
#include "q4_k.h"
#include "q5_k.h"
#include "q6_k.h"
#include "q8_0.h"

namespace cairn::kq {

using AllFormats = Formats<Q40, Q41, Q50, Q51, Q80, Q2K, Q3K, Q4K, Q5K, Q6K, IQ2XXS, IQ2XS, IQ3XXS, IQ1S, IQ4NL,
                           IQ3S, IQ2S, IQ4XS, IQ1M, MXFP4>;

}  // namespace cairn::kq

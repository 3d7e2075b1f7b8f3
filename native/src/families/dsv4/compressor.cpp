// cairn kernel: KV compressors (HCA: non-overlapping windows of `rate`; CSA and the CSA
// indexer: two-series overlapping windows of width 2*rate, stride rate).
//
// Design notes
//  * Token-at-a-time streaming equals HF's chunked store/peel logic: a window emits exactly
//    when its last token (position % rate == rate-1) arrives, whatever the chunking.
//  * Entry w pools, per channel, softmax_j(gate_j + ape_j) * kv_j; CSA slots are
//    [window w-1's Ca (overlap, gate already biased) | window w's Cb]. For w = 0 the Ca slots
//    have weight 0 (HF: zero kv, -inf gate), so they are simply skipped.
//  * Then weighted RMSNorm(dim) and compress-theta RoPE at position w*rate.
#include <cmath>
#include <cstring>
#include <limits>

#include "cairn/forward.h"
#include "dsv4.h"
#include "cairn/kernels.h"

namespace cairn {

static void emit_entry(const Model& m, const CompressorW& w, State& st, CompState& cs, bool overlap,
                       int64_t widx) {
  const int R = cs.rate, dim = cs.dim, cw = cs.cw;
  std::vector<float> out(dim);
  const bool has_prev = overlap && widx > 0;
  for (int c = 0; c < dim; ++c) {
    // logits over slots; the current window's column is c (HCA) or dim + c (CSA: Cb)
    const int cc = overlap ? dim + c : c;
    float mx = -std::numeric_limits<float>::infinity();
    float lg[2 * 1024];
    int ns = 0;
    if (has_prev)
      for (int j = 0; j < R; ++j) { lg[ns] = cs.ov_gate[(size_t)j * dim + c]; mx = std::max(mx, lg[ns]); ++ns; }
    for (int j = 0; j < R; ++j) {
      lg[ns] = cs.buf_gate[(size_t)j * cw + cc] + w.ape[(size_t)j * cw + cc];
      mx = std::max(mx, lg[ns]);
      ++ns;
    }
    float sum = 0.f;
    for (int j = 0; j < ns; ++j) { lg[j] = std::exp(lg[j] - mx); sum += lg[j]; }
    float acc = 0.f;
    int s = 0;
    if (has_prev)
      for (int j = 0; j < R; ++j, ++s) acc += cs.ov_kv[(size_t)j * dim + c] * (lg[s] / sum);
    for (int j = 0; j < R; ++j, ++s) acc += cs.buf_kv[(size_t)j * cw + cc] * (lg[s] / sum);
    out[c] = acc;
  }
  rmsnorm(out.data(), w.norm, out.data(), dim, m.cfg.rms_eps);
  rope(out.data(), dim, m.cfg.r, m.inv_freq_comp.data(), widx * R);
  const int64_t pos = (widx + 1) * R - 1;  // the token that completed the window
  st.will_append(cs, pos);
  st.append_entry(cs, out.data());
  if (overlap) {  // keep this window's Ca (gate biased) for the next entry
    st.will_write(cs.ov_kv.data(), (int64_t)cs.ov_kv.size(), pos);
    st.will_write(cs.ov_gate.data(), (int64_t)cs.ov_gate.size(), pos);
    for (int j = 0; j < R; ++j)
      for (int c = 0; c < dim; ++c) {
        cs.ov_kv[(size_t)j * dim + c] = cs.buf_kv[(size_t)j * cw + c];
        cs.ov_gate[(size_t)j * dim + c] = cs.buf_gate[(size_t)j * cw + c] + w.ape[(size_t)j * cw + c];
      }
  }
}

void compressor_feed(const Model& m, const CompressorW& w, State& st, CompState& cs, bool overlap,
                     const float* kv, const float* gate, int S, int64_t pos0) {
  const int R = cs.rate, cw = cs.cw;
  for (int i = 0; i < S; ++i) {
    const int64_t p = pos0 + i;
    const int slot = (int)(p % R);
    st.will_write(&cs.buf_kv[(size_t)slot * cw], cw, p);
    st.will_write(&cs.buf_gate[(size_t)slot * cw], cw, p);
    std::memcpy(&cs.buf_kv[(size_t)slot * cw], kv + (size_t)i * cw, sizeof(float) * cw);
    std::memcpy(&cs.buf_gate[(size_t)slot * cw], gate + (size_t)i * cw, sizeof(float) * cw);
    if (slot == R - 1) emit_entry(m, w, st, cs, overlap, p / R);
  }
}

}  // namespace cairn

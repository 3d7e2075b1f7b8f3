// cairn kernel: the forward entry points every family shares: one chunk, a batched decode step, a
// speculative call and its rewind, chunked prefill. The family's decoder (FamilyOps::run) does the
// layers; these keep n, tokens and logits.
//
// Design notes
//  * State is only mutated inside a call; the abort flag is checked between chunks, so a State
//    always reflects a whole number of completed chunks.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cairn/forward.h"
#include "cairn/profile.h"

namespace cairn {

double g_prof[P_N] = {};
const char* const g_prof_names[P_N] = {"hc", "qkv", "compress", "indexer", "attn", "out",
                                      "router", "experts", "head"};

std::atomic<int> StepFault::skip{-1};
thread_local bool StepFault::in_worker = false;

void StepFault::check() {
  int k = skip.load();
  while (k >= 0 && !skip.compare_exchange_weak(k, k - 1)) {
  }
  if (k == 0) throw std::runtime_error("injected fault in a decode step (test hook _fail_worker_step)");
}

void forward_chunk(State& st, const int32_t* tokens, int S, float* logits_out, bool all_logits) {
  st.journal.j.reset();  // a plain call: nothing to rewind into any more
  const Model& m = *st.model;
  const int V = m.cfg.vocab;
  const Seg seg{&st, st.n, 0, S};
  // the head: only the rows whose logits are needed
  const int r0 = all_logits ? 0 : S - 1;
  std::vector<float> logits = m.family->run(m, &seg, 1, tokens, S, r0);
  if (StepFault::in_worker) StepFault::check();
  st.n += S;
  st.tokens.insert(st.tokens.end(), tokens, tokens + S);
  st.last_logits.assign(logits.end() - V, logits.end());
  if (logits_out) std::memcpy(logits_out, logits.data(), sizeof(float) * logits.size());
}

void forward_batch(State* const* states, const int32_t* tokens, int B, float* logits_out) {
  const Model& m = *states[0]->model;
  const int V = m.cfg.vocab;
  std::vector<Seg> segs(B);
  for (int b = 0; b < B; ++b) {
    states[b]->journal.j.reset();
    segs[b] = Seg{states[b], states[b]->n, b, 1};
  }
  std::vector<float> logits = m.family->run(m, segs.data(), B, tokens, B, 0);
  for (int b = 0; b < B; ++b) {
    State& st = *states[b];
    st.n += 1;
    st.tokens.push_back(tokens[b]);
    st.last_logits.assign(logits.begin() + (size_t)b * V, logits.begin() + (size_t)(b + 1) * V);
  }
  if (logits_out) std::memcpy(logits_out, logits.data(), sizeof(float) * logits.size());
}

void verify_batch(State* const* states, const int32_t* tokens, const int* lens, int B, float* logits_out) {
  const Model& m = *states[0]->model;
  const int V = m.cfg.vocab;
  if (!m.family->supports_verify)
    throw std::invalid_argument(std::string("speculative decoding is off for ") + m.family->name +
                                ": its state cannot be rewound (verify/rewind journal only DeepSeek-V4's writes)");
  std::vector<Seg> segs(B);
  int S = 0;
  for (int b = 0; b < B; ++b) {
    State& st = *states[b];
    st.journal.j = std::make_unique<Journal>();
    st.journal.j->reserve(m.cfg, lens[b]);  // never grows past journal_bytes (Model.verify_journal_nbytes)
    st.journal.j->n0 = st.n;
    st.journal.j->logits_before = st.last_logits;
    segs[b] = Seg{&st, st.n, S, lens[b]};
    S += lens[b];
  }
  std::vector<float> logits = m.family->run(m, segs.data(), B, tokens, S, 0);  // [S, V]
  for (int b = 0; b < B; ++b) {
    State& st = *states[b];
    const int r0 = segs[b].r0, n = lens[b];
    Journal& j = *st.journal.j;
    j.logits.assign(logits.begin() + (size_t)r0 * V, logits.begin() + (size_t)(r0 + n) * V);
    j.n1 = st.n + n;
    st.n += n;
    st.tokens.insert(st.tokens.end(), tokens + r0, tokens + r0 + n);
    st.last_logits.assign(logits.begin() + (size_t)(r0 + n - 1) * V, logits.begin() + (size_t)(r0 + n) * V);
  }
  if (logits_out) std::memcpy(logits_out, logits.data(), sizeof(float) * logits.size());
}

void rewind(State& st, int64_t k) {
  Journal* j = st.journal.j.get();
  if (!j) throw std::invalid_argument("rewind: the state's last call was not a speculative one (verify)");
  if (k < 0 || k > j->n1 - j->n0)
    throw std::invalid_argument("rewind: k must be in 0.." + std::to_string(j->n1 - j->n0) + " (the tokens the last "
                                "verify fed that are still kept), got " + std::to_string(k));
  const int64_t keep = j->n1 - k;
  // Newest first over the whole record: layer by layer, a call's writes are not in position order
  // overall, only per location (and appends only per compressor).
  for (size_t i = j->writes.size(); i-- > 0;) {
    const Journal::Write& w = j->writes[i];
    if (w.pos >= keep) std::memcpy(w.dst, j->saved.data() + w.off, sizeof(float) * (size_t)w.len);
  }
  for (size_t i = j->appends.size(); i-- > 0;) {
    if (j->appends[i].second < keep) continue;
    CompState& cs = *j->appends[i].first;
    cs.rows -= 1;
    st.pages.drop_last_row(cs.arr, cs.rows);
  }
  j->writes.erase(std::remove_if(j->writes.begin(), j->writes.end(), [&](const Journal::Write& w) { return w.pos >= keep; }),
                  j->writes.end());
  j->appends.erase(std::remove_if(j->appends.begin(), j->appends.end(), [&](const auto& a) { return a.second >= keep; }),
                   j->appends.end());
  const int V = st.model->cfg.vocab;
  if (keep > j->n0)
    st.last_logits.assign(j->logits.begin() + (size_t)(keep - 1 - j->n0) * V, j->logits.begin() + (size_t)(keep - j->n0) * V);
  else
    st.last_logits = j->logits_before;
  j->logits.resize((size_t)(keep - j->n0) * V);
  st.n = keep;
  st.tokens.resize((size_t)keep);
  j->n1 = keep;
}

int64_t prefill(State& st, const int32_t* tokens, int64_t n, int chunk, const std::atomic<bool>* abort,
                float* logits_all) {
  const int V = st.model->cfg.vocab;
  int64_t done = 0;
  while (done < n) {
    if (abort && abort->load(std::memory_order_relaxed)) break;
    const int S = (int)std::min<int64_t>(chunk, n - done);
    forward_chunk(st, tokens + done, S, logits_all ? logits_all + (size_t)done * V : nullptr, logits_all != nullptr);
    done += S;
  }
  return done;
}

}  // namespace cairn

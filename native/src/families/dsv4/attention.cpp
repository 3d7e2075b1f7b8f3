// cairn kernel: attention block (sliding window + sink; CSA with indexer top-k; HCA).
//
// Design notes
//  * One KV head, K == V, stored post kv_norm + RoPE. For a chunk of S queries at positions
//    pos0.., keys are assembled as [last min(pos0, W-1) ring rows | S new rows] so query t sees
//    absolute positions t-W+1..t (W keys, itself included).
//  * Compressors run over the whole chunk before attention (as HF): query t may only use
//    entries w < (t+1)/rate. HCA attends to all of them; CSA to the indexer's top-k.
//  * Indexer: score(t, s) = sum_h relu(qI_h . k_s) * Di^-0.5 * (w_h * nI^-0.5) with one fixed
//    order of fp32 operations, so a query's scores are bit-identical whether the chunk's keys
//    are packed once and scored by the packed micro-kernel (default) or each (query, key) is
//    computed by the scalar reference loop (Model.batched_indexer = False), and whatever the
//    chunking. Top-k ties go to the lowest entry index.
//  * Softmax includes the per-head sink logit in the denominator; output RoPE is undone at the
//    query position before the grouped low-rank output projection.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "cairn/forward.h"
#include "dsv4.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"
#include "../../formats/lanes.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cairn {

IndexerStats g_indexer_stats;

// score(t, s) = sum over heads h ascending of fma(relu(d_h) * ss, w_h * ws, acc), where
// d_h = fma chain over the Di channels ascending (the packed micro-kernel's order). The
// per-query reference path below and the packed path compute exactly these operations.
// keys[s]'s column c is keys[s][c * kst] (kst 16 for keys kept as panels, 1 for rows).
static void index_scores_ref(const float* q /*[nI,Di]*/, const float* wts /*[nI]*/, const float* const* keys,
                             int kst, int64_t T, int nI, int Di, float ss, float ws, float* sc /*[T]*/) {
  for (int64_t s = 0; s < T; ++s) {
    const float* k = keys[s];
    float acc = 0.f;
    for (int h = 0; h < nI; ++h) {
      float d = 0.f;
      for (int c = 0; c < Di; ++c) d = fmadd(q[(size_t)h * Di + c], k[(size_t)c * kst], d);
      acc = fmadd(std::max(d, 0.f) * ss, wts[h] * ws, acc);
    }
    sc[s] = acc;
  }
}

// A unit of scoring work: np <= kPackN key panels ([np][Di][16]) holding keys k0 .. k0 + 16 np.
// Units are independent (each writes its own scores), so they split over threads freely.
struct KeyUnit {
  const float* p;  // the panels (null on the reference path, which reads rows)
  int64_t k0;
  int np;
};

// Scores of unit u's keys below Ti into sc[u.k0 ..] (whole panels: up to 15 past Ti): heads are
// the micro-kernel's input rows, keys its panel columns.
static void index_scores_packed(const float* const* qh /*[nI] -> [Di]*/, const float* cw /*[nI]*/, const KeyUnit& u,
                                int64_t Ti, int nI, int Di, float ss, float* sc) {
  const int np = (int)std::min<int64_t>(u.np, (Ti - u.k0 + kPanel - 1) / kPanel), nc = np * kPanel;
  const Linear keys{nullptr, u.p, nc, Di};
  float r[64 * kPackN * kPanel];  // [nI][np*16] head dots of the unit
  float* out = sc + u.k0;
  std::fill(out, out + nc, 0.f);
  packed_panels(qh, nI, keys, 0, np, r);
  for (int h = 0; h < nI; ++h)
    for (int j = 0; j < nc; ++j) out[j] = fmadd(std::max(r[h * nc + j], 0.f) * ss, cw[h], out[j]);
}

// The K best of row[0..n) (ties to the lowest index), ascending: the K-th largest value by
// nth_element on a copy, then one ascending scan taking everything above it and the lowest
// indices equal to it -- the same set a (score desc, index asc) sort would give.
static void top_k(const float* row, int64_t n, int K, std::vector<float>& tmp, std::vector<int>& out) {
  tmp.assign(row, row + n);
  std::nth_element(tmp.begin(), tmp.begin() + (K - 1), tmp.end(), std::greater<float>());
  const float v = tmp[K - 1];
  int64_t above = 0;
  for (int64_t s = 0; s < n; ++s) above += row[s] > v;
  int64_t ties = K - above;
  out.clear();
  out.reserve(K);
  for (int64_t s = 0; s < n; ++s)
    if (row[s] > v || (row[s] == v && ties-- > 0)) out.push_back((int)s);
}

// For each query i, fills sel[i] with the selected entry indices (ascending). The keys' panels
// are read in place from their page groups where the layout keeps them as panels (pages.h), else
// packed once per call. A chunk's queries split over threads; a single query (decode) splits its
// key units instead. Either way each score is the same operations, so the bits do not change.
static void indexer_select(const Model& m, const State& st, const LayerState& ls, const float* qI /*[S,nI*Di]*/,
                           const float* wI /*[S,nI]*/, int S, int64_t pos0,
                           std::vector<std::vector<int>>& sel) {
  const Config& c = m.cfg;
  const int nI = c.nI, Di = c.Di, K = c.topk, R = c.csa_rate;
  const int64_t T = ls.icomp.n_entries();
  const float ss = 1.f / std::sqrt((float)Di), ws = 1.f / std::sqrt((float)nI);
  sel.assign(S, {});
  const int64_t Tlast = std::min<int64_t>(T, (pos0 + S) / R);  // the most any query of the chunk sees
  if (Tlast <= K) {  // every query takes all its keys
    for (int i = 0; i < S; ++i) {
      sel[i].resize(std::min<int64_t>(T, (pos0 + i + 1) / R));
      std::iota(sel[i].begin(), sel[i].end(), 0);
    }
    return;
  }
  const PageLayout::Array& arr = st.pages.layout->arrays[ls.icomp.arr];
  const bool in_place = m.batched_indexer && arr.panels;
  std::vector<const float*> rows;  // the keys, from their pages (reference path, or to pack)
  std::vector<float> kp;           // [ceil(Tlast/16)][Di][16] when packed here
  std::vector<KeyUnit> units;      // covering keys [0, Tlast) in order
  auto add_units = [&](const float* p, int64_t k0, int64_t nkeys) {
    const int npan = (int)((nkeys + kPanel - 1) / kPanel);
    for (int p0 = 0; p0 < npan; p0 += kPackN)
      units.push_back({p ? p + (size_t)p0 * Di * kPanel : nullptr, k0 + (int64_t)p0 * kPanel, std::min(kPackN, npan - p0)});
  };
  if (in_place) {
    for (int64_t k0 = 0; k0 < Tlast; k0 += arr.rows)
      add_units(st.pages.group_rows(ls.icomp.arr, k0 / arr.rows), k0, std::min<int64_t>(arr.rows, Tlast - k0));
  } else {
    rows.resize(Tlast);
    for (int64_t s = 0; s < Tlast; ++s) rows[s] = st.entry(ls.icomp, s);
    if (m.batched_indexer) {
      kp.resize(packed_floats((int)Tlast, Di));
      pack_panels(rows, Di, kp.data());
      g_indexer_stats.packed_floats.fetch_add(Tlast * Di, std::memory_order_relaxed);
    }
    add_units(m.batched_indexer ? kp.data() : nullptr, 0, Tlast);
  }
  const int kst = arr.stride();
  // Unit u's scores for query i (its keys below Ti) into sc; qh, cw: the query's heads [nI].
  auto score = [&](int i, const float* const* qh, const float* cw, const KeyUnit& u, int64_t Ti, float* sc) {
    if (u.k0 >= Ti) return;
    if (m.batched_indexer) return index_scores_packed(qh, cw, u, Ti, nI, Di, ss, sc);
    const int64_t n = std::min<int64_t>(Ti - u.k0, (int64_t)u.np * kPanel);
    index_scores_ref(qI + (size_t)i * nI * Di, wI + (size_t)i * nI, rows.data() + u.k0, kst, n, nI, Di, ss, ws, sc + u.k0);
  };
  auto heads = [&](int i, const float** qh, float* cw) {
    for (int h = 0; h < nI; ++h) { qh[h] = qI + ((size_t)i * nI + h) * Di; cw[h] = wI[(size_t)i * nI + h] * ws; }
  };
  const int64_t work = (int64_t)S * Tlast * nI * Di;
  if (S == 1) {  // decode: the key units split over threads, the top-k after them
    const float* qh[64];
    float cw[64];
    heads(0, qh, cw);
    std::vector<float> sc((size_t)(Tlast + kPanel * kPackN)), tmp;
#pragma omp parallel num_threads(m.threads) if (m.threads > 1 && work > kParMinWork)
    {
      if (omp_get_thread_num() == 0 && omp_get_num_threads() > 1)
        g_indexer_stats.parallel_decode.fetch_add(1, std::memory_order_relaxed);
#pragma omp for schedule(static)
      for (size_t u = 0; u < units.size(); ++u) score(0, qh, cw, units[u], Tlast, sc.data());
    }
    top_k(sc.data(), Tlast, K, tmp, sel[0]);
    return;
  }
#pragma omp parallel num_threads(m.threads) if (work > kParMinWork)
  {
    std::vector<float> sc, tmp;
    const float* qh[64];
    float cw[64];
#pragma omp for schedule(dynamic, 4)
    for (int i = 0; i < S; ++i) {
      const int64_t Ti = std::min<int64_t>(T, (pos0 + i + 1) / R);
      std::vector<int>& out = sel[i];
      if (Ti <= K) {
        out.resize(Ti);
        std::iota(out.begin(), out.end(), 0);
        continue;
      }
      heads(i, qh, cw);
      sc.resize((size_t)(Ti + kPanel * kPackN));
      for (const KeyUnit& u : units) score(i, qh, cw, u, Ti, sc.data());
      top_k(sc.data(), Ti, K, tmp, out);
    }
  }
}

AttnStats g_attn_stats;

#if defined(__AVX2__) || defined(__AVX512F__)
constexpr int kPvH = 6;  // heads a pass holds: 6 x 16 accumulators (12 ymm / 6 zmm)
#else
constexpr int kPvH = 2;
#endif

// o[h][d] = sum over keys k ascending of p[h][k] * rows[k][d], one fma chain from 0 per output:
// the chain the packed product runs over pack_panels_kn(rows) (packed.cpp: acc = fma(x[k], w[k],
// acc), k ascending), whose panel column k is 16 consecutive floats of rows[k] -- so the rows are
// read where they are instead. MH heads of p [.., ldp] from h0 into o [.., Dh].
template <int MH>
static void pv_heads(const float* p, int ldp, int h0, const float* const* rows, int nk, int Dh, float* o) {
  const float* ph[MH];
  for (int a = 0; a < MH; ++a) ph[a] = p + (size_t)(h0 + a) * ldp;
  int d0 = 0;
  for (; d0 + kPanel <= Dh; d0 += kPanel) {
#if defined(__AVX512F__)
    __m512 acc[MH];
    for (int a = 0; a < MH; ++a) acc[a] = _mm512_setzero_ps();
    for (int k = 0; k < nk; ++k) {
      const __m512 u = _mm512_loadu_ps(rows[k] + d0);
      for (int a = 0; a < MH; ++a) acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(ph[a][k]), u, acc[a]);
    }
    for (int a = 0; a < MH; ++a) _mm512_storeu_ps(o + (size_t)(h0 + a) * Dh + d0, acc[a]);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[MH][2];
    for (int a = 0; a < MH; ++a) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
    for (int k = 0; k < nk; ++k) {
      const __m256 u0 = _mm256_loadu_ps(rows[k] + d0), u1 = _mm256_loadu_ps(rows[k] + d0 + 8);
      for (int a = 0; a < MH; ++a) {
        const __m256 w = _mm256_set1_ps(ph[a][k]);
        acc[a][0] = _mm256_fmadd_ps(w, u0, acc[a][0]);
        acc[a][1] = _mm256_fmadd_ps(w, u1, acc[a][1]);
      }
    }
    for (int a = 0; a < MH; ++a) {
      _mm256_storeu_ps(o + (size_t)(h0 + a) * Dh + d0, acc[a][0]);
      _mm256_storeu_ps(o + (size_t)(h0 + a) * Dh + d0 + 8, acc[a][1]);
    }
#else
    lanes::f32x16 acc[MH] = {};
    for (int k = 0; k < nk; ++k) {
      const lanes::f32x16 u = lanes::load_f32(rows[k] + d0);
      for (int a = 0; a < MH; ++a) acc[a] = lanes::fmadd_lanes(ph[a][k], u, acc[a]);
    }
    for (int a = 0; a < MH; ++a) lanes::store(o + (size_t)(h0 + a) * Dh + d0, acc[a]);
#endif
  }
  for (; d0 < Dh; ++d0)  // a last part-panel: the micro-kernel's lanes round as fmadd does (kernels.h)
    for (int a = 0; a < MH; ++a) {
      float acc = 0.f;
      for (int k = 0; k < nk; ++k) acc = fmadd(ph[a][k], rows[k][d0], acc);
      o[(size_t)(h0 + a) * Dh + d0] = acc;
    }
}

// Heads [h0, h1) of o = P U (pv_heads), kPvH at a time.
static void pv_rows(const float* p, int ldp, int h0, int h1, const float* const* rows, int nk, int Dh, float* o) {
  using Fn = void (*)(const float*, int, int, const float* const*, int, int, float*);
  static constexpr Fn kFns[] = {&pv_heads<1>, &pv_heads<2>, &pv_heads<3>, &pv_heads<4>, &pv_heads<5>, &pv_heads<6>};
  for (int h = h0; h < h1; h += kPvH) {
    const int mh = std::min(kPvH, h1 - h);
    kFns[mh - 1](p, ldp, h, rows, nk, Dh, o);
  }
}

// One (query, head)'s softmax with its sink, in place: row [nu] (a block's key union: the window
// [lo, hi] and HCA [nwin, nwin + vh) visible, every other key set to an exact 0) and srw [nsel]
// (its CSA top-k). Both attention paths call this, so their weights are the same bits.
static void softmax_head(float* row, int nu, int lo, int hi, int nwin, int vh, float* srw, int nsel, float sink,
                         float scale) {
  float mx = sink;
  for (int j = 0; j < nu; ++j) row[j] *= scale;
  for (int e = 0; e < nsel; ++e) srw[e] *= scale;
  for (int j = lo; j <= hi; ++j) mx = std::max(mx, row[j]);
  for (int j = nwin; j < nwin + vh; ++j) mx = std::max(mx, row[j]);
  for (int e = 0; e < nsel; ++e) mx = std::max(mx, srw[e]);
  for (int j = 0; j < nu; ++j) row[j] -= mx;
  for (int e = 0; e < nsel; ++e) srw[e] -= mx;
  vexp(row, row, nu);
  if (nsel) vexp(srw, srw, nsel);
  std::fill(row, row + lo, 0.f);  // masked keys weigh exactly 0
  std::fill(row + hi + 1, row + nwin, 0.f);
  std::fill(row + nwin + vh, row + nu, 0.f);
  float sum = 0.f;
  for (int j = lo; j <= hi; ++j) sum += row[j];
  for (int j = nwin; j < nwin + vh; ++j) sum += row[j];
  for (int e = 0; e < nsel; ++e) sum += srw[e];
  sum += fexp(sink - mx);
  const float inv = 1.f / sum;
  for (int j = 0; j < nu; ++j) row[j] *= inv;
  for (int e = 0; e < nsel; ++e) srw[e] *= inv;
}

// A block of one query (decode; a chunk's last block of one), its keys read where they are:
// nothing is packed but its own H heads. keys = [window rows | HCA rows] (the first nu, all
// visible) then its CSA top-k rows. Scores: the packed product with the roles swapped -- the
// query's heads packed as the weights, the key rows its input rows; fma(u[c], q[c], acc) over Dh
// ascending is the same chain as today's fma(q[c], u[c], acc) -- and o = P U by pv_rows, so every
// number is the block path's. Key rows split over threads for the scores, heads for the rest
// (one barrier between). The window/HCA keys' softmax runs over [0, nu) as one visible run: the
// block path's window-then-HCA order, nothing masked. o [H, Dh].
static void attend_one(const float* q /*[H,Dh]*/, const std::vector<const float*>& keys, int nu, int H, int Dh,
                       float scale, const float* sink /*[H]*/, int nt, float* o) {
  const int nk = (int)keys.size(), nsel = nk - nu;
  std::vector<const float*> qh(H);
  for (int h = 0; h < H; ++h) qh[h] = q + (size_t)h * Dh;
  std::vector<float> qp(packed_floats(H, Dh));  // [ceil(H/16)][Dh][16]
  pack_panels(qh, Dh, qp.data());
  const Linear heads{nullptr, qp.data(), H, Dh};
  std::vector<float> sk((size_t)nk * H);  // [nk, H] scores as the product gives them
  std::vector<float> sc((size_t)H * nk);  // [H, nk] the same per head, then its weights
  std::vector<float> osel((size_t)(nsel ? H : 0) * Dh);  // [H, Dh] the top-k keys' part
  constexpr int kRows = 48;  // key rows per scoring task: whole row tiles on every target
  const int ntask = (nk + kRows - 1) / kRows;
  const bool par = nt > 1 && 2 * (int64_t)nk * H * Dh > kParMinWork && !omp_in_parallel();
  g_attn_stats.one_query.fetch_add(1, std::memory_order_relaxed);
  if (par) g_attn_stats.one_query_parallel.fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel num_threads(nt) if (par)
  {
#pragma omp for schedule(static)
    for (int t = 0; t < ntask; ++t) {
      const int k0 = t * kRows;
      linear_rows(keys.data() + k0, std::min(kRows, nk - k0), heads, &sk[(size_t)k0 * H], H);
    }
    // then each thread its own heads, start to end (the weights of a head are its thread's own)
    const int T = omp_get_num_threads(), me = omp_get_thread_num();
    const int h0 = H * me / T, h1 = H * (me + 1) / T;
    for (int h = h0; h < h1; ++h) {
      float* row = &sc[(size_t)h * nk];
      for (int j = 0; j < nk; ++j) row[j] = sk[(size_t)j * H + h];
      softmax_head(row, nu, 0, nu - 1, nu, 0, row + nu, nsel, sink[h], scale);
    }
    pv_rows(sc.data(), nk, h0, h1, keys.data(), nu, Dh, o);
    if (nsel) {
      pv_rows(sc.data() + nu, nk, h0, h1, keys.data() + nu, nsel, Dh, osel.data());
      for (size_t d = (size_t)h0 * Dh; d < (size_t)h1 * Dh; ++d) o[d] = o[d] + osel[d];
    }
  }
}

// The call's projected rows, shared by its segments: segment g reads rows r0 .. r0 + S of each.
struct AttnRows {
  const float *q /*[Stot,H,Dh]*/, *kv /*[Stot,Dh]*/, *cs, *sn /*[Stot,r/2]*/;
  const float *ckv, *cg /*[Stot,cw]*/, *ikv, *ig /*[Stot,icw]*/, *qI /*[Stot,nI*Di]*/, *wI /*[Stot,nI]*/;
  float* o;  // [Stot, H, Dh]
};

// One segment's own work: its window ring, compressors, indexer and attention, on its own state
// and its own rows of o. nt: threads it may use inside; prof: its section timers.
static void attend_segment(const Model& m, int layer, const AttnSeg& seg, const AttnRows& R, int nt, double* prof) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const AttnType type = c.layer_types[layer];
  const int H = c.H, Dh = c.Dh, r = c.r, W = c.W, half = r / 2;
  double t0 = omp_get_wtime();
  auto lap = [&](Section s) {
    const double t = omp_get_wtime();
    prof[s] += t - t0;
    t0 = t;
  };
  State& st = *seg.st;
  LayerState& ls = *seg.ls;
  const int S = seg.S, R0 = seg.r0;
  const int64_t pos0 = seg.pos0;
  const float* q = R.q + (size_t)R0 * H * Dh;
  const float* csg = R.cs + (size_t)R0 * half;
  const float* sng = R.sn + (size_t)R0 * half;

  // The window's key rows where they are: position p < pos0 in the ring (its slot is rewritten
  // only after attention, below), the chunk's own in kvnew [S, Dh].
  const int ring = W - 1;
  const float* kvnew = R.kv + (size_t)R0 * Dh;
  auto key_row = [&](int64_t p) {
    return p < pos0 ? &ls.win[(size_t)(p % ring) * Dh] : kvnew + (size_t)(p - pos0) * Dh;
  };

  // compressors + indexer
  std::vector<std::vector<int>> sel;  // CSA: selected entries per query
  if (type != AttnType::Sliding) {
    const int cw = ls.comp.cw;
    compressor_feed(m, L.comp, st, ls.comp, type == AttnType::CSA, R.ckv + (size_t)R0 * cw, R.cg + (size_t)R0 * cw,
                    S, pos0);
    lap(P_COMPRESS);
    if (type == AttnType::CSA) {
      const int icw = ls.icomp.cw, nI = c.nI, Di = c.Di;
      compressor_feed(m, L.icomp, st, ls.icomp, true, R.ikv + (size_t)R0 * icw, R.ig + (size_t)R0 * icw, S, pos0);
      indexer_select(m, st, ls, &R.qI[(size_t)R0 * nI * Di], &R.wI[(size_t)R0 * nI], S, pos0, sel);
      lap(P_INDEXER);
    }
  }
  // attention: o [S, H, Dh]. K == V and all heads share one KV head, so a block of kQB
  // queries runs as GEMMs over the union of its keys, U = [window rows t0-W+1 .. t1 | HCA
  // entries visible to the block's last query]: scores [nq*H, |U|] = Q U^T, then per (query,
  // head) a masked softmax (with sink) and o = P U. A masked key's weight is an exact 0, so a
  // query's sums see the same nonzero terms in the same order whichever block it falls in.
  // CSA queries add their own top-k entries as a second, per-query pair of GEMMs. A block of one
  // query (decode) does the same sums without packing its keys (attend_one).
  float* o = R.o + (size_t)R0 * H * Dh;
  const float scale = 1.f / std::sqrt((float)Dh);
  const int rate = type == AttnType::HCA ? c.hca_rate : c.csa_rate;
  const int64_t nent = ls.comp.n_entries();
  constexpr int kQB = 16;
  const int nblk = (S + kQB - 1) / kQB;
  const int64_t extra_keys = type == AttnType::HCA ? nent : type == AttnType::CSA ? std::min<int64_t>(nent, c.topk) : 0;
  const int64_t attn_work = (int64_t)S * H * Dh * (std::min<int64_t>(W, pos0 + S) + extra_keys);
  struct Scratch {
    std::vector<float> uq, uv, sc, sq, sv, ssc, osel;
    std::vector<const float*> urow, qrow, prow, srow;
  };
  auto block = [&](int b, Scratch& scr) {
    {
      auto& [uq, uv, sc, sq, sv, ssc, osel, urow, qrow, prow, srow] = scr;
      const int i0 = b * kQB, nq = std::min(kQB, S - i0);
      const int64_t tf = pos0 + i0, tl = tf + nq - 1;
      const int64_t u0 = std::max<int64_t>(0, tf - W + 1);
      const int nwin = (int)(tl - u0 + 1);
      const int nhca = type == AttnType::HCA ? (int)std::min<int64_t>(nent, (tl + 1) / rate) : 0;
      const int nu = nwin + nhca;
      urow.resize(nu);
      for (int j = 0; j < nwin; ++j) urow[j] = key_row(u0 + j);
      for (int e = 0; e < nhca; ++e) urow[nwin + e] = st.entry(ls.comp, e);
      if (nq == 1) {
        if (type == AttnType::CSA)
          for (int e : sel[i0]) urow.push_back(st.entry(ls.comp, e));
        attend_one(q + (size_t)i0 * H * Dh, urow, nu, H, Dh, scale, L.sink, nt, o + (size_t)i0 * H * Dh);
        for (int h = 0; h < H; ++h)
          rope_apply(o + ((size_t)i0 * H + h) * Dh, Dh, r, &csg[(size_t)i0 * half], &sng[(size_t)i0 * half], -1.f);
        return;
      }
      uq.resize(packed_floats(nu, Dh));
      uv.resize(packed_floats(Dh, nu));
      pack_panels(urow, Dh, uq.data());
      pack_panels_kn(urow.data(), nu, Dh, uv.data());
      g_attn_stats.keys_packed.fetch_add(2 * (int64_t)nu * Dh, std::memory_order_relaxed);
      qrow.resize((size_t)nq * H);
      for (int a = 0; a < nq * H; ++a) qrow[a] = &q[((size_t)i0 * H + a) * Dh];
      sc.resize((size_t)nq * H * nu);
      linear_rows(qrow.data(), nq * H, Linear{nullptr, uq.data(), nu, Dh}, sc.data(), nu);
      for (int a = 0; a < nq; ++a) {
        const int i = i0 + a;
        const int64_t t = pos0 + i;
        const int lo = (int)(std::max<int64_t>(0, t - W + 1) - u0), hi = (int)(t - u0);  // window [lo, hi]
        const int vh = type == AttnType::HCA ? (int)std::min<int64_t>(nent, (t + 1) / rate) : 0;
        const int nsel = type == AttnType::CSA ? (int)sel[i].size() : 0;
        if (nsel) {  // this query's top-k entries: scores [H, nsel]
          srow.resize(nsel);
          for (int e = 0; e < nsel; ++e) srow[e] = st.entry(ls.comp, sel[i][e]);
          sq.resize(packed_floats(nsel, Dh));
          pack_panels(srow, Dh, sq.data());
          ssc.resize((size_t)H * nsel);
          linear_rows(&qrow[(size_t)a * H], H, Linear{nullptr, sq.data(), nsel, Dh}, ssc.data(), nsel);
        }
        for (int h = 0; h < H; ++h)
          softmax_head(&sc[((size_t)a * H + h) * nu], nu, lo, hi, nwin, vh, nsel ? &ssc[(size_t)h * nsel] : nullptr,
                       nsel, L.sink[h], scale);
        if (nsel) {  // o_sel [H, Dh] = P_sel S, added to the window/HCA part below
          sv.resize(packed_floats(Dh, nsel));
          pack_panels_kn(srow.data(), nsel, Dh, sv.data());
          g_attn_stats.keys_packed.fetch_add(2 * (int64_t)nsel * Dh, std::memory_order_relaxed);
          prow.resize(H);
          for (int h = 0; h < H; ++h) prow[h] = &ssc[(size_t)h * nsel];
          osel.resize((size_t)nq * H * Dh);
          linear_rows(prow.data(), H, Linear{nullptr, sv.data(), Dh, nsel}, &osel[(size_t)a * H * Dh], Dh);
        }
      }
      // o rows of the block [nq*H, Dh] = P U, one product for the whole block
      prow.resize((size_t)nq * H);
      for (int a = 0; a < nq * H; ++a) prow[a] = &sc[(size_t)a * nu];
      float* ob = o + (size_t)i0 * H * Dh;
      linear_rows(prow.data(), nq * H, Linear{nullptr, uv.data(), Dh, nu}, ob, Dh);
      for (int a = 0; a < nq; ++a) {
        const int i = i0 + a;
        float* oi = ob + (size_t)a * H * Dh;
        if (type == AttnType::CSA && !sel[i].empty())
          for (int d = 0; d < H * Dh; ++d) oi[d] = oi[d] + osel[(size_t)a * H * Dh + d];
        for (int h = 0; h < H; ++h)
          rope_apply(oi + (size_t)h * Dh, Dh, r, &csg[(size_t)i * half], &sng[(size_t)i * half], -1.f);
      }
    }
  };
  // Blocks over threads only when there are several: a region around one block (decode) would make
  // attend_one's own region a nested one, which libgomp serves with new threads each time.
  if (nt > 1 && nblk > 1 && attn_work > kParMinWork) {
#pragma omp parallel num_threads(nt)
    {
      Scratch scr;
#pragma omp for schedule(dynamic, 1)
      for (int b = 0; b < nblk; ++b) block(b, scr);
    }
  } else {
    Scratch scr;
    for (int b = 0; b < nblk; ++b) block(b, scr);
  }
  // The chunk's rows into the ring, now that nothing reads the slots they take. Rows a later row
  // of the chunk overwrites are skipped, except in a journaled call: rewinding into the chunk must
  // find each position's own write to undo to.
  for (int64_t p = st.journal.j ? pos0 : std::max<int64_t>(pos0, pos0 + S - ring); p < pos0 + S; ++p) {
    st.will_write(&ls.win[(size_t)(p % ring) * Dh], Dh, p);
    std::memcpy(&ls.win[(size_t)(p % ring) * Dh], &kvnew[(size_t)(p - pos0) * Dh], sizeof(float) * Dh);
  }
  lap(P_ATTN);
}

// The projections (q, kv, compressor and indexer inputs, output) are per-row products over all
// Stot rows at once, so each weight is read once for every sequence of a batched decode; the
// window ring, compressors, indexer and attention itself run per segment on its own state --
// several segments (a batched decode's states) side by side on the threads, each writing only its
// own state and its own rows. Every row's numbers are the same whichever rows share the call (the
// packed micro-kernel's sums depend only on the row), which is what makes a batched decode
// bit-identical to single ones.
void attention_rows(const Model& m, int layer, const AttnSeg* segs, int nseg, const float* x, int Stot,
                    float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const AttnType type = c.layer_types[layer];
  const int D = c.D, H = c.H, Dh = c.Dh, r = c.r, Rq = c.Rq, W = c.W, nt = m.threads;
  const float* inv_freq = type == AttnType::Sliding ? m.inv_freq_main.data() : m.inv_freq_comp.data();
  const int half = r / 2;
  double t0 = omp_get_wtime();

  // cos/sin per query position: [Stot, r/2]
  std::vector<float> cs((size_t)Stot * half), sn((size_t)Stot * half);
  for (int g = 0; g < nseg; ++g)
    for (int i = 0; i < segs[g].S; ++i) {
      const int row = segs[g].r0 + i;
      rope_cs(segs[g].pos0 + i, half, inv_freq, &cs[(size_t)row * half], &sn[(size_t)row * half]);
    }

  // query path
  std::vector<float> qr((size_t)Stot * Rq);  // [Stot, Rq] q_residual
  linear(x, Stot, L.wq_a, qr.data(), nt);
  for (int i = 0; i < Stot; ++i) rmsnorm(&qr[(size_t)i * Rq], L.q_norm, &qr[(size_t)i * Rq], Rq, c.rms_eps);
  std::vector<float> qall((size_t)Stot * H * Dh);  // [Stot, H, Dh]
  linear(qr.data(), Stot, L.wq_b, qall.data(), nt);
  for (int i = 0; i < Stot; ++i)
    for (int h = 0; h < H; ++h) {
      float* qh = &qall[((size_t)i * H + h) * Dh];
      rmsnorm(qh, nullptr, qh, Dh, c.rms_eps);
      rope_apply(qh, Dh, r, &cs[(size_t)i * half], &sn[(size_t)i * half], 1.f);
    }
  // new key/value rows: [Stot, Dh]
  std::vector<float> kvall((size_t)Stot * Dh);
  linear(x, Stot, L.wkv, kvall.data(), nt);
  for (int i = 0; i < Stot; ++i) {
    float* kr = &kvall[(size_t)i * Dh];
    rmsnorm(kr, L.kv_norm, kr, Dh, c.rms_eps);
    rope_apply(kr, Dh, r, &cs[(size_t)i * half], &sn[(size_t)i * half], 1.f);
  }
  prof_lap(P_QKV, t0);
  // compressor and indexer inputs: [Stot, .]
  std::vector<float> ckv, cg, ikv, ig, qIall, wIall;
  if (type != AttnType::Sliding) {
    const int cw = segs[0].ls->comp.cw;
    ckv.resize((size_t)Stot * cw);
    cg.resize((size_t)Stot * cw);
    linear(x, Stot, L.comp.wkv, ckv.data(), nt);
    linear(x, Stot, L.comp.wgate, cg.data(), nt);
    prof_lap(P_COMPRESS, t0);
    if (type == AttnType::CSA) {
      const int icw = segs[0].ls->icomp.cw, nI = c.nI, Di = c.Di;
      ikv.resize((size_t)Stot * icw);
      ig.resize((size_t)Stot * icw);
      linear(x, Stot, L.icomp.wkv, ikv.data(), nt);
      linear(x, Stot, L.icomp.wgate, ig.data(), nt);
      qIall.resize((size_t)Stot * nI * Di);
      wIall.resize((size_t)Stot * nI);
      linear(qr.data(), Stot, L.iwq_b, qIall.data(), nt);
      for (int i = 0; i < Stot; ++i)
        for (int h = 0; h < nI; ++h)
          rope_apply(&qIall[((size_t)i * nI + h) * Di], Di, r, &cs[(size_t)i * half], &sn[(size_t)i * half], 1.f);
      linear(x, Stot, L.iweights, wIall.data(), nt);
      prof_lap(P_INDEXER, t0);
    }
  }
  std::vector<float> oall((size_t)Stot * H * Dh);  // [Stot, H, Dh]
  const AttnRows R{qall.data(), kvall.data(), cs.data(), sn.data(), ckv.data(), cg.data(),
                   ikv.data(),  ig.data(),    qIall.data(), wIall.data(), oall.data()};

  // Segments side by side when there are several and their attention is worth a parallel region;
  // inside, each runs on its one thread (nested regions stay inactive).
  int64_t seg_work = 0;
  for (int g = 0; g < nseg; ++g) {
    const int64_t nent = type == AttnType::Sliding ? 0 : segs[g].ls->comp.n_entries();
    const int64_t extra = type == AttnType::HCA ? nent : std::min<int64_t>(nent, c.topk);
    seg_work += (int64_t)segs[g].S * H * Dh * (std::min<int64_t>(W, segs[g].pos0 + segs[g].S) + extra);
  }
  if (nseg > 1 && nt > 1 && seg_work > kParMinWork) {
    g_attn_stats.segment_parallel.fetch_add(1, std::memory_order_relaxed);
    // Section timers: each thread adds up its own; the region's wall time is then shared out in
    // their proportions, so the sections still add up to the call's time.
    double sum[P_N] = {};
    const double w0 = omp_get_wtime();
#pragma omp parallel num_threads(std::min(nt, nseg))
    {
      double mine[P_N] = {};
#pragma omp for schedule(dynamic, 1)
      for (int g = 0; g < nseg; ++g) attend_segment(m, layer, segs[g], R, 1, mine);
#pragma omp critical(cairn_attn_prof)
      for (int s = 0; s < P_N; ++s) sum[s] += mine[s];
    }
    const double wall = omp_get_wtime() - w0, tot = std::accumulate(sum, sum + P_N, 0.0);
    for (int s = 0; s < P_N && tot > 0; ++s) g_prof[s] += wall * sum[s] / tot;
  } else {
    for (int g = 0; g < nseg; ++g) attend_segment(m, layer, segs[g], R, nt, g_prof);
  }
  t0 = omp_get_wtime();

  // grouped low-rank output: z [Stot, G*Ro]; y = wo_b z
  const int G = c.G, Ro = c.Ro, gin = H * Dh / G;
  std::vector<float> z((size_t)Stot * G * Ro);
  for (int g = 0; g < G; ++g)
    linear(oall.data() + (size_t)g * gin, Stot, H * Dh, L.wo_a_g[g], z.data() + (size_t)g * Ro, G * Ro, nt);
  linear(z.data(), Stot, L.wo_b, y, nt);
  prof_lap(P_OUT, t0);
  (void)D;
}

}  // namespace cairn

// cairn bindings: low-level hooks for benchmarks and tests (underscore-prefixed, not API).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <optional>
#include <string>
#include <vector>

#include "bind.h"
#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"
#include "codecs/codec.h"
#include "formats/formats.h"
#include "formats/pow2_chain.h"

namespace py = pybind11;

namespace {
// (y, seconds per call) for y = x @ W.T, W packed by pack(N, K) into a Linear (untimed), the product
// run reps times with the GIL released. pack returns the Linear and keeps its panels alive in `keep`.
template <class Pack>
py::tuple timed_linear(const py::array_t<float, py::array::c_style | py::array::forcecast>& x, int N, int threads,
                       int reps, const char* name, Pack&& pack) {
  if (reps < 1) throw py::value_error(std::string(name) + ": reps must be >= 1");
  const int M = (int)x.shape(0), K = (int)x.shape(1);
  py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)N});
  const float* xp = x.data();
  float* yp = y.mutable_data();
  double dt;
  {
    py::gil_scoped_release rel;
    std::vector<uint8_t> keep;
    const cairn::Linear L = pack(N, K, keep);
    const double t0 = omp_get_wtime();
    for (int r = 0; r < reps; ++r) cairn::linear(xp, M, L, yp, std::max(1, threads));
    dt = (omp_get_wtime() - t0) / reps;
  }
  return py::make_tuple(y, dt);
}
// 64-byte aligned room for n bytes in keep
uint8_t* aligned(std::vector<uint8_t>& keep, size_t n) {
  keep.assign(n + 64, 0);
  return keep.data() + (64 - (uintptr_t)keep.data() % 64) % 64;
}
}  // namespace

void register_bench(py::module_& m) {
  m.def("_packed_matmul", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                             py::array_t<float, py::array::c_style | py::array::forcecast> w, int threads,
                             int reps) {
    if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(1))
      throw py::value_error("_packed_matmul: want x [M, K], w [N, K]");
    const float* wp = w.data();
    return timed_linear(x, (int)w.shape(0), threads, reps, "_packed_matmul", [&](int N, int K, std::vector<uint8_t>& keep) {
      float* P = (float*)aligned(keep, cairn::packed_floats(N, K) * sizeof(float));
      std::vector<const float*> rows(N);
      for (int i = 0; i < N; ++i) rows[i] = wp + (size_t)i * K;
      cairn::pack_panels(rows, K, P);
      return cairn::Linear{nullptr, P, N, K};
    });
  }, py::arg("x"), py::arg("w"), py::arg("threads") = 1, py::arg("reps") = 1,
     "(y, seconds per call) for y = x @ w.T through the packed-panel GEMM (w packed once, untimed).");
  m.def("_ggml_matmul", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                           py::array_t<uint8_t, py::array::c_style> blocks, const std::string& type, int threads,
                           int reps) {
    const cairn::BlockCodec* c = cairn::find_codec(type);
    if (!c || c->block == 1) throw py::value_error("_ggml_matmul: want a GGUF block type, got " + type);
    if (x.ndim() != 2 || blocks.ndim() != 2 || x.shape(1) % c->block != 0 ||
        blocks.shape(1) != x.shape(1) / c->block * c->bytes)
      throw py::value_error("_ggml_matmul: want x [M, K], blocks [N, K / block * bytes]");
    const uint8_t* bp = blocks.data();
    return timed_linear(x, (int)blocks.shape(0), threads, reps, "_ggml_matmul", [&](int N, int K, std::vector<uint8_t>& keep) {
      const cairn::PanelCodec& C = cairn::panel_codec(cairn::QFmt::Ggml);
      cairn::Linear L{};
      L.out = N, L.in = K, L.qf = cairn::QFmt::Ggml, L.codec = c, L.q = bp;
      std::vector<cairn::QRow> rows(N);
      for (int i = 0; i < N; ++i) rows[i] = {&L, i};
      uint8_t* P = aligned(keep, C.code_bytes(c, N, K));
      C.pack(rows, K, P, nullptr);
      L.q = nullptr, L.pq = P;
      return L;
    });
  }, py::arg("x"), py::arg("blocks"), py::arg("type"), py::arg("threads") = 1, py::arg("reps") = 1,
     "(y, seconds per call) for y = x @ W.T, W a GGUF block matrix (rows of `type` blocks as stored), through "
     "the block panels the model uses (packed once, untimed).");
  m.def("_qfmt_matmul", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                           py::array_t<uint8_t, py::array::c_style> codes, py::array_t<uint8_t, py::array::c_style> scales,
                           const std::string& fmt, int threads, int reps) {
    const bool fp4 = fmt == "FP4";
    if (!fp4 && fmt != "FP8") throw py::value_error("_qfmt_matmul: fmt must be FP4 or FP8, got " + fmt);
    const int G = fp4 ? cairn::kFp4Group : cairn::kFp8Block;
    if (x.ndim() != 2 || codes.ndim() != 2 || scales.ndim() != 2)
      throw py::value_error("_qfmt_matmul: want x [M, K], codes [N, K or K / 2], scales 2-d");
    const int N = (int)codes.shape(0), K = (int)x.shape(1);
    const int so = fp4 ? N : (N + G - 1) / G, si = (K + G - 1) / G;
    if ((fp4 && K % G) || codes.shape(1) != (fp4 ? K / 2 : K) || scales.shape(0) != so || scales.shape(1) != si)
      throw py::value_error("_qfmt_matmul: want codes [N, K] (FP8) or [N, K / 2] (FP4, K a multiple of 32) and "
                            "scales [ceil(N / 128), ceil(K / 128)] (FP8) or [N, K / 32] (FP4)");
    const uint8_t *cp = codes.data(), *sp = scales.data();
    return timed_linear(x, N, threads, reps, "_qfmt_matmul", [&](int N, int K, std::vector<uint8_t>& keep) {
      const cairn::QFmt f = fp4 ? cairn::QFmt::E2M1 : cairn::QFmt::E4M3;
      const cairn::PanelCodec& C = cairn::panel_codec(f);
      cairn::Linear L{};
      L.out = N, L.in = K, L.qf = f, L.q = cp, L.qs = sp;
      std::vector<cairn::QRow> rows(N);
      for (int i = 0; i < N; ++i) rows[i] = {&L, i};
      const size_t cb = C.code_bytes(nullptr, N, K), sb = C.scale_bytes(N, K);
      uint8_t* P = aligned(keep, (cb + 63) / 64 * 64 + sb);
      C.pack(rows, K, P, P + (cb + 63) / 64 * 64);
      L.q = L.qs = nullptr, L.pq = P, L.pqs = P + (cb + 63) / 64 * 64;
      return L;
    });
  }, py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("fmt"), py::arg("threads") = 1, py::arg("reps") = 1,
     "(y, seconds per call) for y = x @ W.T, W an official FP4 (codes [N, K / 2], scales [N, K / 32]) or FP8 "
     "(codes [N, K], scales [ceil(N / 128), ceil(K / 128)]) matrix, ue8m0 scale bytes, through its panels.");
  m.def("_pow2_chain", [](py::object enabled, bool reset, py::object unguarded) {
    auto& g = cairn::g_pow2;
    if (!enabled.is_none()) g.enabled.store(enabled.cast<bool>());
    if (!unguarded.is_none()) g.unguarded.store(unguarded.cast<bool>());
    py::dict d;
    d["enabled"] = g.enabled.load();
    d["scaled"] = reset ? g.scaled.exchange(0) : g.scaled.load();
    d["kept"] = reset ? g.kept.exchange(0) : g.kept.load();
    return d;
  }, py::arg("enabled") = py::none(), py::arg("reset") = true, py::arg("unguarded") = py::none(),
     "The power-of-two scale on the accumulator (formats/pow2_chain.h) for MXFP4, FP4 and FP8 decode: spans "
     "computed on it and kept on the weights-scaled path since the last reset (process-wide); enabled "
     "(True / False) turns it on or off first; unguarded=True (tests only) takes it without its exactness check.");
  m.def("_fma_peak", [](int threads, double seconds) {
    // The compute ceiling the products are measured against: fp32 FMAs on independent registers
    // (12 chains hide the FMA latency), every thread for about `seconds`.
    double flops = 0, dt;
    {
      py::gil_scoped_release rel;
      const int T = std::max(1, threads);
      std::vector<double> per(T, 0);
      const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(T)
      {
        float acc[12][16];
        for (int i = 0; i < 12; ++i)
          for (int l = 0; l < 16; ++l) acc[i][l] = 1.f + 1e-3f * (float)(i + l);
        const float a = 0.999999f, b = 1e-7f;
        int64_t n = 0;
        while (omp_get_wtime() - t0 < seconds) {
          for (int r = 0; r < 4096; ++r)
            for (int i = 0; i < 12; ++i)
#pragma omp simd
              for (int l = 0; l < 16; ++l) acc[i][l] = cairn::fmadd(acc[i][l], a, b);
          n += 4096;
        }
        float sink = 0;
        for (int i = 0; i < 12; ++i)
          for (int l = 0; l < 16; ++l) sink += acc[i][l];
        per[omp_get_thread_num()] = 2.0 * 12 * 16 * (double)n + (sink == 12345.f ? 1 : 0);
      }
      dt = omp_get_wtime() - t0;
      for (double f : per) flops += f;
    }
    return flops / dt;
  }, py::arg("threads") = 1, py::arg("seconds") = 0.5, "FLOP/s of a pure fp32 FMA loop on `threads` threads.");
  m.def("_profile", [](bool reset) {
    py::dict d;
    for (int i = 0; i < cairn::P_N; ++i) d[cairn::g_prof_names[i]] = cairn::g_prof[i];
    if (reset)
      for (double& v : cairn::g_prof) v = 0;
    return d;
  }, py::arg("reset") = true, "Seconds spent per forward section since the last reset (process-wide).");
  m.def("_fail_worker_step", [](std::optional<int> skip) {
    if (skip && *skip < -1) throw std::invalid_argument("skip must be >= -1 (-1 disarms), got " + std::to_string(*skip));
    return skip ? cairn::StepFault::skip.exchange(*skip) : cairn::StepFault::skip.load();
  }, py::arg("skip") = py::none(),
        "Test hook: arm a fault in the (skip+1)-th StepWorker decode step from now (process-wide; -1 "
        "disarms). It raises RuntimeError from the step after its layers wrote the state, before n "
        "advanced. Returns the previous setting (without skip: the current one; -1 once it fired).");
  m.def("_indexer_stats", [](bool reset) {
    auto& g = cairn::g_indexer_stats;
    py::dict d;
    d["packed_floats"] = reset ? g.packed_floats.exchange(0) : g.packed_floats.load();
    d["parallel_decode"] = reset ? g.parallel_decode.exchange(0) : g.parallel_decode.load();
    return d;
  }, py::arg("reset") = true,
        "What the CSA indexer did since the last reset (process-wide): key floats packed into panels, "
        "decode scorings split over threads.");
  m.def("_attn_stats", [](bool reset) {
    auto& g = cairn::g_attn_stats;
    py::dict d;
    for (auto [name, v] : {std::pair{"keys_packed", &g.keys_packed}, {"one_query", &g.one_query},
                           {"one_query_parallel", &g.one_query_parallel}, {"segment_parallel", &g.segment_parallel}})
      d[name] = reset ? v->exchange(0) : v->load();
    return d;
  }, py::arg("reset") = true,
        "What attention did since the last reset (process-wide): key floats packed into panels, blocks of one "
        "query (keys read in place) and those split over threads, calls that ran their segments side by side.");
}

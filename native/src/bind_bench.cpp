// cairn bindings: low-level hooks for benchmarks and tests (underscore-prefixed, not API).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <omp.h>

#include <vector>

#include "bind.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"
#include "codecs/codec.h"
#include "formats/formats.h"

namespace py = pybind11;

void register_bench(py::module_& m) {
  m.def("_packed_matmul", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                             py::array_t<float, py::array::c_style | py::array::forcecast> w, int threads,
                             int reps) {
    if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(1))
      throw py::value_error("_packed_matmul: want x [M, K], w [N, K]");
    if (reps < 1) throw py::value_error("_packed_matmul: reps must be >= 1");
    const int M = (int)x.shape(0), K = (int)x.shape(1), N = (int)w.shape(0);
    py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)N});
    const float* xp = x.data();
    const float* wp = w.data();
    float* yp = y.mutable_data();
    double dt;
    {
      py::gil_scoped_release rel;
      std::vector<float> panels(cairn::packed_floats(N, K) + 16);
      float* P = panels.data() + (16 - ((uintptr_t)panels.data() / 4) % 16) % 16;  // 64-byte aligned
      std::vector<const float*> rows(N);
      for (int i = 0; i < N; ++i) rows[i] = wp + (size_t)i * K;
      cairn::pack_panels(rows, K, P);
      cairn::Linear L{nullptr, P, N, K};
      double t0 = omp_get_wtime();
      for (int r = 0; r < reps; ++r) cairn::linear(xp, M, L, yp, std::max(1, threads));
      dt = (omp_get_wtime() - t0) / reps;
    }
    return py::make_tuple(y, dt);
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
    if (reps < 1) throw py::value_error("_ggml_matmul: reps must be >= 1");
    const int M = (int)x.shape(0), K = (int)x.shape(1), N = (int)blocks.shape(0);
    py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)N});
    const float* xp = x.data();
    float* yp = y.mutable_data();
    double dt;
    {
      py::gil_scoped_release rel;
      const cairn::PanelCodec& C = cairn::panel_codec(cairn::QFmt::Ggml);
      cairn::Linear src{};
      src.out = N, src.in = K, src.qf = cairn::QFmt::Ggml, src.codec = c, src.q = blocks.data();
      std::vector<cairn::QRow> rows(N);
      for (int i = 0; i < N; ++i) rows[i] = {&src, i};
      std::vector<uint8_t> panels(C.code_bytes(c, N, K) + 64, 0);
      uint8_t* P = panels.data() + (64 - (uintptr_t)panels.data() % 64) % 64;
      C.pack(rows, K, P, nullptr);
      cairn::Linear L{};
      L.out = N, L.in = K, L.qf = cairn::QFmt::Ggml, L.codec = c, L.pq = P;
      double t0 = omp_get_wtime();
      for (int r = 0; r < reps; ++r) cairn::linear(xp, M, L, yp, std::max(1, threads));
      dt = (omp_get_wtime() - t0) / reps;
    }
    return py::make_tuple(y, dt);
  }, py::arg("x"), py::arg("blocks"), py::arg("type"), py::arg("threads") = 1, py::arg("reps") = 1,
     "(y, seconds per call) for y = x @ W.T, W a GGUF block matrix (rows of `type` blocks as stored), through "
     "the block panels the model uses (packed once, untimed).");
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
}

// cairn bindings: low-level hooks for benchmarks and tests (underscore-prefixed, not API).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bind.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"

namespace py = pybind11;

void register_bench(py::module_& m) {
  m.def("_matmul", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                      py::array_t<float, py::array::c_style | py::array::forcecast> w, int threads) {
    if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(1))
      throw py::value_error("_matmul: want x [M, K], w [N, K]");
    const int M = (int)x.shape(0), K = (int)x.shape(1), N = (int)w.shape(0);
    py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)N});
    const float* xp = x.data();
    const float* wp = w.data();
    float* yp = y.mutable_data();
    {
      py::gil_scoped_release rel;
      cairn::matmul(xp, M, K, K, wp, N, yp, N, std::max(1, threads));
    }
    return y;
  }, py::arg("x"), py::arg("w"), py::arg("threads") = 1,
     "y = x @ w.T through the kernel's GEMM (M > 1: OpenBLAS split over OpenMP) or GEMV (M == 1).");
  m.def("_profile", [](bool reset) {
    py::dict d;
    for (int i = 0; i < cairn::P_N; ++i) d[cairn::g_prof_names[i]] = cairn::g_prof[i];
    if (reset)
      for (double& v : cairn::g_prof) v = 0;
    return d;
  }, py::arg("reset") = true, "Seconds spent per forward section since the last reset (process-wide).");
}

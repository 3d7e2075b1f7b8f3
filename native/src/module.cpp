// cairn._kernel: registration only; bindings live in bind_*.cpp, kernels in the other files.
#include <cblas.h>
#include <pybind11/pybind11.h>

#include "bind.h"
#include "cairn/model.h"
#include "cairn/state.h"

namespace py = pybind11;

PYBIND11_MODULE(_kernel, m) {
  m.doc() = "cairn DeepSeek-V4 kernel (fp32, CPU)";
  // One thread pool: OpenMP. OpenBLAS is always called single-threaded (see gemm.cpp).
  scipy_openblas_set_num_threads(1);
  m.attr("MAX_CHUNK") = cairn::MAX_CHUNK;
  m.attr("SNAPSHOT_VERSION") = cairn::SNAPSHOT_VERSION;
  register_model(m);
  register_state(m);
  register_bench(m);
}

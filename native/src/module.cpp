// cairn._kernel_<isa>: registration only; bindings live in bind_*.cpp, kernels in the other files.
// cairn/_kernel.py imports the build for the CPU it runs on (CMakeLists.txt).
#include <pybind11/pybind11.h>

#include "bind.h"
#include "cairn/model.h"
#include "cairn/state.h"

namespace py = pybind11;

PYBIND11_MODULE(CAIRN_MODULE, m) {
  m.doc() = "cairn DeepSeek-V4 kernel (fp32, CPU)";
  m.attr("ISA") = CAIRN_ISA;
  m.attr("MAX_CHUNK") = cairn::MAX_CHUNK;
  m.attr("SNAPSHOT_VERSION") = cairn::SNAPSHOT_VERSION;
  register_model(m);
  register_state(m);
  register_bench(m);
  register_experts(m);
  register_packed(m);
  register_codecs(m);
  register_qwen35(m);
}

#include <pybind11/pybind11.h>
namespace py = pybind11;
PYBIND11_MODULE(_kernel, m) { m.doc() = "cairn DeepSeek-V4 kernel"; }

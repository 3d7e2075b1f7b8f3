// cairn bindings: the packed cache file's layout description and keys.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <stdexcept>
#include <string>

#include "bind.h"
#include "packed_file.h"

namespace py = pybind11;
using namespace cairn;

void register_packed(py::module_& m) {
  m.def("packed_layout", [] {
    py::dict d;
    for (const auto& f : pack_layout()) d[py::str(f.first)] = f.second;
    return d;
  }, "The packed cache file's layout description (field -> value, in hashing order).");
  m.def("packed_layout_key", [](const std::map<std::string, std::string>& overrides) {
    try {
      return pack_layout_key(pack_layout(), overrides);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  }, py::arg("overrides") = std::map<std::string, std::string>{},
     "Key of the layout description, with some fields' values replaced (overrides: field -> value): what a "
     "build whose layout differs in those fields would compute. Every packed file's header key starts from it.");
  py::class_<BoundModel, std::shared_ptr<BoundModel>> cls =
      py::reinterpret_borrow<py::class_<BoundModel, std::shared_ptr<BoundModel>>>(m.attr("Model"));
  cls.def_property_readonly("packed_layout_key", [](const BoundModel& b) { return b.packed_layout; },
                            "The packed cache file header's layout key for this model's panels (the layout "
                            "description's key, then every matrix's format, shape and offset).");
}

// cairn bindings: State, AbortFlag, prefill / decode, snapshot / restore.
//
// Design notes
//  * Every argument is validated with the GIL held (dtype, contiguity, ids in range, chunk);
//    tokens are copied into a private vector, output arrays allocated, then the GIL is
//    released for the whole compute (safe: the kernel touches only C++ memory and the
//    Model's weights, which the State pins through a shared_ptr).
//  * A State is single-writer: a concurrent second call raises RuntimeError instead of racing.
//  * Abort: a std::atomic<bool> checked between chunks; prefill returns how far it got rather
//    than throwing (see docs/stack-notes.md).
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "bind.h"
#include "cairn/forward.h"

namespace py = pybind11;
using namespace cairn;

namespace {

struct AbortFlag {
  std::atomic<bool> v{false};
};

struct PyState : BoundState {
  std::atomic<bool> busy{false};
  using BoundState::BoundState;
};

struct BusyGuard {
  PyState& s;
  explicit BusyGuard(PyState& st) : s(st) {
    if (s.busy.exchange(true)) throw std::runtime_error("State is already in use by another call");
  }
  ~BusyGuard() { s.busy.store(false); }
};

struct KernelError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

std::vector<int32_t> check_tokens(const PyState& s, const py::handle& obj) {
  if (!py::isinstance<py::array>(obj)) throw KernelError("tokens must be a numpy.ndarray of int32");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<int32_t>()))
    throw KernelError("tokens must have dtype int32, got " + std::string(py::str(a.dtype())));
  if (a.ndim() != 1) throw KernelError("tokens must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  if (!(a.flags() & py::array::c_style)) throw KernelError("tokens must be C-contiguous");
  if (a.size() == 0) throw KernelError("tokens is empty");
  const int32_t* p = (const int32_t*)a.data();
  const int V = s.model->cfg.vocab;
  for (py::ssize_t i = 0; i < a.size(); ++i)
    if (p[i] < 0 || p[i] >= V)
      throw KernelError("token id " + std::to_string(p[i]) + " at index " + std::to_string(i) +
                        " is out of range [0, " + std::to_string(V) + ")");
  return std::vector<int32_t>(p, p + a.size());
}

py::array_t<float> vec_to_array(const std::vector<float>& v) {
  py::array_t<float> out((py::ssize_t)v.size());
  std::memcpy(out.mutable_data(), v.data(), sizeof(float) * v.size());
  return out;
}

}  // namespace

void register_state(py::module_& m) {
  static py::exception<KernelError> exc(m, "KernelError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KernelError& e) {
      py::set_error(exc, e.what());
    } catch (const std::invalid_argument& e) {
      py::set_error(exc, e.what());
    }
  });

  py::class_<AbortFlag, std::shared_ptr<AbortFlag>>(m, "AbortFlag", "Thread-safe flag checked between prefill chunks.")
      .def(py::init<>())
      .def("set", [](AbortFlag& f) { f.v.store(true); })
      .def("clear", [](AbortFlag& f) { f.v.store(false); })
      .def("is_set", [](const AbortFlag& f) { return f.v.load(); });

  py::class_<PyState>(m, "State", "Mutable per-sequence state (window KV, compressed rows, buffers, tokens, logits).")
      .def(py::init([](std::shared_ptr<BoundModel> model) {
             if (!model) throw KernelError("model must not be None");
             return std::make_unique<PyState>(model);
           }),
           py::arg("model"))
      .def_property_readonly("n_tokens", [](const PyState& s) { return s.st.n; })
      .def_property_readonly("tokens", [](const PyState& s) {
        py::array_t<int32_t> out((py::ssize_t)s.st.tokens.size());
        if (!s.st.tokens.empty()) std::memcpy(out.mutable_data(), s.st.tokens.data(), 4 * s.st.tokens.size());
        return out;
      })
      .def_property_readonly("nbytes", [](const PyState& s) { return s.st.payload_bytes(); })
      .def_property_readonly("last_logits", [](const PyState& s) -> py::object {
        if (s.st.last_logits.empty()) return py::none();
        return vec_to_array(s.st.last_logits);
      })
      .def("snapshot", [](PyState& s) {
        BusyGuard g(s);
        const size_t n = snapshot_size(s.st);
        PyObject* b = PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)n);
        if (!b) throw py::error_already_set();
        py::bytes out = py::reinterpret_steal<py::bytes>(b);
        uint8_t* dst = (uint8_t*)PyBytes_AS_STRING(b);
        {
          py::gil_scoped_release rel;  // the bytes object is new and private to this call
          snapshot_into(s.st, dst);
        }
        return out;
      }, "Owned, versioned, self-describing blob of the whole state.")
      .def_static("restore", [](std::shared_ptr<BoundModel> model, py::buffer blob) {
        if (!model) throw KernelError("model must not be None");
        py::buffer_info info = blob.request();
        if (info.ndim != 1 || info.strides[0] != info.itemsize)
          throw KernelError("blob must be a contiguous 1-D bytes-like object");
        const uint8_t* p = (const uint8_t*)info.ptr;
        size_t n = (size_t)(info.size * info.itemsize);
        std::unique_ptr<PyState> out;
        {
          py::gil_scoped_release rel;
          out = std::make_unique<PyState>(model, restore(*model, p, n));
        }
        return out;
      }, py::arg("model"), py::arg("blob"));

  m.def("prefill", [](PyState& s, py::handle tokens, int chunk, std::shared_ptr<AbortFlag> abort, bool all_logits) {
    std::vector<int32_t> tok = check_tokens(s, tokens);
    if (chunk < 1 || chunk > MAX_CHUNK)
      throw KernelError("chunk must be in 1.." + std::to_string(MAX_CHUNK) + ", got " + std::to_string(chunk));
    BusyGuard g(s);
    const int V = s.model->cfg.vocab;
    const int64_t n = (int64_t)tok.size();
    py::array_t<float> all;
    float* allp = nullptr;
    if (all_logits) {
      all = py::array_t<float>({(py::ssize_t)n, (py::ssize_t)V});
      allp = all.mutable_data();
    }
    int64_t done;
    {
      py::gil_scoped_release rel;
      done = prefill(s.st, tok.data(), n, chunk, abort ? &abort->v : nullptr, allp);
    }
    py::object logits;
    if (all_logits) {
      logits = done == n ? py::object(all) : all[py::slice(0, done, 1)].attr("copy")();
    } else if (done == 0) {
      logits = py::array_t<float>(0);
    } else {
      logits = vec_to_array(s.st.last_logits);
    }
    return py::make_tuple(done, logits);
  }, py::arg("state"), py::arg("tokens"), py::kw_only(), py::arg("chunk") = 128, py::arg("abort") = nullptr,
     py::arg("all_logits") = false,
     "Feed tokens in chunks of <= chunk. Returns (n_done, logits): [V] after the last completed token, "
     "or [n_done, V] when all_logits. Stops between chunks when abort is set.");

  m.def("decode", [](PyState& s, int64_t token) {
    const int V = s.model->cfg.vocab;
    if (token < 0 || token >= V)
      throw KernelError("token id " + std::to_string(token) + " is out of range [0, " + std::to_string(V) + ")");
    BusyGuard g(s);
    int32_t t = (int32_t)token;
    py::array_t<float> out(V);
    float* o = out.mutable_data();
    {
      py::gil_scoped_release rel;
      forward_chunk(s.st, &t, 1, o, false);
    }
    return out;
  }, py::arg("state"), py::arg("token"), "Feed one token; returns float32 logits [V].");

  m.def("decode_batch", [](py::sequence states, py::sequence tokens, std::shared_ptr<AbortFlag> abort) {
    const py::ssize_t B = py::len(states);
    if (B == 0) throw KernelError("states is empty");
    if ((py::ssize_t)py::len(tokens) != B)
      throw KernelError("tokens has " + std::to_string(py::len(tokens)) + " entries, states has " +
                        std::to_string(B) + "; they must match");
    std::vector<PyState*> ps((size_t)B);
    std::vector<State*> sts((size_t)B);
    std::vector<int32_t> tok((size_t)B);
    std::unordered_set<PyState*> seen;
    for (py::ssize_t b = 0; b < B; ++b) {
      py::object o = states[b];
      if (!py::isinstance<PyState>(o)) throw KernelError("states[" + std::to_string(b) + "] is not a State");
      PyState* s = o.cast<PyState*>();
      if (b && s->model.get() != ps[0]->model.get())
        throw KernelError("states[" + std::to_string(b) + "] belongs to another model than states[0]");
      if (!seen.insert(s).second)
        throw KernelError("states[" + std::to_string(b) + "] appears twice; each state advances once per step");
      py::object tb = tokens[b];
      if (!PyIndex_Check(tb.ptr()) || PyBool_Check(tb.ptr()))
        throw KernelError("tokens[" + std::to_string(b) + "] must be an integer token id");
      int64_t t;
      try {
        t = py::cast<int64_t>(tb);
      } catch (const py::cast_error&) {
        throw KernelError("tokens[" + std::to_string(b) + "] is not a 64-bit integer");
      }
      const int V = s->model->cfg.vocab;
      if (t < 0 || t >= V)
        throw KernelError("tokens[" + std::to_string(b) + "]: token id " + std::to_string(t) +
                          " is out of range [0, " + std::to_string(V) + ")");
      ps[b] = s;
      sts[b] = &s->st;
      tok[b] = (int32_t)t;
    }
    // Claim every state before touching any; on a conflict release those already claimed.
    py::ssize_t claimed = 0;
    for (; claimed < B; ++claimed)
      if (ps[claimed]->busy.exchange(true)) break;
    auto release = [&] {
      for (py::ssize_t b = 0; b < claimed; ++b) ps[b]->busy.store(false);
    };
    if (claimed < B) {
      release();
      throw std::runtime_error("states[" + std::to_string(claimed) + "] is already in use by another call");
    }
    const int V = ps[0]->model->cfg.vocab;
    py::array_t<float> out;
    try {
      if (abort && abort->v.load()) {
        out = py::array_t<float>(std::vector<py::ssize_t>{0, (py::ssize_t)V});
      } else {
        out = py::array_t<float>(std::vector<py::ssize_t>{B, (py::ssize_t)V});
        float* o = out.mutable_data();
        py::gil_scoped_release rel;
        forward_batch(sts.data(), tok.data(), (int)B, o);
      }
    } catch (...) {
      release();
      throw;
    }
    release();
    return out;
  }, py::arg("states"), py::arg("tokens"), py::kw_only(), py::arg("abort") = nullptr,
     "One decode step for several distinct states of one model: tokens[b] is fed to states[b]. "
     "Returns float32 logits [B, V], bit-identical to decode(states[b], tokens[b]) for each b; "
     "every dense weight is read once for all of them. If abort is set before the step, nothing "
     "runs and the result has 0 rows.");
}

// cairn bindings: State, AbortFlag, prefill / decode, snapshot / restore.
//
// Design notes
//  * Every argument is validated with the GIL held (dtype, contiguity, ids in range, chunk);
//    tokens are copied into a private vector, output arrays allocated, then the GIL is
//    released for the whole compute (safe: the kernel touches only C++ memory and the
//    Model's weights, which the State pins through a shared_ptr).
//  * A State is single-writer: a concurrent second call raises StateBusyError (a RuntimeError)
//    instead of racing.
//  * Its getters read the same mutable vectors a kernel call grows with the GIL released, so each
//    claims the busy flag for the length of its read, as a call does: while a call runs they raise
//    StateBusyError (the daemon reads figures published when a call ends), and a call cannot start
//    mid-read. Checking the flag without claiming it would not do: building the result allocates,
//    which can run Python code that lets another thread take the GIL and start a call.
//  * Abort: a std::atomic<bool> checked between chunks; prefill returns how far it got rather
//    than throwing (see docs/stack-notes.md).
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <time.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "bind.h"
#include "cairn/forward.h"
#include "step_worker.h"

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

// Raised as cairn._kernel.StateBusyError (a RuntimeError).
struct StateBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct BusyGuard {
  PyState& s;
  explicit BusyGuard(PyState& st) : s(st) {
    if (s.busy.exchange(true)) throw StateBusy("State is already in use by another call");
  }
  ~BusyGuard() { s.busy.store(false); }
};

// A getter's claim on the state for the length of its read (see the notes).
struct ReadGuard {
  PyState& s;
  explicit ReadGuard(PyState& st) : s(st) {
    if (s.busy.exchange(true))
      throw StateBusy("State is in use by a kernel call (prefill, decode, verify, rewind or snapshot): its "
                      "figures are published when the call ends");
  }
  ~ReadGuard() { s.busy.store(false); }
};

// A State getter: f(state) under a ReadGuard.
template <class F>
auto guarded(F f) {
  return [f](PyState& s) {
    ReadGuard g(s);
    return f(static_cast<const State&>(s.st));
  };
}

struct KernelError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// An immutable snapshot: the used part of the state's tail (State::snapshot), sharing its page groups.
struct PySnapshot {
  std::shared_ptr<BoundModel> model;
  State st;
  int64_t copied_bytes = 0;  // what taking it copied: the tail, plus every group when not shared
};

py::array_t<uint64_t> group_ids(const State& st) {
  py::array_t<uint64_t> out((py::ssize_t)st.pages.groups.size());
  for (size_t k = 0; k < st.pages.groups.size(); ++k) out.mutable_data()[k] = st.pages.groups[k]->id;
  return out;
}

// Group k's bytes as a read-only uint8 array that keeps the group alive (no copy).
py::array group_view(const std::shared_ptr<PageGroup>& g) {
  auto* keep = new std::shared_ptr<PageGroup>(g);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<PageGroup>*>(p); });
  py::array a(py::dtype::of<uint8_t>(), {(py::ssize_t)(4 * g->nfloats)}, {(py::ssize_t)1},
              (const void*)g->data.get(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

const uint8_t* buffer_bytes(const py::handle& obj, const std::string& what, size_t& n, std::vector<py::buffer_info>& keep) {
  if (!PyObject_CheckBuffer(obj.ptr())) throw KernelError(what + " must be a bytes-like object");
  keep.push_back(py::reinterpret_borrow<py::buffer>(obj).request());
  const py::buffer_info& info = keep.back();
  if (info.ndim != 1 || info.strides[0] != info.itemsize)
    throw KernelError(what + " must be a contiguous 1-D bytes-like object");
  n = (size_t)(info.size * info.itemsize);
  return (const uint8_t*)info.ptr;
}

std::unique_ptr<PySnapshot> snapshot_from_parts(std::shared_ptr<BoundModel> model, py::handle tail, py::sequence pages) {
  if (!model) throw KernelError("model must not be None");
  std::vector<py::buffer_info> keep;
  keep.reserve((size_t)py::len(pages) + 1);
  size_t tn = 0;
  const uint8_t* tp = buffer_bytes(tail, "tail", tn, keep);
  std::vector<const uint8_t*> ptrs;
  std::vector<size_t> sizes;
  for (size_t k = 0; k < (size_t)py::len(pages); ++k) {
    size_t pn = 0;
    ptrs.push_back(buffer_bytes(pages[k], "pages[" + std::to_string(k) + "]", pn, keep));
    sizes.push_back(pn);
  }
  std::unique_ptr<PySnapshot> out;
  {
    py::gil_scoped_release rel;
    out = std::make_unique<PySnapshot>(PySnapshot{model, restore(*model, tp, tn, ptrs.data(), sizes.data(), ptrs.size()), 0});
  }
  return out;
}

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

// The states of a multi-state call (one entry of tokens each, at least one): each a State of
// states[0]'s model, none twice.
std::vector<PyState*> distinct_states(const py::sequence& states, const py::sequence& tokens) {
  const py::ssize_t B = py::len(states);
  if (B == 0) throw KernelError("states is empty");
  if ((py::ssize_t)py::len(tokens) != B)
    throw KernelError("tokens has " + std::to_string(py::len(tokens)) + " entries, states has " +
                      std::to_string(B) + "; they must match");
  std::vector<PyState*> ps((size_t)B);
  std::unordered_set<PyState*> seen;
  for (py::ssize_t b = 0; b < B; ++b) {
    py::object o = states[b];
    if (!py::isinstance<PyState>(o)) throw KernelError("states[" + std::to_string(b) + "] is not a State");
    PyState* s = o.cast<PyState*>();
    if (b && s->model.get() != ps[0]->model.get())
      throw KernelError("states[" + std::to_string(b) + "] belongs to another model than states[0]");
    if (!seen.insert(s).second)
      throw KernelError("states[" + std::to_string(b) + "] appears twice; each state advances once per step");
    ps[b] = s;
  }
  return ps;
}

// Every state of a multi-state call claimed before any is touched, released when the call ends;
// on a conflict those already claimed are released.
struct Claim {
  std::vector<PyState*>& ps;
  size_t n = 0;
  explicit Claim(std::vector<PyState*>& states) : ps(states) {
    for (; n < ps.size(); ++n)
      if (ps[n]->busy.exchange(true)) {
        const size_t bad = n;
        release();
        throw StateBusy("states[" + std::to_string(bad) + "] is already in use by another call");
      }
  }
  void release() {
    for (size_t b = 0; b < n; ++b) ps[b]->busy.store(false);
    n = 0;
  }
  ~Claim() { release(); }
};

// verify's token rows: one int32 array per state, 1..MAX_CHUNK ids in range each.
std::vector<int32_t> check_draft(const PyState& s, const py::handle& obj, const std::string& what) {
  std::vector<int32_t> t;
  try {
    t = check_tokens(s, obj);
  } catch (const KernelError& e) {
    throw KernelError(what + ": " + e.what());
  }
  if (t.size() > (size_t)MAX_CHUNK)
    throw KernelError(what + " has " + std::to_string(t.size()) + " tokens; one verify takes 1.." +
                      std::to_string(MAX_CHUNK));
  return t;
}

int64_t clock_ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// StepWorker bound to Python: the decode step in flight. Its Python objects (the state, the logits
// array) are touched only by the thread that posts and collects, with the GIL; the job itself sees
// only C++ memory: the State (pinned by `state`), one token and the array's buffer.
struct PyStepWorker {
  StepWorker w;
  py::object state = py::none();   // the state of the step in flight (None: none)
  py::array_t<float> out;      // its logits [V], written by the job
  std::exception_ptr error;    // what the job threw, rethrown by collect
  int64_t t0 = 0, t1 = 0, cpu = 0;   // the job's start, end (CLOCK_MONOTONIC = perf_counter_ns), thread CPU ns

  ~PyStepWorker() {
    if (!state.is_none()) {    // never collected: the job may still run on the state and buffer it holds
      py::gil_scoped_release rel;
      w.wait_done();
    }
  }
};

}  // namespace

void register_state(py::module_& m) {
  static py::exception<KernelError> exc(m, "KernelError", PyExc_ValueError);
  static py::exception<StateBusy> busy_exc(m, "StateBusyError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StateBusy& e) {
      py::set_error(busy_exc, e.what());
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
      // Every getter but page_nbytes (the model's) reads mutable data: each raises StateBusyError
      // while a kernel call holds the state (see the notes).
      .def_property_readonly("n_tokens", guarded([](const State& st) { return st.n; }))
      .def_property_readonly("rewindable", guarded([](const State& st) {
        const Journal* j = st.journal.j.get();
        return j ? j->n1 - j->n0 : (int64_t)0;
      }), "How many of its last tokens rewind can take back: those its last call, a verify, fed (0 otherwise).")
      .def_property_readonly("journal_nbytes", guarded([](const State& st) {
        const Journal* j = st.journal.j.get();
        return j ? j->held_bytes() : (int64_t)0;
      }), "Bytes its undo record holds (its last call's, a verify's; 0 otherwise): at most "
          "Model.verify_journal_nbytes of the tokens that verify fed.")
      .def_property_readonly("tokens", guarded([](const State& st) {
        py::array_t<int32_t> out((py::ssize_t)st.tokens.size());
        if (!st.tokens.empty()) std::memcpy(out.mutable_data(), st.tokens.data(), 4 * st.tokens.size());
        return out;
      }))
      .def_property_readonly("nbytes", guarded([](const State& st) { return st.payload_bytes(); }))
      .def_property_readonly("page_ids", guarded([](const State& st) { return group_ids(st); }),
                             "Ids of the page groups this state holds (shared with snapshots), in token order.")
      .def_property_readonly("page_nbytes", [](const PyState& s) { return s.model->page_layout->group_bytes(); })
      .def_property_readonly("tail_nbytes", guarded([](const State& st) { return st.snapshot_bytes(); }),
                             "Bytes a snapshot of it would copy and hold outside page groups (its own_nbytes).")
      .def_property_readonly("last_logits", guarded([](const State& st) -> py::object {
        if (st.last_logits.empty()) return py::none();
        return vec_to_array(st.last_logits);
      }))
      .def("snapshot", [](PyState& s, bool share_pages) {
        BusyGuard g(s);
        std::unique_ptr<PySnapshot> out;
        {
          py::gil_scoped_release rel;
          State st = s.st.snapshot();  // the tail's used part is copied, every page group shared
          if (!share_pages) st.pages.unshare();
          const int64_t copied = st.held_bytes() + (share_pages ? 0 : (int64_t)st.pages.groups.size() * st.pages.layout->group_bytes());
          out = std::make_unique<PySnapshot>(PySnapshot{s.model, std::move(st), copied});
        }
        return out;
      }, py::kw_only(), py::arg("share_pages") = true,
         "An immutable Snapshot: a copy of the small mutable tail plus references to the state's page "
         "groups, which the state copies before it next writes one (copy on write). share_pages=False "
         "copies every group too (a snapshot that shares nothing).")
      .def_static("restore", [](std::shared_ptr<BoundModel> model, const PySnapshot& snap) {
        if (!model) throw KernelError("model must not be None");
        if (snap.model->family != model->family)
          throw KernelError(std::string("snapshot is of model family ") + snap.model->family->name +
                            ", this model is " + model->family->name);
        if (snap.model.get() != model.get() && snap.model->fingerprint != model->fingerprint)
          throw KernelError("snapshot belongs to a different model (fingerprint '" + snap.model->fingerprint +
                            "', model '" + model->fingerprint + "')");
        if (snap.model->page_layout->page_tokens != model->page_layout->page_tokens ||
            snap.model->page_layout->group_floats != model->page_layout->group_floats)
          throw KernelError("snapshot pages have another layout than this model's");
        std::unique_ptr<PyState> out;
        {
          py::gil_scoped_release rel;
          // full-size buffers again; shares the snapshot's groups, copying one before writing it
          out = std::make_unique<PyState>(model, snap.st.live(*model));
        }
        return out;
      }, py::arg("model"), py::arg("snapshot"), "A new State equal to the one the snapshot was taken of.");

  py::class_<PySnapshot>(m, "Snapshot",
                         "Immutable snapshot of a State: its tail (window ring, compressor buffers, tokens, "
                         "logits) and references to its page groups of compressed rows.")
      .def_property_readonly("n_tokens", [](const PySnapshot& s) { return s.st.n; })
      .def_property_readonly("tokens", [](const PySnapshot& s) {
        py::array_t<int32_t> out((py::ssize_t)s.st.tokens.size());
        if (!s.st.tokens.empty()) std::memcpy(out.mutable_data(), s.st.tokens.data(), 4 * s.st.tokens.size());
        return out;
      })
      .def_property_readonly("page_ids", [](const PySnapshot& s) { return group_ids(s.st); },
                             "Ids of every page group it holds (the last may be partial), in token order.")
      .def_property_readonly("page_nbytes", [](const PySnapshot& s) { return s.st.pages.layout->group_bytes(); },
                             "Bytes of one page group (all groups of a model are this size).")
      .def_property_readonly("page_tokens", [](const PySnapshot& s) { return s.st.pages.layout->page_tokens; })
      .def_property_readonly("n_full_pages", [](const PySnapshot& s) { return s.st.full_groups(); },
                             "Page groups that are full (n_tokens // page_tokens): the ones stored as pages.")
      .def_property_readonly("own_nbytes", [](const PySnapshot& s) { return s.st.held_bytes(); },
                             "Bytes it holds outside page groups, as allocated: the used part of the window ring "
                             "and compressor buffers, tokens, logits.")
      .def_property_readonly("copied_nbytes", [](const PySnapshot& s) { return s.copied_bytes; },
                             "Bytes copied when it was taken (0 for one rebuilt from parts).")
      .def_property_readonly("nbytes", [](const PySnapshot& s) {
        return s.st.held_bytes() + (int64_t)s.st.pages.groups.size() * s.st.pages.layout->group_bytes();
      }, "Everything it references: own bytes plus every page group, shared or not.")
      .def("tail", [](const PySnapshot& s) {
        const size_t n = tail_size(s.st);
        PyObject* b = PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)n);
        if (!b) throw py::error_already_set();
        py::bytes out = py::reinterpret_steal<py::bytes>(b);
        uint8_t* dst = (uint8_t*)PyBytes_AS_STRING(b);
        {
          py::gil_scoped_release rel;  // the bytes object is new and private to this call
          tail_into(s.st, dst);
        }
        return out;
      }, "The versioned, checksummed tail blob: everything but the full page groups (the partial one's rows included).")
      .def("page", [](const PySnapshot& s, int64_t k) {
        if (k < 0 || k >= s.st.full_groups())
          throw KernelError("page index " + std::to_string(k) + " is out of range [0, " +
                            std::to_string(s.st.full_groups()) + ")");
        return group_view(s.st.pages.groups[(size_t)k]);
      }, py::arg("k"), "Full page group k's bytes: a read-only uint8 array over the group itself (no copy).")
      .def_static("from_parts", &snapshot_from_parts, py::arg("model"), py::arg("tail"), py::arg("pages"),
                  "Rebuild a snapshot from its tail blob and its full page groups' bytes, in order. Raises "
                  "KernelError on any mismatch: version, model, page layout, count or size of pages, checksum.")
      .def("to_bytes", [](const PySnapshot& s) {
        const size_t tn = tail_size(s.st);
        const int64_t F = s.st.full_groups();
        const size_t gb = (size_t)s.st.pages.layout->group_bytes();
        const size_t n = tn + (size_t)F * gb + 8;
        PyObject* b = PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)n);
        if (!b) throw py::error_already_set();
        py::bytes out = py::reinterpret_steal<py::bytes>(b);
        uint8_t* dst = (uint8_t*)PyBytes_AS_STRING(b);
        {
          py::gil_scoped_release rel;
          tail_into(s.st, dst);
          for (int64_t k = 0; k < F; ++k) std::memcpy(dst + tn + (size_t)k * gb, s.st.pages.groups[(size_t)k]->data.get(), gb);
          const uint64_t h = blob_checksum(dst + tn, (size_t)F * gb);
          std::memcpy(dst + n - 8, &h, 8);
        }
        return out;
      }, "One self-contained blob: the tail, the full page groups, and a checksum of the groups (for tests "
         "and tools; the daemon stores each page once, in its own file).")
      .def_static("from_bytes", [](std::shared_ptr<BoundModel> model, py::buffer blob) {
        if (!model) throw KernelError("model must not be None");
        std::vector<py::buffer_info> keep;
        size_t n = 0;
        const uint8_t* p = buffer_bytes(blob, "blob", n, keep);
        const int64_t F = tail_full_groups(*model, p, n);
        const size_t gb = (size_t)model->page_layout->group_bytes();
        if ((size_t)F * gb + 8 > n) throw KernelError("snapshot is truncated (page groups)");
        const size_t tn = n - (size_t)F * gb - 8;
        uint64_t stored;
        std::memcpy(&stored, p + n - 8, 8);
        if (stored != blob_checksum(p + tn, (size_t)F * gb)) throw KernelError("snapshot checksum mismatch (page groups)");
        std::vector<const uint8_t*> ptrs;
        std::vector<size_t> sizes((size_t)F, gb);
        for (int64_t k = 0; k < F; ++k) ptrs.push_back(p + tn + (size_t)k * gb);
        std::unique_ptr<PySnapshot> out;
        {
          py::gil_scoped_release rel;
          out = std::make_unique<PySnapshot>(PySnapshot{model, restore(*model, p, tn, ptrs.data(), sizes.data(), ptrs.size()), 0});
        }
        return out;
      }, py::arg("model"), py::arg("blob"), "Inverse of to_bytes.");

  m.def("page_pool", [] {
    PagePoolStats p = page_pool_stats();
    py::dict d;
    d["groups"] = p.groups;
    d["bytes"] = p.bytes;
    return d;
  }, "Page groups alive in this process (live states and snapshots share them) and their bytes.");

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

  py::class_<PyStepWorker>(m, "StepWorker",
                           "A GIL-free hand-off of decode steps to the kernel thread (native/src/step_worker.h): "
                           "that thread waits in serve(); decode() posts a step and returns at once; fileno() "
                           "becomes readable when it has finished; collect() returns its result.")
      .def(py::init<>())
      .def("fileno", [](PyStepWorker& p) { return p.w.fd(); })
      .def("serve", [](PyStepWorker& p, double idle_s) {
        if (!(idle_s > 0)) throw KernelError("idle_s must be > 0 seconds, got " + std::to_string(idle_s));
        py::gil_scoped_release rel;
        return p.w.serve(idle_s);
      }, py::arg("idle_s"),
         "In the kernel thread: run posted steps (without the GIL) until a Python call is posted (True) or "
         "idle_s seconds pass with nothing to do (False).")
      .def("post_python", [](PyStepWorker& p) { p.w.post_python(); },
           "A Python call waits in the caller's queue: serve() returns True once for it.")
      .def_property_readonly("idle", [](PyStepWorker& p) { return p.w.idle(); },
                             "Nothing posted, nothing running.")
      .def_property_readonly("in_flight", [](PyStepWorker& p) { return !p.state.is_none(); },
                             "A step was posted and not collected.")
      .def("decode", [](PyStepWorker& p, py::object state_obj, int64_t token) {
        if (!p.state.is_none()) throw KernelError("a step is already in flight: collect() it first");
        PyState& s = state_obj.cast<PyState&>();
        const int V = s.model->cfg.vocab;
        if (token < 0 || token >= V)
          throw KernelError("token id " + std::to_string(token) + " is out of range [0, " + std::to_string(V) + ")");
        if (s.busy.exchange(true)) throw StateBusy("State is already in use by another call");
        py::array_t<float> out(V);
        PyState* sp = &s;
        float* o = out.mutable_data();
        const int32_t t = (int32_t)token;
        p.state = state_obj;
        p.out = out;
        p.error = nullptr;
        try {
          p.w.post_job([&p, sp, o, t] {   // in the kernel thread, no GIL
            p.t0 = clock_ns(CLOCK_MONOTONIC);
            const int64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            StepFault::in_worker = true;
            try {
              forward_chunk(sp->st, &t, 1, o, false);
            } catch (...) {
              p.error = std::current_exception();
            }
            StepFault::in_worker = false;
            p.cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
            p.t1 = clock_ns(CLOCK_MONOTONIC);
            sp->busy.store(false);
          });
        } catch (...) {
          s.busy.store(false);
          p.state = py::none();
          p.out = py::array_t<float>();
          throw;
        }
      }, py::arg("state"), py::arg("token"),
         "Post one decode step (decode(state, token)'s work) to the thread in serve(); returns at once.")
      .def("collect", [](PyStepWorker& p) {
        if (p.state.is_none()) throw KernelError("no step is in flight");
        if (!p.w.take_done()) throw KernelError("the step has not finished: wait until fileno() is readable");
        py::array_t<float> out = std::move(p.out);
        p.out = py::array_t<float>();
        p.state = py::none();
        if (p.error) {
          std::exception_ptr e = p.error;
          p.error = nullptr;
          std::rethrow_exception(e);
        }
        return py::make_tuple(out, p.t0, p.t1, p.cpu);
      }, "The finished step: (logits [V], start ns, end ns, CPU ns) -- perf_counter_ns times and the kernel "
         "thread's CPU; raises what the step raised (the same errors as decode).");

  m.def("decode_batch", [](py::sequence states, py::sequence tokens, std::shared_ptr<AbortFlag> abort) {
    std::vector<PyState*> ps = distinct_states(states, tokens);
    const py::ssize_t B = (py::ssize_t)ps.size();
    std::vector<State*> sts((size_t)B);
    std::vector<int32_t> tok((size_t)B);
    for (py::ssize_t b = 0; b < B; ++b) {
      py::object tb = tokens[b];
      if (!PyIndex_Check(tb.ptr()) || PyBool_Check(tb.ptr()))
        throw KernelError("tokens[" + std::to_string(b) + "] must be an integer token id");
      int64_t t;
      try {
        t = py::cast<int64_t>(tb);
      } catch (const py::cast_error&) {
        throw KernelError("tokens[" + std::to_string(b) + "] is not a 64-bit integer");
      }
      const int V = ps[b]->model->cfg.vocab;
      if (t < 0 || t >= V)
        throw KernelError("tokens[" + std::to_string(b) + "]: token id " + std::to_string(t) +
                          " is out of range [0, " + std::to_string(V) + ")");
      sts[b] = &ps[b]->st;
      tok[b] = (int32_t)t;
    }
    Claim claim(ps);
    const int V = ps[0]->model->cfg.vocab;
    py::array_t<float> out;
    if (abort && abort->v.load()) {
      out = py::array_t<float>(std::vector<py::ssize_t>{0, (py::ssize_t)V});
    } else {
      out = py::array_t<float>(std::vector<py::ssize_t>{B, (py::ssize_t)V});
      float* o = out.mutable_data();
      py::gil_scoped_release rel;
      forward_batch(sts.data(), tok.data(), (int)B, o);
    }
    return out;
  }, py::arg("states"), py::arg("tokens"), py::kw_only(), py::arg("abort") = nullptr,
     "One decode step for several distinct states of one model: tokens[b] is fed to states[b]. "
     "Returns float32 logits [B, V], bit-identical to decode(states[b], tokens[b]) for each b; "
     "every dense weight is read once for all of them. If abort is set before the step, nothing "
     "runs and the result has 0 rows.");

  m.def("verify", [](PyState& s, py::handle tokens) {
    std::vector<int32_t> tok = check_draft(s, tokens, "tokens");
    BusyGuard g(s);
    py::array_t<float> out({(py::ssize_t)tok.size(), (py::ssize_t)s.model->cfg.vocab});
    float* o = out.mutable_data();
    State* st = &s.st;
    const int n = (int)tok.size();
    {
      py::gil_scoped_release rel;
      verify_batch(&st, tok.data(), &n, 1, o);
    }
    return out;
  }, py::arg("state"), py::arg("tokens"),
     "A speculative step: feed tokens (a decoded token and the draft after it) in one call and return "
     "every row's float32 logits [S, V], the same bits as decoding them one by one. Until the state's "
     "next call, rewind(state, k) can take back any of the last tokens it fed.");

  m.def("verify_batch", [](py::sequence states, py::sequence tokens) {
    std::vector<PyState*> ps = distinct_states(states, tokens);
    const py::ssize_t B = (py::ssize_t)ps.size();
    std::vector<int32_t> all;
    std::vector<int> lens((size_t)B);
    for (py::ssize_t b = 0; b < B; ++b) {
      std::vector<int32_t> t = check_draft(*ps[b], tokens[b], "tokens[" + std::to_string(b) + "]");
      lens[b] = (int)t.size();
      all.insert(all.end(), t.begin(), t.end());
    }
    if (all.size() > (size_t)MAX_CHUNK)
      throw KernelError("verify_batch feeds " + std::to_string(all.size()) + " tokens in all; one call takes up to " +
                        std::to_string(MAX_CHUNK));
    std::vector<State*> sts((size_t)B);
    for (py::ssize_t b = 0; b < B; ++b) sts[b] = &ps[b]->st;
    Claim claim(ps);
    const int V = ps[0]->model->cfg.vocab;
    py::array_t<float> out({(py::ssize_t)all.size(), (py::ssize_t)V});
    float* o = out.mutable_data();
    {
      py::gil_scoped_release rel;
      verify_batch(sts.data(), all.data(), lens.data(), (int)B, o);
    }
    py::list rows;
    for (py::ssize_t b = 0, r = 0; b < B; r += lens[b], ++b) rows.append(out[py::slice(r, r + lens[b], 1)]);
    return rows;
  }, py::arg("states"), py::arg("tokens"),
     "verify for several distinct states of one model in one call (tokens[b]: an int32 array for "
     "states[b]); every dense weight is read once for all rows. Returns one [len(tokens[b]), V] "
     "float32 array per state, bit-identical to verify of each alone.");

  m.def("rewind", [](PyState& s, int64_t k) {
    BusyGuard g(s);
    rewind(s.st, k);
  }, py::arg("state"), py::arg("k"),
     "Take back the last k tokens the state's last call, a verify, fed: afterwards the state (its "
     "snapshot, byte for byte, and last_logits) is that of plain decoding of the tokens it keeps. "
     "Raises KernelError when the last call was not a verify or k is out of range.");
}

// cairn bindings, Qwen3.5: Qwen35Model(config, weights) and its whole-sequence forward.
//
// Design notes
//  * The config dict is HF's (config.json: a `text_config` inside is used when present); every key
//    is read and checked here with the GIL held, then the model is loaded and packed without it
//    (the arrays are pinned by the references this call holds).
//  * Weights: canonical name -> float32 array (or (array, "F32"), the daemon's spelling), BF16 bit
//    patterns (uint16, "BF16"), FP8 codes (uint8 [out, in], "F8_E4M3", scales in `<name>_scale_inv`),
//    or a GGUF block format's stored rows (uint8 [rows..., row bytes], "GGML:<type>"). Only an F32 embed_tokens is kept after load (row lookups; others are decoded);
//    every matrix is packed into the model's panels, BF16 and block formats as stored.
//  * forward converts the ids, then runs without the GIL: the model is immutable and the call's
//    cache is its own.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "../../bind.h"
#include "../../codecs/codec.h"
#include "cairn/forward.h"
#include "model.h"

namespace py = pybind11;
using namespace cairn::qwen35;

namespace {

py::dict text_part(const py::dict& d) {
  if (d.contains("text_config") && py::isinstance<py::dict>(d["text_config"])) return d["text_config"].cast<py::dict>();
  return d;
}

template <class T> T get(const py::dict& d, const char* k) {
  if (!d.contains(k) || d[k].is_none()) throw py::value_error(std::string("Qwen3.5 config is missing key '") + k + "'");
  try {
    return d[k].cast<T>();
  } catch (const py::cast_error&) {
    throw py::value_error(std::string("Qwen3.5 config key '") + k + "' has the wrong type");
  }
}
template <class T> T get_or(const py::dict& d, const char* k, T dflt) {
  return d.contains(k) && !d[k].is_none() ? get<T>(d, k) : dflt;
}

Config parse_config(const py::dict& top) {
  const py::dict d = text_part(top);
  Config c;
  c.vocab = get<int>(d, "vocab_size");
  c.D = get<int>(d, "hidden_size");
  c.n_layers = get<int>(d, "num_hidden_layers");
  c.rms_eps = get_or<float>(d, "rms_norm_eps", 1e-6f);
  // the checkpoint's own (top-level) flag decides when the text part is nested, as HF ties at the top
  c.tied = get_or<bool>(top, "tie_word_embeddings", get_or<bool>(d, "tie_word_embeddings", false));
  const std::string act = get_or<std::string>(d, "hidden_act", "silu");
  if (act != "silu") throw py::value_error("Qwen3.5 config: hidden_act '" + act + "' is not supported (silu only)");
  if (get_or<bool>(d, "attention_bias", false))
    throw py::value_error("Qwen3.5 config: attention_bias true is not supported (Qwen3.5 releases have none)");
  if (d.contains("layer_types") && !d["layer_types"].is_none()) {
    for (auto& s : get<std::vector<std::string>>(d, "layer_types")) {
      if (s == "linear_attention") c.layer_types.push_back(Mixer::Linear);
      else if (s == "full_attention") c.layer_types.push_back(Mixer::Full);
      else throw py::value_error("Qwen3.5 config: unknown layer type '" + s + "' (linear_attention or full_attention)");
    }
  } else {  // HF's default: every interval-th layer is full attention
    const int every = get_or<int>(d, "full_attention_interval", 4);
    if (every < 1) throw py::value_error("Qwen3.5 config: full_attention_interval must be >= 1");
    for (int i = 0; i < c.n_layers; ++i) c.layer_types.push_back((i + 1) % every ? Mixer::Linear : Mixer::Full);
  }
  bool any_full = false, any_lin = false;
  for (Mixer t : c.layer_types) (t == Mixer::Full ? any_full : any_lin) = true;
  if (any_full) {
    c.H = get<int>(d, "num_attention_heads");
    c.Hkv = get<int>(d, "num_key_value_heads");
    c.Dh = get_or<int>(d, "head_dim", c.H > 0 ? c.D / c.H : 0);
    py::dict rp = d.contains("rope_parameters") && py::isinstance<py::dict>(d["rope_parameters"])
                      ? d["rope_parameters"].cast<py::dict>() : py::dict();
    const std::string rt = get_or<std::string>(rp, "rope_type", "default");
    if (rt != "default") throw py::value_error("Qwen3.5 config: rope_type '" + rt + "' is not supported (default only)");
    c.rope_theta = get_or<double>(rp, "rope_theta", get_or<double>(d, "rope_theta", 1e7));
    const double f = get_or<double>(rp, "partial_rotary_factor", get_or<double>(d, "partial_rotary_factor", 0.25));
    c.r = (int)(c.Dh * f);  // HF: int(head_dim * partial_rotary_factor)
  }
  if (any_lin) {
    c.K = get<int>(d, "linear_conv_kernel_dim");
    c.dk = get<int>(d, "linear_key_head_dim");
    c.dv = get<int>(d, "linear_value_head_dim");
    c.nk = get<int>(d, "linear_num_key_heads");
    c.nv = get<int>(d, "linear_num_value_heads");
  }
  if (d.contains("num_experts") && !d["num_experts"].is_none() && get<int>(d, "num_experts") > 0) {
    c.E = get<int>(d, "num_experts");
    c.k = get<int>(d, "num_experts_per_tok");
    c.I = get<int>(d, "moe_intermediate_size");
    c.Is = get<int>(d, "shared_expert_intermediate_size");
  } else {
    c.I = get<int>(d, "intermediate_size");
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return c;
}

// a's values, C-contiguous and aligned to `align` (a view at an odd offset of a file's map: a copy)
py::array c_aligned(const py::array& a, size_t align) {
  py::array c = py::array::ensure(a, py::array::c_style);
  if ((uintptr_t)c.data() % align == 0) return c;
  py::array copy(c.dtype(), std::vector<py::ssize_t>(c.shape(), c.shape() + c.ndim()));
  std::memcpy(copy.mutable_data(), c.data(), (size_t)c.nbytes());
  return copy;
}

}  // namespace

bool is_qwen35_config(const py::dict& config) {
  static const char* const types[] = {"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"};
  auto named = [&](const py::dict& d) {
    if (!d.contains("model_type") || !py::isinstance<py::str>(d["model_type"])) return false;
    const std::string t = d["model_type"].cast<std::string>();
    return std::any_of(std::begin(types), std::end(types), [&](const char* x) { return t == x; });
  };
  return named(config) || named(text_part(config));
}

void load_qwen35(BoundModel& M, py::dict config, py::dict weights, int threads, int64_t page_tokens) {
  const Config c = parse_config(config);
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = every core this process may run on)");
  if (threads == 0) {
    cpu_set_t set;
    threads = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)std::thread::hardware_concurrency();
  }
  WeightMap wm;
  std::vector<py::array> pinned;
  py::object embed;
  for (auto item : weights) {
    const std::string name = py::str(item.first);
    py::object v = py::reinterpret_borrow<py::object>(item.second);
    std::string tag = "F32";
    if (py::isinstance<py::tuple>(v)) {
      py::tuple t = v.cast<py::tuple>();
      if (py::len(t) == 2) tag = py::str(t[1]);
      if (py::len(t) != 2 || (tag != "F32" && tag != "BF16" && tag != "F8_E4M3" && tag.rfind("GGML:", 0) != 0))
        throw py::value_error("weight '" + name + "' must be a float32 array, (array, \"F32\"), (uint16 bits, \"BF16\"), "
                              "(uint8 codes, \"F8_E4M3\") or (uint8 rows, \"GGML:<type>\")");
      v = t[0];
    }
    py::array a = py::array::ensure(v);
    if (!a) throw py::value_error("weight '" + name + "' is not an array");
    std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
    if (tag == "BF16") {  // packed as BF16 panels (matrices) or widened (the rest)
      if (a.itemsize() != 2) throw py::value_error("weight '" + name + "' tagged BF16 must hold 2-byte values");
      py::array c_arr = c_aligned(a, alignof(uint16_t));
      pinned.push_back(c_arr);
      wm[name] = TensorView{nullptr, shape, nullptr, nullptr, (const uint16_t*)c_arr.data()};
      continue;
    }
    if (tag == "F8_E4M3") {  // FP8 codes [out, in]; the scales are the tensor `<name>_scale_inv`
      if (a.itemsize() != 1 || a.ndim() != 2) throw py::value_error("weight '" + name + "' tagged F8_E4M3 must be 2-D bytes");
      py::array codes = py::array::ensure(a, py::array::c_style);
      pinned.push_back(codes);
      TensorView v{nullptr, shape, (const uint8_t*)codes.data()};
      v.fp8 = true;
      wm[name] = v;
      continue;
    }
    if (tag != "F32") {  // a GGUF block format: the stored rows [rows..., row bytes], packed as they are
      const cairn::BlockCodec* codec = cairn::find_codec(tag.substr(5));
      if (!codec) {
        std::string names;
        for (const cairn::BlockCodec* k : cairn::all_codecs()) names += (names.empty() ? "" : ", ") + std::string(k->name);
        throw py::value_error("weight '" + name + "' is stored as " + tag.substr(5) + ", which cairn cannot read (" + names + ")");
      }
      if (a.itemsize() != 1 || a.ndim() < 2 || shape.back() % codec->bytes)
        throw py::value_error("weight '" + name + "' tagged " + tag + " must be uint8 rows of whole " +
                              std::to_string(codec->bytes) + "-byte blocks");
      py::array rows = py::array::ensure(a, py::array::c_style);
      pinned.push_back(rows);
      shape.back() = shape.back() / codec->bytes * codec->block;  // the logical row length
      wm[name] = TensorView{nullptr, shape, (const uint8_t*)rows.data(), codec};
      continue;
    }
    if (!a.dtype().is(py::dtype::of<float>()))
      throw py::value_error("weight '" + name + "' has dtype " + std::string(py::str(a.dtype())) + "; float32 is required");
    py::array c_arr = c_aligned(a, alignof(float));
    pinned.push_back(c_arr);
    wm[name] = TensorView{(const float*)c_arr.data(), shape};
    if (name == "embed_tokens.weight") embed = c_arr;
  }
  std::shared_ptr<const Model> m;
  try {
    py::gil_scoped_release rel;
    m = load(c, wm, threads);
    attach(M, std::move(m), page_tokens);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  M.keep.push_back(embed);  // embed_tokens: row lookups read it in place
}

namespace {

// Qwen35Model: a cairn Model of this family (the shared State, prefill and snapshots take it).
struct BoundQwen35 {
  std::shared_ptr<BoundModel> bm;
  const Model& model() const { return of(*bm); }
};

std::shared_ptr<BoundQwen35> make(py::dict config, py::dict weights, int threads) {
  auto b = std::make_shared<BoundQwen35>();
  b->bm = std::make_shared<BoundModel>();
  load_qwen35(*b->bm, config, weights, threads, 0);
  return b;
}

py::array_t<float> forward_py(BoundQwen35& b, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
                              int chunk) {
  if (ids.ndim() != 1) throw py::value_error("ids must be a 1-D int32 array of token ids");
  if (chunk < 0) throw py::value_error("chunk must be >= 0 (0 = the whole sequence in one call)");
  const Model& m = b.model();
  const int64_t S = ids.shape(0);
  const int V = m.cfg.vocab;
  for (int64_t i = 0; i < S; ++i)
    if (ids.data()[i] < 0 || ids.data()[i] >= V)
      throw py::value_error("ids[" + std::to_string(i) + "] = " + std::to_string(ids.data()[i]) +
                            " is outside the vocabulary [0, " + std::to_string(V) + ")");
  py::array_t<float> out({S, (int64_t)V});
  float* o = out.mutable_data();
  const int32_t* t = ids.data();
  {
    py::gil_scoped_release rel;  // safe: ids and out are held by this frame, the model is immutable
    cairn::State st(*b.bm);  // the shared state: the same calls as prefill, in chunks of <= MAX_CHUNK
    const int64_t step = std::min<int64_t>(chunk ? chunk : std::max<int64_t>(S, 1), cairn::MAX_CHUNK);
    for (int64_t i = 0; i < S; i += step) {
      const int n = (int)std::min(step, S - i);
      cairn::forward_chunk(st, t + i, n, o + i * V, true);
    }
  }
  return out;
}

}  // namespace

void register_qwen35(py::module_& m) {
  py::class_<BoundQwen35, std::shared_ptr<BoundQwen35>>(m, "Qwen35Model", R"doc(Immutable Qwen3.5 text model (qwen3_5 dense or qwen3_5_moe), fp32.

forward() runs a whole sequence from an empty state; the model itself (.model, or Model(config, weights,
fingerprint) with a qwen3_5* model_type) is what State, prefill, decode and snapshots take.
config: HF's config dict (a nested 'text_config' is used when present; layer_types or
full_attention_interval). weights: canonical name -> float32 array: HF's names without the 'model.' /
'model.language_model.' prefix; experts per expert ('layers.L.mlp.experts.E.gate_proj.weight', ...) or
fused ('layers.L.mlp.experts.gate_up_proj' [E, 2I, D], 'layers.L.mlp.experts.down_proj' [E, D, I]);
lm_head.weight unless tie_word_embeddings. (uint16 bits, 'BF16') packs a BF16 matrix as BF16 panels;
(uint8 codes, 'F8_E4M3') an FP8 one with its block scales '<name>_scale_inv' (floats or BF16). A
GGUF's values may come as stored: (uint8 rows, 'GGML:<type>') for a block format, '<norm>.weight+1' for a norm folded as 1 + w, 'linear_attn.ssm_a' for
-exp(A_log), 'linear_attn.out_proj.weight:tiled' for out_proj with llama.cpp's tiled v-head columns. A missing or misshapen tensor raises ValueError naming it and
the expected shape. Matrices are packed into the kernel's panels at load; threads=0 uses all cores.)doc")
      .def(py::init(&make), py::arg("config"), py::arg("weights"), py::arg("threads") = 0)
      .def("forward", &forward_py, py::arg("ids"), py::kw_only(), py::arg("chunk") = 0,
           R"doc(Logits [S, V] float32 of every position of ids (int32 [S]) from an empty state.

chunk > 0 feeds the sequence in calls of that many tokens, carrying the per-token state between them
(conv rows, recurrent state, K/V rows): the same bits as one call. Runs without the GIL.)doc")
      .def_property_readonly("model", [](const BoundQwen35& b) { return b.bm; },
                             "The same model as a cairn._kernel.Model (State, prefill, decode, snapshots).")
      .def_property_readonly("vocab_size", [](const BoundQwen35& b) { return b.model().cfg.vocab; })
      .def_property_readonly("n_layers", [](const BoundQwen35& b) { return b.model().cfg.n_layers; })
      .def_property_readonly("threads", [](const BoundQwen35& b) { return b.model().threads; })
      .def_property_readonly("is_moe", [](const BoundQwen35& b) { return b.model().cfg.moe(); })
      .def_property_readonly("panel_formats", [](const BoundQwen35& b) { return b.model().panel_formats; },
                             "Packed matrices by panel format: {'F32': n, 'Q8_0': m, ...} (a GGUF block format stays one).")
      .def_property_readonly("layer_types", [](const BoundQwen35& b) {
        std::vector<std::string> v;
        for (Mixer t : b.model().cfg.layer_types) v.push_back(t == Mixer::Full ? "full_attention" : "linear_attention");
        return v;
      });
}

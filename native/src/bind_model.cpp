// cairn bindings: Model construction from (config dict, weights dict).
//
// Design notes
//  * Arguments are parsed and every tensor's presence / shape / dtype checked with the GIL held;
//    F32 C-contiguous arrays are used in place and the Python objects kept alive by the
//    Model; BF16 (uint16 view) and F16 arrays are widened to fp32 after releasing the GIL
//    (safe: the source buffers are pinned by references taken while holding it, and the
//    destination buffers are private to this constructor); then every weight matrix is packed
//    into panels (pack_weights), also without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <sched.h>

#include <thread>

#include "bind.h"
#include "cairn/expert_cache.h"
#include "cairn/kernels.h"
#include "codecs/codec.h"

namespace py = pybind11;
using namespace cairn;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      man &= 0x3ff;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) bits = sign | 0x7f800000 | (man << 13);
  else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A C-contiguous array whose data is aligned for its element type: `a` itself, or a copy when `a`
// is a view at an odd offset (a safetensors file need not align its tensors). Reading a float or
// an int16 through a misaligned pointer is undefined behaviour (UBSan reports it, `make sanitize`),
// and a vectorised loop may assume the alignment.
py::array aligned(const py::array& a) {
  py::array c = py::array::ensure(a, py::array::c_style);
  if ((uintptr_t)c.data() % (uintptr_t)c.itemsize() == 0) return c;
  py::array copy(c.dtype(), std::vector<py::ssize_t>(c.shape(), c.shape() + c.ndim()));
  std::memcpy(copy.mutable_data(), c.data(), (size_t)c.nbytes());
  return copy;
}

struct Convert {
  const void* src;
  float* dst;
  int64_t n;
  bool bf16;
  bool matrix = false;  // the source of a packed matrix: not needed when the panels come from the cache
};

struct Loader {
  BoundModel& m;
  py::dict weights;
  std::vector<Convert> jobs;
  // Arrays only read while loading (BF16/F16 widening sources, the mapped bytes of packed
  // matrices): released once everything is packed, so the mapping's pages leave the process.
  std::vector<py::object> transient;
  std::vector<std::function<void()>> checks;  // of quantized sources, run only when they are packed

  py::tuple entry(const std::string& name) {
    if (!weights.contains(name)) throw py::value_error("missing weight tensor '" + name + "'");
    py::object v = weights[py::str(name)];
    if (!py::isinstance<py::tuple>(v) || py::len(v) != 2)
      throw py::value_error("weight '" + name + "' must be a tuple (array, dtype tag)");
    return v.cast<py::tuple>();
  }
  static std::vector<int64_t> shape_of(const py::array& a) {
    return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
  }
  void check_shape(const std::string& name, const py::array& a, const std::vector<int64_t>& want) {
    if (shape_of(a) != want)
      throw py::value_error("weight '" + name + "' has shape " + shape_str(shape_of(a)) + ", expected " +
                            shape_str(want));
  }
  const float* f32(const std::string& name, const std::vector<int64_t>& want) {
    py::tuple t = entry(name);
    std::string tag = py::str(t[1]);
    if (tag.rfind("GGML:", 0) == 0) {  // a GGUF block format in a tensor read as floats: widened at load
      const BlockCodec* c = codec_of(name, tag);
      int64_t n = 1;
      for (auto d : want) n *= d;
      const int64_t in = want.empty() ? 1 : want.back(), rows = in ? n / in : 0;
      const uint8_t* q = ggml_rows(name, t, c, std::vector<int64_t>(want.begin(), want.end() - (want.empty() ? 0 : 1)), in);
      m.owned.push_back(std::unique_ptr<float[]>(new float[(size_t)std::max<int64_t>(n, 1)]));
      float* dst = m.owned.back().get();
      for (int64_t r = 0; r < rows; ++r) c->decode_blocks(q + (size_t)r * (in / c->block) * c->bytes, (int)(in / c->block), dst + r * in);
      return dst;
    }
    py::array a = py::array::ensure(t[0]);
    if (!a) throw py::value_error("weight '" + name + "' is not an array");
    check_shape(name, a, want);
    int64_t n = 1;
    for (auto s : want) n *= s;
    if (tag == "F32") {
      if (!a.dtype().is(py::dtype::of<float>()))
        throw py::value_error("weight '" + name + "' tagged F32 but array dtype is " + std::string(py::str(a.dtype())));
      if (a.flags() & py::array::c_style) {
        py::array c = aligned(a);
        m.keep.push_back(c);
        return (const float*)c.data();
      }
      py::array_t<float, py::array::c_style | py::array::forcecast> c(a);
      m.keep.push_back(c);
      return c.data();
    }
    if (tag == "BF16" || tag == "F16") {
      if (a.itemsize() != 2) throw py::value_error("weight '" + name + "' tagged " + tag + " but itemsize != 2");
      py::array c = aligned(a);
      transient.push_back(c);
      m.owned.push_back(std::unique_ptr<float[]>(new float[(size_t)std::max<int64_t>(n, 1)]));
      float* dst = m.owned.back().get();
      jobs.push_back({c.data(), dst, n, tag == "BF16"});
      if (tag == "BF16") m.bf16_sources.emplace(dst, (const uint16_t*)c.data());
      return dst;
    }
    throw py::value_error("weight '" + name + "' has unsupported dtype tag '" + tag +
                          "' (want F32/BF16/F16, F8_E4M3/I8 with scales, or GGML:<type>)");
  }
  // Gate and up are packed as one matrix (16 rows of each per panel pair): one stored format.
  static void fused_pair(const std::string& gn, const Linear& g, const std::string& un, const Linear& u) {
    auto fmt = [](const Linear& L) -> std::string {
      if (L.qf == QFmt::Ggml) return L.codec->name;
      if (L.qf == QFmt::E4M3) return "F8_E4M3";
      if (L.qf == QFmt::E2M1) return "FP4 (I8)";
      return "float";
    };
    if (g.qf != u.qf || g.codec != u.codec)
      throw py::value_error("weights '" + gn + "' (" + fmt(g) + ") and '" + un + "' (" + fmt(u) +
                            ") are one expert's gate and up projections and must share a storage format "
                            "(requantize the file with the same type for both)");
  }
  // The GGUF block format a "GGML:<type>" tag names, or an error listing the supported ones.
  static const BlockCodec* codec_of(const std::string& name, const std::string& tag) {
    const BlockCodec* c = find_codec(tag.substr(5));
    if (c) return c;
    std::string names;
    for (const BlockCodec* k : all_codecs()) names += (names.empty() ? "" : ", ") + std::string(k->name);
    throw py::value_error("weight '" + name + "' has GGML type " + tag.substr(5) + ", which cairn cannot compute on; "
                          "supported: " + names);
  }
  // The stored rows of a GGUF block tensor: a byte array [lead..., in/block*bytes], pinned while loading.
  const uint8_t* ggml_rows(const std::string& name, const py::tuple& t, const BlockCodec* c, std::vector<int64_t> lead,
                           int64_t in) {
    if (in % c->block)
      throw py::value_error("weight '" + name + "' is " + c->name + " (blocks of " + std::to_string(c->block) +
                            ") but its rows hold " + std::to_string(in) + " weights, not a multiple of the block");
    lead.push_back(in / c->block * c->bytes);
    return bytes(name, t, lead);
  }
  // The embedding: BF16 stays in the mapping (rows widened per lookup), others as f32().
  void embedding(const std::string& name, int V, int D) {
    py::tuple t = entry(name);
    const std::string tag = py::str(t[1]);
    if (tag.rfind("GGML:", 0) == 0) {  // stays in the mapping: a row is decoded when it is looked up
      const BlockCodec* c = codec_of(name, tag);
      const uint8_t* q = ggml_rows(name, t, c, {V}, D);
      m.keep.push_back(transient.back());
      transient.pop_back();
      m.embedq = q;
      m.embed_codec = c;
      return;
    }
    if (tag != "BF16") {
      m.embed = f32(name, {V, D});
      return;
    }
    py::array a = py::array::ensure(t[0]);
    if (!a || a.itemsize() != 2) throw py::value_error("weight '" + name + "' tagged BF16 but itemsize != 2");
    check_shape(name, a, {V, D});
    py::array c = aligned(a);
    m.keep.push_back(c);
    m.embed16 = (const uint16_t*)c.data();
  }
  // A byte array (quantized codes or ue8m0 scales) of the given shape, pinned until packed.
  const uint8_t* bytes(const std::string& name, const py::tuple& t, const std::vector<int64_t>& want) {
    py::array a = py::array::ensure(t[0]);
    if (!a || a.itemsize() != 1)
      throw py::value_error("weight '" + name + "' tagged " + std::string(py::str(t[1])) + " must be a 1-byte array");
    check_shape(name, a, want);
    py::array c = py::array::ensure(a, py::array::c_style);
    transient.push_back(c);
    return (const uint8_t*)c.data();
  }
  // W.weight F8_E4M3 [out, in] with W.scale F8_E8M0 [ceil(out/128), ceil(in/128)], or I8 [out, in/2]
  // (FP4 e2m1 pairs, low nibble first) with W.scale [out, in/32]: kept as stored bytes until packed.
  Linear qlin(const std::string& name, const std::string& tag, const py::tuple& t, int out, int in) {
    const QFmt f = tag == "I8" ? QFmt::E2M1 : QFmt::E4M3;
    const std::string suffix = "weight";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      throw py::value_error("weight '" + name + "' is " + tag + "; only '*.weight' matrices may be quantized");
    if (f == QFmt::E2M1 && in % kFp4Group)
      throw py::value_error("weight '" + name + "' is FP4 but its input width " + std::to_string(in) +
                            " is not a multiple of 32");
    Linear L{nullptr, nullptr, out, in};
    L.qf = f;
    L.q = bytes(name, t, {out, f == QFmt::E2M1 ? in / 2 : in});
    const std::string sn = name.substr(0, name.size() - suffix.size()) + "scale";
    py::tuple st = entry(sn);
    const std::string stag = py::str(st[1]);
    if (stag != "F8_E8M0")
      throw py::value_error("weight '" + sn + "' has dtype tag '" + stag + "'; quantized weights need F8_E8M0 (ue8m0) scales");
    const std::vector<int64_t> grid = f == QFmt::E2M1
        ? std::vector<int64_t>{out, in / kFp4Group}
        : std::vector<int64_t>{(out + kFp8Block - 1) / kFp8Block, (in + kFp8Block - 1) / kFp8Block};
    L.qs = bytes(sn, st, grid);
    // checked when packing (without the GIL): panels mapped from the packed cache never read the scales
    checks.push_back([sn, qs = L.qs, n = grid[0] * grid[1], top = qscale_max(f)] {
      for (int64_t i = 0; i < n; ++i)
        if (qs[i] > top)
          throw py::value_error("weight '" + sn + "' holds scale byte " + std::to_string(qs[i]) + " (2^" +
                                std::to_string((int)qs[i] - 127) + "); at most " + std::to_string(top) +
                                " is supported");
    });
    return L;
  }
  std::vector<int32_t> ints(const std::string& name, const std::vector<int64_t>& want, int64_t lim) {
    py::tuple t = entry(name);
    py::array a = py::array::ensure(t[0]);
    if (!a) throw py::value_error("weight '" + name + "' is not an array");
    check_shape(name, a, want);
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> c(a);
    std::vector<int32_t> out(c.size());
    // a view of a safetensors file may sit at any offset: read each value as bytes (an unaligned
    // int64 load is undefined behaviour; UBSan reports it, `make sanitize`)
    const char* raw = (const char*)c.data();
    for (py::ssize_t i = 0; i < c.size(); ++i) {
      int64_t v;
      std::memcpy(&v, raw + (size_t)i * sizeof v, sizeof v);
      if (v < 0 || v >= lim) throw py::value_error("weight '" + name + "' holds out-of-range value " + std::to_string(v));
      out[i] = (int32_t)v;
    }
    return out;
  }
  Linear lin(const std::string& name, int out, int in) {
    py::tuple t = entry(name);
    const std::string tag = py::str(t[1]);
    if (tag == "F8_E4M3" || tag == "I8") return qlin(name, tag, t, out, in);
    if (tag.rfind("GGML:", 0) == 0) {  // a GGUF block format: packed as stored, computed on as stored
      Linear L{nullptr, nullptr, out, in};
      L.qf = QFmt::Ggml;
      L.codec = codec_of(name, tag);
      L.q = ggml_rows(name, t, L.codec, {out}, in);
      return L;
    }
    const size_t kept = m.keep.size(), converts = jobs.size();
    Linear L{f32(name, {out, in}), nullptr, out, in};
    if (jobs.size() > converts) jobs.back().matrix = true;
    if (m.keep.size() > kept) {  // an F32 source used in place: only read while packing
      transient.push_back(m.keep.back());
      m.keep.pop_back();
    }
    return L;
  }
  // Widen the BF16/F16 sources of matrices (matrix) or of everything else; call without the GIL.
  void run_jobs(int threads, bool matrix) {
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (size_t j = 0; j < jobs.size(); ++j) {
      const Convert& c = jobs[j];
      if (c.matrix != matrix || (matrix && m.bf16_unwidened.count(c.dst))) continue;  // packed from its BF16
      const uint16_t* s = (const uint16_t*)c.src;
      if (c.bf16)
        for (int64_t i = 0; i < c.n; ++i) {
          uint32_t b = (uint32_t)s[i] << 16;
          std::memcpy(&c.dst[i], &b, 4);
        }
      else
        for (int64_t i = 0; i < c.n; ++i) c.dst[i] = half_to_float(s[i]);
    }
  }
};

template <class T> T cfg_get(const py::dict& d, const char* k) {
  if (!d.contains(k)) throw py::value_error(std::string("config is missing key '") + k + "'");
  try {
    return d[k].cast<T>();
  } catch (const py::cast_error&) {
    throw py::value_error(std::string("config key '") + k + "' has the wrong type");
  }
}

Config parse_config(const py::dict& d) {
  Config c;
  c.vocab = cfg_get<int>(d, "vocab_size");
  c.D = cfg_get<int>(d, "hidden_size");
  c.n_layers = cfg_get<int>(d, "num_hidden_layers");
  c.H = cfg_get<int>(d, "num_attention_heads");
  c.Dh = cfg_get<int>(d, "head_dim");
  c.r = cfg_get<int>(d, "qk_rope_head_dim");
  c.Rq = cfg_get<int>(d, "q_lora_rank");
  c.G = cfg_get<int>(d, "o_groups");
  c.Ro = cfg_get<int>(d, "o_lora_rank");
  c.W = cfg_get<int>(d, "sliding_window");
  for (auto& s : cfg_get<std::vector<std::string>>(d, "layer_types")) {
    if (s == "sliding_attention") c.layer_types.push_back(AttnType::Sliding);
    else if (s == "compressed_sparse_attention") c.layer_types.push_back(AttnType::CSA);
    else if (s == "heavily_compressed_attention") c.layer_types.push_back(AttnType::HCA);
    else throw py::value_error("unknown layer type '" + s + "'");
  }
  for (auto& s : cfg_get<std::vector<std::string>>(d, "mlp_layer_types")) {
    if (s != "hash_moe" && s != "moe") throw py::value_error("unknown mlp layer type '" + s + "'");
    c.hash_moe.push_back(s == "hash_moe");
  }
  c.csa_rate = cfg_get<int>(d, "csa_rate");
  c.hca_rate = cfg_get<int>(d, "hca_rate");
  c.rope_theta = cfg_get<double>(d, "rope_theta");
  c.compress_rope_theta = cfg_get<double>(d, "compress_rope_theta");
  std::string rt = cfg_get<std::string>(d, "compress_rope_type");
  if (rt != "yarn" && rt != "default") throw py::value_error("compress_rope_type must be 'yarn' or 'default'");
  c.compress_yarn = rt == "yarn";
  c.yarn_factor = cfg_get<double>(d, "yarn_factor");
  c.yarn_orig = cfg_get<double>(d, "yarn_original_max_position_embeddings");
  c.yarn_beta_fast = cfg_get<double>(d, "yarn_beta_fast");
  c.yarn_beta_slow = cfg_get<double>(d, "yarn_beta_slow");
  c.N = cfg_get<int>(d, "hc_mult");
  c.sinkhorn_iters = cfg_get<int>(d, "hc_sinkhorn_iters");
  c.hc_eps = cfg_get<float>(d, "hc_eps");
  c.rms_eps = cfg_get<float>(d, "rms_norm_eps");
  c.E = cfg_get<int>(d, "n_routed_experts");
  c.k = cfg_get<int>(d, "num_experts_per_tok");
  c.I = cfg_get<int>(d, "moe_intermediate_size");
  c.n_shared = cfg_get<int>(d, "n_shared_experts");
  c.routed_scale = cfg_get<float>(d, "routed_scaling_factor");
  c.swiglu_limit = cfg_get<float>(d, "swiglu_limit");
  c.nI = cfg_get<int>(d, "index_n_heads");
  c.Di = cfg_get<int>(d, "index_head_dim");
  c.topk = cfg_get<int>(d, "index_topk");
  std::string sf = cfg_get<std::string>(d, "scoring_func");
  if (sf != "sqrtsoftplus") throw py::value_error("scoring_func '" + sf + "' is not supported (sqrtsoftplus only)");
  auto req = [](bool ok, const std::string& msg) { if (!ok) throw py::value_error("invalid config: " + msg); };
  req(c.vocab > 0 && c.D > 0 && c.n_layers > 0 && c.H > 0 && c.Dh > 0, "sizes must be positive");
  req((int)c.layer_types.size() == c.n_layers, "len(layer_types) != num_hidden_layers");
  req((int)c.hash_moe.size() == c.n_layers, "len(mlp_layer_types) != num_hidden_layers");
  req(c.r > 0 && c.r % 2 == 0 && c.r <= c.Dh && c.r <= c.Di && c.r <= 512, "qk_rope_head_dim must be even, <= head_dim, index_head_dim, 512");
  req(c.G > 0 && (c.H * c.Dh) % c.G == 0, "o_groups must divide heads*head_dim");
  req(c.W >= 2, "sliding_window must be >= 2");
  req(c.csa_rate >= 1 && c.csa_rate <= 1024 && c.hca_rate >= 1 && c.hca_rate <= 1024, "compress rates must be in 1..1024");
  req(c.N >= 1 && c.N <= 8, "hc_mult must be in 1..8");
  req(c.k >= 1 && c.k <= c.E, "num_experts_per_tok must be in 1..n_routed_experts");
  req(c.topk >= 1 && c.nI >= 1 && c.Di >= 1, "indexer sizes must be positive");
  req(c.nI <= 64, "index_n_heads must be <= 64");
  return c;
}

}  // namespace

BoundModel::BoundModel(py::dict config, py::dict weights, std::string fp, int nthreads, bool batched,
                       bool widen, std::string packed_cache, int64_t expert_cache_bytes, std::string expert_policy,
                       int expert_readers, int64_t page_tokens) {
  if (expert_cache_bytes < 0) throw py::value_error("expert_cache_bytes must be >= 0 (0 = every expert resident)");
  if (expert_readers < 1 || expert_readers > 16)
    throw py::value_error("expert_readers must be in 1..16 (reader threads for paged experts), got " +
                          std::to_string(expert_readers));
  SlotPolicy::parse(expert_policy);  // a bad name fails before any packing
  if (is_qwen35_config(config)) {  // another family: its own loader (families/qwen35/)
    if (expert_cache_bytes)
      throw py::value_error("expert_cache_bytes must be 0 for qwen3_5 models (paged experts are DeepSeek-V4's only)");
    load_qwen35(*this, config, weights, nthreads, page_tokens);
    fingerprint = std::move(fp);
    trace = std::make_shared<RouteTrace>();
    return;
  }
  cfg = parse_config(config);
  try {
    page_layout = make_page_layout(cfg, page_tokens);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  fingerprint = std::move(fp);
  // all cores this process may run on (affinity mask), not every core of the machine
  cpu_set_t set;
  int hw = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)std::thread::hardware_concurrency();
  if (nthreads < 0) throw py::value_error("threads must be >= 0");
  threads = nthreads == 0 ? std::max(1, hw) : nthreads;
  batched_indexer = batched;
  widen_bf16 = widen;
  const Config& c = cfg;
  const int D = c.D, N = c.N, NM = (2 + N) * N, V = c.vocab;
  Loader ld{*this, weights, {}, {}, {}};
  ld.embedding("embed.weight", V, D);
  head = ld.lin("head.weight", V, D);
  norm = ld.f32("norm.weight", {D});
  hc_head = ld.lin("hc_head_fn", N, N * D);
  hc_head_base = ld.f32("hc_head_base", {N});
  hc_head_scale = ld.f32("hc_head_scale", {1});
  layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerW& L = layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.attn_norm = ld.f32(p + "attn_norm.weight", {D});
    L.ffn_norm = ld.f32(p + "ffn_norm.weight", {D});
    L.hc_attn = ld.lin(p + "hc_attn_fn", NM, N * D);
    L.hc_attn_base = ld.f32(p + "hc_attn_base", {NM});
    L.hc_attn_scale = ld.f32(p + "hc_attn_scale", {3});
    L.hc_ffn = ld.lin(p + "hc_ffn_fn", NM, N * D);
    L.hc_ffn_base = ld.f32(p + "hc_ffn_base", {NM});
    L.hc_ffn_scale = ld.f32(p + "hc_ffn_scale", {3});
    const std::string a = p + "attn.";
    L.wq_a = ld.lin(a + "wq_a.weight", c.Rq, D);
    L.q_norm = ld.f32(a + "q_norm.weight", {c.Rq});
    L.wq_b = ld.lin(a + "wq_b.weight", c.H * c.Dh, c.Rq);
    L.wkv = ld.lin(a + "wkv.weight", c.Dh, D);
    L.kv_norm = ld.f32(a + "kv_norm.weight", {c.Dh});
    L.wo_a = ld.lin(a + "wo_a.weight", c.G * c.Ro, c.H * c.Dh / c.G);
    L.wo_b = ld.lin(a + "wo_b.weight", D, c.G * c.Ro);
    L.sink = ld.f32(a + "attn_sink", {c.H});
    auto comp = [&](const std::string& q, int dim, int rate, bool two) {
      CompressorW w;
      int cw = two ? 2 * dim : dim;
      w.wkv = ld.lin(q + "wkv.weight", cw, D);
      w.wgate = ld.lin(q + "wgate.weight", cw, D);
      w.ape = ld.f32(q + "ape", {rate, cw});
      w.norm = ld.f32(q + "norm.weight", {dim});
      return w;
    };
    if (c.layer_types[l] == AttnType::HCA) L.comp = comp(a + "compressor.", c.Dh, c.hca_rate, false);
    if (c.layer_types[l] == AttnType::CSA) {
      L.comp = comp(a + "compressor.", c.Dh, c.csa_rate, true);
      L.icomp = comp(a + "indexer.compressor.", c.Di, c.csa_rate, true);
      L.iwq_b = ld.lin(a + "indexer.wq_b.weight", c.nI * c.Di, c.Rq);
      L.iweights = ld.lin(a + "indexer.weights_proj.weight", c.nI, D);
    }
    const std::string f = p + "ffn.";
    L.gate = ld.lin(f + "gate.weight", c.E, D);
    if (c.hash_moe[l]) L.tid2eid = ld.ints(f + "gate.tid2eid", {V, c.k}, c.E);
    else L.gate_bias = ld.f32(f + "gate.bias", {c.E});
    for (int e = 0; e < c.E; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      L.w1.push_back(ld.lin(x + "w1.weight", c.I, D));
      L.w2.push_back(ld.lin(x + "w2.weight", D, c.I));
      L.w3.push_back(ld.lin(x + "w3.weight", c.I, D));
      ld.fused_pair(x + "w1.weight", L.w1.back(), x + "w3.weight", L.w3.back());
    }
    const int Is = c.I * c.n_shared;
    L.sw1 = ld.lin(f + "shared_experts.w1.weight", Is, D);
    L.sw2 = ld.lin(f + "shared_experts.w2.weight", D, Is);
    L.sw3 = ld.lin(f + "shared_experts.w3.weight", Is, D);
    ld.fused_pair(f + "shared_experts.w1.weight", L.sw1, f + "shared_experts.w3.weight", L.sw3);
  }
  {
    py::gil_scoped_release rel;
    ld.run_jobs(threads, false);
    pack_weights(*this, threads, packed_cache, [&] {
      for (auto& check : ld.checks) check();
      ld.run_jobs(threads, true);
    }, PagingOptions{(size_t)expert_cache_bytes, expert_policy, expert_readers});
  }
  ld.transient.clear();
  init_rope(*this);
}

void register_model(py::module_& m) {
  py::class_<BoundModel, std::shared_ptr<BoundModel>>(m, "Model", R"doc(Immutable DeepSeek-V4 weights + config.

A config whose model_type is qwen3_5* (top level or text_config) makes a Qwen3.5 model instead
(families/qwen35/: float32 weights by HF name, Qwen35Model's); the keyword options below then keep
their defaults but page_tokens (its default: 64).
config: resolved config dict; weights: canonical name -> (array, "F32"|"BF16"|"F16"|"I64"|"I32"|
"F8_E4M3"|"I8"|"F8_E8M0"). Weight matrices are packed into panels at load: BF16 ones as BF16 panels
widened inside the product (half the memory and bandwidth, identical results; widen_bf16=True stores
them as fp32 panels), F16/F32 ones as fp32 panels, quantized ones (F8_E4M3 [out, in] or FP4 pairs I8
[out, in/2], each with its F8_E8M0 'X.scale') as panels of the stored codes and scales, widened and
scaled inside the product: the same bits as fp32 panels of the dequantized weights. The sources of
packed matrices are released after packing; other F32 arrays and a BF16 embedding are used in place
(kept alive by the Model).
packed_cache: a file path for the packed panels: when it holds this model's panels (same fingerprint
and layout) they are memory-mapped instead of packed (no weight matrix is read or widened; pages are
read when first used); otherwise the panels are packed and written there atomically for the next start.
expert_cache_bytes: a byte budget for routed experts (0 = all resident, as is a budget of at least
every expert's bytes): the dense part stays resident, routed experts are read on demand from the
packed_cache file (required; written by a streaming pack if missing) into budget // slot_bytes slots,
never mapped; expert_policy ('cycle', 'hotpin', 'lrfu' or 'lru') chooses what to evict; expert_readers (1..16,
default 4) reader threads keep that many expert reads in flight. Outputs are bit-identical.
threads=0 uses all cores.
batched_indexer=False scores the CSA indexer with the scalar per-query reference loop (same results).
page_tokens: tokens per page group of a state's compressed rows (0: the default, the smallest multiple
of every compress rate >= 256); any multiple of every compress rate gives the same outputs.)doc")
      .def(py::init<py::dict, py::dict, std::string, int, bool, bool, std::string, int64_t, std::string, int, int64_t>(),
           py::arg("config"), py::arg("weights"), py::arg("fingerprint"), py::arg("threads") = 0, py::kw_only(),
           py::arg("batched_indexer") = true, py::arg("widen_bf16") = false, py::arg("packed_cache") = "",
           py::arg("expert_cache_bytes") = 0, py::arg("expert_policy") = "cycle", py::arg("expert_readers") = 4,
           py::arg("page_tokens") = 0)
      .def_property_readonly("page_tokens", [](const BoundModel& m) { return m.page_layout->page_tokens; })
      .def_property_readonly("page_nbytes", [](const BoundModel& m) { return m.page_layout->group_bytes(); },
                             "Bytes of one page group of a state's compressed rows.")
      .def("verify_journal_nbytes", [](const BoundModel& m, int64_t n) {
        if (n < 1 || n > MAX_CHUNK)
          throw py::value_error("n_tokens must be in 1.." + std::to_string(MAX_CHUNK) + " (one verify's tokens), got " +
                                std::to_string(n));
        if (!m.family->supports_verify)
          throw py::value_error(std::string("speculative decoding is off for ") + m.family->name +
                                ": it has no verify journal");
        return journal_bytes(m.cfg, n);
      }, py::arg("n_tokens"),
         "Bytes of the undo record a verify of n_tokens tokens keeps in its state until the state's next "
         "call (an exact upper bound: the record is reserved at this size and never grows).")
      .def_property_readonly("packed_from_cache", [](const BoundModel& m) { return m.packed_from_cache; })
      .def_property_readonly("packed_cache_written", [](const BoundModel& m) { return m.packed_cache_written; })
      .def_property_readonly("packed_bytes", [](const BoundModel& m) { return m.packed_bytes; })
      .def_property_readonly("fingerprint", [](const BoundModel& m) { return m.fingerprint; })
      .def_property_readonly("family", [](const BoundModel& m) { return std::string(m.family->name); },
                             "The model family: 'deepseek_v4' or 'qwen3_5' (chosen from the config's model_type).")
      .def_property_readonly("supports_verify", [](const BoundModel& m) { return m.family->supports_verify; },
                             "Whether verify/rewind (speculative decoding) work on its states (False: they raise "
                             "ValueError; Qwen3.5's recurrent state has no journal).")
      .def_property_readonly("vocab_size", [](const BoundModel& m) { return m.cfg.vocab; })
      .def_property_readonly("n_layers", [](const BoundModel& m) { return m.cfg.n_layers; })
      .def_property_readonly("threads", [](const BoundModel& m) { return m.threads; })
      .def_property_readonly("widen_bf16", [](const BoundModel& m) { return m.widen_bf16; })
      .def_property("batched_indexer", [](const BoundModel& m) { return m.batched_indexer; },
                    [](BoundModel& m, bool v) { m.batched_indexer = v; });
}

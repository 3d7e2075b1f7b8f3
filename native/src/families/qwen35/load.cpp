// cairn kernel, Qwen3.5: the config's checks and the model's load (names, shapes, folds, panels).
#include <omp.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "../../codecs/codec.h"
#include "../../formats/formats.h"
#include "model.h"

namespace cairn::qwen35 {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument("invalid Qwen3.5 config: " + msg);
}

// One matrix to pack: its logical rows (nullptr = a zero row) into dst's panels; or BF16 rows
// (rows16 non-empty) into BF16 panels; or, qf set, the rows of stored-format sources (QRow: src
// null = a zero row) into that format's panels.
struct PackJob {
  Linear* dst;
  std::vector<const float*> rows;
  std::vector<QRow> qrows;
  QFmt qf = QFmt::None;                 // qrows' format (Ggml: codec's blocks)
  const BlockCodec* codec = nullptr;
  std::vector<const uint16_t*> rows16;
  int nrows() const { return (int)(qf != QFmt::None ? qrows.size() : rows16.empty() ? rows.size() : rows16.size()); }
  std::string format() const {
    return qf == QFmt::Ggml ? codec->name : qf == QFmt::E4M3F ? "F8_E4M3" : rows16.empty() ? "F32" : "BF16";
  }
};

// An FP8 e4m3fn code's value (the NaN pattern reads as the finite 480 its bits spell, as the panels').
float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e ? std::ldexp((float)(8 + m), e - 10) : std::ldexp((float)m, -9);
  return b & 0x80 ? -v : v;
}

struct Loader {
  const WeightMap& w;
  Model& m;
  std::vector<PackJob> jobs;
  std::deque<Linear> sources;  // the block-format matrices' stored rows (QRow points at them)

  const TensorView& view(const std::string& name, const std::vector<int64_t>& want) const {
    auto it = w.find(name);
    if (it == w.end()) throw std::invalid_argument("missing weight tensor '" + name + "' (expected shape " + shape_str(want) + ")");
    if (it->second.shape != want)
      throw std::invalid_argument("weight '" + name + "' has shape " + shape_str(it->second.shape) + ", expected " +
                                  shape_str(want));
    return it->second;
  }
  // As floats: a block-format tensor is decoded once (the same values its panels compute with).
  const float* get(const std::string& name, const std::vector<int64_t>& want) {
    const TensorView& t = view(name, want);
    if (!t.codec && !t.bf16 && !t.fp8) return t.data;
    const int64_t in = want.back(), n = std::accumulate(want.begin(), want.end(), (int64_t)1, std::multiplies<>());
    const float* fs = t.fp8 ? fp8_scales(name, want[0], in) : nullptr;
    m.decoded.emplace_back(new float[(size_t)n]);
    float* dst = m.decoded.back().get();
    if (t.fp8) {  // code x block scale: exact in fp32 (the panels' value)
      const int64_t ng = (in + kFp8Block - 1) / kFp8Block;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = e4m3_value(t.q[i]) * fs[(i / in / kFp8Block) * ng + (i % in) / kFp8Block];
      return dst;
    }
    if (t.bf16) {  // exact: a BF16 value is the top half of its float
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t b = (uint32_t)t.bf16[i] << 16;
        std::memcpy(&dst[i], &b, 4);
      }
      return dst;
    }
    const int nb = (int)(in / t.codec->block);
    for (int64_t r = 0; r < n / in; ++r)
      t.codec->decode_blocks(t.q + (size_t)r * nb * t.codec->bytes, nb, dst + r * in);
    return dst;
  }
  bool has(const std::string& name) const { return w.count(name) > 0; }
  // An RMSNorm weight stored zero-centred: 1 + w in fp32, HF's `1.0 + w.float()`; a GGUF's is
  // stored folded (`name+1`, the converter's own fp32 `1 + w`) and read as it is.
  std::vector<float> norm1p(const std::string& name, int n) {
    if (has(name + "+1")) {
      const float* s = get(name + "+1", {n});
      return std::vector<float>(s, s + n);
    }
    const float* s = get(name, {n});
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = 1.0f + s[i];
    return v;
  }
  // A matrix W [out, in] with rows at src + i * stride (stride: in unless a slice of a larger tensor).
  Linear rows(const float* src, int out, int in, int64_t stride = -1) {
    if (stride < 0) stride = in;
    Linear L{nullptr, nullptr, out, in};
    jobs.push_back({nullptr, {}, {}, QFmt::None, nullptr, {}});
    jobs.back().rows.resize(out);
    for (int i = 0; i < out; ++i) jobs.back().rows[i] = src + (size_t)i * stride;
    return L;
  }
  // An FP8 weight's block scales `<name>_scale_inv` [ceil(out/128), ceil(in/128)], as floats, checked.
  const float* fp8_scales(const std::string& name, int64_t out, int64_t in) {
    const std::vector<int64_t> grid{(out + kFp8Block - 1) / kFp8Block, (in + kFp8Block - 1) / kFp8Block};
    const float* s = get(name + "_scale_inv", grid);
    check_fp8_float_scales(name + "_scale_inv", s, (size_t)(grid[0] * grid[1]));
    return s;
  }
  // A block-format or FP8 tensor as a source Linear whose rows QRow can name (null: a float tensor).
  const Linear* stored(const std::string& name, int out, int in) {
    const TensorView& t = view(name, {out, in});
    if (!t.codec && !t.fp8) return nullptr;
    Linear L{nullptr, nullptr, out, in};
    L.qf = t.fp8 ? QFmt::E4M3F : QFmt::Ggml;
    L.codec = t.codec;
    L.q = t.q;
    if (t.fp8) L.qfs = fp8_scales(name, out, in);
    sources.push_back(L);
    return &sources.back();
  }
  Linear lin(const std::string& name, int out, int in) {
    if (const Linear* src = stored(name, out, in)) {
      jobs.push_back({nullptr, {}, std::vector<QRow>(out), src->qf, src->codec, {}});
      for (int i = 0; i < out; ++i) jobs.back().qrows[i] = QRow{src, i};
      return Linear{nullptr, nullptr, out, in};
    }
    if (const uint16_t* b = view(name, {out, in}).bf16) {
      jobs.push_back({nullptr, {}, {}, QFmt::None, nullptr, std::vector<const uint16_t*>(out)});
      for (int i = 0; i < out; ++i) jobs.back().rows16[i] = b + (size_t)i * in;
      return Linear{nullptr, nullptr, out, in};
    }
    return rows(get(name, {out, in}), out, in);
  }
  // Gate and up fused per panel: 16 gate rows, the same 16 up rows, ... (rows past I are zero).
  MlpW mlp(const float* gate, const float* up, const float* down, int I, int D) {
    MlpW f = mlp13(gate, up, I, D);
    f.down = rows(down, D, I);
    return f;
  }
  MlpW mlp13(const float* gate, const float* up, int I, int D) {
    MlpW f = fused_shape(I, D);
    jobs.push_back({nullptr, std::vector<const float*>((size_t)f.w13.out, nullptr), {}, QFmt::None, nullptr, {}});
    for_fused(I, [&](size_t j, int g, int i) { jobs.back().rows[j] = (g ? up : gate) + (size_t)i * D; });
    return f;
  }
  MlpW mlp_named(const std::string& p, int I, int D) {
    const Linear* g = stored(p + "gate_proj.weight", I, D);
    const Linear* u = stored(p + "up_proj.weight", I, D);
    MlpW f;
    const uint16_t* g16 = view(p + "gate_proj.weight", {I, D}).bf16;
    const uint16_t* u16 = view(p + "up_proj.weight", {I, D}).bf16;
    if (g16 && u16) {
      f = fused_shape(I, D);
      jobs.push_back({nullptr, {}, {}, QFmt::None, nullptr, std::vector<const uint16_t*>((size_t)f.w13.out, nullptr)});
      for_fused(I, [&](size_t j, int which, int i) { jobs.back().rows16[j] = (which ? u16 : g16) + (size_t)i * D; });
      f.down = lin(p + "down_proj.weight", D, I);
      return f;
    }
    if (!g || !u || g->qf != u->qf || g->codec != u->codec) {  // as floats (decoded when stored): one format a matrix
      f = mlp13(get(p + "gate_proj.weight", {I, D}), get(p + "up_proj.weight", {I, D}), I, D);
      f.down = lin(p + "down_proj.weight", D, I);
      return f;
    }
    f = fused_shape(I, D);
    jobs.push_back({nullptr, {}, std::vector<QRow>((size_t)f.w13.out, QRow{nullptr, 0}), g->qf, g->codec, {}});
    for_fused(I, [&](size_t j, int which, int i) { jobs.back().qrows[j] = QRow{which ? u : g, i}; });
    f.down = lin(p + "down_proj.weight", D, I);
    return f;
  }

 private:
  static MlpW fused_shape(int I, int D) {
    MlpW f;
    f.I = I;
    const int np = (I + kPanel - 1) / kPanel;
    f.w13 = Linear{nullptr, nullptr, 2 * np * kPanel, D};
    return f;
  }
  template <class F> static void for_fused(int I, F&& put) {
    const int np = (I + kPanel - 1) / kPanel;
    for (int q = 0; q < np; ++q)
      for (int l = 0; l < kPanel && q * kPanel + l < I; ++l) {
        put((size_t)(2 * q) * kPanel + l, 0, q * kPanel + l);
        put((size_t)(2 * q + 1) * kPanel + l, 1, q * kPanel + l);
      }
  }
};

}  // namespace

void Config::validate() const {
  require(vocab > 0 && D > 0 && n_layers > 0, "vocab_size, hidden_size and num_hidden_layers must be positive");
  require((int)layer_types.size() == n_layers, "layer_types has " + std::to_string(layer_types.size()) +
                                                   " entries, num_hidden_layers is " + std::to_string(n_layers));
  bool any_full = false, any_lin = false;
  for (Mixer t : layer_types) (t == Mixer::Full ? any_full : any_lin) = true;
  if (any_full) {
    require(H > 0 && Hkv > 0 && Dh > 0, "num_attention_heads, num_key_value_heads and head_dim must be positive");
    require(H % Hkv == 0, "num_attention_heads (" + std::to_string(H) + ") must be a multiple of num_key_value_heads (" +
                              std::to_string(Hkv) + ")");
    require(r >= 0 && r % 2 == 0 && r <= Dh && r <= 512,
            "the rotated width head_dim * partial_rotary_factor = " + std::to_string(r) + " must be even and in 0..min(head_dim, 512)");
    require(rope_theta > 0, "rope_theta must be positive");
  }
  if (any_lin) {
    require(K >= 1 && K <= 16, "linear_conv_kernel_dim must be in 1..16, got " + std::to_string(K));
    require(dk > 0 && dv > 0 && nk > 0 && nv > 0, "linear_{key,value}_head_dim and linear_num_{key,value}_heads must be positive");
    require(nv % nk == 0, "linear_num_value_heads (" + std::to_string(nv) + ") must be a multiple of linear_num_key_heads (" +
                              std::to_string(nk) + ")");
  }
  require(I > 0, moe() ? "moe_intermediate_size must be positive" : "intermediate_size must be positive");
  if (moe()) {
    require(k >= 1 && k <= E, "num_experts_per_tok must be in 1..num_experts (" + std::to_string(E) + "), got " +
                                  std::to_string(k));
    require(Is > 0, "shared_expert_intermediate_size must be positive");
  }
  require(rms_eps > 0, "rms_norm_eps must be positive");
}

std::unique_ptr<Model> load(const Config& c, const WeightMap& w, int threads) {
  c.validate();
  auto mp = std::make_unique<Model>();
  Model& m = *mp;
  m.cfg = c;
  m.threads = std::max(1, threads);
  Loader ld{w, m, {}, {}};
  const int D = c.D, V = c.vocab;
  m.embed = ld.get("embed_tokens.weight", {V, D});
  m.norm = ld.norm1p("norm.weight", D);
  m.head = ld.lin(c.tied ? "embed_tokens.weight" : "lm_head.weight", V, D);  // tied: the same rows
  // Linears are referenced by jobs through their final addresses: layers are sized first
  m.layers.resize(c.n_layers);
  std::vector<Linear*> dsts{&m.head};
  for (int l = 0; l < c.n_layers; ++l) {
    LayerW& L = m.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.kind = c.layer_types[l];
    L.in_norm = ld.norm1p(p + "input_layernorm.weight", D);
    L.post_norm = ld.norm1p(p + "post_attention_layernorm.weight", D);
    if (L.kind == Mixer::Linear) {
      const std::string a = p + "linear_attn.";
      const int cd = c.conv_dim(), vd = c.value_dim(), nv = c.nv, K = c.K;
      GdnW& g = L.gdn;
      g.qkv = ld.lin(a + "in_proj_qkv.weight", cd, D);
      dsts.push_back(&g.qkv);
      g.z = ld.lin(a + "in_proj_z.weight", vd, D);
      dsts.push_back(&g.z);
      g.b = ld.lin(a + "in_proj_b.weight", nv, D);
      dsts.push_back(&g.b);
      g.a = ld.lin(a + "in_proj_a.weight", nv, D);
      dsts.push_back(&g.a);
      // HF's [conv_dim, 1, K]; GGUF's squeezed [conv_dim, K] is the same bytes
      const std::string cn = a + "conv1d.weight";
      const std::vector<int64_t> squeezed{cd, K};
      auto it = w.find(cn);
      const float* cw = ld.get(cn, it != w.end() && it->second.shape == squeezed ? squeezed : std::vector<int64_t>{cd, 1, K});
      g.conv.resize((size_t)K * cd);
      for (int ch = 0; ch < cd; ++ch)
        for (int j = 0; j < K; ++j) g.conv[(size_t)j * cd + ch] = cw[(size_t)ch * K + j];
      const float* dt = ld.get(a + "dt_bias", {nv});
      g.dt_bias.assign(dt, dt + nv);
      if (ld.has(a + "ssm_a")) {  // a GGUF's -exp(A_log), as the converter stored it
        const float* sa = ld.get(a + "ssm_a", {nv});
        g.neg_A.assign(sa, sa + nv);
      } else {
        const float* al = ld.get(a + "A_log", {nv});
        g.neg_A.resize(nv);
        for (int h = 0; h < nv; ++h) g.neg_A[h] = (float)-std::exp((double)al[h]);
      }
      const float* gn = ld.get(a + "norm.weight", {c.dv});
      g.norm.assign(gn, gn + c.dv);
      g.out_tiled = ld.has(a + "out_proj.weight:tiled");
      g.out = ld.lin(a + (g.out_tiled ? "out_proj.weight:tiled" : "out_proj.weight"), D, vd);
      dsts.push_back(&g.out);
    } else {
      const std::string a = p + "self_attn.";
      const int qd = c.H * c.Dh, kvd = c.Hkv * c.Dh;
      AttnW& t = L.attn;
      t.q = ld.lin(a + "q_proj.weight", 2 * qd, D);
      dsts.push_back(&t.q);
      t.k = ld.lin(a + "k_proj.weight", kvd, D);
      dsts.push_back(&t.k);
      t.v = ld.lin(a + "v_proj.weight", kvd, D);
      dsts.push_back(&t.v);
      t.o = ld.lin(a + "o_proj.weight", D, qd);
      dsts.push_back(&t.o);
      t.q_norm = ld.norm1p(a + "q_norm.weight", c.Dh);
      t.k_norm = ld.norm1p(a + "k_norm.weight", c.Dh);
      for (const char* bias : {"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"})
        if (ld.has(a + bias))
          throw std::invalid_argument("weight '" + a + bias + "' is present but attention_bias is not supported");
    }
    const std::string f = p + "mlp.";
    if (c.moe()) {
      L.router = ld.lin(f + "gate.weight", c.E, D);
      dsts.push_back(&L.router);
      L.experts.resize(c.E);
      const bool fused = ld.has(f + "experts.gate_up_proj");
      const float* gu = fused ? ld.get(f + "experts.gate_up_proj", {c.E, 2 * c.I, D}) : nullptr;
      const float* dn = fused ? ld.get(f + "experts.down_proj", {c.E, D, c.I}) : nullptr;
      for (int e = 0; e < c.E; ++e) {
        if (fused) {  // zero-copy row views of the 3-D tensors
          const float* g0 = gu + (size_t)e * 2 * c.I * D;
          L.experts[e] = ld.mlp(g0, g0 + (size_t)c.I * D, dn + (size_t)e * D * c.I, c.I, D);
        } else {
          L.experts[e] = ld.mlp_named(f + "experts." + std::to_string(e) + ".", c.I, D);
        }
        dsts.push_back(&L.experts[e].w13);
        dsts.push_back(&L.experts[e].down);
      }
      L.shared = ld.mlp_named(f + "shared_expert.", c.Is, D);
      dsts.push_back(&L.shared.w13);
      dsts.push_back(&L.shared.down);
      L.shared_gate = ld.lin(f + "shared_expert_gate.weight", 1, D);
      dsts.push_back(&L.shared_gate);
    } else {
      L.shared = ld.mlp_named(f, c.I, D);
      dsts.push_back(&L.shared.w13);
      dsts.push_back(&L.shared.down);
    }
  }
  if (dsts.size() != ld.jobs.size()) throw std::logic_error("qwen35 load: every packed matrix needs its destination");
  for (size_t j = 0; j < dsts.size(); ++j) ld.jobs[j].dst = dsts[j];
  // panels: one buffer per matrix, packed in parallel
  m.arena.resize(ld.jobs.size());
  std::vector<size_t> code_bytes(ld.jobs.size());
  for (size_t j = 0; j < ld.jobs.size(); ++j) {
    const PackJob& J = ld.jobs[j];
    size_t bytes;
    if (J.qf != QFmt::None) {
      const PanelCodec& C = panel_codec(J.qf);
      code_bytes[j] = C.code_bytes(J.codec, J.nrows(), J.dst->in);
      bytes = code_bytes[j] + C.scale_bytes(J.nrows(), J.dst->in);
    } else {
      bytes = packed_floats(J.nrows(), J.dst->in) * (J.rows16.empty() ? sizeof(float) : sizeof(uint16_t));
    }
    m.arena[j].reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!m.arena[j]) throw std::bad_alloc();
    std::memset(m.arena[j].get(), 0, bytes);  // panel padding is zero
  }
#pragma omp parallel for num_threads(m.threads) schedule(dynamic, 1)
  for (size_t j = 0; j < ld.jobs.size(); ++j) {
    PackJob& J = ld.jobs[j];
    uint8_t* buf = (uint8_t*)m.arena[j].get();
    if (J.qf != QFmt::None) {
      panel_codec(J.qf).pack(J.qrows, J.dst->in, buf, buf + code_bytes[j]);
      J.dst->qf = J.qf;
      J.dst->codec = J.codec;
      J.dst->pq = buf;
      J.dst->pqs = buf + code_bytes[j];
    } else if (!J.rows16.empty()) {
      pack_panels_bf16(J.rows16, J.dst->in, (uint16_t*)buf);
      J.dst->p16 = (const uint16_t*)buf;
    } else {
      pack_panels(J.rows, J.dst->in, (float*)buf);
      J.dst->p = (const float*)buf;
    }
  }
  for (const PackJob& J : ld.jobs) ++m.panel_formats[J.format()];
  // RoPE inverse frequencies as HF computes them: 1 / theta^(2i/r), the exponent in fp32
  m.inv_freq.resize(c.r / 2);
  for (int i = 0; i < c.r / 2; ++i) {
    const float e = (float)(2 * i) / (float)c.r;
    m.inv_freq[i] = 1.0f / (float)std::pow(c.rope_theta, (double)e);
  }
  return mp;
}

}  // namespace cairn::qwen35

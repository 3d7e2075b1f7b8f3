// cairn bindings: test hooks for the GGUF block codecs (codecs/codec.h), checked bit for bit against
// gguf.quants.dequantize by tests/native/test_codecs.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "bind.h"
#include "codecs/codec.h"

namespace py = pybind11;
using namespace cairn;

namespace {

std::string supported_names() {
  std::string s;
  for (const BlockCodec* c : all_codecs()) s += (s.empty() ? "" : ", ") + std::string(c->name) + " (" +
                                                std::to_string(c->ggml_type) + ")";
  return s;
}

}  // namespace

void register_codecs(py::module_& m) {
  m.def("codec_types", [] {
    std::vector<std::tuple<std::string, int, int, int>> out;
    for (const BlockCodec* c : all_codecs()) out.emplace_back(c->name, c->ggml_type, c->block, c->bytes);
    return out;
  }, "The GGUF storage formats the kernel decodes: (name, GGML type, weights per block, bytes per block).");
  m.def("codec_dequantize", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks) {
    const BlockCodec* c = find_codec(ggml_type);
    if (!c)
      throw py::value_error("codec_dequantize: ggml_type " + std::to_string(ggml_type) +
                            " is not a supported GGUF storage format; supported: " + supported_names());
    if (blocks.ndim() != 2 || blocks.shape(1) != c->bytes)
      throw py::value_error("codec_dequantize: blocks must be a uint8 array of shape (n, " +
                            std::to_string(c->bytes) + ") for " + c->name + " (" + std::to_string(c->bytes) +
                            " bytes per block); got " + std::to_string(blocks.ndim()) + " dimensions, last " +
                            (blocks.ndim() ? std::to_string(blocks.shape(blocks.ndim() - 1)) : "-"));
    const py::ssize_t n = blocks.shape(0);
    if (n > (py::ssize_t)INT32_MAX)
      throw py::value_error("codec_dequantize: at most 2^31-1 blocks per call, got " + std::to_string(n));
    py::array_t<float> out(n * c->block);
    const uint8_t* src = blocks.data();
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release rel;
      c->decode_blocks(src, (int)n, dst);
    }
    return out;
  }, py::arg("ggml_type"), py::arg("blocks"),
     "Weights of n blocks of one GGUF format (blocks: uint8 [n, bytes]) as float32 [n * block], through the "
     "codec's decode_blocks.");
  m.def("_codec_decode_each", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks) {
    // The single-block decode(), block by block: tests check it agrees with decode_blocks.
    const BlockCodec* c = find_codec(ggml_type);
    if (!c || blocks.ndim() != 2 || blocks.shape(1) != c->bytes)
      throw py::value_error("_codec_decode_each: want a supported ggml_type and uint8 blocks [n, bytes]");
    const py::ssize_t n = blocks.shape(0);
    py::array_t<float> out(n * c->block);
    for (py::ssize_t b = 0; b < n; ++b) c->decode(blocks.data() + b * c->bytes, out.mutable_data() + b * c->block);
    return out;
  }, py::arg("ggml_type"), py::arg("blocks"));
  m.def("_codec_interleave16", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks) {
    // 16n blocks as stored (row l of group g at 16g + l) -> uint8 [n, bytes * 16], each group's 16
    // blocks interleaved as a panel holds them (codecs/codec.h, lane_byte).
    const BlockCodec* c = find_codec(ggml_type);
    if (!c)
      throw py::value_error("_codec_interleave16: ggml_type " + std::to_string(ggml_type) +
                            " is not a supported GGUF storage format; supported: " + supported_names());
    if (blocks.ndim() != 2 || blocks.shape(1) != c->bytes || blocks.shape(0) % 16 != 0)
      throw py::value_error("_codec_interleave16: blocks must be uint8 [16n, " + std::to_string(c->bytes) + "] for " + c->name);
    const py::ssize_t n = blocks.shape(0) / 16, S = c->bytes;
    py::array_t<uint8_t> out({n, S * 16});
    const uint8_t* src = blocks.data();
    uint8_t* dst = out.mutable_data();
    for (py::ssize_t g = 0; g < n; ++g)
      for (int l = 0; l < 16; ++l)
        place_block(*c, src + (g * 16 + l) * S, dst + g * S * 16, l);
    return out;
  }, py::arg("ggml_type"), py::arg("blocks"));
  m.def("_codec_decode_lanes", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks16) {
    // decode_lanes over n groups of 16 interleaved blocks (uint8 [n, bytes * 16]) -> float32
    // [n, block, 16] (weight k of lane l at [g, k, l]): tests hold it to each row's reference.
    const BlockCodec* c = find_codec(ggml_type);
    if (!c)
      throw py::value_error("_codec_decode_lanes: ggml_type " + std::to_string(ggml_type) +
                            " is not a supported GGUF storage format; supported: " + supported_names());
    if (!c->decode_lanes)
      throw py::value_error(std::string("_codec_decode_lanes: ") + c->name + " has no lane-form decoder");
    if (blocks16.ndim() != 2 || blocks16.shape(1) != (py::ssize_t)c->bytes * 16)
      throw py::value_error("_codec_decode_lanes: blocks16 must be uint8 [n, " + std::to_string(c->bytes * 16) +
                            "] for " + c->name + " (16 interleaved blocks of " + std::to_string(c->bytes) + " bytes)");
    const py::ssize_t n = blocks16.shape(0);
    py::array_t<float> out({n, (py::ssize_t)c->block, (py::ssize_t)16});
    const uint8_t* src = blocks16.data();
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release rel;
      for (py::ssize_t g = 0; g < n; ++g)
        c->decode_lanes(src + g * c->bytes * 16, dst + g * c->block * 16);
    }
    return out;
  }, py::arg("ggml_type"), py::arg("blocks16"));
  m.def("_codec_bench_lanes", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks16, int reps,
                                 bool transpose) {
    // Seconds per pass (one thread) over n blocks of 16 rows into the k-major tile out[k*16 + l],
    // for speed figures; not API. transpose: each row's n blocks through decode_blocks, then laid
    // into the tile one float at a time (formats/ggml_blocks.cpp today); else decode_lanes per block.
    const BlockCodec* c = find_codec(ggml_type);
    if (!c || blocks16.ndim() != 2 || blocks16.shape(1) != (py::ssize_t)c->bytes * 16 || reps < 1 ||
        (!transpose && !c->decode_lanes))
      throw py::value_error("_codec_bench_lanes: want a supported ggml_type (with decode_lanes unless "
                            "transpose), uint8 blocks16 [n, bytes * 16], reps >= 1");
    const int n = (int)blocks16.shape(0), B = c->block, S = c->bytes;
    const uint8_t* src = blocks16.data();
    std::vector<uint8_t> rows((size_t)16 * n * S);  // row l's n blocks, back to back
    for (int g = 0; g < n; ++g)
      for (int i = 0; i < S; ++i)
        for (int l = 0; l < 16; ++l) rows[((size_t)l * n + g) * S + i] = src[(size_t)g * S * 16 + lane_byte(*c, i, l)];
    std::vector<float> out((size_t)n * B * 16), row((size_t)n * B);
    double dt;
    {
      py::gil_scoped_release rel;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        if (transpose) {
          for (int l = 0; l < 16; ++l) {
            c->decode_blocks(rows.data() + (size_t)l * n * S, n, row.data());
            for (size_t k = 0; k < (size_t)n * B; ++k) out[k * 16 + l] = row[k];
          }
        } else {
          for (int g = 0; g < n; ++g) c->decode_lanes(src + (size_t)g * S * 16, out.data() + (size_t)g * B * 16);
        }
        asm volatile("" : : "r"(out.data()) : "memory");   // keep every rep's stores
      }
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    }
    return dt;
  }, py::arg("ggml_type"), py::arg("blocks16"), py::arg("reps") = 1, py::arg("transpose") = false);
  m.def("_codec_bench", [](int ggml_type, py::array_t<uint8_t, py::array::c_style> blocks, int reps) {
    // Seconds per decode_blocks call over all n blocks (one thread), for speed figures; not API.
    const BlockCodec* c = find_codec(ggml_type);
    if (!c || blocks.ndim() != 2 || blocks.shape(1) != c->bytes || reps < 1)
      throw py::value_error("_codec_bench: want a supported ggml_type, uint8 blocks [n, bytes], reps >= 1");
    const int n = (int)blocks.shape(0);
    std::vector<float> out((size_t)n * c->block);
    const uint8_t* src = blocks.data();
    double dt;
    {
      py::gil_scoped_release rel;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        c->decode_blocks(src, n, out.data());
        asm volatile("" : : "r"(out.data()) : "memory");   // keep every rep's stores
      }
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    }
    return dt;
  }, py::arg("ggml_type"), py::arg("blocks"), py::arg("reps") = 1);
}

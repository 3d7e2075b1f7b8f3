// cairn bindings: shared declarations between bind_*.cpp and module.cpp.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "cairn/model.h"
#include "cairn/state.h"

// Model plus the Python objects whose buffers it borrows (F32 weights are zero-copy).
struct BoundModel : cairn::Model {
  std::vector<pybind11::object> keep;
  BoundModel(pybind11::dict config, pybind11::dict weights, std::string fingerprint, int threads,
             bool batched_indexer, bool widen_bf16, std::string packed_cache, int64_t expert_cache_bytes,
             std::string expert_policy, int expert_readers, int64_t page_tokens);
  BoundModel() = default;  // filled by a family's loader (load_qwen35)
};

// State bound to Python: owns a shared reference to its model so it can never dangle.
struct BoundState {
  std::shared_ptr<BoundModel> model;
  cairn::State st;
  explicit BoundState(std::shared_ptr<BoundModel> m) : model(std::move(m)), st(*model) {}
  BoundState(std::shared_ptr<BoundModel> m, cairn::State s) : model(std::move(m)), st(std::move(s)) {}
};

void register_model(pybind11::module_& m);
void register_state(pybind11::module_& m);
void register_bench(pybind11::module_& m);
void register_experts(pybind11::module_& m);  // expert cache: Model methods + policy replay
void register_packed(pybind11::module_& m);   // packed cache file: layout description and keys
void register_codecs(pybind11::module_& m);   // GGUF block codecs: test hooks (codec_dequantize, codec_types)
void register_qwen35(pybind11::module_& m);   // Qwen3.5 family (families/qwen35/): Qwen35Model
// Qwen3.5 (families/qwen35/bind_qwen35.cpp): a config of its model_type (top level or text_config),
// and the loader that makes a Model of that family (page_tokens 0: its default).
bool is_qwen35_config(const pybind11::dict& config);
void load_qwen35(BoundModel& m, pybind11::dict config, pybind11::dict weights, int threads, int64_t page_tokens);

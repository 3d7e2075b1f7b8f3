"""Which model family a model's files are, and what the family provides to read them (issue 43;
docs/architecture.md, "What a family provides").

A family is chosen from config.json's `model_type` (or a nested `text_config`'s) or a GGUF's
`general.architecture`, never stored in the resolved config: the config is hashed into the
fingerprint, and DeepSeek-V4's fingerprints must not change. Everything a loader needs that differs
by family is one frozen `WeightFamily`; model_dir.py and gguf_dir.py hold the shared flow (files,
shape checks, fingerprint, memory maps). A family the kernel cannot run yet is recognised and refused
with its reason, so its users read why instead of "unknown model_type".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import ModelDirError


@dataclass(frozen=True)
class WeightFamily:
    name: str                              # ModelDir.family
    model_types: tuple[str, ...]           # config.json model_type values (top level or text_config)
    gguf_archs: tuple[str, ...]            # GGUF general.architecture values
    refused: str | None = None             # why the kernel cannot run this family yet (None: it can)
    # (path, digest_cache=, log=) -> ModelDir: a family whose directories need more than model_dir's
    # shared flow opens them itself (None: the shared flow)
    open_dir: Callable | None = None
    # (ModelDir, FileMaps) -> (config, weights) as `_kernel.Model` takes them (None: the resolved
    # config and model_dir.map_weights, the stored bytes with their dtype tags)
    kernel_inputs: Callable | None = None
    # config.json (raw dict, where) -> the resolved dict the kernel reads (fingerprinted as is)
    resolve_config: Callable[[dict, str], dict] | None = None
    expected_shapes: Callable[[dict], dict[str, tuple[int, ...]]] | None = None
    canonical_name: Callable[[str], str | None] | None = None   # None: a tensor cairn ignores
    ignored_names: str = ""                # what canonical_name ignores, for the one log line
    quantized_dtypes: tuple[str, ...] = ()
    # (canonical name, info, shape, tensors, config quantization) -> the scale tensor's name
    check_quantized: Callable | None = None
    is_routed_expert: Callable[[str], bool] | None = None        # pageable weight bytes
    gguf_config: Callable[[dict, str], dict] | None = None       # GGUF metadata -> config.json fields
    gguf_tensor: Callable | None = None    # (llama.cpp name, layers) -> (kind, canonical|part, layer)
    gguf_experts: Callable | None = None   # (cfg, layer, part) -> (stacked shape, canonical names)
    gguf_name: Callable[[str], str] | None = None                # canonical -> llama.cpp's (messages)
    # (resolved config, page_tokens) -> how a State's bytes grow (memory_plan.StateCost's interface)
    state_cost: Callable | None = None
    # the kernel can verify drafts (Model.supports_verify): the memory plan, made before the load,
    # charges speculation's journal and prompt lookups only then
    verifies: bool = True


def _dsv4() -> WeightFamily:
    from . import dsv4

    return dsv4.FAMILY


def _qwen35() -> WeightFamily:
    from . import qwen35

    return WeightFamily(
        name="qwen3_5", model_types=("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"),
        gguf_archs=("qwen35", "qwen35moe"),
        verifies=False, **qwen35.FUNCTIONS)


def families() -> tuple[WeightFamily, ...]:
    return (_dsv4(), _qwen35())


def by_name(name: str) -> WeightFamily:
    for f in families():
        if f.name == name:
            return f
    raise ValueError(f"unknown model family {name!r}; known: {', '.join(f.name for f in families())}")


def model_type_of(raw: dict) -> str | None:
    """config.json's model_type; a conditional-generation config names its text model's family in
    `text_config` when the top level's is not one cairn knows."""
    top = raw.get("model_type")
    text = raw.get("text_config")
    known = {t for f in families() for t in f.model_types}
    if top not in known and isinstance(text, dict) and text.get("model_type") in known:
        return text["model_type"]
    return top


def for_config(raw: dict, where: str = "config.json") -> WeightFamily:
    """The family of a config.json (refused families raise ModelDirError with their reason)."""
    mt = model_type_of(raw)
    for f in families():
        if mt in f.model_types:
            return _servable(f, f"{where}: model_type {mt!r}")
    raise ModelDirError(f"{where}: model_type is {raw.get('model_type')!r}; cairn serves DeepSeek-V4 models "
                        f"(model_type \"deepseek_v4\") and {_others('model_types')}")


def for_gguf(arch, where: str) -> WeightFamily:
    """The family of a GGUF file's general.architecture."""
    for f in families():
        if arch in f.gguf_archs:
            return _servable(f, f"{where}: general.architecture {arch!r}")
    raise ModelDirError(f"{where}: general.architecture is {arch!r}; cairn serves DeepSeek-V4 GGUF files "
                        f"(architecture 'deepseek4', as llama.cpp's converter writes them) and {_others('gguf_archs')}")


def _others(field: str) -> str:
    """The other families' accepted values, for the messages above."""
    return "; ".join(f"{f.name} ({', '.join(map(repr, getattr(f, field)))})" for f in families() if f.name != "deepseek_v4")


def _servable(f: WeightFamily, what: str) -> WeightFamily:
    if f.refused is not None:
        raise ModelDirError(f"{what} is {f.refused}")
    return f

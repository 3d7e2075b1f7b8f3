"""DeepSeek-V4's weights: config, tensor names, GGUF mapping (daemon/weights/families.py holds the
registry; the shared loading flow is model_dir.py and gguf_dir.py)."""

from __future__ import annotations

from ..families import WeightFamily
from . import config, gguf, names


def _state_cost(cfg: dict, page_tokens: int = 0):
    from cairn.daemon.service.memory_plan import StateCost   # the service layer's type, used lazily

    return StateCost.from_config(cfg, page_tokens)


FAMILY = WeightFamily(
    name="deepseek_v4", model_types=("deepseek_v4",), gguf_archs=(gguf.ARCH,),
    resolve_config=config.resolve_config, expected_shapes=names.expected_shapes,
    canonical_name=names.canonical_name, ignored_names="mtp.*",
    quantized_dtypes=names.QUANTIZED_DTYPES, check_quantized=names.check_quantized,
    is_routed_expert=names.is_routed_expert, gguf_config=gguf.config_from_metadata,
    gguf_tensor=gguf.tensor_name, gguf_experts=gguf.expert_views, gguf_name=gguf.gguf_name,
    state_cost=_state_cost)

"""Qwen3.5's weights (issue 43): config, tensor names, GGUF mapping and transforms, what the kernel
takes from the files (safetensors directories and GGUF files), a State's cost (daemon/weights/families.py
holds the registry)."""

from __future__ import annotations

from . import config, gguf, names


def state_cost(cfg: dict, page_tokens: int = 0):
    from .state_cost import Qwen35StateCost

    return Qwen35StateCost.from_config(cfg, page_tokens)


def gguf_config(meta: dict, where: str) -> dict:
    # the shared reader passes metadata only: tied embeddings (no output.weight) are known to
    # kernel_inputs.open_qwen35, which reads the tensor table first
    return gguf.config_from_metadata(meta, where)


def open_dir(path, *, digest_cache=None, log=None):
    from .kernel_inputs import open_qwen35

    return open_qwen35(path, digest_cache=digest_cache, log=log)


def kernel_inputs(md, maps):
    """(config, weights) for `_kernel.Model`: the kernel picks the family from a qwen3_5*
    model_type, which the resolved (fingerprinted) config does not keep."""
    from .kernel_inputs import kernel_weights

    cfg, weights = kernel_weights(md, maps)
    return {**cfg, "model_type": "qwen3_5_moe" if cfg.get("num_experts") else "qwen3_5"}, weights


FUNCTIONS = dict(
    resolve_config=config.resolve_config, expected_shapes=names.expected_shapes,
    canonical_name=names.canonical_name, ignored_names=names.IGNORED, is_routed_expert=names.is_routed_expert,
    gguf_config=gguf_config, gguf_tensor=gguf.tensor_name, gguf_experts=gguf.expert_views,
    gguf_name=gguf.gguf_name, state_cost=state_cost, open_dir=open_dir, kernel_inputs=kernel_inputs)

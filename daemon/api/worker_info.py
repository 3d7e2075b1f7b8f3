"""What a gateway in front of several daemons reads: identity, model metadata, a load figure.

Written for SMG (the gateway that grew out of SGLang's router; docs/operations.md "Scale-out"), checked
against smg 1.13.0, and plain enough for any other balancer. Pure: dicts out, JSON is api.py's job.

Design notes
 * Identification. SMG classifies an HTTP worker by the ``owned_by`` of ``GET /v1/models``
   ("sglang" / "vllm"), then by probing ``GET /version`` (taken as vLLM) and ``GET /server_info``
   (taken as SGLang when ``/version`` is absent), and registers anything else as "generic" with a
   warning. cairn keeps ``owned_by: "cairn"`` (it is not SGLang) and serves ``/server_info`` and
   ``/model_info`` in the shape SGLang gives them — the metadata SMG reads from both — but not
   ``/version``: SMG would then treat cairn as vLLM and scrape vLLM gauges. So SMG registers cairn
   as an SGLang-compatible HTTP worker, reads the model id, context length and concurrency from
   here, and asks ``/v1/loads`` for load before anything runtime-specific.
 * Load. ``GET /v1/loads`` answers in SGLang's load schema: one data-parallel rank whose running /
   waiting request counts come from the status board, ``num_used_tokens`` is the live state's length
   and ``token_usage`` that length over the context (cairn keeps one state, not a paged KV pool).
   ``num_waiting_uncached_tokens`` is the queued prompts' length (what of them is cached is only known
   once planned). ``pending_prefill_tokens`` (prompt tokens not yet prefilled: the running request's rest and
   every queued prompt) is cairn's own field: the figure that says how long a new request waits.
   Unknown fields are ignored by SMG; missing ones default to zero.
"""

from __future__ import annotations

import datetime as _dt

ENGINE = "cairn"


def server_info(*, model_id: str, context_length: int, fingerprint: str, version: str,
                max_running_requests: int, queue_size: int | None) -> dict:
    """``GET /server_info``: the fields SMG reads (SGLang's names), then cairn's own."""
    return {
        "model_path": model_id,
        "served_model_name": model_id,
        "context_length": context_length,
        "max_total_tokens": context_length,
        "max_running_requests": max_running_requests,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "is_embedding": False,
        "version": version,
        "engine": ENGINE,
        "fingerprint": fingerprint,
        "queue_size": queue_size,
    }


def model_info(*, model_id: str) -> dict:
    """``GET /model_info`` (SGLang's shape)."""
    return {
        "model_path": model_id,
        "tokenizer_path": model_id,
        "is_generation": True,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
        "engine": ENGINE,
    }


def loads(*, running: int, waiting: int, pending_prefill_tokens: int, queued_prompt_tokens: int, live_tokens: int,
          context_length: int, max_running_requests: int, version: str,
          now: _dt.datetime | None = None) -> dict:
    """``GET /v1/loads``: one rank (SGLang's ``WorkerLoadResponse``)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    ctx = max(1, context_length)
    rank = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": queued_prompt_tokens,   # an upper bound: cached parts are known once planned
        "num_total_reqs": running + waiting,
        "num_used_tokens": live_tokens,
        "max_total_num_tokens": context_length,
        "token_usage": round(min(1.0, live_tokens / ctx), 6),
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": 1.0 if running else 0.0,
        "max_running_requests": max_running_requests,
        "pending_prefill_tokens": pending_prefill_tokens,
    }
    return {"timestamp": now.isoformat(), "version": version, "dp_rank_count": 1, "loads": [rank]}

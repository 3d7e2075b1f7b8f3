"""`cairn serve`: trio.run, signals, and the nursery where the actors and the server are wired.

Shutdown: SIGTERM or SIGINT cancels the nursery. The server stops accepting, in-flight handlers are
cancelled, a running kernel call sees its abort flag and returns at the next chunk boundary, and the
process exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cairn.actors.engine.engine import Engine
from cairn.actors.engine.wiring import start_engine
from cairn.isa import numeric_class

from . import systemd
from cairn.daemon.api.app import API
from .config import ConfigError, Settings, add_arguments, load_settings
from .logs import configure_logging, get_logger
from .shutdown import ShutdownDeadline


@dataclass
class Loaded:
    """Everything `run_daemon` needs that comes from the model directory (tests build their own)."""
    kernel: Any
    model: Any
    tokenizer: Any
    renderer: Any
    name: str
    fingerprint: str
    context_length: int
    encoding: str = ""          # which chat encoding serves this model, and why (logged at start)
    config: dict | None = None  # resolved model config (sizes the default --slots; None: one slot)
    memory_plan: Any = None     # memory_plan.MemoryPlan: slots, expert budget, checkpoints (None: no guard)


def load(settings: Settings, kernel=None) -> Loaded:
    from cairn.daemon.weights.model_dir import load_model, open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    if kernel is None:
        from cairn import _kernel as kernel
    from cairn.daemon.weights.weight_digest import CACHE_NAME

    log = get_logger()
    # The weight-digest cache lives in the checkpoint directory: the place the daemon may write.
    md = open_model_dir(settings.model, digest_cache=Path(settings.checkpoint_dir) / CACHE_NAME, log=log)
    tokenizer = TextTokenizer.from_model_dir(md)   # tokenizer.chat: the family's chat half
    choice = tokenizer.chat.choose_renderer(md, protect=tokenizer.control_texts)
    plan = plan_for(settings, md)
    log.info("memory_plan", limit_bytes=plan.limit_bytes, room_bytes=plan.room_bytes, source=plan.limit_source,
             slots=plan.slots, expert_cache_bytes=plan.expert_cache_bytes, paged=plan.paged,
             checkpoint_bytes=plan.checkpoint_bytes, state_bytes=plan.state_bytes, reason=plan.reason)
    if plan.pool_bytes is not None and plan.pool_bytes <= 0:
        log.warning("memory_plan_empty", room_bytes=plan.room_bytes, source=plan.limit_source,
                    reason="the limit leaves nothing for live states: every request will get HTTP 507")
    log.info("loading_model", model=md.name)
    t = time.monotonic()
    # Only a paged load names the budget: 0 is the kernel's "every expert resident".
    extra = {"expert_cache_bytes": plan.expert_cache_bytes} if plan.paged else {}
    try:
        model = load_model(md, settings.threads, packed_cache=Path(settings.packed_cache_dir),
                           packed_cache_budget=settings.packed_cache_budget_mb << 20,
                           page_tokens=settings.checkpoint_page_tokens, **extra)
    except ValueError as e:
        if not plan.paged:
            raise
        raise ConfigError(f"setting 'expert_cache' ({settings.expert_cache}): the kernel refused a budget of "
                          f"{plan.expert_cache_bytes} bytes ({plan.reason}): {e}") from None
    log.info("model_loaded", model=md.name, seconds=round(time.monotonic() - t, 2),
             packed_bytes=int(model.packed_bytes), packed_from_cache=bool(model.packed_from_cache),
             packed_cache_written=bool(model.packed_cache_written))
    if plan.paged and hasattr(model, "expert_prefetch"):
        model.expert_prefetch = settings.expert_prefetch == "on"
    info = expert_cache_info(model)
    if info is not None:
        log.info("expert_cache", **info)
    return Loaded(kernel=kernel, model=model, tokenizer=tokenizer,
                  renderer=choice.renderer, name=md.name, fingerprint=md.fingerprint,
                  context_length=int(md.config["max_position_embeddings"]),
                  encoding=f"{choice.encoding}: {choice.reason}", config=dict(md.config), memory_plan=plan)


def plan_for(settings: Settings, md, limit=None, *, probe: bool = True):
    """The memory plan for this model on this machine (daemon/service/memory_plan.py), from the limit
    measured now, before the load (`limit`: a memory_plan.LimitSource, for tests; with `probe` False
    and no limit: unknown)."""
    from cairn.actors.engine.prefill import ALL_LOGITS_BUDGET
    from cairn.actors.decoding.drafts import LOOKUP_BYTES_PER_TOKEN
    from cairn.actors.decoding.speculation import MAX_DRAFT

    from cairn.daemon.weights.families import by_name

    from .memory_plan import DIAGNOSTIC_IDS_BYTES, REPLY_IDS_BYTES, parse_expert_cache, plan_memory, split_weight_bytes
    from .memory_probe import binding_limit

    setting = parse_expert_cache(settings.expert_cache)
    if limit is None and probe:
        limit = binding_limit()
    family = by_name(md.family)   # what differs by family: which weights page, how a state grows
    weights = split_weight_bytes(((name, t.end - t.start) for name, t in md.tensors.items()), family.is_routed_expert)
    cfg = md.config
    try:
        cost = family.state_cost(cfg, int(getattr(settings, "checkpoint_page_tokens", 0) or 0))
    except (KeyError, TypeError, ValueError):
        cost = None
    # with speculation, each slot's state keeps one verify's undo journal until its next call
    speculate = settings.speculate == "on" and family.verifies
    journal = cost.journal_bytes(1 + MAX_DRAFT) if cost is not None and speculate else 0
    try:   # the kernel's least budget: one decode step's experts (k slots of one expert each)
        n_keys = len(cfg["layer_types"]) * int(cfg["n_routed_experts"])
        min_budget = int(cfg["num_experts_per_tok"]) * -(-weights.experts // max(1, n_keys))
    except (KeyError, TypeError, ValueError):
        min_budget = 0
    vocab = int(cfg.get("vocab_size", 0) or 0)
    # one prefill call's every-position logits (prompt log-probabilities; actors/engine/prefill.segment_length)
    block = 4 * vocab * min(settings.segment, ALL_LOGITS_BUDGET // max(vocab, 1)) if vocab else 0
    return plan_memory(limit=limit, weights=weights, state=cost,
                       context_length=int(cfg.get("max_position_embeddings", 0) or 1),
                       expert_setting=setting, slots_setting=settings.slots,
                       checkpoint_setting=(settings.checkpoint_memory_mb << 20) if settings.checkpoints else 0,
                       logits_block_bytes=block, min_expert_budget=min_budget, reply_bytes=REPLY_IDS_BYTES,
                       diagnostic_bytes=DIAGNOSTIC_IDS_BYTES, journal_bytes=journal,
                       lookup_bytes_per_token=LOOKUP_BYTES_PER_TOKEN if speculate else 0)


def expert_cache_info(model) -> dict | None:
    """The kernel's description of its expert cache (None: a kernel or model without one)."""
    fn = getattr(model, "expert_cache_info", None)
    if fn is None:
        return None
    try:
        return {k: (v if isinstance(v, (bool, str)) else int(v)) for k, v in dict(fn()).items()}
    except Exception:      # a description only: never a reason not to serve
        return None


@dataclass(frozen=True, slots=True)
class SlotsChoice:
    slots: int
    reason: str


def choose_slots(settings: Settings, loaded: Loaded) -> SlotsChoice:
    """The number of slots and why: the slots setting, else the memory plan's; without a plan (tests'
    fake models) one."""
    plan = loaded.memory_plan
    if settings.slots is not None:     # the plan was made with the same setting (tests may load once, serve twice)
        return SlotsChoice(settings.slots, "set by the slots setting")
    if plan is not None:
        return SlotsChoice(plan.slots, plan.slots_reason)
    return SlotsChoice(1, "no memory plan: one slot")


def choose_speculation(settings: Settings, model) -> tuple[bool, str]:
    """Whether decode speculates, and why not when the setting asks for it but the model cannot: a
    family without a verify journal (Qwen3.5: each token rewrites its recurrent state, families.md §3)
    reports `supports_verify` False, and its engine must never call `verify`."""
    if settings.speculate != "on":
        return False, ""
    if not getattr(model, "supports_verify", True):
        return False, (f"the {getattr(model, 'family', '?')} kernel has no bounded rewind of its recurrent state "
                       "(speculative decoding is off for the family; docs/architecture.md)")
    return True, ""


def checkpoint_fingerprint(loaded: Loaded) -> str:
    """What a disk checkpoint must match to be restored: the model (config + weights + tokenizer,
    model_dir's fingerprint), the kernel's snapshot format and page size, and the build's rounding
    (x86-64-v2 has no FMA: its states differ in the last bits from v3/v4/aarch64 ones)."""
    pages = getattr(loaded.model, "page_tokens", None)
    isa = getattr(loaded.kernel, "ISA", None)     # None: a kernel that does not say (tests' fake)
    return (f"{loaded.fingerprint};snapshot-v{getattr(loaded.kernel, 'SNAPSHOT_VERSION', 0)}"
            + (f";pages-{pages}" if pages else "")
            + f";numeric-{numeric_class(isa) if isa else 'unknown'}")


def make_checkpoints(settings: Settings, loaded: Loaded, log, metrics):
    from cairn.actors.checkpoints.actor import Checkpoints

    # A shared directory (several daemons of the model, docs/operations.md "Scale-out") wins over the
    # per-daemon disk tier; checkpoint_dir still holds the weight-digest cache.
    shared = settings.shared_checkpoint_dir is not None
    disk_dir = settings.shared_checkpoint_dir if shared else (settings.checkpoint_dir if settings.disk_checkpoints
                                                              else None)
    plan = loaded.memory_plan      # its checkpoint budget is the setting, cut to what the limit leaves
    return Checkpoints(enabled=settings.checkpoints, max_slots=settings.checkpoint_slots,
                       max_bytes=min(settings.checkpoint_memory_mb << 20,
                                     plan.checkpoint_bytes if plan is not None else 1 << 62), min_tokens=settings.checkpoint_min_tokens,
                       fingerprint=checkpoint_fingerprint(loaded),
                       disk_dir=disk_dir if settings.checkpoints else None, shared=shared,
                       disk_max_bytes=settings.checkpoint_disk_mb << 20,
                       rebuild=lambda tail, pages: loaded.kernel.Snapshot.from_parts(loaded.model, tail, pages),
                       share_pages=settings.checkpoint_share_pages, log=log, metrics=metrics)


async def _on_signal(cancel_scope: trio.CancelScope, log, deadline: ShutdownDeadline) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("shutting_down", signal=signal.Signals(signum).name, timeout_s=deadline.seconds)
            systemd.stopping()
            deadline.start()
            cancel_scope.cancel()
            return


async def run_daemon(settings: Settings, loaded: Loaded, *, handle_signals: bool = True,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    from cairn.daemon.api.server import check_inherited, make_sockets

    log = get_logger()
    from .metrics import Metrics

    metrics = Metrics(tiers=("ram", "disk") if settings.disk_checkpoints or settings.shared_checkpoint_dir
                      else ("ram",))
    slots = choose_slots(settings, loaded)
    log.info("slots", slots=slots.slots, reason=slots.reason)
    speculate, why = choose_speculation(settings, loaded.model)
    if why:
        log.info("speculation_off", reason=why)
    engine = Engine(loaded.kernel, loaded.model, loaded.tokenizer, loaded.context_length,
                    segment=settings.segment, chunk=settings.chunk, metrics=metrics,
                    progress_interval_s=settings.progress_interval_ms / 1000, speculate=speculate,
                    checkpoints=make_checkpoints(settings, loaded, log, metrics))
    if loaded.memory_plan is not None:
        from cairn.actors.engine.memory_guard import MemoryGuard

        engine.memory = MemoryGuard(loaded.memory_plan, engine, log=log, metrics=metrics)
    model_id = settings.served_model_name or loaded.name
    # Socket activation: systemd (cairn.socket) passes the listening Unix socket; then it owns the path.
    inherited = [sock for _, sock in systemd.listen_fds()] if handle_signals else []
    check_inherited(inherited, settings.api_key)
    own_path = None if inherited else settings.socket
    sockets = make_sockets(own_path, settings.socket_mode_int, settings.tcp_host_port, inherited)
    deadline = ShutdownDeadline(settings.shutdown_timeout_s, log)
    try:
        await _serve_all(settings, loaded, engine, model_id, sockets, log, handle_signals, task_status,
                         slots, deadline)
    finally:
        deadline.cancel()                         # stopped in time (or failed): no stacks, no forced exit
        if own_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(own_path)
    log.info("stopped")


async def _serve_all(settings, loaded, engine, model_id, sockets, log, handle_signals, task_status,
                     slots, deadline: ShutdownDeadline) -> None:
    from cairn.daemon.api.cache_diagnostics import FingerprintTable
    from cairn.daemon.api.server import serve_http
    from cairn.daemon.api.status import StatusBoard
    from cairn.daemon.protocol.reply_ids import ReplyTable
    from cairn.daemon.protocol.tokenizer import StreamDecoder

    from .memory_plan import DIAGNOSTIC_IDS_BYTES, REPLY_IDS_BYTES

    async with trio.open_nursery() as nursery:
        if handle_signals:
            nursery.start_soon(_on_signal, nursery.cancel_scope, log, deadline)
        await engine.checkpoints.open_disk()      # rebuild the disk index before the writer starts
        inbox = await start_engine(nursery, engine, queue_size=settings.queue_size, log=log,
                                   new_stream_decoder=lambda: StreamDecoder(loaded.tokenizer),
                                   checkpoint_slots=settings.checkpoint_slots, slots=slots.slots)
        # finished replies' generated ids, replayed in later prompts (daemon/protocol/reply_ids.py)
        replies = ReplyTable(loaded.memory_plan.reply_bytes if loaded.memory_plan is not None else REPLY_IDS_BYTES)
        # finished responses' prompts, compared with later ones (daemon/api/cache_diagnostics.py)
        prints = FingerprintTable(loaded.memory_plan.diagnostic_bytes if loaded.memory_plan is not None
                                  else DIAGNOSTIC_IDS_BYTES)
        api = API(inbox=inbox, tokenizer=loaded.tokenizer, renderer=loaded.renderer, model_id=model_id,
                  context_length=loaded.context_length, vocab_size=int(loaded.model.vocab_size),
                  max_tokens_default=settings.max_tokens_default, fingerprint=loaded.fingerprint, log=log,
                  reasoning=settings.reasoning, chat=loaded.tokenizer.chat,
                  api_key=settings.api_key, metrics=engine.metrics, checkpoints=engine.checkpoints, replies=replies,
                  fingerprints=prints,
                  body_bytes=loaded.memory_plan.body_bytes if loaded.memory_plan is not None else None,
                  status=StatusBoard(engine, queue_size=settings.queue_size, fingerprint=loaded.fingerprint,
                                     context_length=loaded.context_length, slots_reason=slots.reason,
                                     expert_reason=loaded.memory_plan.expert_reason if loaded.memory_plan else "",
                                     memory_plan=loaded.memory_plan, replies=replies, fingerprints=prints))
        log.info("chat_encoding", encoding=getattr(loaded.renderer, "name", "?"), detail=loaded.encoding,
                 reasoning_default=settings.reasoning)
        binds = await nursery.start(serve_http, api, sockets)
        log.info("listening", binds=binds, model=model_id)
        if handle_signals:
            _print_banner(model_id, sockets)
            await nursery.start(systemd.watchdog_task, systemd.watchdog_interval())
            systemd.ready()                       # only now: the model is loaded and the socket accepts
            serving = f"serving {model_id} on {', '.join(binds)}"
            systemd.status(serving)
            engine.announce = lambda text: systemd.status(f"{serving}; {text}")
        task_status.started(binds)


def _print_banner(model_id: str, sockets) -> None:
    import socket as _socket

    paths = [s.getsockname() for s in sockets.insecure_sockets if s.family == _socket.AF_UNIX]
    for path in paths:
        print(f"cairn: serving {model_id} on unix:{path}", flush=True)
    if paths:
        print(f"  try: curl --unix-socket {paths[0]} http://localhost/v1/chat/completions "
              f"-H 'Content-Type: application/json' "
              f"-d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], "
              f"\"max_tokens\": 64}}'", flush=True)


def _serve(args: argparse.Namespace) -> int:
    try:
        from cairn import _kernel
        settings = load_settings(args, max_chunk=getattr(_kernel, "MAX_CHUNK", None))
        if not settings.model:
            raise ConfigError("setting 'model': missing; pass --model DIR (or CAIRN_MODEL, or model = \"...\" "
                              "in the config file)")
    except ConfigError as e:
        print(f"cairn serve: {e}", file=sys.stderr)
        return 2
    configure_logging(level=settings.log_level)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)          # numpy's BLAS must not fight the kernel's threads (2 cores)
    except Exception:  # pragma: no cover - optional
        pass
    return serve(settings)


def serve(settings: Settings, load_model=load) -> int:
    """Load the model, then serve it until SIGTERM / SIGINT. Exit status: 0, 1 (sockets), 2 (model)."""
    from cairn.daemon.weights.model_dir import ModelDirError
    from cairn.daemon.api.server import prepare_socket_dir
    from .socket_dir import check_socket_free

    if not os.environ.get("LISTEN_FDS"):      # else systemd owns the socket (checked again at bind)
        try:
            prepare_socket_dir(settings.socket)   # refuse an unsafe directory before a minutes-long load,
            check_socket_free(settings.socket)    # and a busy path (another daemon) likewise
        except OSError as e:
            print(f"cairn serve: {e}", file=sys.stderr)
            return 1
    # The load runs on the main thread, before the event loop: OpenMP teams started by a load on
    # another thread keep spinning and made the kernel ~20x slower on 2 cores (measured). A real
    # model takes minutes and WatchdogSec=30, so a thread feeds the watchdog meanwhile.
    try:
        with systemd.pinging(f"loading model {settings.model}", systemd.watchdog_interval()):
            loaded = load_model(settings)
    except (ModelDirError, ConfigError) as e:
        print(f"cairn serve: {e}", file=sys.stderr)
        return 2
    try:
        trio.run(run_daemon, settings, loaded)
    except OSError as e:
        print(f"cairn serve: {e}", file=sys.stderr)
        return 1
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible API on a Unix socket")
    add_arguments(p)
    p.set_defaults(func=_serve)

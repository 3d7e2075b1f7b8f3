"""Messages between the HTTP edge and the actors, and between actors: one frozen dataclass each.

Token ids and numbers only; JSON never gets here. A request's reply channel carries the
`Reply` messages back to its HTTP handler; `RequestControl` is the one mutable piece a request
shares with the engine: the handler asks for a cancel, the running worker maps it onto its cancel
scope (and so onto the kernel's abort flag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import trio

from .trace import RequestTrace


class RequestControl:
    """Cancel a request wherever it is, and learn how it ended. Plain Trio-thread object; no locking.

    `final` is the request's terminal reply (Rejected / Done / Failed / CancelAck), set by the actor
    that ends the request (actors/engine/replies.finish) before it closes the reply channel: a stalled
    client's full reply buffer cannot lose it, and /v1/status can tell an ended request from a
    running one even while its handler is still blocked writing to the client.
    """

    __slots__ = ("cancel_requested", "_scope", "final")

    def __init__(self) -> None:
        self.cancel_requested = False
        self._scope: trio.CancelScope | None = None
        self.final: object | None = None

    def cancel(self) -> None:
        self.cancel_requested = True
        if self._scope is not None:
            self._scope.cancel()

    def attach(self, scope: trio.CancelScope) -> None:
        """The worker now running the request listens through `scope`."""
        self._scope = scope
        if self.cancel_requested:
            scope.cancel()

    def detach(self) -> None:
        self._scope = None


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int                    # 0 allowed: prefill only
    temperature: float = 1.0           # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                     # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0              # 0..20
    ignore_eos: bool = False
    presence_penalty: float = 0.0      # OpenAI's: over the tokens generated so far (actors/decoding/penalties.py)
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    banned: tuple[int, ...] = ()       # token ids never chosen, whatever the bias (tool_choice "none")
    constraint: object = field(default=None, compare=False)   # a grammar (daemon/protocol/constrain.py) or None


# --- edge -> admission --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Submit:
    request_id: str
    prompt: tuple[int, ...]            # token ids, already checked against the vocabulary and context
    hint_tokens: int | None            # system-prefix boundary in tokens (for checkpoint capture)
    sampling: Sampling
    prompt_logprobs: bool              # echo + logprobs: log-probs for every prompt position
    reply: trio.MemorySendChannel = field(compare=False)   # of Reply
    control: RequestControl = field(compare=False)
    turn_end_tokens: int | None = None  # where the next turn's prompt diverges, if before the end (capture there)
    turn_tokens: int | None = None     # where the last user message starts, in tokens (actors/checkpoints/turns.py)
    trace: RequestTrace = field(default_factory=RequestTrace, compare=False)   # stage times (trace.py)
    # a chat reply the next turn may replay (daemon/protocol/reply_ids.py): `Done.ids` carries the generated
    # ids, and a reply that ends with EOS is captured there (kind "reply_end", actors/engine/decode.py)
    keep_reply: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str


# --- workers -> admission -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Finished:
    """The engine is free again: the kernel has stopped and the live state is consistent."""
    request_id: str
    outcome: Literal["done", "cancelled", "error"]


# --- admission -> prefill -> decode -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Admitted:
    submit: Submit
    arrived_at: float                  # trio.current_time() when admission received it


@dataclass(frozen=True, slots=True)
class Prefilled:
    submit: Submit
    logits: object                     # np.ndarray float32 [V]: next-token logits after the prompt
    reused_tokens: int                 # tokens not recomputed (usage.prompt_tokens_details.cached_tokens)
    prompt_logprobs: "PromptLogprobs | None"
    arrived_at: float                  # trio.current_time() when admission received the request
    slot: int = 0                      # the engine's sequence slot that holds the prefilled state


# --- checkpoint writer --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class WriteCheckpoint:
    """A snapshot to write to disk (the checkpoint writer actor; dropped when its queue is full)."""
    id: str                            # the store's entry id (prefix hash), also the file stem
    tokens: object = field(repr=False)  # np.ndarray int32 [n]: the prefix the snapshot was taken at
    kind: str = "prompt_end"           # "system" | "common" | "prompt_end" (a "reply_end" is never written)
    snapshot: object = field(default=None, repr=False)   # the kernel Snapshot (page references + tail)


@dataclass(frozen=True, slots=True)
class FlushRecency:
    """To the checkpoint writer: save the recency of recently used disk checkpoints (file mtimes)."""


# --- replies to the HTTP edge -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Rejected:
    reason: Literal["queue_full", "shutting_down"]
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """One entry per prompt position; position 0 has none (None, ())."""
    logprobs: tuple[float | None, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]


@dataclass(frozen=True, slots=True)
class Progress:
    """Prefill progress (best effort, <= 4/s): `done` of `total` prompt tokens are in the state."""
    request_id: str
    done: int
    total: int
    eta_s: float | None                # None until a rate is known


@dataclass(frozen=True, slots=True)
class Started:
    """Prefill finished; tokens follow."""
    reused_tokens: int
    prompt_logprobs: PromptLogprobs | None


@dataclass(frozen=True, slots=True)
class TokenOut:
    token_id: int
    text: str                          # text that became final with this token (UTF-8 joined, stops held)
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first; empty unless asked


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Done:
    finish_reason: Literal["stop", "length"]
    usage: Usage
    text_tail: str = ""                # text flushed at the end (held-back bytes), after the last TokenOut
    stop_sequence: str | None = None   # the stop string that ended the reply (Anthropic's stop_sequence)
    ids: tuple[int, ...] = field(default=(), repr=False)   # the generated ids, EOS included (Submit.keep_reply)


@dataclass(frozen=True, slots=True)
class Failed:
    message: str
    kind: Literal["engine", "memory"] = "engine"   # memory: the memory plan had no room (HTTP 507)


@dataclass(frozen=True, slots=True)
class CancelAck:
    """The request was cancelled and the engine has let go of it."""
    request_id: str
    # why: the client asked (disconnect), the client stopped reading (replies.STALL_S), or shutdown
    reason: Literal["client", "stalled", "shutdown"] = "client"


Reply = Rejected | Progress | Started | TokenOut | Done | Failed | CancelAck

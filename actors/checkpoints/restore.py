"""Checkpoints, the restore side: plan where a prefill starts, fetch the chosen snapshot (a disk-only
entry is read with its pages and rebuilt in a thread), check the restored state's tokens, and drop
a checkpoint that went bad. One log line (and metric) per hit and per miss, with the miss's reason.

A bad file or page never fails the request: the entry is dropped with a warning and the caller plans
again (a shorter checkpoint, the live state, or fresh). In a shared directory a file that vanished
(evicted by another daemon) or a load past its deadline is a quiet miss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import trio

from . import disk_io
from .capture import METRIC_TIER
from .disk_format import CheckpointFileError, check_page_keys, file_name
from .plan import PrefillPlan, common_prefix_len, plan_prefill
from .shared_tier import SharedUnresponsive
from .store import Entry

RESTORE_COST_MEMORY = 64     # prefill tokens a restore from memory is charged
RESTORE_COST_DISK = 128      # a disk-only entry must be read first


def miss_reason(detail: str | None) -> str:
    """A short metric label for a plan's ``store_miss`` phrase (the log keeps the phrase)."""
    d = detail or ""
    for prefix, label in (("no stored prefix matches", "no_match"), ("no stored prefix", "no_stored_prefix"),
                          ("stored prefixes all longer", "longer_than_prompt"),
                          ("live state is as good", "live_state_better"), ("checkpoint of", "not_worth_it"),
                          ("prompt log-probabilities", "all_logits"), ("no memory to restore", "no_memory")):
        if d.startswith(prefix):
            return label
    return "other"


class Restore:
    """Planning and restoring, for the prefill worker. Uses the attributes set in
    ``Checkpoints.__init__``: enabled, min_tokens, tail_guard, previous_fresh_prompt, fingerprint,
    rebuild, store, disk_dir, shared, shared_load_timeout_s, log, metrics. Calls the other parts:
    _apply, _update_bytes, _note_recency (capture), _unlink, _unlink_pages, _unlink_orphans (disk
    tier), _on_shared, _shared_hung (shared tier)."""

    def plan(self, prompt: np.ndarray, live_tokens, *, hint_tokens: int | None,
             need_all_logits: bool, turn_end_tokens: int | None = None,
             turn_tokens: int | None = None, exclude: frozenset[str] = frozenset()) -> PrefillPlan:
        n = int(prompt.shape[0])
        if need_all_logits:
            return PrefillPlan("fresh", 0, n, None, (), False, "prompt log-probabilities need every position",
                               "prompt log-probabilities need every position's logits")
        if not self.enabled:
            p = plan_prefill(prompt, live_tokens, self.store, min_tokens=n + 1)
            return PrefillPlan(p.action, p.start, p.end, None, (), False, p.live_miss, "checkpoints off")
        return plan_prefill(prompt, live_tokens, self.store, hint_tokens=hint_tokens, turn_tokens=turn_tokens,
                            previous_fresh_prompt=self.previous_fresh_prompt, min_tokens=self.min_tokens,
                            tail_guard=self.tail_guard, restore_cost_tokens=self._restore_cost,
                            turn_end_tokens=turn_end_tokens, exclude=exclude)

    def _restore_cost(self, entry: Entry) -> int:
        if entry.in_memory:
            return RESTORE_COST_MEMORY
        if self.shared and self._shared_hung():
            return entry.n_tokens     # the mount does not answer: a disk-only entry saves nothing now
        return RESTORE_COST_DISK

    def note_plan(self, plan: PrefillPlan, prompt: np.ndarray, request_id: str) -> None:
        """After the plan is final: shares, recency, the rule-2 memory, and the miss line."""
        if not self.enabled or plan.store_miss and plan.store_miss.startswith("prompt log-probabilities"):
            return
        self._note_recency(self.store.record_prompt(prompt))
        if plan.action != "reuse_live":
            self.previous_fresh_prompt = prompt
        if plan.action != "restore":
            self.miss(request_id, miss_reason(plan.store_miss), plan.store_miss or "")

    def miss(self, request_id: str, reason: str, detail: str) -> None:
        if self.log is not None:
            self.log.info("checkpoint_miss", request_id=request_id, reason=reason, detail=detail)
        if self.metrics is not None:
            self.metrics.checkpoint_misses.inc(reason=reason)

    async def snapshot_for(self, entry_id: str, request_id: str) -> tuple[Any, str]:
        """The snapshot of ``entry_id`` and the tier it came from; a disk-only entry is read with its
        pages and rebuilt (in a thread) and loaded into memory. None when the file or one of its
        pages went bad or vanished: the entry is dropped, a warning logged, and the caller plans
        again (a shorter checkpoint, the live state, or fresh)."""
        e = self.store.get(entry_id)
        if e is None:
            return None, "memory"
        if e.snapshot is not None:
            return e.snapshot, "memory"
        if not e.on_disk or self.disk_dir is None:
            self.store.remove(entry_id)
            return None, "disk"
        path = self.disk_dir / file_name(e.tokens)
        try:
            if self.shared:
                header, snap = await self._on_shared(self.shared_load_timeout_s, self._read, path)
            else:
                header, snap = await trio.to_thread.run_sync(self._read, path)
            if not np.array_equal(header.tokens, e.tokens):
                raise CheckpointFileError("token ids differ from the index")
        except SharedUnresponsive:
            if self.log is not None:
                self.log.warning("checkpoint_load_timeout", request_id=request_id, id=e.id, tokens=e.n_tokens,
                                 timeout_s=self.shared_load_timeout_s, action="prefill instead")
            self._forget_file(e.id, "shared directory did not answer in time", request_id, "shared_timeout")
            return None, "disk"
        except (CheckpointFileError, OSError) as err:
            if self.shared and isinstance(err, FileNotFoundError):
                self._forget_file(e.id, "evicted by another daemon", request_id)   # a miss, not an error
                return None, "disk"
            reason = err.reason if isinstance(err, CheckpointFileError) else f"unreadable: {err.strerror or err}"
            await self.drop_bad(e, reason, request_id, bad_page=getattr(err, "page", None))
            return None, "disk"
        if self.store.get(entry_id) is e:     # not deleted or evicted while the file was read
            self._apply(self.store.put(e.tokens, e.kind, snap))
            self._update_bytes()
        return snap, "disk"

    def _read(self, path: Path):
        """In a thread: a checkpoint file and its pages, verified, rebuilt into a kernel Snapshot. A
        page that is missing or damaged raises CheckpointFileError; the kernel refusing the parts too."""
        header, tail, pages = disk_io.load(path, self.fingerprint)
        if self.rebuild is None:     # no kernel (tools, tests): opaque blobs, a tail and no pages
            if pages:
                raise CheckpointFileError("no kernel to rebuild a paged snapshot")
            return header, tail
        try:
            snap = self.rebuild(tail, pages)
        except ValueError as err:     # KernelError: version, model, page layout, checksum
            raise CheckpointFileError(f"kernel refused the snapshot: {err}") from None
        check_page_keys(header, int(getattr(snap, "page_tokens", 0)))   # the model's page size (a blob: no pages)
        return header, snap

    def _forget_file(self, entry_id: str, reason: str, request_id: str | None = None,
                     miss_label: str = "evicted_elsewhere") -> None:
        """A shared file that is gone (or out of reach): the entry leaves the disk tier (keeps a
        loaded snapshot); a later listing indexes the file again if it is still there."""
        e = self.store.remove(entry_id, "disk")
        if e is None:
            return
        if self.log is not None:
            self.log.info("checkpoint_gone", request_id=request_id, id=entry_id, tokens=e.n_tokens, reason=reason)
        if request_id is not None:
            self.miss(request_id, miss_label, reason)
        self._update_bytes()

    async def drop_bad(self, e: Entry, reason: str, request_id: str | None = None, bad_page: str | None = None) -> None:
        """A checkpoint that must not be used (bad file or page, or the kernel refused the snapshot)."""
        if self.log is not None:
            self.log.warning("checkpoint_bad", request_id=request_id, id=e.id, tokens=e.n_tokens, reason=reason,
                             action="removed; prefill instead")
        was_on_disk, pages = e.on_disk, e.disk_pages
        self.store.remove(e.id)
        if was_on_disk and self.disk_dir is not None:
            await self._unlink(file_name(e.tokens))
            if bad_page is not None:    # a damaged page file: bad for every checkpoint that needs it (shared too)
                await self._unlink_pages([bad_page])
            await self._unlink_orphans(pages)
        label = ("fingerprint_mismatch" if "fingerprint" in reason else
                 "tokens_mismatch" if "tokens differ" in reason else
                 "page_keys_mismatch" if "page keys" in reason else "bad_file")
        self.miss(request_id or "", label, reason)
        self._update_bytes()

    async def check_restored(self, entry_id: str, state_tokens, expected: np.ndarray, request_id: str) -> bool:
        """After a restore: the state must hold exactly ``expected`` (the prompt's first tokens, as
        planned). A file's header tokens are only a claim: whoever can write the directory can
        write a matching header and CRC; the kernel state's own tokens decide the answer. On a
        mismatch the entry and its file are dropped (a warning) and the caller plans again."""
        got = np.asarray(state_tokens, dtype=np.int64)
        want = np.asarray(expected, dtype=np.int64)
        if got.shape == want.shape and np.array_equal(got, want):
            return True
        k = common_prefix_len(got, want)
        reason = (f"restored state's tokens differ from the prompt at token {k} "
                  f"(state holds {got.shape[0]}, the plan expects {want.shape[0]})")
        e = self.store.get(entry_id)
        if e is not None:
            await self.drop_bad(e, reason, request_id)
        elif self.log is not None:   # deleted while it was restored: its file is already gone
            self.log.warning("checkpoint_bad", request_id=request_id, id=entry_id, reason=reason,
                             action="prefill instead")
        return False

    def hit(self, entry_id: str, tier: str, request_id: str, prompt_tokens: int) -> None:
        if self.store.get(entry_id) is None:  # deleted (API, disk eviction) while it was being restored
            return
        e = self.store.touch(entry_id)
        self._note_recency([e])
        if self.log is not None:
            self.log.info("checkpoint_hit", request_id=request_id, id=e.id, kind=e.kind, tokens=e.n_tokens,
                          prompt_tokens=prompt_tokens, tier=tier)
        if self.metrics is not None:
            self.metrics.checkpoint_hits.inc(tier=METRIC_TIER[tier])
            self.metrics.prefill_tokens.inc(e.n_tokens, kind="restored")

"""Prefix checkpoints: snapshots of a prompt's state, restored to skip its prefill. The pure parts (the
store and its budgets `store.py`, where to start and capture `plan.py`, turn markers `turns.py`, the
write back-off, the shared tier's victim choice `shared_evict.py`, the file and page formats), the
file effects (`disk_io.py`, the shared directory `shared_dir.py`), the writer actor, and `Checkpoints`
(`actor.py`), which applies the policy and reports it; it is composed of one mixin per job: restore,
capture, the local disk tier, the shared tier and the operator's views. Everything but the file work
runs on the Trio thread; the prefill worker and the HTTP edge call in."""

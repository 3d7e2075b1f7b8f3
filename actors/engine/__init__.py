"""The engine: the actors a request passes through and the shared things they hold. Admission (FIFO,
a slot per request), the prefill and decode workers, the one kernel thread and the gate that says who
runs the kernel next, each slot's live `Sequence`, the memory guard, one request's lifecycle and its
one terminal reply, the messages between the actors (one frozen dataclass each) and `wiring.py`, which
opens every channel and starts the actors. Policy (which slot, who runs next, the admission queue) is in
small synchronous modules beside them; the decoding policy is in `actors/decoding/`, the checkpoints the
prefill worker plans with and captures into in `actors/checkpoints/`."""

"""How long a heavy request keeps the event loop from answering: /health polled every 10 ms while one
request with N tools is refused (a forced tool choice on a prompt that cannot fit) or counted.

    python bench/edge_stall.py [--tools 10000] [--model DIR]

A daemon (the fake kernel: no model compute, only the edge) on a Unix socket; for each request the
wall time and the longest /health round trip while it ran. The edge renders and tokenizes in a worker
thread; what stalls the loop is work that holds the GIL there (docs/benchmarks/2026-12-04.md,
"The edge under a heavy request").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from daemon_harness import daemon, fake_loaded, request  # noqa: E402


def tools(n: int) -> list[dict]:
    return [{"name": f"tool_{i}", "description": f"does thing {i}",
             "input_schema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                              "required": ["a"]}} for i in range(n)]


async def measure(model: Path, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "d.sock"
        async with daemon(fake_loaded(model), sock):
            ask = [{"role": "user", "content": "hi"}]
            cases = [("forced tool_choice", "/v1/messages",
                      {"model": model.name, "max_tokens": 5, "messages": ask, "tools": tools(n),
                       "tool_choice": {"type": "tool", "name": "tool_5"}}),
                     ("count_tokens", "/v1/messages/count_tokens",
                      {"model": model.name, "messages": ask, "tools": tools(n)})]
            for name, path, body in cases:
                worst, done = 0.0, trio.Event()

                async def poll():
                    nonlocal worst
                    while not done.is_set():
                        t = time.perf_counter()
                        await request(sock, "GET", "/health")
                        worst = max(worst, time.perf_counter() - t)
                        await trio.sleep(0.01)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(poll)
                    t = time.perf_counter()
                    r = await request(sock, "POST", path, body)
                    elapsed = time.perf_counter() - t
                    done.set()
                print(f"{name:28s} {n} tools: HTTP {r.status} in {elapsed:.2f} s; /health worst {worst * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", type=int, default=10_000)
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: make-model tiny)")
    a = ap.parse_args()
    model = a.model
    if model is None:
        from cairn.daemon.modelgen.make_model import make_model

        model = Path(tempfile.mkdtemp()) / "tiny"
        make_model("tiny", 0, model)
    trio.run(measure, model, a.tools)


if __name__ == "__main__":
    main()

"""The tensor types of GGUF files: a histogram (count, bytes) per GGML type, and per tensor role
(routed experts gate/up/down, other 2-D weights, embedding/head, 1-D), with the file type in the
metadata (issue 23 benchmark inputs, not a test).

    .venv/bin/python bench/gguf_types.py FILE.gguf ...
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path


def role(name: str, ndim: int) -> str:
    if m := re.search(r"ffn_(gate|up|down)_exps", name):
        return f"experts {m.group(1)}"
    if name in ("token_embd.weight", "output.weight"):
        return name.split(".")[0]
    return "other 2-D+" if ndim >= 2 else "1-D"


def main() -> None:
    from gguf import GGUFReader

    for p in map(Path, sys.argv[1:]):
        r = GGUFReader(p)
        ft = r.fields.get("general.file_type")
        print(f"# {p.name}: {p.stat().st_size / 1e9:.3f} GB stored, general.file_type "
              f"{ft.contents() if ft else '?'}, {len(r.tensors)} tensors")
        by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        by_role: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for t in r.tensors:
            ty = t.tensor_type.name
            by_type[ty][0] += 1
            by_type[ty][1] += int(t.n_bytes)
            k = (role(t.name, len(t.shape)), ty)
            by_role[k][0] += 1
            by_role[k][1] += int(t.n_bytes)
        print("| type | tensors | bytes |\n|---|---|---|")
        for ty, (n, b) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
            print(f"| {ty} | {n} | {b / 1e9:.3f} GB |")
        print("| role | type | tensors | bytes |\n|---|---|---|---|")
        for (ro, ty), (n, b) in sorted(by_role.items()):
            print(f"| {ro} | {ty} | {n} | {b / 1e6:.1f} MB |")


if __name__ == "__main__":
    main()

"""Which files an eviction pass of the shared checkpoint tier deletes. Pure: no I/O.

The shared tier (actors/checkpoints/shared_dir.py) has one byte budget for every daemon using the directory.
A pass sees the whole directory (every daemon's files) and deletes least recently used first: a
file's mtime is its last use by any daemon (each daemon saves its uses as mtimes), ties broken by
name so every daemon would choose the same victims from the same listing. Passes run one at a time
(a lease), so two daemons never both delete for the same overflow.

Page files count once however many checkpoints reference them: deleting a checkpoint frees only
the page files no remaining checkpoint references.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FileStat:
    name: str
    size: int
    mtime: float
    pages: tuple[tuple[str, int], ...] = field(default=())   # page files it references, (name, bytes)


def choose_victims(files: list[FileStat], max_bytes: int) -> list[FileStat]:
    """The least recently used checkpoint files to delete so the rest, with the page files they
    reference (each once), fit in ``max_bytes``."""
    refs: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for f in files:
        for name, size in set(f.pages):
            refs[name] = refs.get(name, 0) + 1
            sizes[name] = size
    total = sum(f.size for f in files) + sum(sizes.values())
    victims: list[FileStat] = []
    for f in sorted(files, key=lambda f: (f.mtime, f.name)):
        if total <= max_bytes:
            break
        victims.append(f)
        total -= f.size
        for name, _ in set(f.pages):
            refs[name] -= 1
            if refs[name] == 0:
                total -= sizes[name]
    return victims


def abandoned_temps(temps: list[FileStat], now: float, grace_s: float) -> list[FileStat]:
    """Temp files no writer can still be finishing: older than ``grace_s`` (a write takes seconds)."""
    return [f for f in temps if now - f.mtime > grace_s]

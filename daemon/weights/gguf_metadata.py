"""A family's GGUF metadata keys, read with the same checks and errors for every family."""

from __future__ import annotations

from typing import Callable

from .errors import ModelDirError


def metadata_key(meta: dict, where: str, arch: str) -> Callable:
    """key(name, kind=(int,), default=None): the value of `<arch>.<name>`, of one of the types `kind`
    (a bool is not an int unless bool is listed); a clear ModelDirError when it is missing or of
    another type."""

    def key(name: str, kind=(int,), default=None):
        full = f"{arch}.{name}"
        v = meta.get(full, default)
        if v is None:
            raise ModelDirError(f"{where}: metadata key {full!r} is missing")
        if isinstance(v, bool) and bool not in kind or not isinstance(v, kind):
            raise ModelDirError(f"{where}: metadata key {full!r} must be {' or '.join(k.__name__ for k in kind)}, "
                                f"got {v!r}")
        return v

    return key

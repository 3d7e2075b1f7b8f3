"""Exception groups, reduced to what a caller can act on. Pure.

Trio nurseries wrap errors in (possibly nested) ``BaseExceptionGroup``s; the actors and the HTTP edge
want the one error inside, so a ``ValueError`` from a kernel call is handled as a ``ValueError``.
"""

from __future__ import annotations

import trio


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, however nested, in order (depth first); ``[exc]`` for a plain one."""
    out: list[BaseException] = []
    stack = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(reversed(e.exceptions))
        else:
            out.append(e)
    return out


def single(exc: BaseException) -> BaseException:
    """A group with one leaf other than `Cancelled` (however nested) -> that leaf; a group of only
    `Cancelled` -> its first `Cancelled`; anything else unchanged."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    all_leaves = leaves(exc)
    real = [e for e in all_leaves if not isinstance(e, trio.Cancelled)]
    if len(real) == 1:
        return real[0]
    if not real and all_leaves:
        return all_leaves[0]
    return exc

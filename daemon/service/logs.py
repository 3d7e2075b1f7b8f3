"""Logging: structlog, configured once per process.

JSON lines on stdout when stdout is not a terminal (journald keeps them as they are), a
console renderer on a terminal. Request-scoped fields (request id, session, ...) are bound with
`bind_request(...)` through structlog's contextvars, which Trio gives each task its own copy of,
and merged into every event logged inside the block.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator

import structlog


def configure_logging(*, json: bool | None = None, level: str = "info") -> None:
    """`json=None` picks JSON when stdout is not a TTY. Safe to call again (last call wins)."""
    if json is None:
        json = not sys.stdout.isatty()
    levels = logging.getLevelNamesMapping()
    if level.upper() not in levels:
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_logger_name,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levels[level.upper()]),
        logger_factory=_NamedPrintLogger,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None):
    """A lazy logger: safe to create at import time, before configure_logging runs."""
    return structlog.get_logger(name)


class _NamedPrintLogger(structlog.PrintLogger):
    """Writes to the current sys.stdout; carries the name given to get_logger."""

    def __init__(self, name: str | None = None):
        super().__init__(sys.stdout)
        self.name = name


def _add_logger_name(logger, method_name: str, event_dict: dict) -> dict:
    name = getattr(logger, "name", None)
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


@contextmanager
def bind_request(**kw) -> Iterator[None]:
    """Add `kw` to every event logged inside the block (by this task and tasks it starts)."""
    with structlog.contextvars.bound_contextvars(**kw):
        yield

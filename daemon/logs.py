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
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None):
    return structlog.get_logger(logger=name) if name else structlog.get_logger()


@contextmanager
def bind_request(**kw) -> Iterator[None]:
    """Add `kw` to every event logged inside the block (by this task and tasks it starts)."""
    with structlog.contextvars.bound_contextvars(**kw):
        yield

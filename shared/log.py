"""structlog set-up (JSON lines for machines, pretty lines on a terminal) and the stop signals."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from typing import TextIO, cast

import structlog


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the moment of writing, not at set-up: a logger configured
    while stderr was redirected (a test's capture, a closed pipe) must not fail forever after."""

    def write(self, text: str) -> None:
        sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(service: str, fmt: str = "auto", level: str = "info") -> structlog.stdlib.BoundLogger:
    """Configure structlog for this process and return a logger bound to `service`.

    Every request-scoped line should be emitted with `request_id=...` bound, so one grep
    follows a request through scheduler, block manager and worker logs.
    """
    pretty = sys.stderr.isatty() if fmt == "auto" else fmt == "pretty"
    renderer = structlog.dev.ConsoleRenderer() if pretty else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks if not pretty else structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # write and flush are all WriteLogger calls: the stand-in is a TextIO as far as it goes
        logger_factory=structlog.WriteLoggerFactory(file=cast("TextIO", _CurrentStderr())),
        cache_logger_on_first_use=False,
    )
    return structlog.get_logger().bind(service=service)


def on_stop_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM or SIGINT: every service finishes its loop and closes its sockets."""
    signal.signal(signal.SIGTERM, lambda *_: stop())
    signal.signal(signal.SIGINT, lambda *_: stop())

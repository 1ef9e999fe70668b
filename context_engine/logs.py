"""Structured JSON logs (structlog) on stderr, one object per line."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "INFO", *, process: str = "context-engine") -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s", force=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            lambda _, __, event: {"process": process, **event},
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

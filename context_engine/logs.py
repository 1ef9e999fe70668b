"""Structured JSON logs on stderr, one object per line, for every process we run: structlog's own
loggers, and the standard library's (Faust, mode, aiokafka, asyncio, grpc...) through the same
processors (`logging_config`, which the worker also gives Faust's Worker, as it would otherwise
install its own text format)."""

from __future__ import annotations

import logging
import logging.config
import sys
from typing import Any

import structlog


def _shared(process: str) -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        lambda _, __, event: {"process": process, **event},
    ]


def logging_config(level: str = "INFO", *, process: str = "context-engine") -> dict[str, Any]:
    """A `logging.config.dictConfig` whose root handler writes every standard-library record to
    stderr as one JSON object: its message as `event`, its logger's name as `logger`, a traceback
    as the `exception` string (one line, escaped)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {
            "()": structlog.stdlib.ProcessorFormatter,
            "foreign_pre_chain": [*_shared(process), structlog.stdlib.add_logger_name],
            "processors": [structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                           structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        }},
        "handlers": {"default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                 "formatter": "json", "level": level}},
        "root": {"level": level, "handlers": ["default"]},
    }


def configure_logging(level: str = "INFO", *, process: str = "context-engine") -> None:
    logging.root.handlers.clear()
    logging.config.dictConfig(logging_config(level, process=process))
    structlog.configure(
        processors=[
            *_shared(process),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

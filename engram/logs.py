"""JSON logs: one object per line, with whatever ids the caller passed in `extra`."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime, timezone

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def log_outbound(logger: logging.Logger, what: str, *, stage: str, provider: str, model: str, started: float,
                 outcome: str) -> None:
    """One line per call to a model server: which, how long (`started` from time.perf_counter), outcome."""
    logger.info(what, extra={"stage": stage, "provider": provider, "model": model,
                             "latency_ms": round((time.perf_counter() - started) * 1000, 1), "outcome": outcome})


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)

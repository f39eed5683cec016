"""Structured JSON logging for every meshplane process.

One JSON object per line on stderr, so log shippers (Fluent Bit, Vector,
Loki's promtail) need no parsing rules. Extra fields passed with
``log.info("msg", extra={"k": v})`` become top-level keys.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sys
from typing import Any

# LogRecord attributes that are plumbing, not payload.
_RESERVED = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "service": self._service,
            "pid": record.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure_logging(service: str, level: str | None = None) -> None:
    """Route the root logger to stderr as JSON lines.

    ``level`` defaults to ``$MESHPLANE_LOG_LEVEL`` or INFO. Calling it again
    replaces the handler, so worker processes can call it after spawn.
    """
    resolved = (level or os.environ.get("MESHPLANE_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(resolved)
    # Access logs of embedded HTTP servers are per-request noise at INFO.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)

"""How log records are written: text or JSON, one record a line, each with
a timestamp that carries its time zone (ISO 8601, milliseconds, UTC offset).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime

FORMATS = ("text", "json")


def timestamp(record: logging.LogRecord) -> str:
    """2025-01-17T16:25:32.788+00:00: local time, with its offset."""
    when = datetime.fromtimestamp(record.created).astimezone()
    return when.isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"{timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the
    traceback, when there is one, as one string)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level` in `fmt` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])

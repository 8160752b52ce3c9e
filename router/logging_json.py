"""``--log-format json``: one JSON object per log line, for log shippers.

Each object has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, plus
``realm``, ``protocol``, ``session``, ``client`` and ``peer`` where the code that logged knew
them (passed as ``extra``), and ``exception`` with the traceback of a logged error.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

CONTEXT_FIELDS = ("realm", "protocol", "session", "client", "peer")
"""``extra`` keys a log call may carry; they become fields of the same name."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (never raises on an odd argument)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, ""):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)

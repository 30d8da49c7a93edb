"""Log lines: text or JSON, each carrying the request and execution it belongs to.

The pipeline binds `request_id` and `execution_id` to the running task's context
(`bind`); every line logged in that task, or in tasks it starts, carries them. These
two context variables are the one piece of module state here: that is how context
variables work (each task sees its own value), not shared data.

Nothing secret may reach a log line: the pipeline never logs a token, but a line
that quotes one anyway (an exception message echoing a header, say) has bearer
tokens and JWTs replaced before it is written.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import Any, Literal

REQUEST_ID: ContextVar[str | None] = ContextVar("execgate_request_id", default=None)
EXECUTION_ID: ContextVar[str | None] = ContextVar("execgate_execution_id", default=None)

# "Bearer <anything>" and anything shaped like a JWS (three base64url parts, eyJ...).
_SECRETS = re.compile(r"(?i)(bearer\s+)\S+|eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_TEXT = "%(asctime)s %(levelname)s %(name)s%(ids)s: %(message)s"


def bind(request_id: str | None, execution_id: str | None) -> None:
    """Name the request this task works on, for every line it logs from now on."""
    REQUEST_ID.set(request_id)
    EXECUTION_ID.set(execution_id)


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: (m.group(1) or "") + "[redacted]", text)


class ContextFilter(logging.Filter):
    """Adds request_id / execution_id (from the task's context) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        record.execution_id = getattr(record, "execution_id", None) or EXECUTION_ID.get()
        ids = [i for i in (record.request_id, record.execution_id) if i]
        record.ids = f" [{' '.join(ids)}]" if ids else ""
        return True


class TextFormatter(logging.Formatter):
    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, execution_id, exc."""

    converter = time.gmtime  # the "Z" in the timestamps is true

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(record.getMessage()),
            "request_id": getattr(record, "request_id", None),
            "execution_id": getattr(record, "execution_id", None),
        }
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "INFO", fmt: Literal["text", "json"] = "text") -> None:
    """Set up the root logger once, for the `execgate` command."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)

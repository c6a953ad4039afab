"""Log setup shared by every pdserve process: human lines by default, JSON on request,
and the request id of the request being served on every line logged while serving it.

``PDSERVE_LOG_FORMAT=json`` gives one JSON object per line (``ts``, ``level``,
``process``, ``logger``, ``message``, ``request_id`` when set, ``exc`` on exceptions)
for a log shipper; ``human`` (the default) stays readable in a terminal. The request
id travels in a context variable, so code deep in the request path logs it without
being handed it, and tasks spawned for the request inherit it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re

REQUEST_ID_HEADER = "X-Request-Id"
_MAX_REQUEST_ID_CHARS = 128
# What a client may name its request: enough for UUIDs and trace ids, nothing that can
# break a log line or a header.
_SAFE_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:\-]{{1,{_MAX_REQUEST_ID_CHARS}}}")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pdserve_request_id", default=None
)


def request_id_from(header: str | None) -> str:
    """The client's id when it is a safe token, else a fresh one (never an error)."""
    if header is not None and _SAFE_REQUEST_ID.fullmatch(header):
        return header
    return os.urandom(16).hex()  # uuid4's randomness without building a UUID


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class _HumanFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return line if request_id is None else f"{line} [request_id={request_id}]"


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "process": self._process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(process: str, *, log_format: str | None = None) -> None:
    """Root logging for one process (``router``, ``prefill``, ...), from the environment:
    ``PDSERVE_LOG_LEVEL`` (INFO) and ``PDSERVE_LOG_FORMAT`` (human | json)."""
    chosen = (log_format or os.environ.get("PDSERVE_LOG_FORMAT") or "human").lower()
    if chosen not in ("human", "json"):
        raise SystemExit(f"PDSERVE_LOG_FORMAT must be human or json, not {chosen!r}")
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    if chosen == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(_HumanFormatter(f"%(asctime)s %(levelname)s {process} %(message)s"))
    logging.basicConfig(
        level=os.environ.get("PDSERVE_LOG_LEVEL", "INFO"), handlers=[handler], force=True
    )

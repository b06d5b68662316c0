"""Log lines as Prometheus exporters write them (--log.format): logfmt or JSON, one record a line.

logfmt: `ts=2026-11-26T11:22:41.873Z level=info logger=exporter msg="serving http://..."`: the time in
UTC with milliseconds, the level in lower case (warn, as node_exporter writes it), and any value
that is empty or holds a space, `=`, a quote, a backslash or a control character quoted with
Go's escapes, so a logfmt parser reads back exactly what was logged. json: one object per line
with the same keys. An exception's traceback is the `exc` value (escaped onto the same line).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

FORMATS = ("logfmt", "json")
_HANDLER = "gpu-health-exporter"
LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


def timestamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


def fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    out = {"ts": timestamp(record.created), "level": LEVELS.get(record.levelname, record.levelname.lower()),
           "logger": record.name, "msg": record.getMessage()}
    if record.exc_info:
        out["exc"] = formatter.formatException(record.exc_info)
    return out


def logfmt_value(v: str) -> str:
    if v and not any(c in v for c in ' ="\\') and v.isprintable():
        return v
    out = []
    for c in v:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif not c.isprintable() and c != " ":
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={logfmt_value(v)}" for k, v in fields(record, self).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record, self), ensure_ascii=False)


# type: ignore: logging.StreamHandler is generic in typeshed but not subscriptable on Python 3.10
class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record comes (a test harness swaps it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup(level: str, fmt: str = "logfmt") -> None:
    """Log to stderr at `level` (debug, info, warn/warning, error) in `fmt` (logfmt or json)."""
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    for h in list(root.handlers):
        if h.get_name() == _HANDLER:  # ours from an earlier call (in-process reuse); others stay
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, {"warn": "WARNING"}.get(level, level.upper())))

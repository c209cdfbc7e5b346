"""How a process of the server writes its log: `attnserve serve --log-format text` (the default, for
people) or `json` (one JSON object per line, for log collectors). The server's process and the
engine core's both call configure_logging with the flag's value, so both write the same way to
their shared stderr. The front ends more of --api-server-count say their number in each line.

A JSON line holds the record's time (ISO 8601, UTC, milliseconds), level, logger and message, the
request id and trace id of the request being served (tracing/current.py; "" outside one, and always
in the engine core's process), and the traceback of an exception, where the record has one. A
record's own `request_id` or `trace_id` (logging's `extra=`) wins: the request log
(`--log-requests`) writes its line after the call's task. A text line escapes its message's control
characters (a client's newline cannot forge a line); JSON escapes them itself. Standard library only.
"""

from __future__ import annotations

import json
import logging
import time

from ..tracing.current import current

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# C0 and C1 control characters and DEL: in a client's text (a request id, a prompt quoted in an error) a
# newline would forge a log line of its own and an ESC would drive the reader's terminal.
CONTROLS = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def iso_time(record: logging.LogRecord) -> str:
    """The record's time in UTC, e.g. 2026-11-27T23:20:01.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonLines(logging.Formatter):
    """A record as one line of JSON (see the module's docstring); `front_end`: its number, in each line."""

    def __init__(self, front_end: int = 0) -> None:
        super().__init__()
        self.front_end = front_end

    def format(self, record: logging.LogRecord) -> str:
        trace = current()
        line: dict[str, object] = {
            "time": iso_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": str(getattr(record, "request_id", trace.request_id)),
            "trace_id": str(getattr(record, "trace_id", trace.trace_id)),
        }
        if self.front_end:
            line["front_end"] = self.front_end
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


class TextLines(logging.Formatter):
    """The plain text line, its message's control characters escaped (a traceback after it stays as is);
    `front_end`: its number after the logger's name."""

    def __init__(self, front_end: int = 0) -> None:
        super().__init__(
            TEXT_FORMAT.replace("%(name)s", f"%(name)s (front end {front_end})") if front_end else TEXT_FORMAT
        )

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(CONTROLS)
        return super().formatMessage(record)


def formatter(log_format: str, front_end: int = 0) -> logging.Formatter:
    """--log-format's formatter: JsonLines for json, the plain text line for anything else."""
    return JsonLines(front_end) if log_format == "json" else TextLines(front_end)


def configure_logging(log_format: str = "text", front_end: int = 0) -> None:
    """INFO and up to stderr, as `log_format` says (text or json); like logging.basicConfig, nothing
    changes where the root logger has a handler already (a test's, an embedding program's). `front_end`:
    the number of one of --api-server-count's front ends more, which each of its lines says."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format, front_end))
    logging.basicConfig(level=logging.INFO, handlers=[handler])

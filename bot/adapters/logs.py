"""The bot's own log output: every record passes through the runtime's Redactor."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bot.core.redact import Redactor

#: The attributes every LogRecord has; any other is an `extra` a caller passed (aiohttp's access log passes the
#: request line and headers), which a JSON formatter writes out: redacted too.
_STANDARD = frozenset({"name", "msg", "args", "levelname", "levelno", "pathname", "filename", "module", "exc_info",
                       "exc_text", "stack_info", "lineno", "funcName", "created", "msecs", "relativeCreated",
                       "thread", "threadName", "processName", "process", "taskName", "message", "asctime"})


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record's message (and traceback text) through a Redactor, so no
    log line, DEBUG included (raw Slack payloads, what users typed), carries a secret. Always keeps the
    record."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact `record` in place; returns True."""
        try:
            record.msg, record.args = self.redactor(record.getMessage()), None
        except Exception:  # a broken format string stays as it was: logging reports it itself
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.stack_info:
            record.stack_info = self.redactor(record.stack_info)
        for name in record.__dict__.keys() - _STANDARD:
            value = record.__dict__[name]
            if isinstance(value, Mapping):  # headers (a multidict), not only dicts
                value = {str(k): v for k, v in value.items()}
            elif not isinstance(value, str | list | tuple | int | float | bool | type(None)):
                value = str(value)
            try:
                record.__dict__[name] = self.redactor.deep(value)
            except Exception:  # not a value redaction can walk: left out rather than written unredacted
                record.__dict__[name] = "[unredactable]"
        if record.exc_text:
            record.exc_text = self.redactor(record.exc_text)
            # formatters print exc_text; one that formats exc_info itself (JSON) would print it unredacted
            record.exc_info = None
        return True


def redact_logs(redactor: Redactor) -> None:
    """Put a RedactingFilter with `redactor` on every handler of the root logger (replacing one an earlier
    runtime of this process put there)."""
    for handler in logging.getLogger().handlers:
        for f in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(f)
        handler.addFilter(RedactingFilter(redactor))

"""The bot's own log output: every record passes through the runtime's Redactor."""

from __future__ import annotations

import logging

from bot.core.redact import Redactor


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

"""Stack dumps for the thread: `templates/stackdump.*.j2` context, and the message with the full dump
attached (pure apart from rendering)."""

from __future__ import annotations

import re
from typing import Any

from bot.core.parse.log import no_mentions
from bot.core.stackdump import ProcessDump, full_text, process_detail, process_headline, summarize_process
from bot.present.render import Message, Renderer


def stackdump_context(host: str, dumps: list[ProcessDump], *, native: bool = False) -> dict[str, Any]:
    """The context of `templates/stackdump.*.j2`: host, native, counts, and per process its pid, ok, error,
    headline (`pid N: detail`), detail and summary lines (without the headline)."""
    return {
        "host": host,
        "native": native,
        "ok_count": sum(d.ok for d in dumps),
        "processes": [
            {"pid": d.pid, "ok": d.ok, "error": d.error, "headline": process_headline(d),
             "detail": process_detail(d), "lines": summarize_process(d)[1:]}
            for d in dumps
        ],
    }


def stack_dump_message(renderer: Renderer, host: str, dumps: list[ProcessDump], *, native: bool = False) -> Message:
    """The summary (templates/stackdump.*) with the full dump attached as `stackdump-HOST.txt` (redacted)
    whenever at least one process was dumped (replacing the renderer's own cut-text attachment)."""
    msg = renderer.render("stackdump", **stackdump_context(host, dumps, native=native))
    msg.text = no_mentions(msg.text)  # thread and frame names come from the dumped process
    if any(d.ok for d in dumps):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)[:60] or "host"
        msg.files = [(f"stackdump-{safe}.txt", renderer.redactor(full_text(dumps)).encode("utf-8", "replace"))]
    return msg

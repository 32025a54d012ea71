"""Suggestion tokens (bot.core.commands): written with this install's names; markers that came from a host never
pass for a token, never join two JSON strings, and a token's JSON escapes are written once."""

from __future__ import annotations

import json

from bot.core.commands import CommandNames, for_launch, slash, strip_markers, thread
from bot.core.probe import split_sections
from bot.present.render import Renderer

NAMES = CommandNames(slash_of={"kill": "/kill-staging", "probe": "/probe-staging"}, router="/gpu-staging",
                     prefix="?")


def test_tokens_are_written_with_the_install_s_names():
    assert NAMES.expand(f"do {slash('kill', 7)} or {thread('logs', 200)}") == "do /kill-staging 7 or ?logs 200"
    console = CommandNames(prefix="!", threads=False)
    assert console.expand(for_launch(f"{thread('logs', 200)}", 7)) == "!logs #7 200"
    assert NAMES.expand(for_launch(thread("logs", 200), 7)) == "?logs 200"  # Slack has threads


def test_markers_in_json_strings_of_two_blocks_never_join_them():
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "log ev\ue000!x.log"}},
              {"type": "context", "elements": [{"type": "mrkdwn", "text": "see b\ue001 here"}]}]
    out = json.loads(NAMES.expand_json(json.dumps(blocks, ensure_ascii=False)))
    assert out[0]["text"]["text"] == "log ev!x.log" and out[1]["elements"][0]["text"] == "see b here"


def test_a_token_s_json_escapes_are_written_once():
    text = json.dumps({"t": slash("probe", "match=<a&b>")}, ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace("&", "\\u0026")  # how Jinja's tojson writes them
    assert json.loads(NAMES.expand_json(text)) == {"t": "/probe-staging match=&lt;a&amp;b&gt;"}


def test_a_renderer_given_stray_markers_at_two_depths_still_renders():
    msg = Renderer(names=NAMES).render("error", title="Bad", detail="no file \ue000/a.log", hint="see b\ue001 here")
    assert "\ue000" not in msg.text and "\ue001" not in json.dumps(msg.blocks, ensure_ascii=False)


def test_host_output_loses_its_markers_before_anything_reads_it():
    assert strip_markers("line \ue000/kill 1\ue001 ok".encode()) == b"line /kill 1 ok"
    out = b"@@n BEGIN log_tail\nline \xee\x80\x80/kill 1\xee\x80\x81 ok\n@@n END log_tail rc=0\n"
    assert split_sections(out, "n")["log_tail"].body == b"line /kill 1 ok"

"""Secrets masked by value (the bot's own, the config's `${NAME}` values, launch params) and the list and
Rust `Some(...)` forms engines log."""

from __future__ import annotations

import pytest

from bot.config import parse_config
from bot.core.redact import MASK, Redactor, redact
from bot.wiring import known_secret_values


@pytest.mark.parametrize(("line", "want"), [
    ("INFO non-default args: {'model': 'x', 'api_key': ['k3yV4lue0001']}",
     "INFO non-default args: {'model': 'x', 'api_key': ['[REDACTED]']}"),
    ('Args { model_id: "x", api_key: Some("k3yV4lue0001"), port: 80 }',
     'Args { model_id: "x", api_key: Some("[REDACTED]"), port: 80 }'),
    ("hf_token: Some('k3yV4lue0001')", "hf_token: Some('[REDACTED]')"),
    ("api_key: None", "api_key: None"),
])
def test_list_and_some_forms_are_masked_whole(line, want):
    assert redact(line) == want and redact(want) == want


def test_a_known_value_is_masked_in_any_form_and_short_ones_are_not():
    r = Redactor(values=["OpaqueVal9876xyzQ", "abc", None, ""])
    assert r("python -m x --key OpaqueVal9876xyzQ --port 1") == f"python -m x --key {MASK} --port 1"
    assert r("served as 'OpaqueVal9876xyzQ'.") == f"served as '{MASK}'."
    assert r("abc is a word") == "abc is a word"  # too short to mask by value
    r.add_values(["L8rSecretValue"])
    assert r("then L8rSecretValue") == f"then {MASK}" and r(r("then L8rSecretValue")) == f"then {MASK}"
    assert r.deep({"a": ["OpaqueVal9876xyzQ"]}) == {"a": [MASK]}


def test_the_bot_knows_its_slack_tokens_and_the_config_s_env_values():
    cfg = parse_config({
        "hosts": {"h": {"local": True, "env": {"DB_URL": "${DB_URL}", "HF_TOKEN": "${HF_TOKEN}",
                                               "OPAQUE": "${OPAQUE}", "CACHE": "${HF_HOME}"}}},
        "variants": {"v": {"host": "h", "command": "serve", "env": {"OPENAI_BASE": "${OPENAI_BASE}"},
                           "params": {"key": {"secret": True, "default": "DefaultKey12345"},
                                      "model": {"default": "llama-3-70b"}}}},
    }, environ={"DB_URL": "postgres://u:pw@db/x", "OPENAI_BASE": "https://api.internal/v1",
                "HF_TOKEN": "hf_from_the_environment_1234", "OPAQUE": "Zq8vT3kLm9RpXy2W", "HF_HOME": "/data/hf-cache"})
    values = known_secret_values(cfg, {"SLACK_BOT_TOKEN": "xoxb-bot-token-value", "SLACK_APP_TOKEN": ""})
    # a secret-named key or a token-like value is masked by value; a path or a URL without credentials is not
    # (the URL's password is masked by its shape anyway)
    assert set(values) == {"xoxb-bot-token-value", "hf_from_the_environment_1234", "Zq8vT3kLm9RpXy2W",
                           "DefaultKey12345"}
    assert "llama-3-70b" not in values and "/data/hf-cache" not in values


def test_bidi_and_zero_width_controls_in_typed_text_are_shown_not_obeyed():
    from bot.config import Config
    from bot.core.grammar import show_invisible
    from handlers.derive import grammar

    g = grammar(Config())
    call = g.parse_slash("/gpu", "probe gpu\u202e1-tsoh log=/data/\u200bx.log")
    assert "\u202e" not in call.raw and "<U+202E>" in call.raw
    assert all("\u200b" not in v and "\u202e" not in v for v in [*call.args, *call.kwargs.values()])
    assert show_invisible("a\u2066b\ufeffc") == "a<U+2066>b<U+FEFF>c" and show_invisible("plain") == "plain"


def test_log_records_are_redacted_debug_included():
    import io
    import logging

    from bot.adapters.logs import RedactingFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(Redactor(values=["OpaqueVal9876xyzQ"])))
    logger = logging.getLogger("gpubot.test.redaction")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.debug("payload %s", {"text": "/launch base api_key=OpaqueVal9876xyzQ",
                                    "token": "xoxb-1234-5678-abcdefgh"})
        try:
            raise ValueError("bad key OpaqueVal9876xyzQ")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "OpaqueVal9876xyzQ" not in out and "xoxb-1234" not in out and "[REDACTED]" in out
    assert "Traceback" in out and "ValueError" in out


@pytest.mark.parametrize(("text", "want"), [
    ("token ya29.a0AfH6SMBx3k9Q-abcdefghijklmnop used", "token [REDACTED] used"),
    ("STRIPE=sk_live_51H8abcdefghijklmnopqrst", "STRIPE=[REDACTED]"),
    ("key rk_test_abcdefghijklmnop1234 set", "key [REDACTED] set"),
    ("post to https://hooks.slack.com/services/T0AAA/B0BBB/xyzXYZ0123456789abcdef now",
     "post to https://hooks.slack.com/services/[REDACTED] now"),
    ("see https://hooks.slack.com/ for docs", "see https://hooks.slack.com/ for docs"),
    ("the sk_live_ prefix marks a live key", "the sk_live_ prefix marks a live key"),
])
def test_more_well_known_token_formats(text, want):
    assert redact(text) == want and redact(want) == want


def test_given_values_list_each_value_once_in_order_and_feed_another_redactor_the_same():
    a = Redactor(values=["  first-secret-1 "])
    a.add_values(["second-secret-2", "first-secret-1", None, 12345678, ""])
    assert a.given_values == ("first-secret-1", "second-secret-2", "12345678")
    b = Redactor()
    b.add_values(a.given_values[:1])
    b.add_values(a.given_values[1:])  # a worker fed the tail it has not had
    line = "x first-secret-1 y second-secret-2 z 12345678"
    assert b.lines([line]) == a.lines([line]) and "secret" not in b.lines([line])[0]

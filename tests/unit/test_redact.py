"""Secrets never survive into anything posted."""

from __future__ import annotations

import re
import string
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot.config import Config
from bot.core.models import GpuProcess, GpuReading, GpuSection, LogInfo, ProcessInfo, Snapshot
from bot.core.parse.log import clean_log_lines
from bot.core.probe import ProbeRequest, Section, assemble_snapshot
from bot.core.redact import MASK, Redactor, redact, redact_lines, redact_mapping, redact_then_cut
from bot.present.render import Renderer
from bot.present.views import probe_view, status_view
from tests.support.names import renderer

#: Renders with the built-in rules only (no configured patterns).
RENDERER = renderer()

CASES = [
    ("python -m vllm.entrypoints.openai.api_server --api-key sk-abcdefghijklmnopqrstu --port 8000",
     "sk-abcdefghijklmnopqrstu"),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv python serve.py", "hf_AbCdEfGhIjKlMnOpQrStUv"),
    ("curl -H 'Authorization: Bearer abc.def.ghi-123456' http://x", "abc.def.ghi-123456"),
    ("SLACK_BOT_TOKEN=xoxb-1234-5678-abcdefgh gpubot run", "xoxb-1234-5678-abcdefgh"),
    ("server_args=ServerArgs(api_key='supersecret123', port=8000)", "supersecret123"),
    ("--password=hunter2hunter2", "hunter2hunter2"),
    ("DB_PASSWORD=p4ss", "p4ss"),
    ("git clone https://user:ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/x", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ("AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
]


def test_known_secret_forms_are_masked_and_names_kept():
    for text, secret in CASES:
        out = redact(text)
        assert secret not in out, (text, out)
        assert MASK in out


def test_harmless_text_is_untouched():
    for text in ("--port 8000 --tp-size 8", "[TP0] Load weight end. avail mem=21.34 GB", "tokenizer_path='/x'",
                 "max_new_tokens=256 pad_token_id=0", "--max-tokens 100", "#tokens: 1000000"):
        assert redact(text) == text


def _snapshot(secret_args: str, secret_line: str) -> Snapshot:
    snap = Snapshot(host="h", clock=1000.0)
    snap.processes = [ProcessInfo(pid=10, ppid=1, pgid=10, sid=10, stat="Sl", args=secret_args)]
    snap.all_process_count = 1
    snap.gpu = GpuSection(ok=True, gpus=[GpuReading(index=0, name="NVIDIA H200", memory_used_mib=1,
                                                     memory_total_mib=2)],
                          processes=[GpuProcess(pid=10, used_memory_mib=1, gpu_index=0)])
    snap.log = LogInfo(path="/x.log", exists=True, size_bytes=1, mtime=999.0, lines=1, tail=[secret_line])
    snap.errors = [f"note {secret_line}"]
    return snap


_token = st.text(alphabet=string.ascii_letters + string.digits, min_size=20, max_size=40)


@settings(max_examples=300, deadline=None)
@given(tok=_token, kind=st.sampled_from(["hf_", "sk-", "xoxb-", "xapp-1-", "env", "flag", "bearer"]))
def test_planted_secrets_never_survive_any_template(tok, kind):
    if kind == "env":
        secret, args = tok, f"python serve.py OPENAI_API_KEY={tok}"
    elif kind == "flag":
        secret, args = tok, f"python -m sglang.launch_server --api-key {tok} --port 1"
    elif kind == "bearer":
        secret, args = tok, f"curl -H 'Authorization: Bearer {tok}' localhost"
    else:
        secret = kind + tok
        args = f"python serve.py {secret}"
    snap = _snapshot(args, f"ERROR auth failed for {args}")
    for msg in (RENDERER.render("probe", **probe_view(snap, "pgid=10")),
                RENDERER.render("status", **status_view([snap]))):
        assert secret not in msg.text
        assert secret not in str(msg.blocks)


# --- forms an adversarial review found surviving ---------------------------------------------------

# (text, secret that must be gone, text that must stay: the name or the harmless rest)
MORE_CASES = [
    ("serve --api_key s3cretVALUE1 --port 8000", "s3cretVALUE1", "--api_key [REDACTED] --port 8000"),
    ("serve --hf_token hfsecretVALUE2 --tp 8", "hfsecretVALUE2", "--hf_token [REDACTED] --tp 8"),
    ("serve --secret-key=abcSECRET3 --x", "abcSECRET3", "--secret-key=[REDACTED] --x"),
    ('serve --api-key "quoted secret value" --port 1', "quoted secret value", '--api-key "[REDACTED]" --port 1'),
    ("serve --api-key 'quoted secret value' --port 1", "secret value", "--api-key '[REDACTED]' --port 1"),
    ("serve --password='x y' --port 1", "x y", "--password='[REDACTED]' --port 1"),
    ("serve --api-key= spacedSecret9", "spacedSecret9", "--api-key= [REDACTED]"),
    ('cfg {"api_key": "jsonSecret1"}', "jsonSecret1", '{"api_key": "[REDACTED]"}'),
    ("cfg {'password': 'dictSecret2'}", "dictSecret2", "{'password': '[REDACTED]'}"),
    ('cfg {"password":"tightSecret3"}', "tightSecret3", '{"password":"[REDACTED]"}'),
    ('  "hf_token": "hfJsonSecret4",', "hfJsonSecret4", '"hf_token": "[REDACTED]",'),
    ('{"password": "esc\\"aped secret"}', 'aped secret', '{"password": "[REDACTED]"}'),
    ('api_key="unterminated secret', "unterminated secret", 'api_key="[REDACTED]'),
    ("api_key := goSecret5", "goSecret5", "api_key := [REDACTED]"),
    ("{:api_key => 'rubySecret6'}", "rubySecret6", "api_key => '[REDACTED]'"),
    ("curl -H 'X-Api-Key: hdrSecret1' http://h", "hdrSecret1", "X-Api-Key: [REDACTED]' http://h"),
    ("X-Auth-Token: hdrSecret2", "hdrSecret2", "X-Auth-Token: [REDACTED]"),
    ("api-key: hdrSecret3", "hdrSecret3", "api-key: [REDACTED]"),
    ("Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "Proxy-Authorization: Basic "),
    ("machine h login u password hunter2", "hunter2", "machine h login u password [REDACTED]"),
    ("default login anonymous password guestSecret", "guestSecret", "password [REDACTED]"),
    ("GET https://h/v1/models?api-key=qsSecret1&limit=5", "qsSecret1", "?api-key=[REDACTED]&limit=5"),
    ("GET https://h/v1/models?x=1&token=qsSecret2#top", "qsSecret2", "&token=[REDACTED]#top"),
    ("GET https://h/cb?access_token=qsSecret3 200", "qsSecret3", "?access_token=[REDACTED] 200"),
    ("REDIS_URL=redis://:redisSecret@cache:6379/0", "redisSecret", "redis://:[REDACTED]@cache:6379/0"),
    ("connect postgres://u:pgSecret@h/db ok", "pgSecret", "postgres://u:[REDACTED]@h/db ok"),
    ("connect postgres://u:p@ss@h/db ok", "p@ss", "postgres://u:[REDACTED]@h/db ok"),
    ("git push https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz012345@github.com/o/r", "ghs_abcdefghij",
     "@github.com/o/r"),
    ("pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFG", "github_pat_11ABCDEFG", "pat "),
    ("pat glpat-AbCdEfGhIj0123456789", "glpat-AbCdEf", "pat "),
    ("NGC nvapi-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcdefghijklmnopqrstuvwx", "nvapi-AbCd", "NGC "),
    ("hub hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_AbCdEf", "hub "),
    ("oai sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "sk-AbCdEf", "oai "),
    ("oai sk-proj-AbCd_EfGhIjKlMnOp-QrStUvWxYz0123456789", "sk-proj-AbCd", "oai "),
    ("slack xoxb-1234567890-0987654321-AbCdEfGhIjKl", "xoxb-1234567890", "slack "),
    ("slack xoxp-1234567890-0987654321-AbCdEfGhIjKl", "xoxp-1234567890", "slack "),
    ("slack xapp-1-A0123456789-0123456789012-abcdef0123456789", "xapp-1-A0123", "slack "),
    ("aws AKIAIOSFODNN7EXAMPLE and ASIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE", "aws [REDACTED] and [REDACTED]"),
    ("gcp AIzaSyD-abcdefghijklmnopqrstuvwxyz012345 end", "AIzaSyD-abcdef", "gcp [REDACTED] end"),
    ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
     "SflKxwRJSMeKKF2QT4fw", "jwt [REDACTED]"),
    ("jwt eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0. end", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", "jwt [REDACTED] end"),
    ('creds "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n-----END PRIVATE KEY-----\\n",',
     "MIIEvQIBADANBg", '"private_key": "[REDACTED]",'),
    ("key -----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEA -----END RSA PRIVATE KEY----- done", "MIIEowIBAAKCAQEA",
     "key [REDACTED] done"),
    ("token: X-Api-Key: nestedSecret", "nestedSecret", "X-Api-Key: [REDACTED]"),
    ("Authorization: Bearer X-Api-Key: nestedSecret2", "nestedSecret2", "X-Api-Key: [REDACTED]"),
]


@pytest.mark.parametrize(("text", "secret", "kept"), MORE_CASES)
def test_more_secret_forms_are_masked(text, secret, kept):
    out = redact(text)
    assert secret not in out, out
    assert kept in out, out
    assert redact(out) == out


# Harmless look-alikes: none of these may change.
HARMLESS = [
    "--max-tokens 100",
    "max_new_tokens=256 pad_token_id=0",
    "tokenizer_path='/x'",
    "#tokens: 1000000",
    "--tokenizer-mode auto --tokenizer /models/llama",
    "KV cache tokens: 123456 (free 50%)",
    # A name that only CONTAINS a secret word is a reference (where the secret lives), not the secret.
    "password_file=/etc/x --token-file /run/secrets/t api_key_path=/x hf_token_id=3",
    "Authorization required for this endpoint",
    "pip install sk-learn",
    "https://host:8000/v1 and http://10.0.0.1:30000/health",
    "Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0",
    "Decode batch. #running-req: 1, #token: 40, token usage: 0.00, gen throughput (token/s): 5.19",
    "server_args=ServerArgs(model_path='m', api_key=None, hf_token=None, tp_size=8)",
    "INFO: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.3 tokens/s",
    "max_num_batched_tokens=8192, skip_tokenizer_init=False, tokenizer_mode=auto",
    "login succeeded for user bob",
    "password is wrong",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "Bearer tokens are accepted",
    "token:",
    'api_key="" --api-key "" --password \'\' hf_token=None HF_TOKEN=null',
    "-----BEGIN CERTIFICATE-----",
    '  "bos_token": "<s>", "eos_token": "</s>", "pad_token": null, "unk_token": "<unk>"',
    "self.eos_token_id = tokenizer.eos_token_id; max_tokens: 256",
    "login: bob tty1",
    "INFO: 127.0.0.1:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
    "vllm serve m --max-model-len 8192 --max-num-batched-tokens 8192 --generation-config auto",
]


@pytest.mark.parametrize("text", HARMLESS)
def test_harmless_look_alikes_are_untouched(text):
    assert redact(text) == text
    assert redact_lines([text]) == [text]


def test_a_value_on_the_line_after_its_name_is_masked_and_nothing_else_crosses_lines():
    for text in ("token:\nnot-a-secret", "api_key =\r\nvalue", "--api-key\nnext-line", "Authorization:\nBearer-ish",
                 "x?token=\nabc", "--api-key \\\n   s3cr3tv4lue \\"):
        head, brk, _tail = text.partition("\r\n") if "\r\n" in text else text.partition("\n")
        assert redact(text).startswith(head + brk), text
        assert redact(text).splitlines()[1].strip() == MASK, text
    # no separator: not a name/value pair, and a line that is itself a name/value pair is its own business
    for text in ("password\nhunter2", "token:\napi_key: [REDACTED]", "login:\n  bob"):
        assert redact(text) == text, text


def test_multiline_text_keeps_its_line_breaks():
    text = "a HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv\r\nplain\n\nlast api_key=abc\n"
    assert redact(text) == "a HF_TOKEN=[REDACTED]\r\nplain\n\nlast api_key=[REDACTED]\n"


# --- PEM private keys across lines ------------------------------------------------------------------

_BODY = [
    "MIIEowIBAAKCAQEAwJHYt0k2tX1mY2xq3c6cX9m0lq2a0Ev3Bf8Y1yQ0l2uQ0w2xq3",
    "c6cX9m0lq2a0Ev3Bf8Y1yQ0l2uQ0w2xq3c6cX9m0lq2a0Ev3Bf8Y1yQ0l2uQ0w2x+/",
    "q3c6cX9m0lq2a0Ev3Bf8Y1yQ0l2u==",
]


def test_pem_block_across_lines_is_masked_begin_to_end():
    lines = ["INFO loading key:", "-----BEGIN RSA PRIVATE KEY-----", *_BODY, "-----END RSA PRIVATE KEY-----",
             "INFO done"]
    out = redact_lines(lines)
    assert out == ["INFO loading key:", MASK, MASK, MASK, MASK, MASK, "INFO done"]
    assert redact("\n".join(lines)) == "\n".join(out)
    assert redact_lines(out) == out


def test_pem_keeps_text_around_the_markers_and_indentation():
    lines = ["key = -----BEGIN OPENSSH PRIVATE KEY-----", "    " + _BODY[0], "-----END OPENSSH PRIVATE KEY----- ok"]
    assert redact_lines(lines) == ["key = " + MASK, "    " + MASK, MASK + " ok"]


def test_pem_every_line_between_markers_is_masked_even_non_base64():
    lines = ["-----BEGIN ENCRYPTED PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED", "", "some odd line", _BODY[2],
             "-----END ENCRYPTED PRIVATE KEY-----"]
    assert redact_lines(lines) == [MASK, MASK, MASK, MASK, MASK, MASK]


def test_pem_long_base64_line_directly_after_block_is_masked():
    lines = ["-----BEGIN PRIVATE KEY-----", _BODY[0], "-----END PRIVATE KEY-----", _BODY[1], "after"]
    assert redact_lines(lines) == [MASK, MASK, MASK, MASK, "after"]


def test_pem_unterminated_block_masks_the_body_that_follows():
    # The tail was cut inside the key: the END never comes.
    lines = ["-----BEGIN EC PRIVATE KEY-----", *_BODY]
    assert redact_lines(lines) == [MASK] * 4
    # ...and it stops at the first line that is not key material.
    lines = ["-----BEGIN EC PRIVATE KEY-----", _BODY[0], "INFO server started on :8000"]
    assert redact_lines(lines) == [MASK, MASK, "INFO server started on :8000"]


def test_pem_tail_starting_inside_the_key_masks_body_above_end():
    lines = ["INFO x", *_BODY, "-----END RSA PRIVATE KEY-----", "INFO y"]
    assert redact_lines(lines) == ["INFO x", MASK, MASK, MASK, MASK, "INFO y"]


def test_pem_window_inside_a_key_with_no_marker():
    assert redact_lines(["a", *(_BODY[:2] * 2), "b"]) == ["a", MASK, MASK, MASK, MASK, "b"]
    # Two long lines, or lines of hex digests, are left alone.
    assert redact_lines(_BODY[:2]) == _BODY[:2]
    hexes = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"] * 4
    assert redact_lines(hexes) == hexes


def test_a_lone_base64_line_is_not_masked_without_a_pem_block():
    assert redact(_BODY[0]) == _BODY[0]
    assert redact_lines(["INFO ok", _BODY[0]]) == ["INFO ok", _BODY[0]]


def test_two_blocks_an_unterminated_one_does_not_swallow_the_log_up_to_the_next():
    lines = ["-----BEGIN PRIVATE KEY-----", _BODY[0], "INFO normal line", "-----BEGIN PRIVATE KEY-----",
             _BODY[1], "-----END PRIVATE KEY-----"]
    assert redact_lines(lines) == [MASK, MASK, "INFO normal line", MASK, MASK, MASK]


# --- redact before cutting --------------------------------------------------------------------------


def test_redact_then_cut_never_leaves_the_start_of_a_secret():
    secret = "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
    text = "x" * 385 + " " + secret
    naive = text[:399] + "…"
    assert "sk-ABCDEFGHIJ" in naive and redact(naive) == naive  # the bug: cut first, and it survives
    out = redact_then_cut(text, 400)
    assert "sk-ABC" not in out and len(out) <= 400
    assert redact_then_cut("short --api-key abcdefghij", 1000) == "short --api-key [REDACTED]"
    assert redact_then_cut("abc", 0) == "…"
    assert redact_then_cut("", 5) == ""


def test_clean_log_lines_with_redact_lines_redacts_before_the_cut():
    raw = "x" * 385 + " sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345\n"
    assert clean_log_lines(raw, max_width=400) == ["x" * 385 + " sk-ABCDEFGHIJ…"]  # without: leaks
    (line,) = clean_log_lines(raw, max_width=400, redactor=redact_lines)
    assert "sk-ABC" not in line and line == "x" * 385 + " [REDACTED]"
    # The redactor sees lines above the kept window: a key whose BEGIN scrolled out is still masked.
    raw = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(_BODY) + "\n-----END RSA PRIVATE KEY-----\nok\n"
    assert clean_log_lines(raw, max_lines=3, redactor=redact_lines) == [MASK, MASK, "ok"]


# --- property tests ---------------------------------------------------------------------------------

# Every planted secret is built so that every 3rd character is "Z", and the surrounding text never holds a
# "Z": so "Z" in the output means some 3+ character piece of a secret survived.
_ALNUM = string.ascii_letters.replace("Z", "") + string.digits
_B64 = _ALNUM + "+/"


def _z(alphabet: str, lo: int, hi: int) -> st.SearchStrategy[str]:
    """A random string over `alphabet` with a "Z" at every 3rd position."""
    return st.text(alphabet=alphabet, min_size=lo, max_size=hi).map(
        lambda s: "".join("Z" if i % 3 == 0 else c for i, c in enumerate(s)))


_val = _z(_ALNUM + "_.~!%^*+/", 6, 30)
_words = st.lists(_z(_ALNUM, 3, 8), min_size=1, max_size=4).map(" ".join)
_jwt_seg = _z(_ALNUM + "_-", 10, 40)

_PLANTED = st.one_of(
    # flags
    _val.map(lambda v: f"--api_key {v}"), _val.map(lambda v: f"--hf_token {v}"),
    _val.map(lambda v: f"--secret-key={v}"), _val.map(lambda v: f"--api-key {v}"),
    _words.map(lambda v: f'--api-key "{v}"'), _words.map(lambda v: f"--password='{v}'"),
    # env / dict / JSON
    _val.map(lambda v: f"HF_TOKEN={v}"), _val.map(lambda v: f"OPENAI_API_KEY={v}"),
    _words.map(lambda v: f'{{"api_key": "{v}"}}'), _words.map(lambda v: f"{{'password': '{v}'}}"),
    _words.map(lambda v: f'{{"password":"{v}"}}'), _words.map(lambda v: f'"hf_token": "{v}",'),
    _words.map(lambda v: f"ServerArgs(api_key='{v}', port=1)"),
    # headers
    _val.map(lambda v: f"X-Api-Key: {v}"), _val.map(lambda v: f"X-Auth-Token: {v}"),
    _val.map(lambda v: f"api-key: {v}"), _val.map(lambda v: f"-H 'Authorization: Bearer {v}'"),
    _val.map(lambda v: f"Authorization: {v}"),
    # netrc
    _val.map(lambda v: f"machine h login u password {v}"),
    # query strings
    _z(_ALNUM, 6, 30).map(lambda v: f"https://h/v1?api-key={v}&n=1"),
    _z(_ALNUM, 6, 30).map(lambda v: f"https://h/v1?a=1&token={v}"),
    _z(_ALNUM, 6, 30).map(lambda v: f"https://h/cb?access_token={v}#x"),
    # URL credentials
    _z(_ALNUM, 6, 30).map(lambda v: f"redis://:{v}@host:6379"),
    _z(_ALNUM, 6, 30).map(lambda v: f"postgres://u:{v}@h/db"),
    # token formats
    _z(_ALNUM + "_", 22, 60).map(lambda v: "github_pat_" + v),
    _z(_ALNUM, 36, 36).map(lambda v: "ghp_" + v),
    _z(_ALNUM + "_-", 20, 20).map(lambda v: "glpat-" + v),
    _z(_ALNUM + "_-", 64, 64).map(lambda v: "nvapi-" + v),
    _z(_ALNUM, 34, 34).map(lambda v: "hf_" + v),
    _z(_ALNUM + "_-", 20, 60).map(lambda v: "sk-" + v),
    _z(_ALNUM + "_-", 20, 60).map(lambda v: "sk-proj-" + v),
    _z(_ALNUM + "-", 20, 50).map(lambda v: "xoxb-" + v),
    _z(_ALNUM + "-", 20, 50).map(lambda v: "xoxp-" + v),
    _z(_ALNUM + "-", 20, 50).map(lambda v: "xapp-" + v),
    _z(string.ascii_uppercase.replace("Z", "") + string.digits, 16, 16).map(lambda v: "AKIA" + v),
    _z(_ALNUM + "_-", 35, 35).map(lambda v: "AIza" + v),
    st.tuples(_jwt_seg, _jwt_seg, _jwt_seg).map(lambda t: "eyJ" + ".".join(t)),
    # PEM private key, multi-line
    st.lists(_z(_B64, 64, 64), min_size=1, max_size=4).flatmap(
        lambda body: _z(_B64, 4, 60).map(
            lambda last: "\n".join(["-----BEGIN RSA PRIVATE KEY-----", *body, last,
                                    "-----END RSA PRIVATE KEY-----"]))),
)

# Surrounding text: anything but "Z" (line breaks included), the harmless look-alikes, and pieces of other
# secret forms (names, quotes, markers, already masked text) that could confuse where a value starts or ends.
_FRAGMENTS = [*HARMLESS, "INFO", "[TP0]", "--port 8000", "token", "password", "Authorization", "login", "=",
              ":", '"', "'", "?", "&", "@", "#", "-", "\t", "\n", "\\", "(", ",", ")", "{", "}", "//", "--",
              "token:", "token=", 'token="', "api_key=", "api_key='", "--api-key", "X-Api-Key:", "&token=",
              "?api-key=", "Bearer", "Bearer abcdefghij", "Basic", "Authorization:", "Proxy-Authorization:",
              "machine h", "login u", "https://", "redis://", ":@", "None", "eyJ", "sk-", "hf_", MASK,
              "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", _BODY[0], _BODY[2]]
_surround = st.tuples(
    st.lists(st.one_of(st.text(st.characters(blacklist_characters="Z", blacklist_categories=("Cs",)), max_size=20),
                       st.sampled_from(_FRAGMENTS)), max_size=5),
    st.sampled_from(["", " ", "\t"]),
).map(lambda t: t[1].join(t[0]))
_break = st.sampled_from([" ", "\n", "\t", "  ", "\r\n"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=_surround, secret=_PLANTED, after=_surround, b1=_break, b2=_break)
@example(before="x" * 20, secret="sk-ZabZcdZefZghZijZklZmn", after="", b1=" ", b2=" ")
# a value line that ends in a flag with its value to come (`TOKEN:-APIKEY`) is still the value of the name above:
# judged on both its raw and its redacted form, or redacting the result again would mask it then
@example(before="TOKEN:", secret="machine h login u password Z00Z00", after="TOKEN:-APIKEY", b1="\n", b2=" ")
# `Authorization:"` closing a quoted name: the quote after it opens no value, so the flag after it keeps its own
@example(before='AUTHORIzATION:"', secret='--api-key "Z00"', after="", b1=" ", b2=" ")
@example(before="AUTHORIzATION:'0", secret="ServerArgs(api_key='Z00'", after=", port=1)", b1=" ", b2=" ")
@example(before="#TOKEN:", secret="--api_key Z00Z00", after="", b1=" ", b2=" ")
def test_planted_secrets_never_survive_redact_or_redact_lines(before, secret, after, b1, b2):
    text = before + b1 + secret + b2 + after
    out = redact(text)
    assert "Z" not in out, (text, out)
    lines = redact_lines(text.split("\n"))
    assert "Z" not in "\n".join(lines), (text, lines)
    assert redact(out) == out


@settings(max_examples=300, deadline=None)
@example(text="--api_key Z00Z00 &token=#,")
@example(text="-----END RSA PRIVATE KEY----- --api_key x -----END RSA PRIVATE KEY-----")
@example(text='token=" Bearer --max-tokens 100')
@example(text='token=" redis://:Z00@host:6379 pip install sk-learnpasswordtoken:')
@example(text="python serve.py hf_ABCDEFGHIJKLMNOPQRSTUV--api-key Z00Z00Z00")
@example(text="|mysql -p''IDENTIFIED BY")
@given(text=st.lists(st.one_of(st.text(max_size=30), st.sampled_from(_FRAGMENTS), _PLANTED), max_size=6)
       .map(" ".join))
def test_redact_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once
    lines = text.split("\n")
    assert redact_lines(redact_lines(lines)) == redact_lines(lines)


# --- pathological lines -------------------------------------------------------------------------------
# A 64 KiB line like "a.a.a..." once took seconds (backtracking). Here: such lines are redacted right (and the
# per-test timeout catches a hang). How the time grows with the line length is measured, as ratios, by
# `python -m benchmarks.redact_scaling` (a time limit in a test fails for nothing on a loaded machine).

#: name -> (the line with k periods, what redact makes of the 64 KiB line).
PATHOLOGICAL: dict[str, tuple[Callable[[int], str], Callable[[str], str]]] = {
    "a.": (lambda k: "a." * k, str),
    "x-": (lambda k: "x-" * k, str),
    "dashes": (lambda k: "-" * k, str),
    "dashes-token": (lambda k: "--" * k + "token", str),
    "login": (lambda k: "login u " * k, str),
    "sk-": (lambda k: "sk-" * k, lambda line: MASK),
    "--token": (lambda k: "--token " * k, str),
    "query": (lambda k: "?token=a&" * k, lambda line: line.replace("=a&", f"={MASK}&")),
    "quotes": (lambda k: 'token="' + 'a, ,"' * k, lambda line: 'token="' + MASK + line[len('token="a, ,'):]),
    "pem-begin": (lambda k: "-----BEGIN " + "A " * k, str),
    "url": (lambda k: "https://u:" * k, str),
    # review: the escaped-JSON form and the JWT format were quadratic on these (8 s for 20 000 backslashes)
    "backslashes": (lambda k: "\\" * k, str),
    "-eyJ": (lambda k: "-eyJ" * k, str),
    # issue 23's families: calls with no closing parenthesis, echoes with no pipe, flags with no value flag
    "login(": (lambda k: "login(" * k, str),
    "echo-sudo": (lambda k: "sudo -S " + "echo " * k, str),
    "token-flags": (lambda k: "value " + "token --a b " * k, str),
}
#: Periods of each line for 64 KiB (the size that once took seconds).
_64K = {"a.": 32768, "x-": 32768, "dashes": 65536, "dashes-token": 32768, "login": 8192, "sk-": 21845,
        "--token": 8192, "query": 7281, "quotes": 13107, "pem-begin": 32768, "url": 6553, "backslashes": 65536,
        "-eyJ": 16384, "login(": 10922, "echo-sudo": 13105, "token-flags": 5460}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_long_pathological_lines_are_redacted_right(name):
    make, expected = PATHOLOGICAL[name]
    line = make(_64K[name])
    assert 65_000 < len(line) < 66_000
    out = redact(line)
    assert out == expected(line)
    assert redact_lines([line, line]) == [out, out]
    assert redact(out) == out


# --- configured patterns: a Redactor object, no module state -------------------------------------------

ACME_TOKEN = "ACME-" + "0123456789ABCDEF" * 2


def acme_redactor() -> Redactor:
    return Redactor(Config(redact_patterns=["ACME-[0-9A-F]{32}"]).redact_patterns)


def test_configured_patterns_are_masked_by_the_redactor_and_nowhere_else():
    redactor = acme_redactor()
    assert redactor(f"curl -H 'X-Acme: {ACME_TOKEN}' http://x") == "curl -H 'X-Acme: [REDACTED]' http://x"
    assert redactor(f"HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv {ACME_TOKEN}") == f"HF_TOKEN={MASK} {MASK}"  # and built-ins
    assert redactor.lines(["ok", f"key {ACME_TOKEN}"]) == ["ok", f"key {MASK}"]
    assert redactor.then_cut("x" * 30 + " " + ACME_TOKEN, 41) == "x" * 30 + " " + MASK
    assert redactor.then_cut("x" * 30 + " " + ACME_TOKEN, 36) == "x" * 30 + " [RED…"  # masked first, then cut
    assert redactor.mapping({"note": ACME_TOKEN, "api_key": "plain", "n": 3}) == {"note": MASK, "api_key": MASK,
                                                                                  "n": 3}
    assert redactor.deep({"a": [ACME_TOKEN, ("b", 1)], "c": None}) == {"a": [MASK, ["b", 1]], "c": None}
    # a Redactor without patterns, and the module functions, apply the built-in rules only
    text = f"key {ACME_TOKEN}"
    assert Redactor()(text) == redact(text) == text
    assert Redactor().lines([text]) == redact_lines([text]) == [text]
    assert Redactor().then_cut(text, 99) == redact_then_cut(text, 99) == text
    assert Redactor().mapping({"k": text}) == redact_mapping({"k": text}) == {"k": text}
    assert Redactor().deep([text]) == [text]
    # the module functions take compiled extra patterns
    extra = [re.compile("ACME-[0-9A-F]{32}")]
    assert redact(ACME_TOKEN, extra) == redact_lines([ACME_TOKEN], extra)[0] == redact_then_cut(ACME_TOKEN, 99, extra)
    assert redact(ACME_TOKEN, extra) == MASK


def test_configured_patterns_are_masked_in_everything_rendered():
    renderer = Renderer(acme_redactor())
    msg = renderer.render("error", title="Failed", detail=f"server said {ACME_TOKEN}", hint=None)
    assert ACME_TOKEN not in msg.text and ACME_TOKEN not in str(msg.blocks) and "[REDACTED]" in msg.text
    assert ACME_TOKEN not in renderer.text("error", title=ACME_TOKEN, detail="x", hint=ACME_TOKEN)
    error = renderer.error("Failed", "x", hint=f"try {ACME_TOKEN}")
    assert ACME_TOKEN not in error.text and ACME_TOKEN not in str(error.blocks)
    snap = _snapshot(f"python serve.py --license {ACME_TOKEN}", f"licence {ACME_TOKEN} accepted")
    for msg in (renderer.render("probe", **probe_view(snap, "pgid=10")),
                renderer.render("status", **status_view([snap]))):
        assert ACME_TOKEN not in msg.text and ACME_TOKEN not in str(msg.blocks), msg.text
    # a renderer without the pattern shows the token: only the configured renderer masks it
    plain = RENDERER.render("error", title="Failed", detail=f"server said {ACME_TOKEN}", hint=None)
    assert ACME_TOKEN in plain.text
    assert ACME_TOKEN in Renderer(Redactor()).text("error", title="x", detail=ACME_TOKEN, hint=None)


def test_configured_patterns_are_masked_in_snapshots_before_the_cut():
    req = ProbeRequest(gpu=False, log_path="/data/logs/x.log", tags=False)
    ps = (b"    PID    PPID    PGID     SID STAT %CPU   RSS ELAPSED     TIME WCHAN  COMMAND\n"
          b"     10       1      10      10 S     0.0   100      20 00:00:00 -      python serve.py "
          + b"x" * 1570 + b" " + ACME_TOKEN.encode() + b"\n")
    sections = {"ps": Section(ps, 0, True), "log_stat": Section(b"100 1764402000 2\n", 0, True),
                "log_tail": Section(f"start\nlicence {ACME_TOKEN}\n".encode(), 0, True)}
    masked = assemble_snapshot("h", req, sections, redactor=acme_redactor())
    (proc,) = masked.table
    assert ACME_TOKEN[:8] not in proc.args and proc.args.endswith(" " + MASK)  # masked whole, then not cut
    assert masked.log is not None and masked.log.tail == ["start", f"licence {MASK}"]
    plain = assemble_snapshot("h", req, sections)
    assert plain.log is not None and plain.log.tail == ["start", f"licence {ACME_TOKEN}"]
    assert ACME_TOKEN[:8] in plain.table[0].args  # the default redactor has no configured patterns


@pytest.mark.parametrize("bad", ["(", "a*", "", "x" * 501, "(a+)+$", "(\\w*x)*"])
def test_bad_redact_patterns_are_config_errors(bad):
    from pydantic import ValidationError

    from bot.config import Config

    with pytest.raises(ValidationError, match="redact_patterns"):
        Config(redact_patterns=[bad])


def test_a_config_line_s_unquoted_multi_word_value_is_masked_whole():
    assert redact("passphrase: correct horse battery staple") == "passphrase: [REDACTED]"
    assert redact("  password = Iw1oRd2sXy hunter3xyz") == "  password = [REDACTED]"
    # an environment prefix on a command line is not a config line: the command stays
    assert redact("MYSQL_PWD=Hy6tGf4dSa2q mysql -u root") == "MYSQL_PWD=[REDACTED] mysql -u root"
    assert redact("password = hunter2xyz") == "password = [REDACTED]"  # no separator taken for a value


def test_a_mask_that_brings_a_keyword_next_to_a_value_is_followed_in_the_same_pass():
    """One rule's mask puts `--api-key` right after `[REDACTED]`: its value is masked by the first call already
    (the keyword pass runs again on what changed), as the rules one by one would."""
    out = redact("python serve.py hf_ABCDEFGHIJKLMNOPQRSTUV--api-key s3cr3tPassw0rd")
    assert "s3cr3tPassw0rd" not in out and "hf_ABCDEFGHIJ" not in out and out.endswith("--api-key [REDACTED]")
    assert redact_lines(["x", "python serve.py hf_ABCDEFGHIJKLMNOPQRSTUV--api-key s3cr3tPassw0rd"])[1] == out

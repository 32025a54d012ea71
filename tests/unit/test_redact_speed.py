"""The redactor's shortcuts change nothing: the keyword pass (which rules can match a line), the rules tried only
where a secret name starts, the rules' extra requirements and the remembered answers give exactly what every
rule run over every whole line gives (the reference below), on the secret-shape corpus, on every fixture file, on
generated lines built from the pieces the rules look for, and on every code point that case-insensitive matching
takes for an ASCII letter."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core import redact as redact_module
from bot.core.redact import MASK, Redactor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHAPES = yaml.safe_load((FIXTURES / "secrets" / "shapes.yaml").read_text())
ALL_RULES = (1 << len(redact_module._RULES)) - 1
EVERYTHING = ALL_RULES | redact_module._VALUE_BIT | redact_module._PEM_BIT | redact_module._DANGLING_BIT


class ReferenceRedactor(Redactor):
    """The redactor with every shortcut off: every rule runs over every whole line (`re.sub`), again while a pass
    changes the line, the PEM and next-line checks look at every line, nothing is remembered."""

    def _bits(self, line: str) -> int:
        return EVERYTHING

    def _apply(self, line: str, bits: int) -> str:
        for pat in self._configured:
            line = pat.sub(MASK, line)
        if self._values_re is not None:
            line = self._values_re.sub(MASK, line)
        for i, rule in enumerate(redact_module._RULES):
            line = redact_module._compiled(i).sub(rule.repl, line)
        return line

    def _line(self, line: str, bits: int) -> str:
        # the same passes as the redactor: every rule again over what a pass changed (`Redactor._settled`)
        return self._settled(line, bits) if line else line

    def __call__(self, text: str) -> str:
        self._texts = {}
        return super().__call__(text)


VALUES = ["Vv9SeCrEtVaLuE", "pa ss:wo/rd=1", "ΣIGMAsecret"]


def pair() -> tuple[Redactor, Redactor]:
    """A fast redactor and the reference, with the same configured pattern and known values."""
    fast = Redactor([r"ACME-[0-9A-F]{8}"], values=VALUES)
    ref = ReferenceRedactor([r"ACME-[0-9A-F]{8}"], values=VALUES)
    return fast, ref


def fixture_lines() -> list[str]:
    """Every line of every text fixture (logs, ps tables, nvidia-smi outputs, case bundles, stack dumps)."""
    out: list[str] = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.suffix in {".log", ".txt", ".csv", ".md", ".json", ".yaml"}:
            out.extend(path.read_text(errors="replace").splitlines()[:400])
    return out


def test_the_corpus_shapes_redact_as_every_rule_over_every_line_does():
    fast, ref = pair()
    for shape in SHAPES:
        text = shape["text"]
        assert fast(text) == ref(text), shape["id"]
        assert fast.lines(text.splitlines()) == ref.lines(text.splitlines()), shape["id"]
        # again: the remembered answer is the same
        assert fast(text) == ref(text), shape["id"]


def test_every_fixture_line_redacts_as_every_rule_over_every_line_does():
    fast, ref = pair()
    lines = fixture_lines()
    assert len(lines) > 4000
    assert fast.lines(lines) == ref.lines(lines)
    for line in lines[::7]:
        assert fast(line) == ref(line), line


# The pieces the rules look for, in the case variants and look-alikes that case-insensitive matching accepts
# (dotless i, long s, Kelvin sign, dotted capital I), and the punctuation around names and values.
PIECES = [
    "token", "TOKEN", "Token", "tokens", "tokenizer", "#token", "secret", "SECRETS", "ſecret", "password", "passwd",
    "PASS", "passphrase", "api_key", "API-KEY", "apikey", "api_keys", "access_key", "accesskey", "private_key",
    "account_key", "credentials", "cookie", "Set-Cookie", "signature", "dsn", "bearer", "Bearer", "auth", "AUTH",
    "_auth", "basic_auth", "auth_tokens", "hf_tokens", "openai_key", "db_pwd", "pwd", "PWD", "_KEY", "-key",
    "Authorization", "authorization", "crédential", "credentıal", "İdentified", "\u212aEY", "_2", "_prod", "-dev",
    "=", "==", ":", ":=", "=>", "|", ">", "<", "</", "#", "//", "?", "&", ";", ",", "(", ")", "[", "]", "{", "}",
    '"', "'", "\\", '\\"', "`", " ", "  ", "\t", "-", "--", "b'", "Some(", "name", "key=", "name=", "value=",
    "setx", "set -x", "configure set", "export", "machine", "login", "default", "is", "IDENTIFIED BY",
    "requirepass", "masterauth", "> AUTH", "mysql -p", "sshpass -p", "docker login -p", "curl -u u:", "sig=",
    "https://", "user:pw@host", "sk-ABCDEFGHIJKLMNOPQRST", "hf_ABCDEFGHIJKLMNOPQR", "ghp_ABCDEFGHIJKLMNOPQRSTUV",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig", "xoxb-123456789", "AKIAABCDEFGHIJKLMNOP",
    "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" * 2,
    "Vv9SeCrEtVaLuE", "ΣIGMAsecret", "σigmasecret", "ACME-0123ABCD", "None", "null", "''", "/etc/x",
    "get_token()", "<|pad|>", "value", "s3cr3tV4lue", "x", "42", "é", "\\n",
    # issue 23's families: set commands, code, program flags and positions, piped passwords, cloud files, vendor
    # formats, Authorization schemes, credential calls, encoded forms, blocks over several lines
    "setenv", "%env", "ENV ", "set --export", "config set", "config create", "--value", "--body", '"]', "$'",
    "os.environ[", "-storepass", " -u u -p ", "sqlcmd -U sa -P", "snmpwalk -A", "-X", "echo x |", "--password-stdin",
    "<<<", "sudo -S", "| base64", "mc alias set a h k s", "htpasswd -b f u", "net use Z: \\\\s\\m", "sqlplus u/",
    '"-p", "', '"--api-key", "', "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVkt", "eyJhdXRocyI6IHsiZ2hjci5pbyI6IHsiYXV0aCI6",
    "AKIAABCDEFGHIJKLMNOP\t", "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78St90", '"keyName": "key1", "value": ',
    '"key": "0a1b2c3d4e5f60718293a4b5c6d7e8f9"', "auth=(", "BasicAuth(", '"u", "p"', "login(", "connect(",
    "btoa('u:", "SSWS ", "Custom ", "%5F", "%3D", "%22", "%253D", "\\u0022", "\\u005f", "&quot;", "<<EOT", "EOT",
    '"""', "<password>", "</password>", 'form-data; name="password"', "dop_v1_", "lin_api_", "pplx-", "tskey-auth-",
    "_AbCdEfGh1234567890XyZ", "key-0123456789abcdef0123456789abcdef", "https:\\/\\/u:p@h", "Q~", "private_key_id",
]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=14))
def test_generated_lines_redact_as_every_rule_over_every_line_does(pieces):
    fast, ref = pair()
    line = "".join(pieces)
    assert fast(line) == ref(line)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(PIECES), min_size=0, max_size=8), min_size=2, max_size=6))
def test_generated_multi_line_texts_redact_as_every_rule_over_every_line_does(rows):
    fast, ref = pair()
    lines = ["".join(r) for r in rows]
    assert fast.lines(lines) == ref.lines(lines)
    assert fast("\n".join(lines)) == ref("\n".join(lines))


def test_folding_covers_every_character_that_case_insensitive_matching_takes_for_an_ascii_letter():
    letters = re.compile(r"(?i)[a-z]")
    checked = 0
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if not letters.fullmatch(c):
            continue
        for a in "abcdefghijklmnopqrstuvwxyz":
            if re.fullmatch(f"(?i){a}", c):
                assert a in redact_module._fold(c), (hex(cp), a)
                checked += 1
    assert checked >= 52  # the ASCII letters in both cases, and the look-alikes


def test_a_value_learned_later_is_masked_in_a_line_remembered_before():
    r = Redactor()
    line = "serving with key Zq8vLm2Nx7Pw"
    assert r(line) == line
    assert r.lines([line]) == [line]
    r.add_values(["Zq8vLm2Nx7Pw"])
    assert r(line) == f"serving with key {MASK}"
    assert r.lines([line]) == [f"serving with key {MASK}"]


@pytest.mark.parametrize("line", [
    "[2025-12-03 10:00:01 TP0] Decode batch. #running-req: 1, #token: 4096, token usage: 0.00, #queue-req: 0",
    "INFO 12-03 10:00:01 [loggers.py:123] Avg prompt throughput: 0.0 tokens/s, max_total_num_tokens=81920",
    "python3 -m sglang.launch_server --model-path /m --tokenizer-path /t --api-key sk-ABCDEFGHIJKLMNOPQRSTUV",
])
def test_common_engine_lines_redact_as_the_reference(line):
    fast, ref = pair()
    assert fast(line) == ref(line)

"""Secret redaction for everything gpubot posts (pure).

Process command lines, environment-style assignments, log lines and error texts can carry API keys and
tokens (`--api-key sk-...`, `HF_TOKEN=hf_...`, `Authorization: Bearer ...`, a PEM private key printed into
a log). `redact(text)` replaces the secret part with `[REDACTED]` and keeps the name, so people still see
WHICH secret was there.

Public API:
- `redact(text, extra=())`: one line or a whole multi-line text.
- `redact_lines(lines, extra=())`: a list of lines (a log tail), with PEM private-key blocks tracked
  across lines.
- `redact_then_cut(text, width)`: redact first, then cut to `width` characters (command lines).
- `Redactor(patterns)`: the same, plus the config's `redact_patterns`; built once per bot (bot.wiring) and
  handed to whatever posts, stores or logs text. The module functions apply the built-in rules only.

What counts as a secret (names match case-insensitively and must END in a secret word, so
`max_new_tokens`, `pad_token_id`, `tokenizer_path`, `--max-tokens`, `--tokenizer-mode` are not secrets):
- `NAME=value`, `NAME: value`, `"NAME": "value"`, `'NAME': 'value'`, `NAME := value`, `NAME => value`,
  query parameters `?api-key=value&...`, headers `X-Api-Key: value`, where NAME ends in TOKEN, SECRET,
  PASSWORD, PASSWD, PASSPHRASE, API_KEY/API-KEY/APIKEY, ACCESS_KEY, SECRET_KEY, PRIVATE_KEY, CREDENTIAL(S).
  A quoted value is masked whole (`--api-key "a b c"`), an unquoted one up to whitespace, a quote,
  `,` or `)` (and `&`/`#` inside a query string).
- `--flag VALUE`, `--flag=VALUE`, `--flag "quoted value"` for flags ending in one of those words
  (`--api-key`, `--api_key`, `--hf_token`, `--secret-key`, `--password`).
- `Authorization: <scheme> value`, `Bearer value`, netrc `machine h login u password value`.
- URL credentials `scheme://user:password@host` (also an empty user, `redis://:pw@host`).
- Well-known token formats anywhere: `hf_`, `sk-` (also `sk-proj-`, `sk-ant-`), `github_pat_`, `ghp_`/
  `gho_`/`ghu_`/`ghs_`/`ghr_`, `glpat-` (and the other GitLab prefixes), `nvapi-`, Slack `xox?-`/`xapp-`,
  AWS `AKIA`/`ASIA` key ids, GCP `AIza` keys, Google OAuth `ya29.` tokens, Stripe `sk_live_`/`sk_test_`/
  `rk_`/`pk_` keys, JWTs, and the path of Slack incoming-webhook URLs.
- PEM private keys: from `-----BEGIN ... PRIVATE KEY-----` to `-----END ... PRIVATE KEY-----`.
- More names: also ending in COOKIE, SIGNATURE, DSN, BASIC_AUTH, SECRETS/PASSWORDS, API_KEYS/AUTH_TOKENS, in
  `_KEY`/`_PWD` after a prefix (`AZURE_OPENAI_KEY`, `MYSQL_PWD`; not `primary_key`, `PWD=/home/x`), in a
  whole-part PASS/AUTH (`DB_PASS`, `"auth"`), with a numbered or per-environment suffix (`API_KEY_2`,
  `OPENAI_API_KEY_PROD`). `SECRET_NAME_RE` is the same rule for params and config keys.
- More forms: lists (`['A', 'B']`), TGI's `Some("...")`, escaped JSON (`{\"password\": \"...\"}`), Python
  tuples and bytes, `{"name": "HF_TOKEN", "value": "..."}`, XML elements, a table column (`| Key | v |`),
  `Cookie:`/`Set-Cookie:` (whole), URL signatures (`?sig=`, `X-Amz-Signature=`), a commented-out assignment,
  a config line's multi-word value, SQL `IDENTIFIED BY`, redis `requirepass`, `setx NAME v`; programs'
  password flags (`_PROGRAM_FLAGS`: `mysql -pX`, `sshpass -p`, `docker login -p`, `curl -u u:X`, ...);
  prose `password X` (unless X is an ordinary word, `_PROSE_WORDS`).
- Across lines: a value on the line after its name (`password:` then the value; a YAML block or list, a
  pretty-printed JSON value or array, TGI's pretty `Some(`, a `--api-key \\` continuation, `Bearer` then the
  token), also inside escaped line breaks (a backslash-n in a repr).
- Kept although secret-named: a tokenizer special token value (`'<|image_pad|>'`), an absolute path
  (`ssh_key=/root/.ssh/id_ed25519`), code (`auth_token = get_token()`), a comment (`password: # none`).

By family (issue 23: general rules by meaning, not by one sample's wording; tests/fixtures/secrets/shapes.yaml,
with a held-out third in heldout.yaml and the near misses that must stay readable in near_misses.yaml):
- Environment assignments in any language: `os.environ["NAME"] = v`, `process.env['NAME'] = v`, `ENV["NAME"]`,
  a call taking the name then the value (`setdefault`, `putenv`, `Setenv`, `set_var`, `setProperty` with a dotted
  name, `SetEnvironmentVariable`, `monkeypatch.setenv`), set commands with the value after a blank (`setx`,
  `setenv`, `%env`, Dockerfile `ENV`, fish `set -gx`/`--export`, `config set`, `rclone config create ... NAME v`),
  a value flag after the name (`gh secret set NAME --body v`, `Env:NAME -Value v`), ANSI-C `$'...'`.
- Logins and positional passwords: a program's password flag (`_PROGRAM_FLAGS`: every flag of the command, also in
  an argument list `"-p", "v"`, and continued on the next line), `-u USER -p PASSWORD` side by side for any program
  (a port, path or variable after -p kept), glued `-storepass`/`-keypass`, `user:password` to an HTTP client's user
  flag, positional credentials (`_POSITIONAL`: `mc alias set`, `htpasswd -b`, `net use`, `sqlplus u/p@db`; `wandb`,
  `vault`, `cargo login TOKEN`, `ngrok config add-authtoken`, `poetry config http-basic`), a password echoed or
  here-stringed into a program that reads it on stdin (`--password-stdin`, `sudo -S`, `chpasswd`, `kinit`).
- Credential files: base64 PEM (`LS0tLS1CRUdJTi...`: kubeconfig `client-key-data`, a Secret's `tls.key`) and base64
  JSON (`eyJ...` with no dots: `.dockerconfigjson`), `private_key_id`/`secret_id`/`pass_phrase`, an AWS secret key
  beside its key id, name/value records (`"keyName": "key1", ..., "value"`), a bare `"key"` holding key material,
  `"--api-key", "v"` argument lists.
- Vendor tokens: the published formats (`_VENDOR_TOKENS`, from the vendors' docs and gitleaks' rules), and any
  `prefix_` or `prefix-` with a random-looking body of 20+ characters (`_PREFIXED_RANDOM`, `_looks_random`; not a
  hex hash, not an id prefix like `chatcmpl-`/`req_`, never inside a path).
- HTTP basic auth in code: the password of `auth=("u", "p")`, `HTTPBasicAuth`/`BasicAuth`/`SetBasicAuth`,
  `*Credentials(...)`, `login("u", "p")`, `connect(host, port, "u", "p")`, `add_password(...)`; base64 of a
  `"u:p"` literal (`btoa`, `b64encode`); `Authorization:` with any scheme (a published one is kept, an unknown
  word is masked with the value); URL credentials also with JSON-escaped slashes.
- Encoded forms: URL-encoded names, quotes and separators (`api%5Fkey=`, `%22token%22%3A%22`, `%253D`), JSON
  `\\u` escapes, HTML entities (`&quot;`), a backslash-escaped value after a plain name; tokens right after an
  escaped tab or line break of a repr.
- Across lines, to a closer: a heredoc, a triple-quoted string or an XML element opened after a secret name; a
  multipart form field's value after its blank line.

Deliberately NOT secrets (documented trade-offs):
- Names that only CONTAIN a secret word are references, not secrets: `password_file=/etc/x`,
  `--token-file`, `api_key_path`, `hf_token_id`. They are shown unchanged.
- Counters written `#token: 40` / `#new-token: 7` (SGLang batch logs) are not secrets.
- Tokenizer special tokens are not secrets: `"eos_token": "</s>"`, `pad_token=...`, `bos_token`, `unk_token`...
- The literal values None/null/nil/true/false/undefined and an empty `""`/`''` are kept (`api_key=None`
  tells the reader no key was given); a quoted `'None'` is still masked.
Over-redaction we accept: any value after a secret-looking name is masked even when it is harmless
(`token: 5` in prose, `--api-key $OPENAI_API_KEY`), and any `sk-` word of 16+ token characters is masked.

Separators and values never cross a line break: multi-line text is split into lines first.

Cost (it runs on every shown row of every probe of every host, and on every log line a check reads): every rule
carries keywords (`_Rule`), the literals one of which each of its matches contains, and ONE Aho-Corasick pass
(pyahocorasick) over the lower-cased line says which rules can match it; only those run, most lines run none and
come back at once. A rule with no literal to look for (an unknown vendor's token) has a gate instead: two searches
for "_" or "-" followed by 20 letters and digits. A
secret NAME counts only where what follows it fits a name/value form (`_name_follows`), so `max_tokens=` or
`tokens/s` runs nothing; the three costliest rules are tried only where such a name starts (`_rule`'s `at`).
Rules compile on first use (importing this module compiles nothing), and a Redactor remembers what it made of
each text and line up to CACHE_MAX_CHARS. tests/unit/test_redact_speed.py checks that none of this changes a
single result against every rule run over every whole line.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import shlex
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

__all__ = ["MASK", "REDACT_REACH", "SECRET_NAME_RE", "Redactor", "redact", "redact_lines", "redact_mapping",
           "redact_then_cut"]

MASK = "[REDACTED]"
_ELLIPSIS = "…"


class _LazyPattern:
    """A regex compiled on first use (compiling every rule at import took about a second): `search`, `match`,
    `fullmatch`, `finditer` and `sub` as on `re.Pattern`; `pattern` is its source."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, source: str, flags: int = 0):
        self.pattern = source
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        """The compiled regex (compiled now when it was not yet)."""
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def search(self, text: str, *args: int) -> re.Match[str] | None:
        """`re.Pattern.search`."""
        return (self._compiled or self.compiled()).search(text, *args)

    def match(self, text: str, *args: int) -> re.Match[str] | None:
        """`re.Pattern.match`."""
        return (self._compiled or self.compiled()).match(text, *args)

    def fullmatch(self, text: str, *args: int) -> re.Match[str] | None:
        """`re.Pattern.fullmatch`."""
        return (self._compiled or self.compiled()).fullmatch(text, *args)

    def finditer(self, text: str, *args: int) -> Iterator[re.Match[str]]:
        """`re.Pattern.finditer`."""
        return (self._compiled or self.compiled()).finditer(text, *args)

    def sub(self, repl: Any, text: str, count: int = 0) -> str:
        """`re.Pattern.sub`."""
        return (self._compiled or self.compiled()).sub(repl, text, count)

# The word a secret NAME ends in. KEY and PWD count only as the last part of a longer name (AZURE_OPENAI_KEY,
# Ocp-Apim-Subscription-Key, MYSQL_PWD: a bare `key` or `PWD=/home/x` is not a secret); PASS, DSN and BEARER
# only as a whole part (DB_PASS, --db-pass, SENTRY_DSN; not `bypass`).
_WORD = (
    r"(?:(?:TOKEN|SECRETS?|PASSWORDS?|PASSWD|PASS[_-]?PHRASE|SECRET[_-]?(?:STRING|VALUE|ID)|PRIVATE[_-]?KEY[_-]?ID"
    r"|API[_-]?KEYS?|ACCESS[_-]?KEY|SECRET[_-]?KEY|PRIVATE[_-]?KEY"
    r"|ACCOUNT[_-]?KEY|CREDENTIALS?|COOKIE|SIGNATURE|(?:AUTH|ACCESS|API|BEARER|REFRESH|HF)[_-]?TOKENS|BASIC[_-]?AUTH"
    r"|(?<![A-Za-z0-9])(?:PASS|DSN|BEARER|_?AUTH)|(?<=[A-Za-z0-9][_-])(?:KEY|PWD))"
    # a numbered or per-environment copy: API_KEY_2, OPENAI_API_KEY_PROD, SECRET_KEY_BASE
    r"(?:[_-](?:[0-9]{1,3}|PROD|PRD|DEV|STAGING|STG|TEST|QA|BASE|LIVE|OLD|NEW|PRIMARY|SECONDARY|CURRENT|NEXT))?)"
)
# Tokenizer special tokens are vocabulary entries, not credentials (`"eos_token": "</s>"`).
_SPECIAL_TOKENS = ("bos", "eos", "pad", "unk", "sep", "cls", "mask", "eot", "im_start", "im_end")
# Names ending in KEY that name a lookup key, not a credential (`primary_key`, `sort_key`, `cache_key`...).
_PLAIN_KEYS = ("primary", "foreign", "sort", "partition", "routing", "cache", "hash", "public", "host", "group",
               "dict", "lookup", "index", "row", "column", "shard", "map", "order", "unique", "composite")
# A secret name: word characters and hyphens ending in the secret word (X-Api-Key, AWS_SECRET_ACCESS_KEY).
_NAME = (rf"[A-Za-z0-9_-]*{_WORD}" + "".join(rf"(?<!{t}_token)(?<!{t}-token)" for t in _SPECIAL_TOKENS)
         + "".join(rf"(?<!{k}_key)(?<!{k}-key)" for k in _PLAIN_KEYS))
# NAME = / NAME: / NAME == / NAME := / NAME => (spaces and tabs only: never across a line break).
_SEP = r"[ \t]*(?:=>|==?|:=?|[?+]=|\|(?!\|))[ \t]*"  # also a table's column bar (`| SecretAccessKey | v |`),
# make's `?=` and `+=` (also bash's `+=`)

# A bearer credential's characters (RFC 6750 b64token), and an already masked value (so that a second pass
# over redacted text takes the same decisions as the first: `redact` is idempotent).
_B64URL = r"[A-Za-z0-9._~+/=-]"
_MASK_RE = re.escape(MASK)
# Where a NAME=value form starts: an unquoted name not after "#" (SGLang's `#token: 40` counters), or a
# quoted one; never right after "//" (`https://user:pw@host` is URL credentials).
_NAME_FORM = rf"(?<!//)(?:\"{_NAME}\"(?:[ \t]*\])?|'{_NAME}'(?:[ \t]*\])?|(?<!#){_NAME}){_SEP}"
# A value must not itself be, or run into, the start of ANOTHER secret form: masking it would swallow that
# form's name and leave its secret standing (`token: X-Api-Key: s3cr3t`, `token: f(api_key=s3cr3t)`). Each
# alternative matches only where the pattern for that form (below) matches too.
_FORM_START = (
    rf"{_NAME_FORM}"
    rf"|--?{_NAME}(?:[ \t]*=|[ \t])"
    r"|[\"']?(?:proxy-)?authorization[\"']?[ \t]*[:=]"
    rf"|bearer[ \t]+(?:{_B64URL}{{8}}|{_MASK_RE})"
    r"|(?:machine|login|account|default)[ \t]"
)
# ...nor is a bare None/null/... or an empty quoted string a secret (`api_key=None` tells the reader that no
# key was given).
_WRAPPED = r"(?:\[[ \t]*|Some\([ \t]*)"  # a value in a list (`['KEY']`, vLLM) or Rust's `Some("KEY")` (TGI)
#: A flag that names a secret and gives its value (`--api_key V`, `-token=V`): what a name before it (`TOKEN:
#: --api_key V`) must not take as its own value, or the flag's value would be left unmasked.
_SECRET_FLAG = rf"--?{_NAME}(?:[ \t]*=|[ \t]+)(?=\S)"
_NOT_A_SECRET_FLAG = rf"(?!{_SECRET_FLAG})"
_GUARD = (rf"(?!{_FORM_START}|(?:none|null|nil|true|false|undefined|\"\"|'')(?:[\s'\",)]|$)|{_WRAPPED}[\"']{_MASK_RE}"
          # references and vocabulary, not secrets: a tokenizer's special token (`'<|image_pad|>'`), an absolute
          # path (`ssh_key=/root/.ssh/id_ed25519`), code (`auth_token = get_token()`)
          rf"|[\"']?<\|?[^<>\s'\"]{{1,40}}\|?>[\"']?(?:[\s,;)]|$)|[\"']?/[\w.@+-]+/[\w./@+-]*[\"']?(?:[\s,;)]|$)"
          rf"|[A-Za-z_][\w.]*\("
          # a heredoc or a triple-quoted string that opens here: its text, on the next lines, is masked there
          rf"|<<-?[ \t]*[\"']?[A-Za-z_]\w*[\"']?[ \t]*$|[rbuf]?(?:\"\"\"|''')[ \t]*$"
          # a tuple of literals: `auth=("user", "pw")` (the credential-call rule masks what is secret in it)
          rf"|\((?=[ \t]*b?[\"'])"
          # a comment, not a value (`password: # set by the operator`)
          rf"|#(?:[ \t]|$)"
          # a flag that names a secret itself (`TOKEN: --api_key V`): its own rule masks its value
          rf"|{_SECRET_FLAG})")


def _run(char: str) -> str:
    """One or more `char` that stop where another secret form starts. The check runs only where a name can
    start (not after a word character or "-"), so the scan stays linear; a "?" or "&" right before another
    form is left out too, so the query-string form still sees it."""
    return rf"(?:(?![?&](?:{_FORM_START}))(?:(?<=[\w-]){char}|(?<![\w-])(?!{_FORM_START}){char}))+"


_ANY = _run(r"\S")  # flag, header and netrc values: up to whitespace
# NAME=value: also up to a quote, a backquote, `)` or a `,` before a space
_KV = _run(r"(?:[^\s'\",)`]|,(?=[^\s'\",)`]))")
_QS = _run(r"[^\s&#'\"]")  # ?name=value: up to the next parameter or the fragment
# A quoted value (masked whole, quotes kept). An unterminated quote runs to the end of the line, and a quote
# that opens another form (`token=" {"api_key": ...`) is not taken as the closing one.
_DQ_RUN = _run(r'(?:[^"\\\r\n]|\\.)')
_SQ_RUN = _run(r"(?:[^'\\\r\n]|\\.)")
#: A quoted string with no named groups (for repeated use inside one pattern).
_ANY_QUOTED = r"(?:\"(?:[^\"\\\r\n]|\\.)*\"|'(?:[^'\\\r\n]|\\.)*')"
_QUOTED = rf"\"{_DQ_RUN}(?:(?!{_FORM_START})(?P<dq>\"))?|'{_SQ_RUN}(?:(?!{_FORM_START})(?P<sq>'))?"
#: The same without named groups: a quoted value that stops where another form starts inside it
#: (`Authorization:'0 f(api_key='v'`: the name's own rule masks v).
_QUOTED_UNNAMED = rf"\"{_DQ_RUN}(?:(?!{_FORM_START})\")?|'{_SQ_RUN}(?:(?!{_FORM_START})')?"


def _name_value(m: re.Match[str]) -> str:
    """Replacement for the name/value forms: everything before the value, then the masked value (a quoted
    value keeps its opening quote, and its closing quote when it had one)."""
    head = m.group(0)[: m.start("val") - m.start(0)]
    q = m.group("val")[0]
    if q not in "\"'" or "dq" not in m.re.groupindex:
        return head + MASK
    return head + q + MASK + (m.group("dq") or m.group("sq") or "")


def _wrapped_value(m: re.Match[str]) -> str:
    """Replacement for a list or `Some(...)` value: the first quoted element as `_name_value` masks it, and every
    further quoted element of the list masked too (`['A', 'B']` -> `['[REDACTED]', '[REDACTED]']`)."""
    more = re.sub(_ANY_QUOTED, lambda q: q.group(0)[0] + MASK + q.group(0)[0], m.group("more"))
    return _name_value(m) + more


def _keep_head(m: re.Match[str]) -> str:
    """Replacement that keeps everything before group `val` and masks the value."""
    return m.group(0)[: m.start("val") - m.start(0)] + MASK + m.group(0)[m.end("val") - m.start(0):]


def _mask_values(m: re.Match[str]) -> str:
    """Replacement that masks every group whose name starts with "val" that took part in the match (a quoted value
    keeps its quotes: `"-p", "[REDACTED]"`) and keeps the rest."""
    text, base, out, last = m.group(0), m.start(0), [], 0
    spans = sorted(m.span(g) for g in m.re.groupindex if g.startswith("val") and m.group(g) is not None)
    for start, end in spans:
        value = text[start - base:end - base]
        q = value[0] if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0] else ""
        out += [text[last:start - base], q, MASK, q]
        last = end - base
    return "".join([*out, text[last:]])


_PEM_KEY = r"[ \t]+(?:[A-Z0-9]+[ \t]+)*?PRIVATE[ \t]+KEY(?:[ \t]+BLOCK)?[ \t]*-{2,}"
_PEM_BEGIN_RE = rf"(?<!-)-{{2,}}[ \t]*BEGIN{_PEM_KEY}"
_PEM_END_RE = rf"(?<!-)-{{2,}}[ \t]*END{_PEM_KEY}"
_PEM_BEGIN = _LazyPattern(_PEM_BEGIN_RE, re.IGNORECASE)
_PEM_END = _LazyPattern(_PEM_END_RE, re.IGNORECASE)

#: Between the words of a program's name: blanks, or the quotes and commas of an argument list
#: (`["docker", "login", ...]`, a Kubernetes `args:`, `subprocess.run([...])`).
_ARGV_WS = r"(?:[\"']?,?[ \t]+[\"']?)"
#: Programs that take a password by a flag, or positionally: (keywords, program names regex, flag regex, what may
#: come between the flag and the value); the keywords are what a line must contain for the rule to run (see
#: `_Rule`). An empty flag is a positional value (`wandb login KEY`). mysql's `-p` takes its value attached (`-p`
#: alone prompts; `-P` is the port); docker's `-p` is a password only after `login` (`docker run -p 8080:80`
#: publishes a port). Also written as an argument list: `"-p", "VALUE"`, `"-pVALUE"`.
_PROGRAM_FLAGS: tuple[tuple[tuple[str, ...], str, str, str], ...] = (
    (("mysql", "mariadb"),
     r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlsh|mysqlcheck|mariadb|mariadb-dump)(?![\w.-])", "-p", ""),
    (("sshpass",), r"sshpass(?![\w.-])", "-p", "[ \t]*"),
    (("login",),
     rf"(?:docker|podman|nerdctl|buildah|skopeo|oras|crane|helm{_ARGV_WS}registry){_ARGV_WS}login(?![\w.-])",
     "-p", "[ \t]+"),
    (("twine",), r"twine(?![\w.-])", "-p", "[ \t]+"),
    (("redis-cli",), r"redis-cli(?![\w.-])", "-a", "[ \t]+"),
    (("mongo",), r"(?:mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport)(?![\w.-])", "-p", "[ \t]+"),
    (("ldap",), r"(?:ldapsearch|ldapmodify|ldapadd|ldapdelete|ldappasswd)(?![\w.-])", "-w", "[ \t]*"),
    (("login",), rf"(?:az|oc|argocd|cf|docker|podman|nerdctl){_ARGV_WS}login(?![\w.-])", "-p", "(?:[ \t]+|=)"),
    (("ssh-keygen",), r"ssh-keygen(?![\w.-])", "-[NP]", "[ \t]+"),  # new and old passphrase
    (("openssl",), r"openssl(?![\w.-])", "-k", "[ \t]+"),
    (("7z",), r"(?:7z|7za|7zr)(?![\w.-])", "-p", ""),
    (("unzip",), r"unzip(?![\w.-])", "-P", "[ \t]+"),
    (("smbclient",), r"smbclient(?![\w.-])", "-U[ \t]*[^\\s%]+%", ""),
    (("wandb",), r"wandb[ \t]+login(?![\w.-])", "", "(?!-)"),
    (("sqlcmd", "bcp", "osql", "isql"), r"(?:sqlcmd|bcp|osql|isql)(?![\w.-])", "-P", "[ \t]*"),  # SQL Server tools
    (("ipmitool",), r"ipmitool(?![\w.-])", "-P", "[ \t]+"),  # BMC password
    (("racadm",), r"racadm(?![\w.-])", "-p", "[ \t]+"),  # Dell iDRAC
    (("ncftp",), r"ncftp(?:put|get|ls|batch)?(?![\w.-])", "-p", "[ \t]+"),
    (("mosquitto_",), r"mosquitto_(?:pub|sub|rr)(?![\w.-])", "-P", "[ \t]+"),
    (("snmp",), r"snmp(?:walk|get|getnext|set|bulkwalk|bulkget|table|trap|inform|status|delta|df|netstat)(?![\w.-])",
     "-[AX]", "[ \t]*"),  # SNMPv3 auth and privacy passphrases
    (("freerdp",), r"(?:xfreerdp|wlfreerdp|sdl-freerdp|freerdp)(?![\w.-])", "/p:", ""),
    (("rar ",), r"(?:unrar|rar)(?= )", "-p", ""),
    (("zip ",), r"zip(?= )", "-P", "[ \t]+"),
    # positional: a token or password where the synopsis puts it
    (("login",), r"(?:vault|cargo)[ \t]+login(?![\w.-])", "", "(?![-\\w.]+=)(?!-)"),
    (("ngrok",), r"ngrok(?:[ \t]+config)?[ \t]+(?:add-authtoken|authtoken|add-api-key)(?![\w.-])", "", "(?!-)"),
    (("wpa_passphrase",), r"wpa_passphrase(?![\w.-])[ \t]+\S+", "", "(?!-)"),
    (("poetry",), r"poetry[ \t]+config(?:[ \t]+--?[\w-]+)*[ \t]+(?:http-basic\.\S+[ \t]+\S+|pypi-token\.\S+)", "",
     "(?!-)"),
    (("rclone",), r"rclone[ \t]+obscure(?![\w.-])", "", "(?!-)"),
)
#: Commands whose synopsis puts credentials at fixed places the table above cannot say (every group named val* is
#: masked): `mc alias set ALIAS URL ACCESSKEY SECRETKEY` (MinIO), `mc admin user add ALIAS USER SECRET`,
#: `net use DEV \\share PASSWORD`, `sqlplus user/password@db` (Oracle tools), `cf auth USER PASSWORD`; and
#: `htpasswd -b [options] FILE USER PASSWORD` / `htpasswd -nb USER PASSWORD` (`_htpasswd`).
_ARG = r"(?:\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s'\"|;&]+)"
_POSITIONAL: tuple[tuple[tuple[str, ...], str], ...] = (
    (("mc",), rf"(?<![\w.-])mc(?:[ \t]+--?[\w-]+)*[ \t]+(?:alias[ \t]+set|config[ \t]+host[ \t]+add)[ \t]+{_ARG}[ \t]+"
              rf"{_ARG}[ \t]+(?P<val>(?!-){_ARG})(?:[ \t]+(?P<val2>(?!-){_ARG}))?"),
    (("mc",), rf"(?<![\w.-])mc(?:[ \t]+--?[\w-]+)*[ \t]+admin[ \t]+user[ \t]+add[ \t]+{_ARG}[ \t]+{_ARG}[ \t]+"
              rf"(?P<val>(?!-){_ARG})"),
    (("net use",), rf"(?i)(?<![\w.-])net use(?:[ \t]+(?:[a-z]:|\*))?[ \t]+\\\\\S+[ \t]+(?P<val>(?![/*]){_ARG})"),
    (("sqlplus", "sqlldr", "expdp", "impdp", "exp ", "imp ", "rman", "dgmgrl"),
     r"(?<![\w.-])(?:sqlplus|sqlldr|expdp|impdp|exp(?= )|imp(?= )|rman|dgmgrl)(?:[ \t]+-[\w-]+)*[ \t]+"
     r"(?:(?:target|auxiliary|catalog|userid)[ \t]*=?[ \t]*)?[\"']?[\w$#.]+/(?P<val>[^@\s'\"/]+)"),
    (("cf",), rf"(?<![\w.-])cf[ \t]+auth[ \t]+(?P<user>(?!-){_ARG})[ \t]+(?P<val>(?!-){_ARG})"),
)
#: What a password piped in on stdin is read by (`echo PW | docker login --password-stdin`, `| sudo -S`, `| chpasswd`):
#: the echoed words before it are the password.
_STDIN_READER = (r"(?:--?[\w-]*stdin\b|password_stdin|sudo(?:[ \t]+-[\w-]+)*[ \t]+-[a-zA-Z]*S|\bchpasswd|\bkinit\b"
                 r"|\bsmbpasswd\b|\bpasswd\b|--pass(?:word)?-fd[ \t=]+0|-passin[ \t]+stdin|\bcryptsetup\b"
                 r"|\bopenconnect\b)")
_STDIN_READER_RE = _LazyPattern(_STDIN_READER)
#: A flag ending in a glued "pass" that is no password flag (`--bypass`, ffmpeg's `-pass 1` is PASS alone).
_NOT_PASS_FLAGS = frozenset(("bypass", "compass", "surpass", "trespass", "encompass", "overpass", "underpass",
                             "multipass", "onepass", "twopass", "firstpass", "secondpass", "singlepass", "nopass",
                             "skippass", "subpass", "renderpass", "bidipass"))


def _piped_password(m: re.Match[str]) -> str:
    """Replacement for an `echo ...` / `printf ...` (one or more, `(echo a; echo b)`) piped into a program that reads
    a password on stdin (`_STDIN_READER`): their arguments masked (not an option, nor a printf format); else as it was.
    Piped into `base64`, only what follows the colon of a `user:password`."""
    text = m.group(0)
    rest = m.group("rest")
    reader = _STDIN_READER_RE.search(rest)
    b64 = reader is None and re.search(r"\|[ \t]*base64\b", rest) is not None
    if reader is None and not b64:
        return text

    def mask_args(cmd: re.Match[str]) -> str:
        words = list(re.finditer(_ARG, cmd.group("args")))
        out, last, fmt_seen = [], 0, cmd.group("verb").lower() != "printf"
        args = cmd.group("args")
        for w in words:
            word = w.group(0)
            if word.startswith("-") and not out and re.fullmatch(r"-[neE]+", word):
                continue
            if not fmt_seen:
                fmt_seen = True
                if "%" in word:
                    continue
            q = word[0] if word[0] in "\"'" and len(word) >= 2 and word[-1] == word[0] else ""
            inner = word[len(q):len(word) - len(q)]
            if b64:
                user, colon, _pw = inner.partition(":")
                masked = q + user + colon + MASK + q if colon else word
            else:
                masked = q + MASK + q
            out += [args[last:w.start()], masked]
            last = w.end()
        return cmd.group("verb") + "".join([*out, args[last:]])

    head = re.sub(r"(?P<verb>echo|printf)(?P<args>[^|;&)\n]*)", mask_args, m.group("head"), flags=re.IGNORECASE)
    return head + rest


#: HTTP authentication schemes (the IANA registry, and the ones vendors document): what follows `Authorization:` and
#: names the kind of credential after it.
_AUTH_SCHEMES = "|".join((
    "basic", "bearer", "digest", "dpop", "gnap", "hoba", "mutual", "negotiate", "ntlm", "oauth", "privatetoken",
    "scram-sha-1", "scram-sha-256", "vapid", "concealed", "token", "api-?key", "key", "aws4-hmac-sha256", "aws", "ssws",
    "splunk", "bot", "geniekey", "deepl-auth-key", "klaviyo-api-key", "zoho-oauthtoken", "sharedkey(?:lite)?",
    "sharedaccesssignature", "client-id", "mac", "hawk", "jwt", "hmac-sha256", "signature", "kerberos", "session",
))


def _auth_value(m: re.Match[str]) -> str:
    """Replacement for the Authorization form: after a published scheme as `_name_value` masks a value; else the whole
    value (a word that may be a scheme, and what follows it)."""
    if m.group("val") is not None:
        return _name_value(m)
    return _mask_values(m)


#: Encoded forms (`_encoded_value`): "_" or "-" inside a name, a quote, and `=`/`:`, each as written in a URL
#: (once or twice encoded), in a JSON \\u escape or an HTML entity; a quote also backslash-escaped.
_ESC_SEP = r"(?:[_-]|%5f|%2d|\\{1,3}u005f|\\{1,3}u002d)"
_ESC_QUOTE = r"(?:%(?:25)*2[27]|\\{1,3}u002[27]|&quot;|&#0*3[49];|&#x0*2[27];|&apos;|\\{1,3}[\"'])"
_ESC_EQ = r"(?:[=:]|%(?:25)*3[da]|\\{1,3}u003[da])"
_ESC_WORDS = (rf"token|secrets?|passwords?|passwd|pass{_ESC_SEP}?phrase|api{_ESC_SEP}?keys?|access{_ESC_SEP}?key"
              rf"|secret{_ESC_SEP}?key|private{_ESC_SEP}?key|credentials?|auth|pass|pwd|signature|sig")
#: A value in those forms: up to an (encoded) quote, `&` (`%26`), `,` (`%2C`), a blank (`%20`) or a bracket.
_ESC_VALUE = (rf"(?:(?!{_ESC_QUOTE}|&(?:amp;)?|%(?:25)*2[06c]|\\+u00(?:2[26c]|7d)|\\+[nrt])"
              rf"(?:[^\s&\"'<>\\,;{{}}\[\]%]|%[0-9a-f]{{2}}|\\u[0-9a-f]{{4}}))+")
#: What a line must contain for the encoded forms to be tried (folded).
_ENCODED_KW = ("%5f", "%2d", "%3d", "%3a", "%22", "%27", "%252", "%253", "&#0", "&#x0", "\\u00", "&quot;", "&#3",
               "&#x2", "&apos;", "\\\"", "\\'")


def _encoded_value(m: re.Match[str]) -> str:
    """Replacement for the encoded forms: the value masked when some part of the form is encoded (a name, a quote or
    the separator) or the value's quote is backslash-escaped; a plain form is left to the plain rules."""
    parts = (m.group("q1"), m.group("q2"), m.group("eq"), m.group("q3"))
    encoded = any(g is not None and g not in ("\"", "'", "=", ":") for g in parts)
    if not encoded and "%" not in m.group("name") and "\\" not in m.group("name"):
        return m.group(0)
    return _keep_head(m)


def _aws_secret(m: re.Match[str]) -> str:
    """Replacement for a 40-character AWS secret key beside its key id: the secret masked when it does not look like
    a hex digest (a SHA-1 is 40 hex digits), else as it was."""
    group = "val" if m.group("val") is not None else "val_before"
    value = m.group(group)
    if all(c in "0123456789abcdefABCDEF" for c in value):
        return m.group(0)
    cut = m.start(group) - m.start(0)
    return m.group(0)[:cut] + MASK + m.group(0)[cut + len(value):]


def _key_value(m: re.Match[str]) -> str:
    """Replacement for a bare `"key": "..."`: masked when the value is hex or random-looking key material (kaggle.json);
    a name (`"key": "model.layers.0"`, `"key": "sort_order_by_name_x"`) is kept."""
    value = m.group("val")
    plain = value.rstrip("=")
    hexlike = len(plain) >= 20 and all(c in "0123456789abcdefABCDEF" for c in plain)
    return _keep_head(m) if hexlike or _looks_random(plain) else m.group(0)


def _credential_call(m: re.Match[str]) -> str:
    """Replacement for a call (or an `auth=(...)` tuple) that takes a user and a password: the string literals among
    its positional arguments after the user (after the host and the user for connect and add_password) masked, when
    there are that many; other calls as they were."""
    call = m.group("call").lower()
    skip = 2 if ("connect" in call or "add_password" in call) else 1
    args = m.group("args")
    literals = [a for a in re.finditer(r"(?<![\w=])[ \t]*(?P<lit>b?(?:\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'))",
                                       args) if not re.search(r"=[ \t]*$", args[:a.start()].rsplit(",", 1)[-1])]
    if len(literals) <= skip:
        return m.group(0)
    out, last = [], 0
    cut = m.start("args") - m.start(0)
    for lit in literals[skip:]:
        start, end = lit.span("lit")
        q = 1 + (args[start] == "b")
        out += [args[last:start + q], MASK]
        last = end - 1
    return m.group(0)[:cut] + "".join([*out, args[last:]]) + m.group(0)[cut + len(args):]


def _login_call(m: re.Match[str]) -> str:
    """Replacement for a login call's one credential (`key="v"`, or a sole string argument): the literal's inside
    masked, its quotes kept."""
    g = "kv" if m.group("kv") is not None else "val"
    start, end = m.span(g)
    if m.group(g)[1:-1] == MASK:
        return m.group(0)
    base = m.start(0)
    return m.group(0)[:start - base + 1] + MASK + m.group(0)[end - base - 1:]


def _htpasswd(m: re.Match[str]) -> str:
    """Replacement for `htpasswd OPTIONS ARGS`: with -b the password is the third argument (the second with -n: no
    file), masked; without -b there is none (it is prompted for)."""
    letters = "".join(o.lstrip("-") for o in m.group("opts").split() if o.startswith("-") and not o[1:].isdigit())
    args = list(re.finditer(_ARG, m.group("args")))
    at = 1 if "n" in letters else 2
    if "b" not in letters or len(args) <= at:
        return m.group(0)
    cut = m.start("args") - m.start(0)
    word = args[at]
    return m.group(0)[:cut + word.start()] + MASK + m.group(0)[cut + word.end():]


def _pass_flag(m: re.Match[str]) -> str:
    """Replacement for a flag ending in a glued "pass" (`-storepass X`, `-keypass X`): the value masked, unless the flag
    is a word like `--bypass` (`_NOT_PASS_FLAGS`)."""
    if m.group("flag").lower() in _NOT_PASS_FLAGS:
        return m.group(0)
    return _mask_values(m)

#: How far after the program's name its password flag is looked for (characters; bounds the scan of long lines).
_FLAG_REACH = 400


def _program_continued() -> str:
    """A program's password flag (`_PROGRAM_FLAGS`, one that takes its value after a blank) at the end of a line
    continued by `\\`: the value is on the next line (part of `_DANGLING`)."""
    alternatives = "|".join(rf"(?:{progs})[^\n|;&]{{0,{_FLAG_REACH}}}?[ \t](?:{flag})"
                            for _kw, progs, flag, gap in _PROGRAM_FLAGS if flag and gap not in ("", "(?:)"))
    return rf"(?<![\w.-])(?:{alternatives})[ \t]+\\+[ \t]*`?[ \t]*$"  # (also inside a Slack code quote)


#: Keywords of the programs `_program_continued` names: a line with one may end in its password flag and `\\`.
_PROGRAM_CONTINUED = _program_continued()
_PROGRAM_CONTINUED_KW = tuple(sorted({k for kws, _progs, flag, gap in _PROGRAM_FLAGS if flag and gap != ""
                                      for k in kws}))


def _program_flag(progs: str, flag: str, gap: str) -> tuple[str, _Repl]:
    """The regex and the replacement of one `_PROGRAM_FLAGS` entry. Positional (no flag): the program, then the first
    word after it that `gap` allows (group val). With a flag: the program and the rest of its command (up to `|`, `;`,
    `&` or _FLAG_REACH characters), every value of the flag in it masked at once (snmpwalk -A x -X y), plain (`-p X`,
    `-pX`) or in an argument list (`"-p", "X"`, `"-pX"`); a lone `\\` is a continuation, not a value (`_DANGLING`
    takes the next line)."""
    if not flag:
        return (rf"(?<![\w.-])(?:{progs})[^\n|;&]{{0,{_FLAG_REACH}}}?[ \t]{gap}(?!\\[ \t]*$)"
                rf"(?P<val>{_ANY_QUOTED}|[^\s'\"]\S*)", _mask_values)
    listed = rf"(?P<fq>[\"'])(?:{flag})(?:(?P=fq)[ \t]*,[ \t]*(?!{_MASK_RE})(?P<val_listed>{_ANY_QUOTED})"
    if gap in ("", "[ \t]*"):
        listed += rf"|(?!{_MASK_RE})(?P<val_glued>[^\s\"'\\]+)(?=(?P=fq))"
    listed += ")"
    plain = rf"(?:{flag}){gap}(?!\\[ \t]*$|{_MASK_RE})(?P<val>{_ANY_QUOTED}|[^\s'\"]\S*)"
    values = _LazyPattern(rf"[ \t\[](?:{plain}|{listed})")

    def repl(m: re.Match[str]) -> str:
        cut = m.start("args") - m.start(0)
        return m.group(0)[:cut] + values.sub(_mask_values, m.group("args"))

    return rf"(?<![\w.-])(?:{progs})(?P<args>[^\n|;&]{{1,{_FLAG_REACH}}})", repl

#: Words that follow "password" in ordinary prose ("password authentication failed", "password is wrong"): the
#: prose form keeps them; any other word after "password" is taken for the password.
_PROSE_WORDS = "|".join((
    "is", "was", "to", "of", "for", "and", "or", "the", "a", "an", "in", "on", "at", "by", "with", "from", "as",
    "has", "have", "had", "will", "would", "can", "cannot", "could", "must", "should", "may", "not", "no", "none",
    "null", "empty", "blank", "required", "incorrect", "invalid", "wrong", "expired", "expires", "changed",
    "change", "reset", "policy", "length", "mismatch", "missing", "authentication", "auth", "login", "prompt",
    "file", "hash", "hashed", "manager", "field", "protected", "based", "less", "set", "entry", "needed", "needs",
    "failed", "fails", "failure", "too", "does", "did", "do", "be", "been", "if", "when", "then", "please", "you",
    "your", "see", "via", "using", "use", "used", "this", "that", "it", "here", "ok", "correct", "accepted",
    "rejected", "denied", "again", "also", "updated", "update", "saved", "stored", "provided", "given", "sent",
    "user", "for", "protection", "strength", "complexity", "history", "rotation", "expiry", "recovery",
    "attempt", "attempts", "expiration", "prompted", "changed", "length", "characters",
))

_Repl = str | Callable[[re.Match[str]], str]

#: The keyword that stands for "a secret name (`_NAME`) followed by what a name/value form needs" in a rule's
#: keywords: the line must contain one of _SECRET_WORDS (case-insensitively, see `_fold`), and right after it (after an
#: optional numbered suffix, `API_KEY_2`) a separator, a quote, a backslash, `>`, the end of the line, or blanks then
#: one of those; or blanks then anything when the name is a flag (`--api-key VALUE`) or the line sets a variable
#: (`setx NAME VALUE`). See `_name_follows`.
_NAME_KW = "<name>"
#: The words a secret name ends in (`_WORD`), lower-case: the keywords behind _NAME_KW.
_SECRET_WORDS: tuple[str, ...] = (
    "token", "secret", "secrets", "password", "passwords", "passwd", "passphrase", "pass_phrase", "pass-phrase",
    *(f"secret{sep}{w}" for sep in ("", "_", "-") for w in ("string", "value", "id")),
    *(f"privatekey{sep}id" for sep in ("", "_", "-")), "private_key_id", "private-key-id", "private_keyid",
    "private-keyid", "apikey", "apikeys", "api_key",
    "api-key", "api_keys", "api-keys", "accesskey", "secretkey", "privatekey", "accountkey", "credential",
    "credentials", "cookie", "signature", "pass", "dsn", "bearer", "auth", "_key", "-key", "_pwd", "-pwd",
    *(f"{p}{sep}tokens" for p in ("auth", "access", "api", "bearer", "refresh", "hf") for sep in ("", "_", "-")),
)
#: The numbered or per-environment suffix a secret name may carry after its word (see `_WORD`).
_SUFFIX = re.compile(r"[_-](?:[0-9]{1,3}|prod|prd|dev|staging|stg|test|qa|base|live|old|new|primary|secondary"
                     r"|current|next)(?![a-z0-9])")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
#: Words of a line that sets a named variable or setting with its value after a blank (`setx NAME v`, `setenv NAME v`,
#: `%env NAME v`, Dockerfile `ENV NAME v`, fish `set -gx NAME v`, `aws configure set NAME v`, `npm config set NAME v`,
#: `rclone config create r s3 NAME v`): the set-command rule's `requires` (folded).
_SET_VERBS = ("set", "env", "config")


#: What may follow a secret name (and its suffix) to the end of a line that `_DANGLING` matches: a closing quote, a
#: separator, then a YAML block indicator, a continuation, an auth scheme or an opening bracket (folded text).
_DANGLING_TAIL = re.compile(r"\\?[\"']?[ \t]*(?:(?:=>|==?|:=?)[ \t]*)?"
                            r"(?:[|>][-+]?[0-9]?|\\+|bearer|basic|token|some\(|\[|\{|\(|<<-?[ \t]*[\"']?[a-z_]\w*[\"']?"
                            r"|[rbuf]?(?:\"\"\"|'''))?[ \t]*`?[ \t]*$")


def _dangling_follows(t: str, end: int) -> bool:
    """Whether the secret name ending at t[:end] (t folded) can end a line `_DANGLING` matches (see _DANGLING_TAIL)."""
    if end < len(t) and t[end] in "_-" and (m := _SUFFIX.match(t, end)):
        end = m.end()
    return _DANGLING_TAIL.match(t, end) is not None


def _name_follows(t: str, start: int, end: int) -> bool:
    """Whether the secret word at t[start:end] (t folded, see `_fold`) can end a secret name that one of the name/value
    forms masks a value after: what comes after the word (and its suffix) is a separator (`=`, `:`, `|`), a quote, a
    backslash, `>`, the end of the line, or blanks then one of those or the end, or a flag; or blanks then anything
    when the name is a flag (its run of name characters starts with `-`) or the line sets a variable (`_SET_VERBS`).
    A superset of
    where the forms match (tests/unit/test_redact_speed.py checks it against every rule run on every line)."""
    n = len(t)
    if end < n and t[end] in "_-" and (m := _SUFFIX.match(t, end)):
        end = m.end()
    if end >= n or t[end] in "\\\"'>=:|" or (t[end] in "?+" and t.startswith("=", end + 1)):
        return True
    if t[end] not in " \t":
        return False
    k = end
    while k < n and t[k] in " \t":
        k += 1
    if k >= n or t[k] in "=:|" or (t[k] in "?+" and t.startswith("=", k + 1)):
        return True
    if t[k] == "-":  # a flag after the name: `gh secret set NAME --body v`, `Env:NAME -Value v`
        return True
    while start > 0 and t[start - 1] in _NAME_CHARS:
        start -= 1
    return t[start] == "-" or any(verb in t for verb in _SET_VERBS)


class _Rule(NamedTuple):
    """One built-in redaction rule: its regex `source` (compiled on first use), what replaces a match (`repl`),
    and its `keywords`: lower-case literals of which every match contains at least one (case-insensitively), so
    the rule only runs on lines that contain one (the gitleaks/trufflehog way: one multi-keyword pass decides).
    `_NAME_KW` among them stands for a secret name followed by what a name/value form needs (`_name_follows`).
    A keyword never contains `[` or `]`, so masking (`[REDACTED]`) cannot create one: a rule a line's keywords
    rule out cannot match what the rules before it made of the line either."""

    keywords: tuple[str, ...]
    source: str
    repl: _Repl
    at: str = "scan"
    requires: tuple[str, ...] = ()
    gate: tuple[str, ...] = ()


def _rule(keywords: tuple[str, ...], source: str, repl: _Repl, *, at: str = "scan",
          requires: tuple[str, ...] = (), gate: tuple[str, ...] = ()) -> _Rule:
    """A `_Rule`. `at` says where its matches can start: "scan" anywhere (`re.sub` over the line), "name" only at a
    secret name's first character (the start of its run of name characters, `_NAME_CHARS`) or one character
    before it (a quote, `<`, `#`), "start" only at the start of the line; such a rule is tried only there
    (`_sub_at`): scanned, the name/value rules cost about a third of a microsecond per character of every line
    that holds a secret word. `requires`: the rule runs only on lines that also contain one of these (folded).
    `gate`: regexes in place of keywords, for a rule with no literal to look for (a token of an unknown vendor): the
    rule runs on the lines where one of them is found (each a literal then a little: a fast `search`)."""
    return _Rule(keywords, source, repl, at, requires, gate)



#: Where a token starts: not inside a word, or right after an escaped tab or line break of a repr (`'a\\tAKIA...'`).
_TOKEN_START = r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))"  # noqa: S105 (a pattern)
_VENDOR_START = r"(?:(?<![A-Za-z0-9_.+-])|(?<=\\[nrt]))"
#: Token formats that vendors publish (their docs; gitleaks' rules): (keywords, the token's regex). Each is masked
#: wherever it stands, as a word of its own. The table is the vendors' formats, not this corpus' samples; tokens of
#: vendors it does not name are left to `_PREFIXED_RANDOM` (a prefix, then a random-looking body).
_VENDOR_TOKENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("dop_v1_", "doo_v1_", "dor_v1_"), r"do[por]_v1_[a-f0-9]{64}"),  # DigitalOcean
    (("shpat_", "shpca_", "shppa_", "shpss_"), r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),  # Shopify
    (("lin_api_", "lin_oauth_"), r"lin_(?:api|oauth)_[A-Za-z0-9]{32,}"),  # Linear
    (("pplx-",), r"pplx-[A-Za-z0-9]{32,}"),  # Perplexity
    (("esecret_",), r"esecret_[A-Za-z0-9]{20,}"),  # Anyscale
    (("tskey-",), r"tskey-(?:[a-z]+-)?[A-Za-z0-9]{6,}-[A-Za-z0-9]{16,}"),  # Tailscale
    (("sntrys_", "sntryu_"), r"sntry[su]_[A-Za-z0-9+/=_]{40,}"),  # Sentry
    (("glc_",), r"glc_[A-Za-z0-9+/]{32,}={0,2}"),  # Grafana Cloud
    (("atatt3", "atctt3", "atbb"), r"(?:AT[AC]TT3[A-Za-z0-9_=-]{60,}|ATBB[A-Za-z0-9]{32,})"),  # Atlassian, Bitbucket
    (("figd_", "figu_"), r"fig[du]_[A-Za-z0-9_-]{30,}"),  # Figma
    (("pul-",), r"pul-[a-f0-9]{40}"),  # Pulumi
    (("pscale_",), r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9=._-]{32,64}"),  # PlanetScale
    (("dp.pt.", "dp.st.", "dp.ct.", "dp.sa.", "dp.scim.", "dp.audit."),
     r"dp\.(?:pt|st|ct|sa|scim|audit)\.[A-Za-z0-9]{40,}"),  # Doppler
    (("ops_eyj",), r"ops_eyJ[A-Za-z0-9+/]{40,}={0,3}"),  # 1Password service account
    (("sbp_", "sb_secret_"), r"(?:sbp_[a-f0-9]{40}|sb_secret_[A-Za-z0-9_-]{20,})"),  # Supabase
    (("pcsk_",), r"pcsk_[A-Za-z0-9_]{40,}"),  # Pinecone
    (("api_org_",), r"api_org_[A-Za-z0-9]{30,}"),  # Hugging Face organization token
    (("squ_", "sqp_", "sqa_"), r"sq[upa]_[a-f0-9]{40}"),  # SonarQube
    (("bkua_",), r"bkua_[a-f0-9]{40}"),  # Buildkite
    (("gocspx-",), r"GOCSPX-[A-Za-z0-9_-]{24,}"),  # Google OAuth client secret
    (("1//0",), r"1//0[A-Za-z0-9_-]{40,}"),  # Google OAuth refresh token
    ((":aa",), r"(?:(?<=/bot)|(?<![A-Za-z0-9_.+-])|(?<=\\[nrt]))[0-9]{5,16}:AA[A-Za-z0-9_-]{30,}"),  # Telegram
    (tuple(f"sk{c}" for c in "0123456789abcdef"), r"SK[0-9a-fA-F]{32}"),  # Twilio API key
    (("nrak-", "nrjs-", "nrii-", "nral-", "nraa-"), r"NR(?:AK|JS|II|AL|AA)-[A-Z0-9]{19,}"),  # New Relic
    (tuple(f"key-{c}" for c in "0123456789abcdef"), r"key-[a-f0-9]{32}"),  # Mailgun
    (("hrku-",), r"HRKU-[A-Za-z0-9_-]{40,}"),  # Heroku
    (("akcp", "cmvmdgtu"), r"(?:AKCp[A-Za-z0-9]{60,}|cmVmdGtu[A-Za-z0-9]{50,})"),  # JFrog
    (("rubygems_",), r"rubygems_[a-f0-9]{48}"),  # RubyGems
    (("sk_",), r"sk_[a-f0-9]{48}"),  # ElevenLabs
    (("e2b_",), r"e2b_[a-f0-9]{40}"),  # E2B
    (("tvly-",), r"tvly-(?:[a-z]+-)?[A-Za-z0-9]{30,}"),  # Tavily
    (("csk-",), r"csk-[a-z0-9]{40,}"),  # Cerebras
    (("nfp_",), r"nfp_[A-Za-z0-9]{30,}"),  # Netlify
    (("ntn_",), r"ntn_[0-9]{11}[A-Za-z0-9]{35}"),  # Notion
    (("eaa",), r"EAA[A-Za-z0-9]{60,}"),  # Square (EAAA), Meta Graph API
    (("sq0atp-", "sq0csp-"), r"sq0(?:atp|csp)-[A-Za-z0-9_-]{22,}"),  # Square
    (("gr1348941",), r"GR1348941[A-Za-z0-9_-]{20,}"),  # GitLab runner registration token
    (("ltai",), r"LTAI[A-Za-z0-9]{12,20}"),  # Alibaba Cloud AccessKey ID
    (("akid",), r"AKID[A-Za-z0-9]{32}"),  # Tencent Cloud SecretId
    (("fwogzxivyxdz", "iqojb3jpz2lux2vj"), r"(?:FwoGZXIvYXdz|IQoJb3JpZ2luX2Vj)[A-Za-z0-9+/]{20,}={0,2}"),  # AWS session
    (("q~",), r"[A-Za-z0-9_~.]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34}"),  # Azure AD client secret
    (("ccipat_",), r"CCIPAT_[A-Za-z0-9]{20,}_[a-f0-9]{40}"),  # CircleCI
    (("rnd_",), r"rnd_[A-Za-z0-9]{30,}"),  # Render
    (("fm1", "fm2"), r"fm[12][ar]?_[A-Za-z0-9+/=_-]{40,}"),  # Fly.io
    (("fw_",), r"fw_[A-Za-z0-9]{20,}"),  # Fireworks AI
    (("pa-",), r"pa-[A-Za-z0-9_-]{40,}"),  # Voyage AI
    (("jina_",), r"jina_[A-Za-z0-9_-]{40,}"),  # Jina AI
    (("llx-",), r"llx-[A-Za-z0-9]{40,}"),  # LlamaCloud
    (("bb_live_",), r"bb_live_[A-Za-z0-9_-]{20,}"),  # Browserbase
    (("napi_",), r"napi_[a-z0-9]{60,}"),  # Neon
    (("rpa_",), r"rpa_[A-Za-z0-9]{30,}"),  # RunPod
    (tuple(f"local-{c}" for c in "0123456789abcdef"), r"local-[a-f0-9]{40}"),  # Weights & Biases (local server)
    (("sess-",), r"sess-[A-Za-z0-9]{40}"),  # OpenAI session key
    (("ls__",), r"ls__[a-f0-9]{32}"),  # LangSmith (legacy)
    (("pmak-",), r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),  # Postman
    (("xkeysib-", "xsmtpsib-"), r"x(?:keysib|smtpsib)-[a-f0-9]{64}-[A-Za-z0-9]{16}"),  # Brevo
    (tuple(f"-us{d}" for d in "123456789"), r"[0-9a-f]{32}-us[0-9]{1,2}"),  # Mailchimp
    (("oy2",), r"oy2[a-z0-9]{43}"),  # NuGet
    (("clojars_",), r"CLOJARS_[a-f0-9]{60}"),  # Clojars
    (("dt0c01.",), r"dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}"),  # Dynatrace
    (("cfpat-",), r"CFPAT-[A-Za-z0-9_-]{43}"),  # Contentful
    (("tfp_",), r"tfp_[A-Za-z0-9_-]{40,}"),  # Typeform
    (("shippo_",), r"shippo_(?:live|test)_[a-f0-9]{40}"),  # Shippo
    (("rdme_",), r"rdme_[a-z0-9]{70}"),  # ReadMe
    (("pnu_",), r"pnu_[A-Za-z0-9]{36}"),  # Prefect
    (("flwseck",), r"FLWSECK(?:_TEST)?-[a-f0-9]{32}-X"),  # Flutterwave
    (("v1.0-",), r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}"),  # Cloudflare Origin CA key
    (("dg9ro",), r"dG9rO[A-Za-z0-9+/]{40,}={0,2}"),  # Intercom (base64 of "tok:")
    (("atlasv1",), r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}"),  # Terraform Cloud
    (("glagent-", "glffct-"), r"gl(?:agent|ffct)-[A-Za-z0-9_-]{20,}"),  # GitLab agent, feature-flag client
)
#: A token of a vendor the table does not name: a short prefix that ends in "_" or "-" (`dop_v1_`, `lin_api_`,
#: `pplx-`, `sntrys_`), then a body of 20+ letters and digits that `_looks_random` (not a word, a name or a hex
#: hash: a request id `chatcmpl-<hex>` or a path's `blobs/<sha256>` stays readable). Never inside a path or a word.
_PREFIXED_RANDOM = (r"(?:(?<![A-Za-z0-9_.+/~%\\-])|(?<=\\[nrt]))"
                    r"(?P<prefix>[A-Za-z][A-Za-z0-9]{1,11}(?:[_-][A-Za-z0-9]{1,8}){0,2}[_-])"
                    r"(?P<body>[A-Za-z0-9]{20,}(?:[_-][A-Za-z0-9]{4,})*)(?![A-Za-z0-9_+/=~\\-]|\.[A-Za-z0-9])")
#: What a line must contain for `_PREFIXED_RANDOM` to be tried at all (regexes in place of keywords: the prefix is not
#: known): "_" or "-" followed by 20 letters and digits; two searches for a literal, far cheaper than the rule.
_PREFIXED_RANDOM_GATE = (r"_[A-Za-z0-9]{20}", r"-[A-Za-z0-9]{20}")
#: Prefixes of object ids, hashes and names (not credentials): `chatcmpl-<hex>`, `req_...`, `run-...`, `sha256-...`.
_ID_PREFIXES = frozenset((
    "chatcmpl", "cmpl", "req", "request", "msg", "run", "job", "trace", "span", "call", "toolu", "file", "batch",
    "ft", "ftjob", "asst", "thread", "step", "vs", "org", "proj", "user", "usr", "acct", "cus", "sub", "evt", "price",
    "prod", "pi", "ch", "txn", "sha1", "sha224", "sha256", "sha384", "sha512", "md5", "blake2b", "blake3", "xxh64",
    "crc32", "uuid", "commit", "rev", "tmp", "temp", "cache", "model", "ckpt", "checkpoint", "session", "pod", "node",
    "gpu", "mig", "container", "docker", "cri", "k8s", "img", "image", "layer", "blob", "hash", "digest", "snapshot",
    "build", "bundle", "artifact", "obj", "object", "task", "worker", "actor", "rid", "id", "uid", "guid", "test",
    "triton", "kernel", "cuda", "sm", "nccl", "torch", "vllm", "sglang", "raysubmit", "raylet", "wandb", "mlflow",
))


def _looks_random(body: str) -> bool:
    """Whether `body` (letters, digits, maybe "_"/"-") looks like random key material rather than a word, a name, a
    CamelCase identifier or a hex hash: 20+ letters and digits, not all hex, with the character spread and the
    changes between upper case, lower case and digits that random text has (a name has long runs of one kind)."""
    s = body.replace("_", "").replace("-", "")
    n = len(s)
    if n < 20 or all(c in "0123456789abcdef" for c in s) or all(c in "0123456789ABCDEF" for c in s):
        return False
    kinds = ["u" if c.isupper() else "l" if c.islower() else "d" for c in s]
    changes = sum(a != b for a, b in itertools.pairwise(kinds))
    counts: dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    entropy = -sum(k / n * math.log2(k / n) for k in counts.values())
    present = set(kinds)
    if present == {"u", "l", "d"}:
        return entropy >= 3.7 and changes >= 0.35 * n
    if present in ({"l", "d"}, {"u", "d"}):
        return n >= 24 and entropy >= 3.8 and changes >= 0.15 * n and kinds.count("d") >= 3
    if present == {"u", "l"}:
        return n >= 30 and entropy >= 4.0 and changes >= 0.35 * n
    return False


def _prefixed_random(m: re.Match[str]) -> str:
    """Replacement for `_PREFIXED_RANDOM`: the whole token masked when its body looks random and its prefix is not an
    id's (`_ID_PREFIXES`); else the text as it was."""
    prefix = m.group("prefix").lower().rstrip("_-")
    first = re.split(r"[_-]", prefix)[0]
    if first in _ID_PREFIXES or not _looks_random(m.group("body")):
        return m.group(0)
    return MASK


_RULES: tuple[_Rule, ...] = (
    # A PEM private key on one line (or its BEGIN line): BEGIN marker through END marker / end of line.
    _rule(("private",), rf"(?i){_PEM_BEGIN_RE}.*?(?:{_PEM_END_RE}|$)", MASK),
    # URL credentials: scheme://user:password@host, scheme://:password@host (password up to the last @);
    # first, so no name/value form takes `scheme` or `user:` for a value
    _rule(("://", ":\\/\\/"), r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*:\\?/\\?/[^/\\\s:]*:)[^\s/?\\]+@", rf"\1{MASK}@"),
    # a long opaque user and no password: a token (https://TOKEN@git.host/x.git)
    _rule(("://",), r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)[A-Za-z0-9_-]{20,}@", rf"\1{MASK}@"),
    # Well-known token formats. Like the two above, these run before the forms below: those decide where a
    # value ends by looking at what follows, and must see the same text when run again on their output.
    _rule(("github_pat_",), rf"{_TOKEN_START}github_pat_[A-Za-z0-9_]{{20,}}", MASK),
    _rule(("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), rf"{_TOKEN_START}gh[pousr]_[A-Za-z0-9]{{20,}}", MASK),
    _rule(("glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glsoat-", "glcbt-", "glimt-", "gloas-"),
          rf"{_TOKEN_START}gl(?:pat|dt|rt|ptt|ft|soat|cbt|imt|oas)-[A-Za-z0-9_.-]{{16,}}", MASK),
    _rule(("nvapi-",), rf"{_TOKEN_START}nvapi-[A-Za-z0-9_-]{{16,}}", MASK),
    _rule(("hf_",), rf"{_TOKEN_START}hf_[A-Za-z0-9]{{16,}}", MASK),
    _rule(("sk-",), rf"{_TOKEN_START}sk-[A-Za-z0-9_-]{{16,}}", MASK),
    _rule(("xox",), rf"{_TOKEN_START}xox[abposre]-[A-Za-z0-9-]{{8,}}", MASK),
    _rule(("xapp-",), rf"{_TOKEN_START}xapp-[A-Za-z0-9-]{{8,}}", MASK),
    # an AWS secret access key (40 characters of base64) on the same line as its key id: `aws sts ... --output text`
    # rows, a CSV of credentials; first, while the key id is still there to tell it
    _rule(("akia", "asia", "abia", "acca", "a3t"),
          rf"(?:{_TOKEN_START}(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{{16}}(?![0-9A-Za-z])[^\n]{{0,300}}?"
          rf"(?:(?<![A-Za-z0-9/+=])|(?<=\\[nrt]))(?P<val>[A-Za-z0-9/+]{{40}})(?![A-Za-z0-9/+=])"
          rf"|(?:(?<![A-Za-z0-9/+=])|(?<=\\[nrt]))(?P<val_before>[A-Za-z0-9/+]{{40}})(?![A-Za-z0-9/+=])"
          rf"(?=[^\n]{{0,300}}?{_TOKEN_START}(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{{16}}(?![0-9A-Za-z])))",
          _aws_secret),
    _rule(("akia", "asia", "abia", "acca", "a3t"),
          rf"{_TOKEN_START}(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{{16}}(?![0-9A-Za-z])", MASK),
    _rule(("aiza",), rf"{_TOKEN_START}AIza[0-9A-Za-z_-]{{35,}}", MASK),
    _rule(("ya29.",), rf"{_TOKEN_START}ya29\.[0-9A-Za-z_-]{{20,}}", MASK),  # Google OAuth access token
    _rule(("_live_", "_test_"), rf"{_TOKEN_START}(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{{16,}}", MASK),  # Stripe keys
    _rule(("pypi-age",), rf"{_TOKEN_START}pypi-AgE[A-Za-z0-9_-]{{20,}}", MASK),  # PyPI API token
    _rule(("hvs.", "hvb.", "hvr."), rf"{_TOKEN_START}hv[sbr]\.[A-Za-z0-9_-]{{20,}}", MASK),  # HashiCorp Vault token
    _rule(("r8_", "gsk_", "xai-", "lsv2_", "glsa_"),
          rf"{_TOKEN_START}(?:r8_[A-Za-z0-9]{{30,}}|gsk_[A-Za-z0-9]{{40,}}|xai-[A-Za-z0-9]{{40,}}"
                r"|lsv2_(?:pt|sk)_[A-Za-z0-9_]{30,}|glsa_[A-Za-z0-9_]{30,})", MASK),  # Replicate Groq xAI LangSmith
    # (and Grafana service-account tokens)
    _rule(("age-secret-key-1",), rf"{_TOKEN_START}AGE-SECRET-KEY-1[0-9A-Z]{{40,}}", MASK),  # age private key
    _rule(("discord",), r"(?i)(https?://(?:\w+\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/)[A-Za-z0-9_-]{20,}",
     rf"\1{MASK}"),  # Discord webhook URL
    _rule(("npm_",), rf"{_TOKEN_START}npm_[A-Za-z0-9]{{30,}}", MASK),  # npm access token
    _rule(("dckr_",), rf"{_TOKEN_START}dckr_(?:pat|oat)_[A-Za-z0-9_-]{{16,}}", MASK),  # Docker Hub access token
    _rule(("sg.",), rf"{_TOKEN_START}SG\.[A-Za-z0-9_-]{{16,}}\.[A-Za-z0-9_-]{{16,}}", MASK),  # SendGrid API key
    _rule(("dapi",), rf"{_TOKEN_START}dapi[0-9a-f]{{32}}(?:-\d)?(?![0-9A-Za-z])", MASK),  # Databricks token
    # the vendors' published formats (`_VENDOR_TOKENS`), then any prefix with a random-looking body
    *(_rule(keywords, rf"{'' if token.startswith('(?:(?<') else _VENDOR_START}(?:{token})(?![A-Za-z0-9_+/=-])",
            MASK) for keywords, token in _VENDOR_TOKENS),
    _rule((), _PREFIXED_RANDOM, _prefixed_random, gate=_PREFIXED_RANDOM_GATE),
    # Airtable personal access tokens (pat<14>.<64 hex>): "pat" is too common a keyword, a gate finds them
    _rule((), rf"{_VENDOR_START}pat[A-Za-z0-9]{{14}}\.[a-f0-9]{{64}}(?![A-Za-z0-9_+/=-])", MASK,
          gate=(r"pat[A-Za-z0-9]{14}\.[a-f0-9]",)),
    # Slack incoming-webhook URLs: the path is the credential
    _rule(("hooks.slack",),
          r"(?i)(https?://hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/)[A-Za-z0-9/_-]{8,}",
     rf"\1{MASK}"),
    # JWT (a start inside a run of token characters is no JWT's start: keeps `-eyJ-eyJ...` linear)
    _rule(("eyj",), r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){1,3}", MASK),
    # base64 of a JSON object ("{\"..." is eyJ): a Docker config, a service-account key, a kubeconfig secret's data
    _rule(("eyj",), r"(?<![A-Za-z0-9+/_.-])eyJ[A-Za-z0-9+/_-]{36,}={0,2}(?![A-Za-z0-9+/=_-]|\.[A-Za-z0-9])", MASK),
    # base64 of a PEM block ("-----BEGIN" is LS0tLS1CRUdJTi): kubeconfig client-key-data, a Secret's tls.key, a key
    # or certificate in a Helm value; masked whole (a certificate is not secret, but no one reads base64)
    _rule(("ls0tls1crudjt",), r"(?<![A-Za-z0-9+/])LS0tLS1CRUdJT[A-Za-z0-9+/]*={0,2}", MASK),
    # a password given to a program by a flag or positionally (mysql -pX, sshpass -p X, docker login -p X,
    # wandb login KEY: _PROGRAM_FLAGS), also in an argument list ("-p", "X"), and the places of _POSITIONAL
    *(_rule(keywords, *_program_flag(progs, flag, gap)) for keywords, progs, flag, gap in _PROGRAM_FLAGS),
    *(_rule(keywords, source, _mask_values) for keywords, source in _POSITIONAL),
    _rule(("htpasswd",), rf"(?<![\w.-])htpasswd(?P<opts>(?:[ \t]+(?:-[rC][ \t]*[0-9]+|-[a-zA-Z]+))*)"
                         rf"(?P<args>(?:[ \t]+(?!-){_ARG}){{2,3}})", _htpasswd),
    # any program: -u USER -p PASSWORD side by side (sqlcmd -U sa -P x, ipmitool -U u -P x, racadm -u u -p x); a
    # port (`docker run -u 1000 -p 8080:80`, `ssh -l u -p 22`), a path or a variable after -p is kept
    _rule((" -u", "\t-u", "\"-u", "'-u", " -l ", "\t-l ", "--user", "--login"),
          rf"(?<![\w.-])(?:-[uU]|-l(?=[ \t])|--user(?:name)?|--login)(?:[ \t]*=[ \t]*|[ \t]*)(?!-)"
                rf"(?:{_ANY_QUOTED}|[^\s'\"]+)[ \t]+"
                rf"(?:-[pPwW]|--pass(?![\w-])|--pw(?![\w-]))(?:[ \t]*=[ \t]*|[ \t]*)"
                rf"(?![-/~.$]|[0-9:.,]+(?:[\s'\",)\]]|$)|\\[ \t]*$)"
                rf"(?!{_MASK_RE})(?P<val>{_ANY_QUOTED}|[^\s'\",\]]+)", _mask_values,
          requires=("-p", "-w", "--pass", "--pw")),
    # a flag ending in a glued "pass": keytool/jarsigner -storepass X, -keypass X, -srcstorepass X
    _rule(("pass ", "pass\t", "pass=", "pass:"),
          rf"(?i)(?<![\w-])-{{1,2}}(?P<flag>[a-z][a-z0-9]*pass)(?:[ \t]*[=:][ \t]*|[ \t]+)"
                     rf"(?!-|{_MASK_RE})"
                     rf"(?P<val>{_ANY_QUOTED}|[^\s'\"]+)", _pass_flag),
    # USER:PASSWORD (USER,PASSWORD for lftp) to a client's user flag: curl -u, wget --user, lftp -u, HTTPie/xh -a,
    # ab -A (the user is kept)
    _rule(("curl", "wget", "lftp", "http ", "https ", "xh ", "xhs ", "ab ", "hey "),
          rf"(?<![\w.-])(?:curl|wget|lftp|(?:https?|xhs?|ab|hey)(?= ))(?![\w.-])[^\n|;&]{{0,{_FLAG_REACH}}}?[ \t]"
                r"(?:-u|--user|-a|--auth|-A)(?:[ \t]+|=|(?<=-u))[\"']?[^\s:,'\"]*[:,](?P<val>[^\s'\"]+)", _keep_head,
          requires=("-u", "--user", "-a", "--auth")),
    # a password echoed into a program that reads it on stdin: echo PW | docker login --password-stdin, | sudo -S,
    # | chpasswd, | kinit, (echo PW; echo PW) | smbpasswd -s; and `echo -n user:PW | base64`
    _rule(("echo", "printf"),
          r"(?i)(?<![\w-])(?P<head>(?:echo|printf)(?>[^|;&)\n]{0,400})"
                r"(?:;[ \t]*(?:echo|printf)(?>[^|;&)\n]{0,400})){0,4}\)?)(?P<rest>[ \t]*\|[^|;&()\n]{0,400})",
          _piped_password,
          requires=("stdin", "sudo", "chpasswd", "kinit", "passwd", "-fd", "cryptsetup", "openconnect", "base64")),
    # ... or handed in a here-string: docker login --password-stdin <<< PW, sudo -S cmd <<< PW
    _rule(("<<<",), rf"{_STDIN_READER}[^\n|;&]{{0,400}}?<<<[ \t]*(?P<val>{_ARG})", _mask_values),
    # Cookie: / Set-Cookie: headers (every cookie in them: the rest of the line, or the quoted value)
    _rule(("cookie",),
          rf"(?i)(?<![\w-])(?P<q>[\"']?)(?:set-)?cookie(?P=q)[ \t]*:[ \t]*(?!{_MASK_RE})(?P<val>{_QUOTED}|\S.*)",
     _name_value),
    # Pwd=VALUE (ODBC connection strings), pwd: VALUE; a path (`PWD=/home/x`, the working directory) is kept
    _rule(("pwd",), rf"(?i)(?<![\w-])pwd[ \t]*[:=][ \t]*(?![/~.$]|{_MASK_RE})(?P<val>[^\s;'\",)}}]+)", _keep_head),
    # query parameters that carry a credential under a short name (?sig=... SAS signatures, ?auth=...); not ?key=
    # (an S3 object key) nor ?code= (a status code)
    _rule(("sig=", "auth=", "pass=", "pwd=", "secret=", "signature="),
          rf"(?i)(?<=[?&;])(?:sig|auth|pass|pwd|secret|signature)=(?!{_MASK_RE})(?P<val>[^&#;\s'\"]+)",
     _keep_head),
    # JSON inside a string, quotes escaped: {\"password\": \"VALUE\"}
    _rule((_NAME_KW,),
          rf"(?i)(?<!\\)\\{{1,3}}(?P<eq>[\"'])(?<!#){_NAME}\\{{1,3}}(?P=eq){_SEP}\\{{1,3}}(?P=eq)(?!{_MASK_RE})"
                rf"(?P<val>(?:(?!\\[\"']).)+)",
     _keep_head, requires=("\\",)),
    # the same forms written encoded: URL-encoded (`api%5Fkey=v`, `password%3Dv`, `%22token%22%3A%22v%22`, twice:
    # `%253D`), JSON \\u escapes (`\\u0022password\\u0022`, `api\\u005fkey`), HTML entities (`&quot;apiKey&quot;`),
    # or a name as is with a backslash-escaped value (`{api_key: \\"v\\"}`) (`_encoded_value`)
    _rule(_ENCODED_KW,
          rf"(?i)(?:(?<![\w%\\-])|(?<=%[0-9a-f]{{2}})|(?<=\\u[0-9a-f]{{4}}))(?P<q1>{_ESC_QUOTE}|[\"'])?(?P<name>(?:[a-z0-9]+{_ESC_SEP})*[a-z0-9]*?(?:{_ESC_WORDS}))"
          rf"(?P<q2>{_ESC_QUOTE}|[\"'])?[ \t]*(?P<eq>{_ESC_EQ})[ \t]*(?:%20|\+)*(?P<q3>{_ESC_QUOTE}|[\"'])?"
          rf"(?!{_MASK_RE}|(?:none|null|nil|true|false)\b){_NOT_A_SECRET_FLAG}(?P<val>{_ESC_VALUE})", _encoded_value,
          requires=("token", "secret", "pass", "pwd", "key", "auth", "credential", "sig")),
    # {"name": "HF_TOKEN", "value": "..."} (Kubernetes / ECS env lists, SSM parameters `"Name": "/prod/db/password"`,
    # CloudFormation `"ParameterKey": "DbPassword", "ParameterValue": ...`), and a record that says it is a key
    # (`az storage account keys list`: `"keyName": "key1", "permissions": "FULL", "value": ...`)
    _rule((_NAME_KW, "keyname", "key_name"),
          rf"(?i)((?:[\"'](?:name|key|parameterkey|variable)[\"'][ \t]*:[ \t]*[\"'](?:[\w./-]*/)?{_NAME}[\"']"
                rf"|[\"']key_?name[\"'][ \t]*:[ \t]*{_ANY_QUOTED})[ \t]*,[ \t]*(?:[\"']\w+[\"'][ \t]*:"
                rf"[ \t]*[^,{{}}]*,[ \t]*){{0,3}}[\"'](?:parameter|secret)?value[\"'][ \t]*:[ \t]*)"
                rf"(?P<val>{_ANY_QUOTED})",
          _keep_head),
    # a bare "key" whose value looks like key material (`~/.kaggle/kaggle.json`: {"username": ..., "key": "<hex>"})
    _rule(("\"key\"", "'key'"), r"(?P<q>[\"'])key(?P=q)[ \t]*:[ \t]*(?P<vq>[\"'])(?P<val>[A-Za-z0-9+/=_-]{20,})(?P=vq)",
          _key_value),
    # a user and a password handed to a call: auth=("user", "pw"), HTTPBasicAuth("u", "pw"), aiohttp.BasicAuth,
    # req.SetBasicAuth, UsernamePasswordCredentials, NetworkCredential, smtp.login("u", "pw"), ssh.connect(host,
    # port, "u", "pw"), add_password(realm, uri, "u", "pw") (`_credential_call`)
    _rule(("auth", "credential", "login(", "connect(", "add_password"),
          r"(?i)(?<![\w])(?P<call>(?:[\w.]*\.)?(?:(?:set_?)?basic_?auth|http(?:basic|digest|proxy)auth|digest_?auth"
          r"|\w*credentials?|add_password|authenticate)[ \t]*\(|(?:login|connect)\("
          r"|(?:auth|basic_?auth|credentials|creds)[ \t]*[=:][ \t]*[(\[])(?P<args>[^\n)\]]{0,400})[)\]]",
          _credential_call),
    # a login call that takes one credential: wandb.login(key="v"), huggingface_hub.login("v"), hf.login(token)
    _rule(("login(",),
          rf"(?i)(?<![\w])(?:[\w.]*\.)?login\([ \t]*(?:(?:key|token|api_key)[ \t]*=[ \t]*(?!{_MASK_RE})"
          rf"(?P<kv>{_ANY_QUOTED})|(?P<val>{_ANY_QUOTED})[ \t]*\))", _login_call),
    # base64 of a "user:password" literal: btoa('u:pw'), base64.b64encode(b"u:pw"), EncodeToString([]byte("u:pw"))
    _rule(("btoa", "b64encode", "encodetostring", "base64"),
          r"(?i)(?:btoa|b64encode|encodetostring|base64_encode|base64\.encode\w*)[ \t]*\([ \t]*(?:b|\[\]byte\()?"
          r"(?P<q>[\"'])[^\"'\s:]*:(?P<val>[^\"'\s]+)(?P=q)", _keep_head),
    # ('api_key', 'v') pairs, also bytes: (b'x-api-key', b'v'); b'Authorization': b'Basic ...'
    _rule((_NAME_KW, "authorization"),
          rf"(?i)\([ \t]*b?([\"'])(?:[\w.:/-]*[.:/])?(?:{_NAME}|authorization)\1[ \t]*,[ \t]*b?(?P<val>{_ANY_QUOTED})",
          _keep_head),
    _rule((_NAME_KW, "authorization"),
          rf"(?i)b([\"'])(?:{_NAME}|authorization)\1[ \t]*:[ \t]*b(?P<val>{_ANY_QUOTED})", _keep_head),
    # XML: <password>v</password>, <add key="ApiKey" value="v"/>
    _rule((_NAME_KW,), rf"(?i)<({_NAME})>(?P<val>[^<\n]+)</\1>", _keep_head, at="name"),
    _rule((_NAME_KW,),
          rf"(?i)\b(?:key|name)=([\"']){_NAME}\1[ \t]+value=(?P<val>{_ANY_QUOTED})", _keep_head,
          requires=("key=", "name=")),
    # SQL `IDENTIFIED BY 'pw'`, redis `requirepass pw` / `masterauth pw`, `AUTH pw` at a redis prompt
    _rule(("identified",),
          rf"(?i)\bIDENTIFIED[ \t]+(?:WITH[ \t]+\S+[ \t]+)?BY[ \t]+(?!{_MASK_RE})(?P<val>{_ANY_QUOTED}|\S+)",
     _keep_head),
    _rule(("requirepass", "masterauth"),
          r"(?i)(?<![\w-])(?:requirepass|masterauth)[ \t]+(?!\[REDACTED\])(?P<val>\S+)", _keep_head),
    _rule(("auth",), r"(?:^|(?<=> ))AUTH[ \t]+(?:\S+[ \t]+)?(?!\[REDACTED\])(?P<val>\S+)[ \t]*$", _keep_head),
    # a command that sets a named variable or setting, its value after a blank: setx NAME v (Windows), setenv NAME v
    # (csh, launchctl), %env NAME v (IPython), ENV NAME v (Dockerfile), set -gx / --export NAME v (fish),
    # aws configure set NAME v, npm/yarn/kubectl/pulumi config set [--secret] NAME v, dotnet user-secrets set "K" "v",
    # rclone config create REMOTE TYPE ... NAME v (also a namespaced or quoted name: `//host/:_authToken`, `a.b.token`)
    _rule((_NAME_KW,),
          rf"(?i)(?<![\w%-])(?:setx|setenv|%env|(?-i:ENV)|set(?:[ \t]+--?[a-z][\w-]*)+"
                rf"|(?:configure|config|user-secrets|secrets?)(?:[ \t]+--?[\w-]+)*[ \t]+(?:set|create|update|add)"
                rf"(?:[ \t]+--?[\w-]+)*(?:[ \t]+[^\s=|;&'\"-][^\s=|;&]*){{0,12}}?)"
                rf"[ \t]+[\"']?(?:[\w./:@-]*[./:])?{_NAME}[\"']?[ \t]+(?!-|{_MASK_RE}){_GUARD}"
                rf"(?P<val>{_ANY_QUOTED}|[^\s|;&]+)",
          _keep_head, requires=_SET_VERBS),
    # a secret-named target whose value a flag gives: gh secret set NAME --body v, Set-Item Env:NAME -Value v,
    # aws ssm put-parameter --name /prod/db/password --value v, az keyvault secret set --name N --value v
    _rule((_NAME_KW,),
          rf"(?i)(?<![\w-]){_NAME}[\"']?(?:[ \t]+--?[a-z][\w-]*(?:[ \t]+(?!-)[^\s|;&]+)?){{0,8}}?[ \t]+"
                rf"--?(?:value|body|string-value|secret-string|secret-value|data)(?:[ \t]*=[ \t]*|[ \t]+)"
                rf"(?!{_MASK_RE}){_GUARD}(?P<val>{_ANY_QUOTED}|[^\s|;&]+)",
          _keep_head, at="name", requires=("value", "body", "string", "data")),
    # a commented-out assignment (`#API_KEY=...`) or a URL fragment (`#access_token=...`); `#token: 40` counters kept
    _rule((_NAME_KW,),
          rf"(?i)(?<=#)(?P<q>[\"']?){_NAME}(?P=q)(?>{_SEP})(?![0-9]+(?:[\s,;)]|$)|{_MASK_RE}){_NOT_A_SECRET_FLAG}"
          rf"(?P<val>[^\s&'\",;)]+)",
     _keep_head, at="name"),
    # a whole line `NAME: value with spaces` / `NAME = a b c` (YAML, INI): the rest of the line (not `NAME=v cmd`)
    _rule((_NAME_KW,), rf"(?i)^[ \t]*(?:-[ \t]+)?(?<!#){_NAME}(?:[ \t]*:[ \t]+|[ \t]+=[ \t]*)"
                rf"(?![\"'\[{{(]|{_MASK_RE}|(?:none|null|nil|true|false|undefined|~)[ \t]*$){_GUARD}"
                rf"(?P<val>\S[^\n]*?\s\S[^\n]*?)[ \t]*$", _keep_head, at="start"),
    # Authorization: [scheme] value: a published scheme (`_AUTH_SCHEMES`) is kept; a word that is not one, followed by
    # another, may be a scheme or the credential itself: both are masked (`Authorization: Custom-Scheme v`)
    _rule(("authorization",), rf"(?i)(?<![\w-])(?P<q>[\"']?)(?:proxy-)?authorization(?P=q)[ \t]*[:=][ \t]*"
                rf"(?:(?:{_AUTH_SCHEMES})[ \t]+{_GUARD}(?P<val>{_QUOTED}|{_ANY})"
                rf"|{_GUARD}(?P<val_unknown>(?![\"'][ \t])(?:{_QUOTED_UNNAMED})"
                rf"|[A-Za-z][\w.~+/=-]{{0,60}}[ \t]+(?=[^\s'\"]){_ANY}|{_ANY}))",
     _auth_value),
    # --api-key VALUE / --api_key=VALUE / --hf_token VALUE / --password='x y'
    _rule((_NAME_KW,),
          rf"(?i)(?<![\w-])--?{_NAME}(?:[ \t]*=[ \t]*|[ \t]+){_GUARD}(?!-|\\[ \t]*$)(?P<val>{_QUOTED}|{_ANY})",
     _name_value, at="name"),
    # an argument list: "--api-key", "VALUE" (Kubernetes args, Compose command, subprocess.run([...]), a repr of argv)
    _rule((_NAME_KW,), rf"(?i)(?P<q>[\"'])--?{_NAME}(?P=q)[ \t]*,[ \t]*(?!{_MASK_RE}|(?P=q)--?[a-z])"
                       rf"(?P<val>{_ANY_QUOTED})", _mask_values, at="name"),
    # 'api_key': ['KEY'] (vLLM's non-default args), api_key: Some("KEY") (TGI's Args): the quoted value inside
    _rule((_NAME_KW,), rf"(?i)(?<![\w-])(?P<q>[\"']?)(?<!#){_NAME}(?P=q){_SEP}{_WRAPPED}{_GUARD}"
                rf"(?P<val>{_QUOTED})(?P<more>(?:[ \t]*,[ \t]*{_ANY_QUOTED})*)",
     _wrapped_value, at="name"),
    # NAME=value, "NAME": "value", X-Api-Key: value, ?api-key=value&... (a query value stops at & and #)
    # (atomic: after ? or & it is a query parameter, with no fall-back to the plain form)
    _rule((_NAME_KW,), rf"(?i)(?<![\w-])(?<!//)(?>(?P<qs>(?<=[?&]))?)(?P<q>[\"']?)(?<!#){_NAME}(?P=q)"
                rf"(?:(?<=[\"'])[ \t]*\])?{_SEP}(?:(?:bearer|basic|token)[ \t]+)?{_GUARD}(?:\$(?=[\"']))?"
                rf"(?P<val>{_QUOTED}|(?(qs){_QS}|{_KV}))",
     _name_value, at="name"),
    # netrc: machine HOST login USER password VALUE (also `login USER password VALUE`)
    _rule(("password", "passwd"), rf"(?i)(?<![\w-])(?:(?:machine|login|account)[ \t]+\S+[ \t]+|default[ \t]+)"
                rf"(?:(?:login|account|port)[ \t]+\S+[ \t]+){{0,3}}(?:password|passwd)[ \t]+{_GUARD}(?P<val>{_ANY})",
     _name_value),
    # prose: `password X`, `the password is X`, `passphrase 'X'` (an ordinary word after it is kept: _PROSE_WORDS)
    _rule(("password", "passwd", "passphrase"),
          rf"(?i)(?<![\w-])(?:password|passwd|passphrase)(?:[ \t]+(?:is|was|to|of))?[ \t]+(?![=:|]){_GUARD}"
                rf"(?!(?:{_PROSE_WORDS}|{_MASK_RE})(?![\w-]))(?P<val>{_QUOTED}|[^\s,;]+)", _name_value),
    # Bearer VALUE anywhere
    _rule(("bearer",), rf"(?i)(?<![\w-])bearer[ \t]+{_GUARD}(?P<val>(?={_B64URL}{{8}}){_run(_B64URL)}|{_MASK_RE})",
     _name_value),
)

# A line that looks like PEM body (base64, no spaces). A "long" one is what a full body line looks like.
_B64_LINE = _LazyPattern(r"[ \t]*[A-Za-z0-9+/=]+[ \t]*")
_B64_LONG = _LazyPattern(r"[ \t]*[A-Za-z0-9+/=]{60,}[ \t]*")
#: A line of a multi-line text that could be one `_b64_runs` or `_after_block` masks (Redactor._untouched).
_B64_LONG_START = _LazyPattern(r"(?m)^[ \t]*[A-Za-z0-9+/=]{60}")  # the start of one: enough to take the slow path
#: A line break that `str.splitlines` splits on besides "\n" (Redactor._untouched).
_ODD_BREAK = _LazyPattern(r"[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_HEX_ONLY = _LazyPattern(r"[ \t]*[0-9A-Fa-f=]+[ \t]*")
_PEM_HEADER = _LazyPattern(r"(?i)[ \t]*(?:Proc-Type|DEK-Info|Comment)[ \t]*:.*")
# Fewer than this many consecutive long base64 lines with no PEM marker at all are left alone.
_B64_RUN = 3
#: The shortest line `_B64_LONG` can match (what it takes to be part of key material with no marker in view).
_B64_LONG_MIN = 60


def _mask_whole(line: str) -> str:
    """MASK in place of a line's content, keeping its indentation."""
    return line[: len(line) - len(line.lstrip(" \t"))] + MASK


def _leading_end(line: str) -> int | None:
    """Where the text after a line's closing PEM marker(s) starts: the end of the last END marker that comes
    before any BEGIN marker on the line; None when the line has no such END marker."""
    begin = _PEM_BEGIN.search(line)
    stop = begin.start() if begin else len(line)
    cut = None
    for end in _PEM_END.finditer(line, 0, stop):
        cut = end.end()
    return cut


def _opens(line: str) -> bool:
    """Whether a line opens a PEM block that goes on to the next lines (a BEGIN with no END after it)."""
    begins = list(_PEM_BEGIN.finditer(line))
    return bool(begins) and _PEM_END.search(line, begins[-1].end()) is None


def _pem_blocks(lines: list[str], out: list[str]) -> None:
    """Mask (in `out`) the PEM private-key material around BEGIN/END markers that needs context across lines;
    single-line forms (a BEGIN line, a key on one line) are left to the rules. Only called when some line
    contains "private" (both markers need it)."""
    n = len(lines)
    i = 0
    while i < n:
        line = lines[i]
        cut = _leading_end(line)
        if cut is not None:
            # END with no open block (the tail starts inside the key): mask up to the marker and the body
            # lines right above it (the last body line may be short; the ones above it are full lines).
            out[i] = MASK + line[cut:]
            j = i - 1
            while j >= 0 and (_B64_LONG.fullmatch(out[j]) or (j == i - 1 and _B64_LINE.fullmatch(out[j]))
                              or _PEM_HEADER.fullmatch(out[j])):
                out[j] = _mask_whole(out[j])
                j -= 1
        if not _opens(line):
            i = _after_block(out, i + 1) if cut is not None else i + 1
            continue
        # An open block: find its END before any other BEGIN.
        j = i + 1
        while j < n and not _PEM_END.search(lines[j]) and not _PEM_BEGIN.search(lines[j]):
            j += 1
        if j < n and _leading_end(lines[j]) is not None:
            for k in range(i + 1, j):
                out[k] = _mask_whole(lines[k])
            i = j  # the END line: masked above, and it may open the next block
            continue
        # Unterminated (the tail ends inside the key): mask what still looks like PEM body.
        k = i + 1
        while k < n and (_B64_LINE.fullmatch(lines[k]) or _PEM_HEADER.fullmatch(lines[k])
                         or (not lines[k].strip() and k + 1 < n and _B64_LINE.fullmatch(lines[k + 1]))):
            if lines[k].strip():
                out[k] = _mask_whole(lines[k])
            k += 1
        i = k


def _b64_runs(out: list[str]) -> None:
    """Mask (in `out`) key material with no marker in sight (a window inside a long key): a run of _B64_RUN or
    more long base64 lines that are not all hex."""
    n = len(out)
    # a line with a blank inside its text is no base64 line: most lines are ruled out without the regex
    long = [len(line) >= _B64_LONG_MIN and " " not in line.strip(" \t") and "\t" not in line.strip(" \t")
            and _B64_LONG.fullmatch(line) is not None for line in out]
    if long.count(True) < _B64_RUN:
        return
    i = 0
    while i < n:
        j = i
        while j < n and long[j]:
            j += 1
        if j - i >= _B64_RUN and any(not _HEX_ONLY.fullmatch(out[k]) for k in range(i, j)):
            for k in range(i, j):
                out[k] = _mask_whole(out[k])
        i = max(j, i + 1)


def _after_block(out: list[str], i: int) -> int:
    """Mask the long base64 lines directly following a PEM block; return the index after them."""
    while i < len(out) and _B64_LONG.fullmatch(out[i]):
        out[i] = _mask_whole(out[i])
        i += 1
    return i


# A line that ends in a secret's name and its separator with the value still to come: `password:`, `api_key: |`,
# `"client_secret":`, `--api-key \` (a shell continuation), `Authorization:`, also quoted in Slack code (`password:`).
# The value is on the next line. Every match contains a secret name that `_name_follows`, "authorization" or "cookie".
_DANGLING = _LazyPattern(
    rf"(?i)(?:(?:(?<![\w-])--?{_NAME}|(?<![\w-])(?P<q>\\?[\"']?)(?<!#)(?:{_NAME}|(?:proxy-)?authorization"
    rf"|(?:set-)?cookie)(?P=q)[ \t]*(?:=>|==?|:=?)|(?:^|-[ \t]+)name[ \t]*:[ \t]*[\"']?{_NAME}[\"']?)"
    # then nothing, a YAML block indicator, a shell continuation, an auth scheme, or an opening bracket
    rf"[ \t]*(?:[|>][-+]?[0-9]?|\\+|(?:bearer|basic|token)|Some\(|\[|\{{|\()?[ \t]*`?[ \t]*$"
    # or a multipart form field's header: its value comes after a blank line (RFC 7578)
    rf"|form-data;[ \t]*name=(?P<fq>[\"']?){_NAME}(?P=fq)[ \t]*`?[ \t]*$"
    # or a program's password flag (_PROGRAM_FLAGS) then a shell continuation: docker login -u ci -p \\
    rf"|(?-i:{_PROGRAM_CONTINUED}))")


# A line that starts a new record rather than carrying a value: a log line's prefix (a bracket, a timestamp, a
# severity), a table's `|`, a `key: value` or `key=value` pair, a flag. Taken for the value on the line above only
# when it is indented deeper than that line's name.
_RECORD_START = _LazyPattern(
    r"[ \t]*(?:[\[|({}<#]|//|(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL|FATAL|TRACE|NOTICE)\b"
    r"|\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d|\d\d-\d\d[ T]\d\d:|[A-Za-z_][\w.-]*[ \t]*(?::[ \t]|:$|=)|--?[A-Za-z])")


_LIST_ITEM = _LazyPattern(r"`?[ \t]*-[ \t]+\S")  # a YAML list item (also inside a Slack code quote)
# A secret's name, then a text that runs over the next lines up to a closer of its own: a heredoc (`password = <<EOT`
# ... `EOT`, Terraform, shell), a triple-quoted string (`API_TOKEN = """` ... `"""`, Python, TOML), an XML element
# whose text starts on the next line (`<password>` ... `</password>`). Every match contains a secret name that
# `_dangling_follows`.
_BLOCK_OPEN = _LazyPattern(
    rf"(?i)(?:(?<![\w-])[\"']?(?<!#){_NAME}[\"']?[ \t]*(?:=>|==?|:=?)[ \t]*"
    rf"(?:<<-?[ \t]*(?P<hq>[\"']?)(?P<tag>[a-z_]\w*)(?P=hq)|[rbuf]?(?P<tq>\"\"\"|'''))|<(?P<el>{_NAME})>)"
    rf"[ \t]*`?[ \t]*$")
#: How many lines a block's text is masked over when its closer does not come (a log cut inside it).
_BLOCK_REACH = 200


def _block_plan(lines: list[str], out: list[str], flagged: list[bool]) -> None:
    """Mask (in `out`) the text of the blocks `_BLOCK_OPEN` opens: every line after the opener up to its closer (the
    heredoc's tag alone on a line, the closing triple quote, `</name>`), the text before the closer on the closing
    line, or _BLOCK_REACH lines when no closer comes. `flagged[i]` says whether line i can open one (its keywords)."""
    n = len(lines)
    i = 0
    while i < n:
        m = _BLOCK_OPEN.search(lines[i]) if flagged[i] and lines[i] else None
        if m is None:
            i += 1
            continue
        tag, closer = m.group("tag"), m.group("tq") or (f"</{m.group('el')}>" if m.group("el") else "")
        j = i + 1
        while j < n and j <= i + _BLOCK_REACH:
            line = lines[j]
            if (line.strip() == tag) if tag else (closer.lower() in line.lower()):
                break
            if line.strip():
                out[j] = _mask_whole(line)
            j += 1
        if j < n and j <= i + _BLOCK_REACH and not tag:
            at = lines[j].lower().find(closer.lower())
            if lines[j][:at].strip():
                out[j] = _mask_whole(lines[j][:at]) + lines[j][at:]
        i = j + 1


def _indent(line: str) -> int:
    """Leading spaces and tabs of `line` (inside a Slack code quote: after its opening backtick)."""
    body = line[1:] if line.startswith("`") else line
    return len(body) - len(body.lstrip(" \t"))


def _next_line_plan(lines: list[str], out: list[str], dangling: list[bool],
                    redacted: Callable[[int], str] | None = None) -> None:
    """Mask (in `out`) the values that sit on the line after their name (`_DANGLING`): the next non-blank line
    (unless it is no deeper than the name's line and starts a record of its own: `_RECORD_START`, or it is a
    name with its value still to come itself, redacted or not: `redacted(j)` gives line j redacted on its own, so
    that redacting the result again masks nothing more), and the lines after it that are indented deeper than the
    name's line (a YAML block or nested mapping, a pretty-printed JSON value). `dangling[i]` says whether line i
    can match `_DANGLING` at all (its keywords)."""
    n = len(lines)
    for i, line in enumerate(lines):
        if not dangling[i] or not line or not _DANGLING.search(line):
            continue
        j = i + 1
        while j < n and not lines[j].strip(" \t`"):  # (an empty line quoted in Slack code is blank too)
            j += 1
        if j >= n or (dangling[j] and _DANGLING.search(lines[j])
                      and (redacted is None or _DANGLING.search(redacted(j)))):
            continue
        base = _indent(line)
        if _indent(lines[j]) <= base and _RECORD_START.match(lines[j]) and not _LIST_ITEM.match(lines[j]):
            continue
        out[j] = _mask_whole(out[j])
        k = j + 1
        if _LIST_ITEM.match(lines[j]):  # a YAML list under the name: its other items at the same indent too
            while k < n and _LIST_ITEM.match(lines[k]) and _indent(lines[k]) == _indent(lines[j]):
                out[k] = _mask_whole(out[k])
                k += 1
        while k < n and (not lines[k].strip() or _indent(lines[k]) > base) and _indent(lines[j]) > base:
            if lines[k].strip():
                out[k] = _mask_whole(out[k])
            k += 1


#: A key that names a secret: the same names the text rules mask a value after (ends in TOKEN, SECRET, PASSWORD,
#: API_KEY, CREDENTIALS, COOKIE, ...; in `_KEY`/`_PASS`/`_PWD` after a prefix: `openai_key`, `db_pass`,
#: `mysql_pwd`; not `pad_token`, `primary_key`, `bypass`). Use `.search(name)`: it is anchored at both ends.
SECRET_NAME_RE = _LazyPattern(rf"^{_NAME}$", re.IGNORECASE)

#: Characters of a line that `redact_then_cut` (and the log tail, bot.core.parse.log) redact before cutting it
#: for display: the shown part and far more context than any secret form needs; bounds the time a hostile
#: megabyte-long line costs.
REDACT_REACH = 16_384

#: Known secret values shorter than this are not masked by value (they would mask ordinary words).
MIN_SECRET_VALUE_LEN = 6

#: Texts up to this many characters have their redaction remembered (`Redactor`): command lines and log lines
#: repeat from probe to probe; longer ones are rare and are not kept (the memory stays small).
CACHE_MAX_CHARS = 4096
#: Passes of the rules over a line that the last pass changed, at most (`Redactor._settled`).
SETTLE_PASSES = 3
#: Remembered texts per Redactor (and per kind: whole texts, single lines); the memory is forgotten at once when
#: full, so a cache costs at most about CACHE_ENTRIES * CACHE_MAX_CHARS * 2 characters.
CACHE_ENTRIES = 4096

# Case folding for the keyword pass: what the rules' (?i) matches as an ASCII letter, lower-cased. `str.lower` does
# it for every character but these three (Python's re also takes dotless i and long s for i and s, and the dotted
# capital I lower-cases to two characters); tests/unit/test_redact_speed.py checks every code point.
_FOLD_FIXES = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})


def _fold(text: str) -> str:
    """`text` lower-cased for the keyword pass (see _FOLD_FIXES)."""
    return text.lower() if text.isascii() else text.translate(_FOLD_FIXES).lower()


#: Bits beyond the rules' own (rule i is bit i) in the keyword pass's answer.
_VALUE_BIT = 1 << len(_RULES)  # a known secret value may be on the line
_PEM_BIT = 1 << (len(_RULES) + 1)  # a PEM marker may be on the line
_DANGLING_BIT = 1 << (len(_RULES) + 2)  # the line may end in a secret's name (`_DANGLING`)
#: The line names a program of `_PROGRAM_CONTINUED_KW`: it may end in its password flag when it ends in a backslash.
_CONTINUED_BIT = 1 << (len(_RULES) + 3)
#: The rules tried only where a secret name starts, and at the start of the line (`_rule`'s `at`).
_AT_NAME = sum(1 << i for i, rule in enumerate(_RULES) if rule.at == "name")
_AT_START = sum(1 << i for i, rule in enumerate(_RULES) if rule.at == "start")
#: The rules that also need one of their `requires` on the line.
_REQUIRING = tuple((1 << i, rule.requires) for i, rule in enumerate(_RULES) if rule.requires)
#: The rules that also need one of their `requires` on the line, all together.
_REQUIRING_BITS = sum(bit for bit, _requires in _REQUIRING)


@functools.cache
def _gates() -> tuple[tuple[int, Callable[[str], re.Match[str] | None]], ...]:
    """(rule bit, the `search` of one of its gates) for every gate of every rule (compiled on first use)."""
    return tuple((1 << i, re.compile(g).search) for i, rule in enumerate(_RULES) for g in rule.gate)


@functools.cache
def _compiled(i: int) -> re.Pattern[str]:
    """Rule i's regex, compiled on first use (then cached: a pure function of i)."""
    return re.compile(_RULES[i].source)


def _keyword_table() -> dict[str, tuple[int, int, int]]:
    """Keyword -> (the bits its mere presence turns on, the bits it turns on when a secret name can end with it:
    the name/value rules' when `_name_follows`, the dangling-name check's when `_dangling_follows`; its length).
    Rule i is bit i; then the known values, PEM and dangling-name checks."""
    table: dict[str, list[int]] = {}

    def add(kw: str, bits: int, checked: int) -> None:
        entry = table.setdefault(kw, [0, 0])
        entry[0] |= bits
        entry[1] |= checked

    named = 0
    for i, rule in enumerate(_RULES):
        for kw in rule.keywords:
            if kw == _NAME_KW:
                named |= 1 << i
            else:
                add(kw, 1 << i, 0)
    for word in _SECRET_WORDS:
        add(word, 0, named | _DANGLING_BIT)
    add("private", _PEM_BIT, 0)
    for kw in ("authorization", "cookie"):  # `_DANGLING` also ends in these names
        add(kw, 0, _DANGLING_BIT)
    for kw in _PROGRAM_CONTINUED_KW:  # ... and in a program's password flag and a continuation (`_bits` checks)
        add(kw, _CONTINUED_BIT, 0)
    return {kw: (bits, checked, len(kw)) for kw, (bits, checked) in table.items()}


class RedactedLines(list):
    """Lines a view made only of what was redacted already and of what cannot hold a secret (numbers, states): a
    process table whose commands were redacted when their rows were read. `Redactor.deep` passes them as they are;
    what a template renders from them is redacted with the rest of the message all the same (bot.present.render),
    so this only spares a second pass over a table of thousands of lines."""

    __slots__ = ()


class Redactor:
    """The built-in rules plus configured extra patterns (the config's `redact_patterns`: Python regexes
    whose whole matches are masked) plus the secret VALUES the bot knows (Slack tokens, `${NAME}` values of
    the config's env maps, secret params of launches: `add_values`), masked wherever they appear, whatever
    flag, quote, list or format carries them. One object, built once and passed to whatever posts, stores
    or logs text. Raises re.error for an invalid pattern (the config validates them first). The patterns
    are fixed; the known values only grow.

    How it stays cheap (a few microseconds for a line with no secret in it): every rule carries keywords, and
    ONE multi-keyword pass over the lower-cased line (an Aho-Corasick automaton, pyahocorasick) tells which rules
    can match it; only those run (most lines contain no keyword at all). The known values are keywords too. Rules
    are compiled on first use, and the redaction of each text and line up to CACHE_MAX_CHARS is remembered
    (CACHE_ENTRIES of them), since command lines and log lines repeat from check to check. Thread-safe."""

    def __init__(self, patterns: Iterable[str] = (), values: Iterable[str] = ()):
        self._configured: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in patterns)
        self._values: set[str] = set()
        self._values_re: re.Pattern[str] | None = None
        self._values_always = False  # a value whose lower-casing depends on context (a Greek capital sigma)
        self._automaton: Any = None
        self._texts: dict[str, str] = {}
        self._lines: dict[str, str] = {}
        self._line_bits: dict[str, int] = {}
        self._memos: dict[str, dict[str, str]] = {}
        self._given: list[str] = []  # the values as given (stripped), in the order they came
        self._given_set: set[str] = set()
        self.add_values(values)

    @property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        """The configured patterns, then the known values' pattern (when there are values)."""
        return (*self._configured, self._values_re) if self._values_re is not None else self._configured

    def add_values(self, values: Iterable[Any]) -> None:
        """Mask these secret values (their str, stripped, at least MIN_SECRET_VALUE_LEN characters) from now
        on, as whole matches anywhere in a line; a value with line breaks line by line, and each also in its
        URL-encoded, JSON-escaped, shell-quoted and backslash-escaped forms."""
        new = set()
        for v in values:
            text = str(v).strip() if v is not None else ""
            if text and text not in self._given_set:
                self._given_set.add(text)
                self._given.append(text)
            # a value with line breaks: each of its lines; and the forms a value takes when it is quoted for a
            # URL, a JSON or Python string, or a shell
            for part in text.splitlines() or [""]:
                part = part.strip()
                escaped = json.dumps(part)[1:-1]
                new |= {part, urllib.parse.quote(part, safe=""), escaped, json.dumps(escaped)[1:-1],
                        escaped.encode("unicode_escape").decode("ascii"), shlex.quote(part),
                        part.encode("unicode_escape").decode("ascii")}
        new = {v for v in new if len(v) >= MIN_SECRET_VALUE_LEN and v != MASK} - self._values
        if not new:
            return
        self._values |= new
        alternation = "|".join(re.escape(v) for v in sorted(self._values, key=len, reverse=True))
        self._values_re = re.compile(alternation)
        self._values_always = any("\u03a3" in v for v in self._values)
        # what was remembered did not know these values; the automaton is built again with them on next use
        self._automaton = None
        self._texts = {}
        self._lines = {}
        self._line_bits = {}
        self._memos = {}

    @property
    def given_values(self) -> tuple[str, ...]:
        """Every value given to `add_values` (and the constructor), stripped, once each, in the order given: a list
        that only grows, so another Redactor fed its new tail masks the same (a probe worker's: bot.services.hosts)."""
        return tuple(self._given)

    def memo(self, name: str) -> dict[str, str]:
        """A dict named `name` where a caller keeps what it made of redacted texts (a probe's shown command lines:
        bot.core.probe.shown_command), emptied with this redactor's own caches when values are added. The caller
        bounds it (CACHE_ENTRIES, texts up to CACHE_MAX_CHARS)."""
        kept = self._memos.get(name)
        if kept is None:
            kept = self._memos[name] = {}
        return kept

    def _build_automaton(self) -> Any:
        import ahocorasick  # pyahocorasick

        automaton = ahocorasick.Automaton()
        table = _keyword_table()
        for value in self._values:
            kw = _fold(value)
            bits, checked, _n = table.get(kw, (0, 0, len(kw)))
            table[kw] = (bits | _VALUE_BIT, checked, len(kw))
        for kw, entry in table.items():
            automaton.add_word(kw, entry)
        automaton.make_automaton()
        self._automaton = automaton
        return automaton

    def _bits(self, line: str) -> int:
        """Which rules (bit i: rule i) and checks can match `line`: the OR of its keywords' bits."""
        automaton = self._automaton or self._build_automaton()
        bits = _VALUE_BIT if self._values_always else 0
        folded = _fold(line)
        for last, (always, checked, n) in automaton.iter(folded):
            bits |= always
            if not checked or bits & checked == checked:
                continue
            named = checked & ~_DANGLING_BIT
            if named and bits & named != named and _name_follows(folded, last + 1 - n, last + 1):
                bits |= named
            if checked & _DANGLING_BIT and not bits & _DANGLING_BIT and _dangling_follows(folded, last + 1):
                bits |= _DANGLING_BIT
        if bits & _CONTINUED_BIT:  # a program's line: it may end in its password flag only when continued
            bits &= ~_CONTINUED_BIT
            if folded.rstrip(" \t`").endswith("\\"):
                bits |= _DANGLING_BIT
        if bits & _REQUIRING_BITS:
            for bit, requires in _REQUIRING:
                if bits & bit and not any(r in folded for r in requires):
                    bits &= ~bit
        for bit, search in _gates():
            if not bits & bit and search(line):
                bits |= bit
        return bits

    def _bits_of(self, line: str) -> int:
        """`_bits(line)`, remembered for lines up to CACHE_MAX_CHARS (a rendered table's lines are redacted as the
        view's data, then in the message's text and again in its blocks)."""
        bits = self._line_bits.get(line)
        if bits is None:
            bits = self._bits(line)
            if len(line) <= CACHE_MAX_CHARS:
                if len(self._line_bits) >= CACHE_ENTRIES:
                    self._line_bits = {}
                self._line_bits[line] = bits
        return bits

    def _name_starts(self, line: str) -> list[int]:
        """Where the secret names that `_name_follows` start in `line` (the starts of their runs of name
        characters), and one character before each, in order: the only places where the match of a rule `at`
        "name" can start."""
        automaton = self._automaton or self._build_automaton()
        folded = _fold(line)
        starts = set()
        for last, (_always, checked, n) in automaton.iter(folded):
            if checked & ~_DANGLING_BIT and _name_follows(folded, last + 1 - n, last + 1):
                start = last + 1 - n
                while start > 0 and folded[start - 1] in _NAME_CHARS:
                    start -= 1
                starts.add(start)
                if start > 0:
                    starts.add(start - 1)
        return sorted(starts)

    def _apply(self, line: str, bits: int) -> str:
        """The rules `bits` allows, in order, on one line (no line breaks inside): the configured patterns and the
        known values first (a built-in form that masks only part of a value it does not fully understand, like
        `'api_key': ['KEY']`, must not leave the rest for them to miss), then the built-in rules; an anchored rule
        only where a secret name starts (`_sub_at`), which gives what its `sub` over the whole line gives."""
        for pat in self._configured:
            line = pat.sub(MASK, line)
        if bits & _VALUE_BIT and self._values_re is not None:
            line = self._values_re.sub(MASK, line)
        rules = bits & (_VALUE_BIT - 1)
        starts_of: tuple[str, list[int]] | None = None
        while rules:
            low = rules & -rules
            i = low.bit_length() - 1
            rules ^= low
            if low & _AT_NAME:
                if starts_of is None or starts_of[0] is not line:
                    starts_of = (line, self._name_starts(line))
                line = _sub_at(_compiled(i), _RULES[i].repl, line, starts_of[1])
            elif low & _AT_START:
                line = _sub_at(_compiled(i), _RULES[i].repl, line, [0])
            else:
                line = _compiled(i).sub(_RULES[i].repl, line)
        return line

    def _settled(self, line: str, bits: int) -> str:
        """`_apply(line, bits)`, applied again to what it returned while that changes (at most SETTLE_PASSES
        times): one rule's mask can make another rule's keyword appear next to a value (`hf_...--api-key v`),
        and the keyword pass looked at the line before it. Lines without a secret take one pass, and so do lines
        longer than CACHE_MAX_CHARS (each pass over a long line full of secrets costs as much as the first)."""
        done = self._apply(line, bits)
        if len(line) > CACHE_MAX_CHARS:  # a very long line (rare; hostile ones are full of masks) gets one pass
            return done
        for _ in range(SETTLE_PASSES):
            if done == line:
                break
            line, done = done, self._apply(done, self._bits_of(done))
        return done

    def _line(self, line: str, bits: int) -> str:
        """`_settled(line, bits)`, remembered for lines up to CACHE_MAX_CHARS."""
        if not line:
            return line
        if len(line) > CACHE_MAX_CHARS:
            return self._settled(line, bits)
        done = self._lines.get(line)
        if done is None:
            done = self._settled(line, bits)
            if len(self._lines) >= CACHE_ENTRIES:
                self._lines = {}
            self._lines[line] = done
        return done

    def lines(self, lines: list[str]) -> list[str]:
        """Return `lines` (each without its line break) with secrets replaced by `[REDACTED]`: a new list of the
        same length. Never raises for a list of str.

        Every line gets what `__call__` does to one line. On top of that, PEM private keys are tracked across
        lines: every line from `-----BEGIN ... PRIVATE KEY-----` to `-----END ... PRIVATE KEY-----` inclusive
        is masked (text before BEGIN on the first line and after END on the last is kept), and so are:
        long base64 lines (60+ characters of `[A-Za-z0-9+/=]`, no spaces) directly following such a block;
        the base64 lines above an END whose BEGIN is not in `lines` (a log tail that starts inside a key);
        the base64 lines after a BEGIN whose END is not in `lines`; and a run of 3+ long base64 lines that
        are not all hex (key material with neither marker in view). A value on the line after its name
        (`_next_line_plan`) is masked too, also across the escaped line breaks of a repr.
        """
        lines = list(lines)
        bits_of = self._bits_of
        bits = [bits_of(line) if line else 0 for line in lines]
        planned = list(lines)
        if any(b & _PEM_BIT for b in bits):
            _pem_blocks(lines, planned)
        if len(lines) >= _B64_RUN:
            _b64_runs(planned)
        if any(b & _DANGLING_BIT for b in bits):
            flagged = [bool(b & _DANGLING_BIT) for b in bits]
            _block_plan(lines, planned, flagged)
            _next_line_plan(lines, planned, flagged, lambda j: self._line(lines[j], bits[j]))
        for i, line in enumerate(planned):
            if "\\n" in line:  # a repr or JSON string with escaped line breaks: its lines are lines too
                parts = line.split("\\n")
                part_bits = [bits_of(p) for p in parts]
                dangling = [bool(b & _DANGLING_BIT) for b in part_bits]
                if any(dangling):
                    masked = list(parts)
                    _block_plan(parts, masked, dangling)
                    _next_line_plan(parts, masked, dangling, lambda j, ps=parts, pb=part_bits: self._line(ps[j], pb[j]))
                    planned[i] = "\\n".join(masked)
        # a line that no rule, value or configured pattern can touch (most lines) comes back as it is
        plain = not self._configured
        return [p if plain and not b and p is line else self._line(p, b if p is line else bits_of(p))
                for p, line, b in zip(planned, lines, bits, strict=True)]

    def __call__(self, text: str) -> str:
        """Return `text` with secrets replaced by `[REDACTED]`, keeping the names (`--api-key [REDACTED]`).

        `text` may be one line (a process command line, one log line) or a multi-line text; multi-line text
        is split on line breaks (which are kept as they were) and passed through `lines`, so PEM private-key
        blocks are masked across lines and no pattern ever spans a line break. Idempotent:
        `r(r(t)) == r(t)`. Never raises for str input.
        """
        if not text:
            return text
        if len(text) <= CACHE_MAX_CHARS:
            done = self._texts.get(text)
            if done is not None:
                return done
        if "\n" not in text and "\r" not in text and text.isprintable():  # one line: the common case
            # a line that no rule, value or configured pattern can touch (most lines) comes back as it is, at once
            if self._configured or "\\n" in text or self._bits_of(text):
                done = self.lines([text])[0]
            else:
                done = text
        elif "\n" in text and self._untouched(text):  # a whole message or table with no keyword in it
            done = text
        else:
            parts = text.splitlines(keepends=True)
            bodies = [p.splitlines()[0] for p in parts]
            redacted = self.lines(bodies)
            done = "".join(r + p[len(b):] for r, p, b in zip(redacted, parts, bodies, strict=True))
        if len(text) <= CACHE_MAX_CHARS:
            if len(self._texts) >= CACHE_ENTRIES:
                self._texts = {}
            self._texts[text] = done
        return done

    def _untouched(self, text: str) -> bool:
        """Whether `lines` would give every line of the multi-line `text` back unchanged, found in one pass over
        the whole text instead of line by line: no configured pattern, no keyword of any rule, value or PEM marker
        anywhere in it (the Aho-Corasick pass over the lower-cased text), no line that could be key material
        (`_B64_LONG_START`), and no line break other than "\\n" (which `str.splitlines` would split on too)."""
        if (self._configured or self._values_always or _B64_LONG_START.search(text)
                or any(search(text) for _bit, search in _gates())):
            return False
        if (any(c in text for c in "\r\x0b\x0c\x1c\x1d\x1e") if text.isascii() else _ODD_BREAK.search(text)):
            return False
        automaton = self._automaton or self._build_automaton()
        for _hit in automaton.iter(_fold(text)):
            return False
        return True

    def then_cut(self, text: str, width: int) -> str:
        """Return `text` redacted and THEN cut to at most `width` characters (the last one "…" when cut).

        Redacting first matters: cutting first can leave the start of a secret that no pattern recognises any
        more (`sk-ABCDEFGHIJ…`). Only the first max(REDACT_REACH, 8 * width) characters are redacted (the rest
        is never shown). `width` < 1 is treated as 1. Never raises for str input.
        """
        width = max(1, width)
        out = self((text or "")[: max(REDACT_REACH, 8 * width)])
        return out if len(out) <= width else out[: width - 1] + _ELLIPSIS

    def mapping(self, values: dict) -> dict:
        """Copy of `values` with every value whose KEY names a secret replaced by `[REDACTED]`, and every
        other string value redacted (so opaque secrets in secret-named params never leak)."""
        out = {}
        for k, v in values.items():
            if isinstance(k, str) and SECRET_NAME_RE.search(k):
                out[k] = MASK
            elif isinstance(v, str):
                out[k] = self(v)
            else:
                out[k] = v
        return out

    def deep(self, obj: Any) -> Any:
        """`obj` (str, dict, list or tuple, nested) with every string redacted; other values as they are. A list
        (or tuple) of one-line strings is redacted as consecutive lines (`lines`: a log tail, evidence lines,
        argument tokens), so a name on one line masks its value on the next; other lists and tuples element by
        element (a tuple comes back as a list). `RedactedLines` come back as they are."""
        if isinstance(obj, RedactedLines):
            return obj
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            return {k: self.deep(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(v, str) and "\n" not in v and "\r" not in v for v in obj):
                return self.lines(list(obj))
            return [self.deep(v) for v in obj]
        return obj


def _sub_at(pattern: re.Pattern[str], repl: _Repl, line: str, starts: list[int]) -> str:
    """`pattern.sub(repl, line)` for a pattern whose matches can only start at `starts` (sorted): tried there
    alone, left to right, each after the end of the last match (as `sub` does); the same string back when nothing
    matched."""
    parts: list[str] = []
    last = 0
    for start in starts:
        if start < last:
            continue
        m = pattern.match(line, start)
        if m is None or m.end() == m.start():
            continue
        parts.append(line[last:m.start()])
        parts.append(repl(m) if callable(repl) else m.expand(repl))
        last = m.end()
    if not parts:
        return line
    parts.append(line[last:])
    return "".join(parts)


def _for(extra: Iterable[re.Pattern[str]]) -> Redactor:
    """The Redactor of the built-in rules plus the compiled patterns `extra` (one per distinct tuple, made on first
    use; the module functions' `extra`)."""
    return _for_tuple(tuple(extra))


@functools.lru_cache(maxsize=64)
def _for_tuple(extra: tuple[re.Pattern[str], ...]) -> Redactor:
    """`_for` of a tuple (cached: the module functions' Redactors learn no values, so each is a pure function of
    `extra`)."""
    r = Redactor()
    r._configured = extra
    return r


def redact_lines(lines: list[str], extra: Iterable[re.Pattern[str]] = ()) -> list[str]:
    """`Redactor().lines(lines)`: the built-in rules, plus the compiled patterns `extra` (whole matches masked),
    over consecutive lines (see `Redactor.lines`)."""
    return _for(extra).lines(lines)


def redact(text: str, extra: Iterable[re.Pattern[str]] = ()) -> str:
    """`Redactor()(text)`: `text` with secrets replaced by `[REDACTED]` by the built-in rules, plus the compiled
    patterns `extra` (whole matches masked; see `Redactor.__call__`). Idempotent; never raises for str input."""
    return _for(extra)(text)


def redact_mapping(values: dict) -> dict:
    """`Redactor().mapping(values)`: secret-named keys' values masked, other strings redacted."""
    return _for(()).mapping(values)


def redact_then_cut(text: str, width: int, extra: Iterable[re.Pattern[str]] = ()) -> str:
    """`Redactor().then_cut(text, width)`: redacted (the built-in rules plus `extra`), then cut to `width`
    characters."""
    return _for(extra).then_cut(text, width)

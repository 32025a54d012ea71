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
  (`ssh_key=/root/.ssh/id_ed25519`), code (`auth_token = get_token()`).

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
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["MASK", "REDACT_REACH", "SECRET_NAME_RE", "Redactor", "redact", "redact_lines", "redact_mapping",
           "redact_then_cut"]

MASK = "[REDACTED]"
_ELLIPSIS = "…"

# The word a secret NAME ends in. KEY and PWD count only as the last part of a longer name (AZURE_OPENAI_KEY,
# Ocp-Apim-Subscription-Key, MYSQL_PWD: a bare `key` or `PWD=/home/x` is not a secret); PASS, DSN and BEARER
# only as a whole part (DB_PASS, --db-pass, SENTRY_DSN; not `bypass`).
_WORD = (
    r"(?:(?:TOKEN|SECRETS?|PASSWORDS?|PASSWD|PASSPHRASE|API[_-]?KEYS?|ACCESS[_-]?KEY|SECRET[_-]?KEY|PRIVATE[_-]?KEY"
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
_SEP = r"[ \t]*(?:=>|==?|:=?|\|(?!\|))[ \t]*"  # also a table's column bar (`| SecretAccessKey | v |`)

# A bearer credential's characters (RFC 6750 b64token), and an already masked value (so that a second pass
# over redacted text takes the same decisions as the first: `redact` is idempotent).
_B64URL = r"[A-Za-z0-9._~+/=-]"
_MASK_RE = re.escape(MASK)
# Where a NAME=value form starts: an unquoted name not after "#" (SGLang's `#token: 40` counters), or a
# quoted one; never right after "//" (`https://user:pw@host` is URL credentials).
_NAME_FORM = rf"(?<!//)(?:\"{_NAME}\"|'{_NAME}'|(?<!#){_NAME}){_SEP}"
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
_GUARD = (rf"(?!{_FORM_START}|(?:none|null|nil|true|false|undefined|\"\"|'')(?:[\s'\",)]|$)|{_WRAPPED}[\"']{_MASK_RE}"
          # references and vocabulary, not secrets: a tokenizer's special token (`'<|image_pad|>'`), an absolute
          # path (`ssh_key=/root/.ssh/id_ed25519`), code (`auth_token = get_token()`)
          rf"|[\"']?<\|?[^<>\s'\"]{{1,40}}\|?>[\"']?(?:[\s,;)]|$)|[\"']?/[\w.@+-]+/[\w./@+-]*[\"']?(?:[\s,;)]|$)"
          rf"|[A-Za-z_][\w.]*\()")


def _run(char: str) -> str:
    """One or more `char` that stop where another secret form starts. The check runs only where a name can
    start (not after a word character or "-"), so the scan stays linear; a "?" or "&" right before another
    form is left out too, so the query-string form still sees it."""
    return rf"(?:(?![?&](?:{_FORM_START}))(?:(?<=[\w-]){char}|(?<![\w-])(?!{_FORM_START}){char}))+"


_ANY = _run(r"\S")  # flag, header and netrc values: up to whitespace
_KV = _run(r"(?:[^\s'\",)]|,(?=[^\s'\",)]))")  # NAME=value: also up to a quote, `)` or a `,` before a space
_QS = _run(r"[^\s&#'\"]")  # ?name=value: up to the next parameter or the fragment
# A quoted value (masked whole, quotes kept). An unterminated quote runs to the end of the line, and a quote
# that opens another form (`token=" {"api_key": ...`) is not taken as the closing one.
_DQ_RUN = _run(r'(?:[^"\\\r\n]|\\.)')
_SQ_RUN = _run(r"(?:[^'\\\r\n]|\\.)")
#: A quoted string with no named groups (for repeated use inside one pattern).
_ANY_QUOTED = r"(?:\"(?:[^\"\\\r\n]|\\.)*\"|'(?:[^'\\\r\n]|\\.)*')"
_QUOTED = rf"\"{_DQ_RUN}(?:(?!{_FORM_START})(?P<dq>\"))?|'{_SQ_RUN}(?:(?!{_FORM_START})(?P<sq>'))?"


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


_PEM_KEY = r"[ \t]+(?:[A-Z0-9]+[ \t]+)*?PRIVATE[ \t]+KEY(?:[ \t]+BLOCK)?[ \t]*-{2,}"
_PEM_BEGIN_RE = rf"(?<!-)-{{2,}}[ \t]*BEGIN{_PEM_KEY}"
_PEM_END_RE = rf"(?<!-)-{{2,}}[ \t]*END{_PEM_KEY}"
_PEM_BEGIN = re.compile(_PEM_BEGIN_RE, re.IGNORECASE)
_PEM_END = re.compile(_PEM_END_RE, re.IGNORECASE)

#: Programs that take a password by a short flag: (program names regex, flag, what may come between the flag and
#: the value). mysql's `-p` takes its value attached (`-p` alone prompts; `-P` is the port); docker's `-p` is a
#: password only after `login` (`docker run -p 8080:80` publishes a port).
_PROGRAM_FLAGS: tuple[tuple[str, str, str], ...] = (
    (r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlsh|mysqlcheck|mariadb|mariadb-dump)(?![\w.-])", "-p", ""),
    (r"sshpass(?![\w.-])", "-p", "[ \t]*"),
    (r"(?:docker|podman|nerdctl|buildah|skopeo|oras|crane|helm[ \t]+registry)[ \t]+login(?![\w.-])", "-p", "[ \t]+"),
    (r"twine(?![\w.-])", "-p", "[ \t]+"),
    (r"redis-cli(?![\w.-])", "-a", "[ \t]+"),
    (r"(?:mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport)(?![\w.-])", "-p", "[ \t]+"),
    (r"(?:ldapsearch|ldapmodify|ldapadd|ldapdelete|ldappasswd)(?![\w.-])", "-w", "[ \t]*"),
    (r"(?:az|oc|argocd|cf|docker|podman|nerdctl)[ \t]+login(?![\w.-])", "-p", "(?:[ \t]+|=)"),
    (r"ssh-keygen(?![\w.-])", "-N", "[ \t]+"),
    (r"openssl(?![\w.-])", "-k", "[ \t]+"),
    (r"(?:7z|7za|7zr)(?![\w.-])", "-p", ""),
    (r"unzip(?![\w.-])", "-P", "[ \t]+"),
    (r"smbclient(?![\w.-])", "-U[ \t]*[^\\s%]+%", ""),
    (r"wandb[ \t]+login(?![\w.-])", "", "(?!-)"),
)
#: How far after the program's name its password flag is looked for (characters; bounds the scan of long lines).
_FLAG_REACH = 400
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

_PATTERNS: list[tuple[re.Pattern[str], _Repl]] = [
    # A PEM private key on one line (or its BEGIN line): BEGIN marker through END marker / end of line.
    (re.compile(rf"{_PEM_BEGIN_RE}.*?(?:{_PEM_END_RE}|$)", re.IGNORECASE), MASK),
    # URL credentials: scheme://user:password@host, scheme://:password@host (password up to the last @);
    # first, so no name/value form takes `scheme` or `user:` for a value
    (re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://[^/\s:]*:)[^\s/?]+@"), rf"\1{MASK}@"),
    # a long opaque user and no password: a token (https://TOKEN@git.host/x.git)
    (re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)[A-Za-z0-9_-]{20,}@"), rf"\1{MASK}@"),
    # Well-known token formats. Like the two above, these run before the forms below: those decide where a
    # value ends by looking at what follows, and must see the same text when run again on their output.
    (re.compile(r"(?<![A-Za-z0-9])github_pat_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])gl(?:pat|dt|rt|ptt|ft|soat|cbt|imt|oas)-[A-Za-z0-9_.-]{16,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])nvapi-[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{16,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])xox[abposre]-[A-Za-z0-9-]{8,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])xapp-[A-Za-z0-9-]{8,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35,}"), MASK),
    (re.compile(r"(?<![A-Za-z0-9])ya29\.[0-9A-Za-z_-]{20,}"), MASK),  # Google OAuth access token
    (re.compile(r"(?<![A-Za-z0-9])(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}"), MASK),  # Stripe keys
    (re.compile(r"(?<![A-Za-z0-9])pypi-AgE[A-Za-z0-9_-]{20,}"), MASK),  # PyPI API token
    (re.compile(r"(?<![A-Za-z0-9])hv[sbr]\.[A-Za-z0-9_-]{20,}"), MASK),  # HashiCorp Vault token
    (re.compile(r"(?<![A-Za-z0-9])(?:r8_[A-Za-z0-9]{30,}|gsk_[A-Za-z0-9]{40,}|xai-[A-Za-z0-9]{40,}"
                r"|lsv2_(?:pt|sk)_[A-Za-z0-9_]{30,}|glsa_[A-Za-z0-9_]{30,})"), MASK),  # Replicate Groq xAI LangSmith
    # (and Grafana service-account tokens)
    (re.compile(r"(?<![A-Za-z0-9])AGE-SECRET-KEY-1[0-9A-Z]{40,}"), MASK),  # age private key
    (re.compile(r"(?i)(https?://(?:\w+\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/)[A-Za-z0-9_-]{20,}"),
     rf"\1{MASK}"),  # Discord webhook URL
    (re.compile(r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{30,}"), MASK),  # npm access token
    (re.compile(r"(?<![A-Za-z0-9])dckr_(?:pat|oat)_[A-Za-z0-9_-]{16,}"), MASK),  # Docker Hub access token
    (re.compile(r"(?<![A-Za-z0-9])SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"), MASK),  # SendGrid API key
    (re.compile(r"(?<![A-Za-z0-9])dapi[0-9a-f]{32}(?:-\d)?(?![0-9A-Za-z])"), MASK),  # Databricks token
    # Slack incoming-webhook URLs: the path is the credential
    (re.compile(r"(?i)(https?://hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/)[A-Za-z0-9/_-]{8,}"),
     rf"\1{MASK}"),
    # JWT (a start inside a run of token characters is no JWT's start: keeps `-eyJ-eyJ...` linear)
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){1,3}"), MASK),
    # a password given to a program by a short flag (mysql -pX, sshpass -p X, docker login -p X: _PROGRAM_FLAGS)
    *((re.compile(rf"(?<![\w.-])(?:{progs})[^\n|;&]{{0,{_FLAG_REACH}}}?[ \t]{flag}{gap}"
                  rf"(?P<val>{_ANY_QUOTED}|[^\s'\"]\S*)"), _keep_head) for progs, flag, gap in _PROGRAM_FLAGS),
    # curl -u USER:PASSWORD (the user is kept)
    (re.compile(rf"(?<![\w.-])(?:curl|wget|lftp)(?![\w.-])[^\n|;&]{{0,{_FLAG_REACH}}}?[ \t](?:-u|--user)"
                r"(?:[ \t]+|=)[\"']?[^\s:'\"]*:(?P<val>[^\s'\"]+)"), _keep_head),
    # Cookie: / Set-Cookie: headers (every cookie in them: the rest of the line, or the quoted value)
    (re.compile(rf"(?i)(?<![\w-])(?P<q>[\"']?)(?:set-)?cookie(?P=q)[ \t]*:[ \t]*(?!{_MASK_RE})(?P<val>{_QUOTED}|\S.*)"),
     _name_value),
    # Pwd=VALUE (ODBC connection strings), pwd: VALUE; a path (`PWD=/home/x`, the working directory) is kept
    (re.compile(rf"(?i)(?<![\w-])pwd[ \t]*[:=][ \t]*(?![/~.$]|{_MASK_RE})(?P<val>[^\s;'\",)}}]+)"), _keep_head),
    # query parameters that carry a credential under a short name (?sig=... SAS signatures, ?auth=...); not ?key=
    # (an S3 object key) nor ?code= (a status code)
    (re.compile(rf"(?i)(?<=[?&;])(?:sig|auth|pass|pwd|secret|signature)=(?!{_MASK_RE})(?P<val>[^&#;\s'\"]+)"),
     _keep_head),
    # JSON inside a string, quotes escaped: {\"password\": \"VALUE\"}
    (re.compile(rf"(?i)(?<!\\)\\{{1,3}}(?P<eq>[\"'])(?<!#){_NAME}\\{{1,3}}(?P=eq){_SEP}\\{{1,3}}(?P=eq)(?!{_MASK_RE})"
                rf"(?P<val>(?:(?!\\[\"']).)+)"),
     _keep_head),
    # {"name": "HF_TOKEN", "value": "..."} (Kubernetes / ECS env lists, SSM parameters `"Name": "/prod/db/password"`)
    (re.compile(rf"(?i)([\"']name[\"'][ \t]*:[ \t]*[\"'](?:[\w./-]*/)?{_NAME}[\"'][ \t]*,[ \t]*(?:[\"']\w+[\"'][ \t]*:"
                rf"[ \t]*[^,{{}}]*,[ \t]*)?[\"']value[\"'][ \t]*:[ \t]*)(?P<val>{_ANY_QUOTED})"), _keep_head),
    # ('api_key', 'v') pairs, also bytes: (b'x-api-key', b'v'); b'Authorization': b'Basic ...'
    (re.compile(rf"(?i)\([ \t]*b?([\"'])(?:{_NAME}|authorization)\1[ \t]*,[ \t]*b?(?P<val>{_ANY_QUOTED})"), _keep_head),
    (re.compile(rf"(?i)b([\"'])(?:{_NAME}|authorization)\1[ \t]*:[ \t]*b(?P<val>{_ANY_QUOTED})"), _keep_head),
    # XML: <password>v</password>, <add key="ApiKey" value="v"/>
    (re.compile(rf"(?i)<({_NAME})>(?P<val>[^<\n]+)</\1>"), _keep_head),
    (re.compile(rf"(?i)\b(?:key|name)=([\"']){_NAME}\1[ \t]+value=(?P<val>{_ANY_QUOTED})"), _keep_head),
    # SQL `IDENTIFIED BY 'pw'`, redis `requirepass pw` / `masterauth pw`, `AUTH pw` at a redis prompt
    (re.compile(rf"(?i)\bIDENTIFIED[ \t]+(?:WITH[ \t]+\S+[ \t]+)?BY[ \t]+(?!{_MASK_RE})(?P<val>{_ANY_QUOTED}|\S+)"),
     _keep_head),
    (re.compile(r"(?i)(?<![\w-])(?:requirepass|masterauth)[ \t]+(?!\[REDACTED\])(?P<val>\S+)"), _keep_head),
    (re.compile(r"(?:^|(?<=> ))AUTH[ \t]+(?:\S+[ \t]+)?(?!\[REDACTED\])(?P<val>\S+)[ \t]*$"), _keep_head),
    # setx NAME value (Windows), set -x NAME value (fish), aws configure set NAME value
    (re.compile(rf"(?i)(?<![\w-])(?:setx|set[ \t]+-[a-zA-Z]*[gxU][a-zA-Z]*|configure[ \t]+set)[ \t]+{_NAME}[ \t]+"
                rf"(?!{_MASK_RE})(?P<val>{_ANY_QUOTED}|\S+)"), _keep_head),
    # a commented-out assignment (`#API_KEY=...`) or a URL fragment (`#access_token=...`); `#token: 40` counters kept
    (re.compile(rf"(?i)(?<=#)(?P<q>[\"']?){_NAME}(?P=q)(?>{_SEP})(?![0-9]+(?:[\s,;)]|$)|{_MASK_RE})(?P<val>[^\s&'\",;)]+)"),
     _keep_head),
    # a whole line `NAME: value with spaces` / `NAME = a b c` (YAML, INI): the rest of the line (not `NAME=v cmd`)
    (re.compile(rf"(?i)^[ \t]*(?:-[ \t]+)?(?<!#){_NAME}(?:[ \t]*:[ \t]+|[ \t]+=[ \t]*)"
                rf"(?![\"'\[{{(]|{_MASK_RE}|(?:none|null|nil|true|false|undefined|~)[ \t]*$){_GUARD}"
                rf"(?P<val>\S[^\n]*?\s\S[^\n]*?)[ \t]*$"), _keep_head),
    # Authorization: [scheme] value
    (re.compile(rf"(?i)(?<![\w-])(?P<q>[\"']?)(?:proxy-)?authorization(?P=q)[ \t]*[:=][ \t]*"
                rf"(?:(?:bearer|basic|token|digest|negotiate|apikey)[ \t]+)?{_GUARD}(?P<val>{_QUOTED}|{_ANY})"),
     _name_value),
    # --api-key VALUE / --api_key=VALUE / --hf_token VALUE / --password='x y'
    (re.compile(rf"(?i)(?<![\w-])--?{_NAME}(?:[ \t]*=[ \t]*|[ \t]+){_GUARD}(?!-|\\[ \t]*$)(?P<val>{_QUOTED}|{_ANY})"),
     _name_value),
    # 'api_key': ['KEY'] (vLLM's non-default args), api_key: Some("KEY") (TGI's Args): the quoted value inside
    (re.compile(rf"(?i)(?<![\w-])(?P<q>[\"']?)(?<!#){_NAME}(?P=q){_SEP}{_WRAPPED}{_GUARD}"
                rf"(?P<val>{_QUOTED})(?P<more>(?:[ \t]*,[ \t]*{_ANY_QUOTED})*)"),
     _wrapped_value),
    # NAME=value, "NAME": "value", X-Api-Key: value, ?api-key=value&... (a query value stops at & and #)
    # (atomic: after ? or & it is a query parameter, with no fall-back to the plain form)
    (re.compile(rf"(?i)(?<![\w-])(?<!//)(?>(?P<qs>(?<=[?&]))?)(?P<q>[\"']?)(?<!#){_NAME}(?P=q){_SEP}"
                rf"(?:(?:bearer|basic|token)[ \t]+)?{_GUARD}"
                rf"(?P<val>{_QUOTED}|(?(qs){_QS}|{_KV}))"),
     _name_value),
    # netrc: machine HOST login USER password VALUE (also `login USER password VALUE`)
    (re.compile(rf"(?i)(?<![\w-])(?:(?:machine|login|account)[ \t]+\S+[ \t]+|default[ \t]+)"
                rf"(?:(?:login|account|port)[ \t]+\S+[ \t]+){{0,3}}(?:password|passwd)[ \t]+{_GUARD}(?P<val>{_ANY})"),
     _name_value),
    # prose: `password X`, `the password is X`, `passphrase 'X'` (an ordinary word after it is kept: _PROSE_WORDS)
    (re.compile(rf"(?i)(?<![\w-])(?:password|passwd|passphrase)(?:[ \t]+(?:is|was|to|of))?[ \t]+(?![=:|]){_GUARD}"
                rf"(?!(?:{_PROSE_WORDS}|{_MASK_RE})(?![\w-]))(?P<val>{_QUOTED}|[^\s,;]+)"), _name_value),
    # Bearer VALUE anywhere
    (re.compile(rf"(?i)(?<![\w-])bearer[ \t]+{_GUARD}(?P<val>(?={_B64URL}{{8}}){_run(_B64URL)}|{_MASK_RE})"),
     _name_value),
]

# A line that looks like PEM body (base64, no spaces). A "long" one is what a full body line looks like.
_B64_LINE = re.compile(r"[ \t]*[A-Za-z0-9+/=]+[ \t]*")
_B64_LONG = re.compile(r"[ \t]*[A-Za-z0-9+/=]{60,}[ \t]*")
_HEX_ONLY = re.compile(r"[ \t]*[0-9A-Fa-f=]+[ \t]*")
_PEM_HEADER = re.compile(r"(?i)[ \t]*(?:Proc-Type|DEK-Info|Comment)[ \t]*:.*")
# Fewer than this many consecutive long base64 lines with no PEM marker at all are left alone.
_B64_RUN = 3


def _redact_line(line: str, extra: Iterable[re.Pattern[str]]) -> str:
    """Apply the `extra` patterns (configured ones, known secret values), then every built-in one, to one line
    (no line breaks inside). Known values go first: a built-in form that masks only part of a value it
    does not fully understand (`'api_key': ['KEY']`) must not leave the rest for them to miss."""
    for pat in extra:
        line = pat.sub(MASK, line)
    for pat, repl in _PATTERNS:
        line = pat.sub(repl, line)
    return line


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


def _pem_plan(lines: list[str]) -> list[str]:
    """Mask the PEM private-key material that needs context across lines; single-line forms (a BEGIN line,
    a key on one line) are left to `_redact_line`. Returns a new list of the same length."""
    out = list(lines)
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
    # Key material with no marker in sight (a window inside a long key): a run of long base64 lines.
    i = 0
    while i < n:
        j = i
        while j < n and _B64_LONG.fullmatch(out[j]):
            j += 1
        if j - i >= _B64_RUN and any(not _HEX_ONLY.fullmatch(out[k]) for k in range(i, j)):
            for k in range(i, j):
                out[k] = _mask_whole(out[k])
        i = max(j, i + 1)
    return out


def _after_block(out: list[str], i: int) -> int:
    """Mask the long base64 lines directly following a PEM block; return the index after them."""
    while i < len(out) and _B64_LONG.fullmatch(out[i]):
        out[i] = _mask_whole(out[i])
        i += 1
    return i


# A line that ends in a secret's name and its separator with the value still to come: `password:`, `api_key: |`,
# `"client_secret":`, `--api-key \` (a shell continuation), `Authorization:`, also quoted in Slack code (`password:`).
# The value is on the next line.
_DANGLING = re.compile(
    rf"(?i)(?:(?<![\w-])--?{_NAME}|(?<![\w-])(?P<q>\\?[\"']?)(?<!#)(?:{_NAME}|(?:proxy-)?authorization|(?:set-)?cookie)"
    rf"(?P=q)[ \t]*(?:=>|==?|:=?)|(?:^|-[ \t]+)name[ \t]*:[ \t]*[\"']?{_NAME}[\"']?)"
    # then nothing, a YAML block indicator, a shell continuation, an auth scheme, or an opening bracket
    rf"[ \t]*(?:[|>][-+]?[0-9]?|\\+|(?:bearer|basic|token)|Some\(|\[|\{{|\()?[ \t]*`?[ \t]*$")


# A line that starts a new record rather than carrying a value: a log line's prefix (a bracket, a timestamp, a
# severity), a table's `|`, a `key: value` or `key=value` pair, a flag. Taken for the value on the line above only
# when it is indented deeper than that line's name.
_RECORD_START = re.compile(
    r"[ \t]*(?:[\[|({}<#]|//|(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL|FATAL|TRACE|NOTICE)\b"
    r"|\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d|\d\d-\d\d[ T]\d\d:|[A-Za-z_][\w.-]*[ \t]*(?::[ \t]|:$|=)|--?[A-Za-z])")


_LIST_ITEM = re.compile(r"`?[ \t]*-[ \t]+\S")  # a YAML list item (also inside a Slack code quote)


def _indent(line: str) -> int:
    """Leading spaces and tabs of `line` (inside a Slack code quote: after its opening backtick)."""
    body = line[1:] if line.startswith("`") else line
    return len(body) - len(body.lstrip(" \t"))


def _next_line_plan(lines: list[str], out: list[str]) -> None:
    """Mask (in `out`) the values that sit on the line after their name (`_DANGLING`): the next non-blank line
    (unless it is no deeper than the name's line and starts a record of its own: `_RECORD_START`), and the lines
    after it that are indented deeper than the name's line (a YAML block or nested mapping, a pretty-printed
    JSON value)."""
    n = len(lines)
    for i, line in enumerate(lines):
        if not line or not _DANGLING.search(line):
            continue
        j = i + 1
        while j < n and not lines[j].strip():
            j += 1
        if j >= n or _DANGLING.search(lines[j]):
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


def redact_lines(lines: list[str], extra: Iterable[re.Pattern[str]] = ()) -> list[str]:
    """Return `lines` (each without its line break) with secrets replaced by `[REDACTED]`.

    Every line gets what `redact` does to one line. On top of that, PEM private keys are tracked across
    lines: every line from `-----BEGIN ... PRIVATE KEY-----` to `-----END ... PRIVATE KEY-----` inclusive
    is masked (text before BEGIN on the first line and after END on the last is kept), and so are:
    long base64 lines (60+ characters of `[A-Za-z0-9+/=]`, no spaces) directly following such a block;
    the base64 lines above an END whose BEGIN is not in `lines` (a log tail that starts inside a key);
    the base64 lines after a BEGIN whose END is not in `lines`; and a run of 3+ long base64 lines that
    are not all hex (key material with neither marker in view). `extra` are configured patterns whose
    whole match is masked. Returns a new list of the same length. Never raises for a list of str.
    """
    patterns = tuple(extra)
    lines = list(lines)
    planned = _pem_plan(lines)
    _next_line_plan(lines, planned)
    for i, line in enumerate(planned):
        if "\\n" in line:  # a repr or JSON string with escaped line breaks: its lines are lines too
            parts = line.split("\\n")
            masked = list(parts)
            _next_line_plan(parts, masked)
            planned[i] = "\\n".join(masked)
    return [_redact_line(line, patterns) if line else line for line in planned]


def redact(text: str, extra: Iterable[re.Pattern[str]] = ()) -> str:
    """Return `text` with secrets replaced by `[REDACTED]`, keeping the names (`--api-key [REDACTED]`).

    `text` may be one line (a process command line, one log line) or a multi-line text; multi-line text
    is split on line breaks (which are kept as they were) and passed through `redact_lines`, so PEM
    private-key blocks are masked across lines and no pattern ever spans a line break. `extra` are
    configured patterns whose whole match is masked (applied line by line). Idempotent:
    `redact(redact(t)) == redact(t)`. Never raises for str input.
    """
    if not text:
        return text
    parts = text.splitlines(keepends=True)
    bodies = [p.splitlines()[0] for p in parts]
    redacted = redact_lines(bodies, extra)
    return "".join(r + p[len(b):] for r, p, b in zip(redacted, parts, bodies, strict=True))


#: A key that names a secret: the same names the text rules mask a value after (ends in TOKEN, SECRET, PASSWORD,
#: API_KEY, CREDENTIALS, COOKIE, ...; in `_KEY`/`_PASS`/`_PWD` after a prefix: `openai_key`, `db_pass`,
#: `mysql_pwd`; not `pad_token`, `primary_key`, `bypass`). Use `.search(name)`: it is anchored at both ends.
SECRET_NAME_RE = re.compile(rf"^{_NAME}$", re.IGNORECASE)


def redact_mapping(values: dict) -> dict:
    """Copy of `values` with every value whose KEY names a secret replaced by `[REDACTED]`, and every
    other string value passed through `redact` (so opaque secrets in secret-named params never leak)."""
    out = {}
    for k, v in values.items():
        if isinstance(k, str) and SECRET_NAME_RE.search(k):
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


def redact_then_cut(text: str, width: int, extra: Iterable[re.Pattern[str]] = ()) -> str:
    """Return `text` redacted and THEN cut to at most `width` characters (the last one "…" when cut).

    Redacting first matters: cutting first can leave the start of a secret that no pattern recognises any
    more (`sk-ABCDEFGHIJ…`). Only the first max(REDACT_REACH, 8 * width) characters are redacted (the rest is
    never shown). `width` < 1 is treated as 1. Never raises for str input.
    """
    width = max(1, width)
    out = redact((text or "")[: max(REDACT_REACH, 8 * width)], extra)
    return out if len(out) <= width else out[: width - 1] + _ELLIPSIS


#: Characters of a line that `redact_then_cut` (and the log tail, bot.core.parse.log) redact before cutting it
#: for display: the shown part and far more context than any secret form needs; bounds the time a hostile
#: megabyte-long line costs.
REDACT_REACH = 16_384

#: Known secret values shorter than this are not masked by value (they would mask ordinary words).
MIN_SECRET_VALUE_LEN = 6


class Redactor:
    """The built-in rules plus configured extra patterns (the config's `redact_patterns`: Python regexes
    whose whole matches are masked) plus the secret VALUES the bot knows (Slack tokens, `${NAME}` values of
    the config's env maps, secret params of launches: `add_values`), masked wherever they appear, whatever
    flag, quote, list or format carries them. One object, built once and passed to whatever posts, stores
    or logs text. Raises re.error for an invalid pattern (the config validates them first). The patterns
    are fixed; the known values only grow."""

    def __init__(self, patterns: Iterable[str] = (), values: Iterable[str] = ()):
        self._configured: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in patterns)
        self._values: set[str] = set()
        self.patterns: tuple[re.Pattern[str], ...] = self._configured
        self.add_values(values)

    def add_values(self, values: Iterable[Any]) -> None:
        """Mask these secret values (their str, stripped, at least MIN_SECRET_VALUE_LEN characters) from now
        on, as whole matches anywhere in a line; a value with line breaks line by line, and each also in its
        URL-encoded, JSON-escaped, shell-quoted and backslash-escaped forms."""
        new = set()
        for v in values:
            text = str(v).strip() if v is not None else ""
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
        self.patterns = (*self._configured, re.compile(alternation))

    def __call__(self, text: str) -> str:
        """`redact(text)` with the configured patterns and known values too. Never raises for str input."""
        return redact(text, self.patterns)

    def lines(self, lines: list[str]) -> list[str]:
        """`redact_lines(lines)` with the configured patterns and values too: a new list of the same length."""
        return redact_lines(lines, self.patterns)

    def then_cut(self, text: str, width: int) -> str:
        """`redact_then_cut(text, width)` with the configured patterns and values too."""
        return redact_then_cut(text, width, self.patterns)

    def mapping(self, values: dict) -> dict:
        """`redact_mapping(values)`, then the configured patterns over every string value."""
        return {k: self(v) if isinstance(v, str) else v for k, v in redact_mapping(values).items()}

    def deep(self, obj: Any) -> Any:
        """`obj` (str, dict, list or tuple, nested) with every string redacted; other values as they are. A list
        (or tuple) of one-line strings is redacted as consecutive lines (`lines`: a log tail, evidence lines,
        argument tokens), so a name on one line masks its value on the next; other lists and tuples element by
        element (a tuple comes back as a list)."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            return {k: self.deep(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(v, str) and "\n" not in v and "\r" not in v for v in obj):
                return self.lines(list(obj))
            return [self.deep(v) for v in obj]
        return obj

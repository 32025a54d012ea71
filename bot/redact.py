"""Secret redaction for everything gpubot posts (pure).

Process command lines, environment-style assignments, log lines and error texts can carry API keys and
tokens (`--api-key sk-...`, `HF_TOKEN=hf_...`, `Authorization: Bearer ...`). `redact(text)` replaces the
secret part with `[REDACTED]` and keeps the name, so people still see WHICH secret was there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "[REDACTED]"

# A name that ENDS in a secret word: HF_TOKEN, api_key, DB_PASSWORD; not tokenizer_path, max_tokens, pad_token_id.
_SECRET_NAME = (
    r"[A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"  # noqa: S105
    r"|SECRET_?KEY|CREDENTIALS?)\b"
)
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # NAME=value (env assignments, ServerArgs(api_key='...'))
    (re.compile(rf"(?i)\b({_SECRET_NAME})([ \t]*[=:][ \t]*)(['\"]?)([^\s'\",)]+)"), rf"\1\2\3{MASK}"),
    # --api-key VALUE / --api-key=VALUE / --hf-token ... / --password ...
    (re.compile(r"(?i)(--?[a-z0-9-]*(?:token|secret|password|passwd|api-?key|access-?key))(=|[ \t]+)(?!-)(\S+)"),
     rf"\1\2{MASK}"),
    (re.compile(r"(?i)\b(authorization|proxy-authorization)([ \t]*:[ \t]*)(?:(bearer|basic|token)[ \t]+)?\S+"),
     lambda m: f"{m.group(1)}{m.group(2)}{(m.group(3) + ' ') if m.group(3) else ''}{MASK}"),
    (re.compile(r"(?i)\bbearer[ \t]+[A-Za-z0-9._~+/=-]{8,}"), f"Bearer {MASK}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{8,}"), MASK),
    (re.compile(r"\bxapp-[A-Za-z0-9-]{8,}"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}"), MASK),  # JWT
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@"), rf"\1{MASK}@"),  # URL credentials
]


def redact(text: str, extra: Iterable[re.Pattern[str]] = ()) -> str:
    """Return `text` with secrets replaced by `[REDACTED]`. `extra` are configured patterns whose whole
    match is masked. Never raises for str input."""
    if not text:
        return text
    for pat, repl in _PATTERNS:
        text = pat.sub(repl, text)
    for pat in extra:
        text = pat.sub(MASK, text)
    return text

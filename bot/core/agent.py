"""The probe agent's protocol (pure): one POSIX shell kept running on a host's pooled SSH connection that runs the
probe scripts sent to it, so a probe opens no SSH channel and starts no login shell (bot.adapters.remote runs it).

The agent is `sh -s gpubot-agent` reading commands on its stdin, its stderr merged into its stdout. A request is
one command: the script, fed on a here-document (so nothing of it, its nonce least of all, shows in any process's
arguments), to `timeout -k KILL BUDGET sh -s gpubot-probe` (bounded and killable like a probe over its own
channel), followed by a DONE line that carries a fresh random token and the script's exit status:

    timeout -k 5 30 sh -s gpubot-probe <<'GPUBOT_<token>'
    <script>
    GPUBOT_<token>
    printf '\\n@@%s DONE %s\\n' <token> "$?"

Everything the agent prints before `\\n@@<token> DONE <status>\\n` is the script's output. The agent says its own
PID once, when it starts (`HELLO`), so probes can leave it out of the process table.
"""

from __future__ import annotations

import re
import secrets

from bot.core.shell import wrap_timeout

#: The word in the agent's (and its probes') arguments that names them in `ps`.
AGENT_NAME = "gpubot-agent"
#: The word in the arguments of the shell that runs one probe script on the agent.
PROBE_NAME = "gpubot-probe"
#: What the SSH channel of the agent runs (through the user's login shell, once per connection).
AGENT_COMMAND = f"exec sh -s {AGENT_NAME} 2>&1"
#: The agent's first command: print its PID between markers.
HELLO = b"printf '@@gpubot-agent pid %s\\n' \"$$\"\n"
HELLO_RE = re.compile(rb"@@gpubot-agent pid ([0-9]{1,10})\n")
#: Longest line `HELLO_RE` can match, bytes (for incremental searching).
HELLO_MAX = 40
#: Longest DONE line, bytes.
DONE_MAX = 64


def new_token() -> str:
    """A fresh 16-hex-digit request token."""
    return secrets.token_hex(8)


def request(script: str, budget_s: float, token: str) -> bytes:
    """The agent command that runs `script` (a POSIX sh script, its values already quoted) under
    `timeout -k` with `budget_s` seconds, then prints the DONE line of `token` (16 hex digits). Raises ValueError
    for a token that is not hex."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", token):
        raise ValueError("token must be hex")
    body = script if script.endswith("\n") else script + "\n"
    return (f"{wrap_timeout(f'sh -s {PROBE_NAME}', budget_s)} <<'GPUBOT_{token}'\n{body}GPUBOT_{token}\n"
            f"printf '\\n@@%s DONE %s\\n' {token} \"$?\"\n").encode()


#: A DONE line of any token: group 1 the token, group 2 the exit status (one regex for every request: compiling one
#: per token cost more than the rest of a request). Only the line with the request's own token ends its output.
DONE_RE = re.compile(rb"\n@@([0-9a-f]{8,64}) DONE (-?[0-9]{1,4})\n")


def done(data: bytes, token: str) -> re.Match[bytes] | None:
    """The DONE line of `token` at the end of `data` (what a read up to a DONE_RE match returned), or None when
    the line there is another token's (a line of the output that looks like one)."""
    m = DONE_RE.search(data, max(0, len(data) - DONE_MAX - 2))
    return m if m is not None and m.group(1) == token.encode() and m.end() == len(data) else None

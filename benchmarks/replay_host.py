"""A replaying SSH host for the fleet benchmark: the asyncssh LoopbackSSHServer (tests.support.fakes.ssh_server) in a
process of its own, whose probe agent does no work: each probe script sent to it is answered, after DELAY_MS of
sleep, with a probe output recorded from a real host (its nonce replaced by the script's own). A fleet of these is a
fleet of hosts that do their share of a probe on CPUs of their own, as real GPU hosts do: what is left on this
machine is the bot's own cost of fanning out (plus this server's SSH framing). Every other command runs as a
subprocess, as in LoopbackSSHServer.

    PYTHONPATH=TREE python benchmarks/replay_host.py TMPDIR MAX_SESSIONS RECORDING DELAY_MS

RECORDING holds a probe's raw output with `NONCE` where its nonce was. Prints one JSON line (host, port, username,
client_key_path, known_hosts_path) once it listens; serves until SIGTERM or until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

AGENT_WORD = "gpubot-agent"  # bot.core.agent.AGENT_NAME: the benchmark code names no bot internals
_TOKEN_RE = re.compile(r"<<'GPUBOT_([0-9a-f]{8,64})'")
_NONCE_RE = re.compile(rb"\nM=([0-9a-f]{8,64})\n")


async def main(tmp: str, max_sessions: int, output: bytes, delay_ms: float) -> None:
    """Serve until stdin closes."""
    from tests.support.fakes.ssh_server import LoopbackSSHServer

    class ReplayServer(LoopbackSSHServer):
        async def _run_session(self, session: Any, stdin: Any, stdout: Any, stderr: Any) -> None:
            chan = stdin.channel
            if AGENT_WORD not in (chan.get_command() or ""):
                await super()._run_session(session, stdin, stdout, stderr)
                return
            try:
                await _agent(stdin, stdout)
            except Exception:  # the client went away mid-request
                pass
            finally:
                chan.exit(0)

    async def _agent(stdin: Any, stdout: Any) -> None:
        hello = await stdin.readline()  # the agent's HELLO: it wants a pid
        if not hello:
            return
        stdout.write(f"@@{AGENT_WORD} pid 1\n".encode())
        while True:
            first = await stdin.readline()
            if not first:
                return
            m = _TOKEN_RE.search(first.decode("utf-8", "replace"))
            if m is None:
                continue
            token = m.group(1)
            body = await stdin.readuntil(f"\nGPUBOT_{token}\n".encode())
            await stdin.readline()  # the DONE printf line
            nonce = _NONCE_RE.search(b"\n" + body)
            await asyncio.sleep(delay_ms / 1000)
            answer = output.replace(b"NONCE", nonce.group(1)) if nonce else b""
            stdout.write(answer + f"\n@@{token} DONE 0\n".encode())

    async with ReplayServer(tmp, max_sessions=max_sessions) as srv:
        print(json.dumps({"host": srv.host, "port": srv.port, "username": srv.username,
                          "client_key_path": str(srv.client_key_path),
                          "known_hosts_path": str(srv.known_hosts_path)}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]).read_bytes(), float(sys.argv[4])))

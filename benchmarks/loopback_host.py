"""The asyncssh LoopbackSSHServer (tests.support.fakes.ssh_server) in a process of its own: the benchmarks'
SSH host where OpenSSH sshd is not installed. Its CPU must never be counted as the bot's, so it never runs in
the measuring process.

    PYTHONPATH=TREE python benchmarks/loopback_host.py TMPDIR MAX_SESSIONS

Prints one JSON line (host, port, username, client_key_path, known_hosts_path, host_pub_key) once it
listens; serves until SIGTERM or until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(tmp: str, max_sessions: int) -> None:
    """Serve until stdin closes."""
    from tests.support.fakes.ssh_server import LoopbackSSHServer

    async with LoopbackSSHServer(tmp, max_sessions=max_sessions) as srv:
        print(json.dumps({"host": srv.host, "port": srv.port, "username": srv.username,
                          "client_key_path": str(srv.client_key_path),
                          "known_hosts_path": str(srv.known_hosts_path),
                          "host_pub_key": srv.known_hosts_line.split(" ", 1)[1]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))

"""A tiny HTTP server for the benchmarks: 200 `ok` on GET /health, 404 elsewhere, on 127.0.0.1.

    python benchmarks/health_server.py

Prints its (ephemeral) port on the first stdout line; exits on SIGTERM or when its stdin closes. Standard
library only: it runs by path, with no gpubot import.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.split("?")[0] == "/health"
        body = b"ok\n" if ok else b"not found\n"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return


def _exit_when_stdin_closes() -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.read()
    os._exit(0)


def main() -> None:
    """Serve until stopped."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.daemon_threads = True
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

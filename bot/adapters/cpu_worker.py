"""The CPU worker: a Python process of the bot's own that runs CPU-bound calls for it (bot.adapters.cpu), started
as `python -m bot.adapters.cpu_worker`.

Protocol on its stdin and stdout, one call at a time: the bot writes a request, an 8-byte big-endian length then
a pickle of `(module, function name, args)`; the worker answers the same way with a pickle of `(True, result)` or
`(False, exception)`. Only its parent writes to it (a pipe), so the pickles are the bot's own. It exits at EOF on
stdin: when the bot closes it, and when the bot dies, however it died. Its stderr is not the bot's (the bot starts
it with /dev/null there), so it never holds the bot's streams open.
"""

import importlib
import pickle
import struct
import sys

_LEN = struct.Struct("!Q")


def _read(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def serve(inp, out) -> None:
    """Answer calls from `inp` on `out` (binary streams) until EOF."""
    while True:
        try:
            (size,) = _LEN.unpack(_read(inp, _LEN.size))
            module, name, args = pickle.loads(_read(inp, size))  # noqa: S301 - only our parent writes here
        except EOFError:
            return
        try:
            fn = getattr(importlib.import_module(module), name)
            answer = (True, fn(*args))
        except Exception as e:  # the caller gets it raised
            answer = (False, e)
        try:
            data = pickle.dumps(answer)
        except Exception as e:  # an unpicklable result or exception
            data = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        out.write(_LEN.pack(len(data)) + data)
        out.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)

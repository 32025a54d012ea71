"""Pure parser for Linux `/proc/net/tcp` and `/proc/net/tcp6` (listening sockets).

No I/O here: the probe `cat`s both files on the remote host (they exist on every Linux host, unlike
`ss`/`netstat`, which were missing on the captured H200 machine) and hands the text over.

Format (Linux kernel `tcp4_seq_show` / `tcp6_seq_show`, unchanged since 2.6): an optional header
line `  sl  local_address rem_address   st tx_queue ...`, then one row per socket:
`   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 12345 1 ...`
Addresses are the raw in-memory IPv4 word (8 hex digits) or four IPv6 words (32 hex digits) printed
in host byte order, so on little-endian hosts (x86-64, arm64) each 32-bit word is byte-reversed;
the port is big-endian hex; `st` 0A is TCP_LISTEN; the 10th field is the socket inode.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from bot.core.models import ListenSocket

__all__ = ["is_listening", "parse_proc_net_tcp"]

_LISTEN = "0A"
_HEX = frozenset("0123456789abcdefABCDEF")


def _is_hex(s: str) -> bool:
    """Whether `s` is a non-empty string of hex digits."""
    return bool(s) and all(c in _HEX for c in s)


@functools.lru_cache(maxsize=4096)
def _decode_address(hexaddr: str) -> tuple[str, bool] | None:
    """Return (text address, is_ipv6) for a little-endian /proc/net hex address, or None if malformed. Cached: a
    host's listening addresses are the same few at every check (0.0.0.0, 127.0.0.1, ::)."""
    if not _is_hex(hexaddr) or len(hexaddr) not in (8, 32):
        return None
    raw = b"".join(bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, len(hexaddr), 8))
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw)), False
    addr = ipaddress.IPv6Address(raw)
    if addr.ipv4_mapped is not None:  # same text on every Python version (3.13 changed str())
        return f"::ffff:{addr.ipv4_mapped}", True
    return addr.compressed, True


def parse_proc_net_tcp(text: str, ipv6: bool = False) -> list[ListenSocket]:
    """Return the listening sockets (state 0A) in `/proc/net/tcp` or `/proc/net/tcp6` text, in file order.

    `address` is dotted IPv4 (`127.0.0.1`, `0.0.0.0`) or compressed IPv6 (`::`, `::1`,
    `::ffff:10.0.0.1`), decoded for a little-endian host; `port` the local TCP port (int); `inode` the
    socket inode, or None when that field is missing or not a number. Set `ipv6` True for tcp6 text:
    it marks every result `ipv6=True`. Addresses are decoded by their length (8 hex digits IPv4,
    32 IPv6), so a wrong flag does not garble them, and a 32-digit address is always marked ipv6.

    The header line is optional; rows in any other state, malformed rows, truncated rows and garbage
    are skipped. Format source: Linux kernel /proc/net/tcp{,6} (`net/ipv4/tcp_ipv4.c`,
    `net/ipv6/tcp_ipv6.c`). Never raises.
    """
    out: list[ListenSocket] = []
    if not isinstance(text, str):
        return out
    for line in text.splitlines():
        fields = line.split(None, 12)
        if len(fields) < 4 or not fields[0].endswith(":") or fields[3].upper() != _LISTEN:
            continue
        local = fields[1]
        addr_hex, sep, port_hex = local.partition(":")
        if not sep or not _is_hex(port_hex) or len(port_hex) > 4:
            continue
        decoded = _decode_address(addr_hex)
        if decoded is None:
            continue
        address, is_v6 = decoded
        inode: int | None = None
        if len(fields) > 9 and fields[9].isascii() and fields[9].isdigit() and len(fields[9]) <= 20:
            inode = int(fields[9])
        out.append(ListenSocket(address=address, port=int(port_hex, 16), inode=inode, ipv6=ipv6 or is_v6))
    return out


def is_listening(sockets: Iterable[ListenSocket], port: int) -> bool:
    """Return True when any socket in `sockets` listens on TCP `port` (any address, IPv4 or IPv6).

    Pure; never raises.
    """
    return any(s.port == port for s in sockets)

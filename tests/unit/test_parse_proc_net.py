"""Tests for bot.core.parse.proc_net: fixed /proc/net/tcp{,6} text, this machine's live files, and fuzz."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.models import ListenSocket
from bot.core.parse.proc_net import is_listening, parse_proc_net_tcp

# Layout copied from this (Linux, x86-64) machine's /proc/net/tcp; values chosen for the test.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1081 1 00000000a50d00f3 100 0 0 10 0
   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 16287 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 16300 1 0000000000000000 20 4 30 10 -1
   3: 0A00000A:D431 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 100 0 0 10 0
"""  # noqa: E501

TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
   3: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:9C40 01 00000000:00000000 00:00000000 00000000     0        0 5555 1 0000000000000000 100 0 0 10 0
"""  # noqa: E501


def test_tcp4_listen_only() -> None:
    socks = parse_proc_net_tcp(TCP)
    assert socks == [
        ListenSocket(address="0.0.0.0", port=2024, inode=1081, ipv6=False),
        ListenSocket(address="127.0.0.1", port=8000, inode=16287, ipv6=False),
        ListenSocket(address="10.0.0.10", port=54321, inode=0, ipv6=False),
    ]
    assert is_listening(socks, 8000)
    assert not is_listening(socks, 50000)  # only ESTABLISHED there
    assert not is_listening([], 8000)


def test_tcp6_addresses() -> None:
    socks = parse_proc_net_tcp(TCP6, ipv6=True)
    assert [(s.address, s.port, s.inode, s.ipv6) for s in socks] == [
        ("::", 8080, 2222, True),
        ("::1", 22, 3333, True),
        ("::ffff:127.0.0.1", 8001, 4444, True),
    ]


def test_headerless_and_flag_mismatch() -> None:
    body = "\n".join(TCP.splitlines()[1:])
    assert parse_proc_net_tcp(body) == parse_proc_net_tcp(TCP)
    # wrong flag: addresses are still decoded by length
    assert [s.address for s in parse_proc_net_tcp(TCP6)] == ["::", "::1", "::ffff:127.0.0.1"]
    assert all(s.ipv6 for s in parse_proc_net_tcp(TCP6))
    assert all(s.ipv6 for s in parse_proc_net_tcp(TCP, ipv6=True))


def test_garbage_rows_skipped() -> None:
    text = (
        "   0: 0100007F:1F4 00000000:0000 0A\n"  # short port is still valid hex
        "   1: 0100007:1F40 00000000:0000 0A\n"  # 7 hex digits
        "   2: 0100007G:1F40 00000000:0000 0A\n"
        "   3: 0100007F:XYZ 00000000:0000 0A\n"
        "   4: 0100007F:11F40 00000000:0000 0A\n"
        "   5: 0100007F 00000000:0000 0A\n"
        "   6: 0100007F:1F40 00000000:0000 0a 0 0 0 0 0 notanumber\n"
        "truncated 0100007F:1F40\n"
    )
    socks = parse_proc_net_tcp(text)
    assert [(s.address, s.port, s.inode) for s in socks] == [
        ("127.0.0.1", 500, None),
        ("127.0.0.1", 8000, None),
    ]
    assert parse_proc_net_tcp("") == []


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
def test_live_proc_net_tcp_sees_our_listener() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        inode = Path(f"/proc/self/fd/{srv.fileno()}").stat().st_ino
        socks = parse_proc_net_tcp(Path("/proc/net/tcp").read_text())
        assert is_listening(socks, port)
        ours = [s for s in socks if s.port == port]
        assert ours == [ListenSocket(address="127.0.0.1", port=port, inode=inode, ipv6=False)]
    after = parse_proc_net_tcp(Path("/proc/net/tcp").read_text())
    assert not any(s.inode == inode for s in after)


def _ipv6_loopback_available() -> bool:
    if not socket.has_ipv6 or not Path("/proc/net/tcp6").exists():
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback_available(), reason="needs IPv6 loopback and /proc/net/tcp6")
def test_live_proc_net_tcp6_sees_our_listener() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as srv:
        srv.bind(("::1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        socks = parse_proc_net_tcp(Path("/proc/net/tcp6").read_text(), ipv6=True)
        assert [(s.address, s.ipv6) for s in socks if s.port == port] == [("::1", True)]


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.one_of(
        st.text(max_size=400),
        st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace")),
        st.lists(
            st.sampled_from([*TCP.splitlines(), *TCP6.splitlines(), " ", ":", "0A", "\x1b[0m", "\n"]),
            max_size=12,
        ).map("".join),
    ),
    st.booleans(),
)
def test_fuzz_never_raises(text: str, ipv6: bool) -> None:
    for s in parse_proc_net_tcp(text, ipv6=ipv6):
        assert 0 <= s.port <= 0xFFFF
        assert isinstance(s.address, str)

"""Regressions for the crashes the parser fuzzing (tests/fuzz/, `./dev fuzz`) found: each input here used to
raise out of a parser documented as "never raises" (or, for the config, as raising only ConfigError).

Python refuses `int()` of a string of more than 4300 digits (ValueError) and `float()` of an int over ~1e308
(OverflowError); `str.isdigit()` is also true for characters like "²" that `int()` rejects.
"""

from __future__ import annotations

import pytest

from bot.config import ConfigError, load_config
from bot.core.parse.log import parse_log_stat
from bot.core.parse.proc_net import parse_proc_net_tcp
from bot.core.probe import (
    HostPolicy,
    ProbeRequest,
    assemble_snapshot,
    parse_df_available_mib,
    parse_launch_tags,
    split_sections,
)
from tests.support.strategies import NONCE, frame

HUGE = "1" * 5000


def test_log_stat_with_absurdly_long_numbers_gives_none():
    assert parse_log_stat(f"{HUGE} 1764402000 {HUGE}") == (None, 1764402000.0, None)
    assert parse_log_stat("5652 1764402000 41") == (5652, 1764402000.0, 41)
    assert parse_log_stat(f"{'9' * 20} 1 1")[0] == 10**20 - 1  # 20 digits still parse


def test_proc_net_row_with_absurd_inode_keeps_the_socket_without_inode():
    row = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 "
    (sock,) = parse_proc_net_tcp(row + HUGE + " 1")
    assert (sock.address, sock.port, sock.inode) == ("127.0.0.1", 8080, None)
    assert parse_proc_net_tcp(row + "12345 1")[0].inode == 12345


def test_launch_tags_with_absurd_pid_are_skipped():
    text = f"/proc/{HUGE}/environ:GPUBOT_LAUNCH=12-abc\n/proc/569/environ:GPUBOT_LAUNCH=12-abc\n"
    assert parse_launch_tags(text) == {569: "12-abc"}


@pytest.mark.parametrize("avail", ["²", HUGE, "9" * 400, "-5", "١٢٣"])
def test_df_with_odd_available_column_gives_none(avail):
    head = "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
    assert parse_df_available_mib(f"{head}tmpfs 100 0 {avail} 0% /dev/shm\n") is None
    assert parse_df_available_mib(f"{head}tmpfs 100 0 2048 0% /dev/shm\n") == 2.0


def test_snapshot_from_sections_with_absurd_numbers_does_not_raise():
    out = (frame("clock", b"1764402000", 0) + frame("self", HUGE.encode(), 0)
           + frame("tags", f"/proc/{HUGE}/environ:GPUBOT_LAUNCH=x".encode(), 0)
           + frame("shm", f"h\ntmpfs 1 0 {HUGE} 0% /dev/shm".encode(), 0)
           + frame("log_stat", f"{HUGE} 1 {HUGE}".encode(), 0) + frame("log_tail", b"x\n", 0)
           + frame("tcp4", f"   0: 0100007F:1F90 00000000:0000 0A 0:0 0:0 0 0 0 {HUGE}".encode(), 0))
    req = ProbeRequest(log_path="/data/logs/a.log", port=8080, shm=True)
    policy = HostPolicy(log_dirs=("/data/logs",))
    policy.check(req)
    snap = assemble_snapshot("h", req, split_sections(out, NONCE), policy=policy)
    assert snap.launch_tags == {} and snap.shm_free_mib is None
    assert snap.log is not None and (snap.log.size_bytes, snap.log.lines) == (None, None)
    assert snap.port_listening is True and snap.listening[0].inode is None


@pytest.mark.parametrize(("data", "where", "char"), [
    (b"\x00", "line 1, column 1", "#x0000"),
    (b"hosts:\n  a: {local: true}\n  b\x1b[31m: x\n", "line 3, column 4", "#x001b"),
])
def test_config_with_a_control_character_is_a_config_error(tmp_path, data, where, char):
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        load_config(path, environ={})
    (msg,) = e.value.errors
    assert msg.startswith(f"{path}:{where}: YAML syntax error: unacceptable character {char}")


def test_a_suggestion_marker_in_a_probe_s_output_is_stripped_from_every_section():
    # found by test_fuzz_split_sections: a marker character (U+E000) right after `rc=` of an END marker
    n = NONCE.encode()
    out = (b"\n@@" + n + b" BEGIN health\n@@" + n + b" BEGIN ps@@" + n + b" END gpu rc=\xee\x80\x80\n@@" + n +
           b" END health rc=0\n")
    secs = split_sections(out, NONCE)
    assert set(secs) == {"health", "ps"} and not secs["health"].complete
    assert secs["ps"].body == b"@@" + n + b" END gpu rc=\n@@" + n + b" END health rc=0\n"
    assert all(b"\xee\x80" not in sec.body for sec in secs.values())

"""Tests for bot.core.probe: request validation, the host policy (log directories), the generated POSIX sh
script (syntax, quoting, markers), split_sections, and the whole script run for real with `sh -s` against a
replaying fake nvidia-smi."""

from __future__ import annotations

import dataclasses
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.models import Snapshot
from bot.core.parse.log import clean_log_lines
from bot.core.parse.nvidia_smi import parse_query_gpu
from bot.core.probe import (
    MAX_LINE_WIDTH,
    HostPolicy,
    ProbeRequest,
    ProbeRequestError,
    Section,
    assemble_snapshot,
    build_script,
    new_nonce,
    split_sections,
)
from bot.demo.fakegpu import install_fake_gpu

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")

NONCE = "0123456789abcdef"
HOSTILE = "/tmp/a'b$(id)`id`;x\"y\\z *?&|<>"
ALL_SECTIONS = ("clock", "hostname", "ps", "gpu", "gpu_apps", "log_stat", "log_tail", "tcp4", "tcp6", "health")


_POLICY_FIELDS = {f.name for f in dataclasses.fields(HostPolicy)}


def probe(**fields) -> tuple[ProbeRequest, HostPolicy]:
    """A request and the policy of the host it runs on, from one set of fields: HostPolicy's fields (`env` may
    be a dict) go to the policy, the others to the request. Unless `log_dirs` is given, the host allows the
    log's own directory."""
    policy = {k: fields.pop(k) for k in _POLICY_FIELDS & set(fields)}
    if isinstance(policy.get("env"), dict):
        policy["env"] = tuple(policy["env"].items())
    if fields.get("log_path") and "log_dirs" not in policy:
        policy["log_dirs"] = (fields["log_path"].rsplit("/", 1)[0] or "/",)
    return ProbeRequest(**fields), HostPolicy(**policy)


def script_for(**fields) -> str:
    """The script of `probe(**fields)` with NONCE."""
    req, policy = probe(**fields)
    return build_script(req, NONCE, policy)


def sh_syntax_ok(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-n"], input=script.encode(), capture_output=True, timeout=10)


def run_sh(script: str, *, path_prefix: Path | None = None, cwd: Path | None = None, timeout: float = 20) -> bytes:
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env.get('PATH', '/usr/bin:/bin')}"
    res = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, env=env, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


def full_request(**overrides) -> tuple[ProbeRequest, HostPolicy]:
    fields = dict(pid=1, pgid=2, sid=3, match="python -m sglang", log_path="/data/logs/server.log", port=8000,
                  health_path="/v1/health", tail_lines=50, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    fields.update(overrides)
    return probe(**fields)


# --- ProbeRequest.validate ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pid": 0}, "pid must be a process id between 1 and 4194304"),
        ({"pgid": -5}, "pgid must be a process id"),
        ({"sid": 4_194_305}, "sid must be a process id"),
        ({"port": 70000}, "port must be 1..65535"),
        ({"port": 0}, "port must be 1..65535"),
        ({"log_path": "logs/server.log"}, "log must be an absolute path"),
        ({"log_path": ""}, "log must be an absolute path"),
        ({"log_path": "/data/x\ny.log"}, "log must be an absolute path"),
        ({"log_path": "/data/x\ry.log"}, "log must be an absolute path"),
        ({"log_path": "/data/x\x00.log"}, "log must be an absolute path"),
        ({"log_path": "/data/\x1b[31m.log"}, "log must be an absolute path"),
        ({"log_path": "/" + "a" * 4096}, "log must be an absolute path"),
        ({"health_path": "/he alth"}, "health path must look like /health"),
        ({"health_path": "health"}, "health path must look like /health"),
        ({"health_path": "/health?x=$(id)"}, "health path must look like /health"),
        ({"tail_lines": 0}, "tail lines must be 1..500"),
        ({"tail_lines": 501}, "tail lines must be 1..500"),
        ({"match": "a" * 201}, "match must be 1..200 characters"),
        ({"match": ""}, "match must be 1..200 characters"),
        ({"match": "a\x00b"}, "match must be 1..200 characters"),
    ],
)
def test_validate_rejects(fields, message):
    req, policy = probe(**fields)
    pattern = message.replace("(", r"\(").replace(".", r"\.")
    with pytest.raises(ProbeRequestError, match=pattern):
        req.validate()
    with pytest.raises(ProbeRequestError, match=pattern):
        policy.check(req)
    with pytest.raises(ProbeRequestError):
        build_script(req, NONCE, policy)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"pid": 1, "pgid": 4_194_304, "sid": 1},
        {"port": 1, "health_path": "/"},
        {"port": 65535, "health_path": None},
        {"tail_lines": 1},
        {"tail_lines": 500},
        {"match": "a" * 200},
        {"match": "$(id) `x` 'q'"},
        {"log_path": HOSTILE},
        {"log_path": "/data/logs/ünïcode log.txt"},
    ],
)
def test_validate_accepts(fields):
    req, policy = probe(**fields)
    req.validate()
    policy.check(req)


@pytest.mark.parametrize("fields", [{"log_path": "/tmp/x.log\n"}, {"health_path": "/health\n"}])
def test_validate_rejects_trailing_newline(fields):
    with pytest.raises(ProbeRequestError):
        probe(**fields)[0].validate()


def test_nonce_must_be_hex():
    for bad in ("", "xyz", "ABCDEF0123", "0123", "01234567;id", "0123456789abcdef\n", "g" * 16):
        with pytest.raises(ValueError, match="nonce must be hex"):
            build_script(ProbeRequest(), bad, HostPolicy())


def test_probe_request_is_immutable_and_varied_with_replace():
    req = ProbeRequest(pid=5, port=8000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.pid = 6  # type: ignore[misc]
    other = dataclasses.replace(req, pid=6, log_path="/data/logs/x.log")
    assert (req.pid, req.log_path) == (5, None)
    assert (other.pid, other.port, other.log_path) == (6, 8000, "/data/logs/x.log")


# --- HostPolicy: what the host allows ---------------------------------------------------------------


def test_host_without_log_dirs_refuses_every_log_read():
    req = ProbeRequest(log_path="/data/logs/server.log")
    for policy in (HostPolicy(), HostPolicy(log_dirs=())):
        assert policy.allowed_log_dirs(req) == []
        with pytest.raises(ProbeRequestError, match=r"this host allows no log= reads: .*hosts\.<host>\.log_dirs"):
            policy.check(req)
        with pytest.raises(ProbeRequestError, match="this host allows no log= reads"):
            build_script(req, NONCE, policy)
    # a probe that reads no log needs no log directory
    HostPolicy().check(ProbeRequest(pid=1, port=8000))
    assert "b log_stat;" not in build_script(ProbeRequest(pid=1), NONCE)


@pytest.mark.parametrize("log_path", ["/etc/shadow", "/data/logsX/a.log", "/data/logs", "/data/other/logs/a.log"])
def test_log_outside_the_host_log_dirs_is_refused(log_path):
    policy = HostPolicy(log_dirs=("/data/logs", "/srv/log/"))
    message = "log= must be under this host's log directories: /data/logs, /srv/log/"
    with pytest.raises(ProbeRequestError, match=message):
        policy.check(ProbeRequest(log_path=log_path))
    with pytest.raises(ProbeRequestError):
        build_script(ProbeRequest(log_path=log_path), NONCE, policy)


@pytest.mark.parametrize("log_path", ["/data/logs/server.log", "/data/logs/deep/er.log", "/srv/log/x"])
def test_log_inside_the_host_log_dirs_is_allowed(log_path):
    policy = HostPolicy(log_dirs=("/data/logs", "/srv/log/"))
    req = ProbeRequest(log_path=log_path)
    policy.check(req)
    script = build_script(req, NONCE, policy)
    # the resolved path of the OPEN file (fd 3) is checked on the host against the same directories
    assert """R=$(readlink /proc/self/fd/3 2>/dev/null); case "$R" in /data/logs/* | /srv/log/*) OK=1;; esac""" \
        in script


def test_own_log_is_allowed_in_its_own_directory_only_on_a_host_without_log_dirs():
    own = ProbeRequest(log_path="/tmp/gpubot/launch-7.log", own_log=True)
    assert HostPolicy().allowed_log_dirs(own) == ["/tmp/gpubot"]
    HostPolicy().check(own)
    assert "case \"$R\" in /tmp/gpubot/*)" in build_script(own, NONCE)
    # a host with log_dirs keeps them, own log or not
    with pytest.raises(ProbeRequestError, match="log= must be under this host's log directories: /data/logs"):
        HostPolicy(log_dirs=("/data/logs",)).check(own)
    # a typed log= is not an own log
    with pytest.raises(ProbeRequestError, match="this host allows no log= reads"):
        HostPolicy().check(dataclasses.replace(own, own_log=False))
    assert HostPolicy().allowed_log_dirs(ProbeRequest(log_path="/top.log", own_log=True)) == ["/"]


def test_new_nonce_is_fresh_hex():
    nonces = {new_nonce() for _ in range(50)}
    assert len(nonces) == 50
    assert all(len(n) == 16 and all(c in "0123456789abcdef" for c in n) for n in nonces)


# --- the generated script -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "req_policy",
    [
        probe(),
        probe(gpu=False),
        full_request(),
        full_request(health_path=None),
        full_request(log_path=HOSTILE, match=HOSTILE[:200], env={"X": HOSTILE, "Y": "\n;'\""}),
        probe(nvidia_smi="/opt/nvidia/bin/nvidia smi;reboot", env={"BAD KEY": "x"}),
    ],
    ids=["default", "no-gpu", "full", "no-health", "hostile", "hostile-tool"],
)
def test_script_is_valid_posix_sh(req_policy):
    req, policy = req_policy
    script = build_script(req, NONCE, policy)
    res = sh_syntax_ok(script)
    assert res.returncode == 0, res.stderr.decode()
    assert res.stderr == b""
    assert script.endswith("exit 0\n")


def test_syntax_check_can_fail():
    # the check above is meaningful: sh -n does reject broken scripts
    assert sh_syntax_ok("if then fi\n").returncode != 0
    assert sh_syntax_ok(script_for() + "case x in\n").returncode != 0


def test_script_markers_use_nonce():
    req, policy = full_request()
    script = build_script(req, NONCE, policy)
    assert f"M={NONCE}\n" in script
    assert "b() { printf '\\n@@%s BEGIN %s\\n' \"$M\" \"$1\"; }" in script
    assert "e() { printf '\\n@@%s END %s rc=%s\\n' \"$M\" \"$1\" \"$2\"; }" in script
    for name in ALL_SECTIONS:
        assert f"b {name};" in script, name
        assert f"e {name} $" in script, name
    other = build_script(req, "fedcba9876543210", policy)
    assert NONCE not in other and "M=fedcba9876543210" in other


def test_script_sections_follow_request():
    minimal = script_for(gpu=False)
    for name in ("gpu", "gpu_apps", "log_stat", "log_tail", "tcp4", "tcp6", "health"):
        assert f"b {name};" not in minimal
    no_health = script_for(port=8000, health_path=None)
    assert "b tcp4;" in no_health and "b health;" not in no_health
    assert "tail -n 38" in script_for(log_path="/x", tail_lines=37)  # one line of context more than shown
    assert "timeout -k 2 3 " in script_for(nvidia_smi_timeout_s=3.2)
    assert "curl -sS -o /dev/null -m 7 " in script_for(port=8000, health_timeout_s=7.4)


def _outside_quotes(script: str, value: str) -> str:
    """The script with every shell-quoted occurrence of `value` removed."""
    return script.replace(shlex.quote(value), "<Q>")


def test_hostile_values_appear_only_quoted():
    hostile_env = "$(touch /tmp/pwned)`id`'\"\n"
    script = script_for(log_path=HOSTILE, env={"HOSTILE": hostile_env}, nvidia_smi="nvidia-smi;id",
                        port=8000, health_path="/h")
    assert f"L={shlex.quote(HOSTILE)}; OK=0;" in script
    assert f"export HOSTILE={shlex.quote(hostile_env)}\n" in script
    assert f"command -v {shlex.quote('nvidia-smi;id')} " in script
    rest = _outside_quotes(_outside_quotes(_outside_quotes(script, HOSTILE), hostile_env), "nvidia-smi;id")
    for needle in ("$(id)", "`id`", "$(touch", "a'b", "nvidia-smi;id"):
        assert needle not in rest, needle
    # health URL is quoted as one word
    assert shlex.quote("http://127.0.0.1:8000/h") in script


def test_match_is_never_sent_to_the_host():
    script = script_for(match="SECRET-MATCH-$(id)")
    assert "SECRET-MATCH" not in script


def test_invalid_env_names_are_dropped():
    script = script_for(env={"OK_NAME": "1", "BAD;touch /tmp/x": "v", "1X": "v", "A B": "v"})
    assert "export OK_NAME=1\n" in script
    assert "BAD;" not in script and "1X" not in script and "A B" not in script


def test_hostile_log_path_runs_without_expansion(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    log = f"{work}/$(touch MARKER)`touch MARKER2`'$(touch MARKER3)'.log"
    req, policy = probe(log_path=log, gpu=False, env={"E": "$(touch MARKER4)"})
    out = run_sh(build_script(req, NONCE, policy), cwd=work)
    assert sorted(os.listdir(work)) == []  # no MARKER* created anywhere in the working directory
    secs = split_sections(out, NONCE)
    assert secs["log_stat"] == Section(b"no such file\n", 2, True)
    assert secs["log_tail"].rc == 2 and secs["log_tail"].body == b""
    snap = assemble_snapshot("local", req, secs, policy=policy)
    assert snap.log is not None and snap.log.error == "no such file" and not snap.log.exists


def test_hostile_file_name_that_exists_is_read(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    log = work / "$(touch MARKER) `touch M2` 'q' \"d\" \\b.log"
    log.write_bytes(b"line one\nline two\n")
    req, policy = probe(log_path=str(log), gpu=False, tail_lines=5)
    out = run_sh(build_script(req, NONCE, policy), cwd=work)
    assert sorted(os.listdir(work)) == [log.name]
    snap = assemble_snapshot("local", req, split_sections(out, NONCE), policy=policy)
    assert snap.log is not None and snap.log.exists and snap.log.error is None
    assert snap.log.lines == 2 and snap.log.size_bytes == 18
    assert snap.log.tail == ["line one", "line two"]


def test_log_symlinked_out_of_the_log_dirs_is_not_read(tmp_path):
    allowed, outside = tmp_path / "logs", tmp_path / "private"
    allowed.mkdir()
    outside.mkdir()
    (outside / "secret.log").write_bytes(b"do not show\n")
    (allowed / "server.log").symlink_to(outside / "secret.log")
    (allowed / "real.log").write_bytes(b"shown\n")
    policy = HostPolicy(log_dirs=(str(allowed),))
    for name, stat, tail in (("server.log", Section(b"resolves outside the allowed log directories\n", 13, True),
                              Section(b"", 2, True)),
                             ("real.log", None, Section(b"shown\n", 0, True))):
        req = ProbeRequest(log_path=str(allowed / name), gpu=False)
        secs = split_sections(run_sh(build_script(req, NONCE, policy)), NONCE)
        assert secs["log_tail"] == tail, name
        if stat is not None:
            assert secs["log_stat"] == stat
            snap = assemble_snapshot("local", req, secs, policy=policy)
            assert snap.log is not None and not snap.log.exists and snap.log.tail == []
            assert snap.log.error == "resolves outside the allowed log directories"


def test_hostile_nvidia_smi_path_not_executed(tmp_path):
    req, policy = probe(nvidia_smi="nvidia-smi;touch MARKER", nvidia_smi_timeout_s=2)
    out = run_sh(build_script(req, NONCE, policy), cwd=tmp_path)
    assert not (tmp_path / "MARKER").exists()
    snap = assemble_snapshot("local", req, split_sections(out, NONCE), policy=policy)
    assert snap.gpu.ok is False and snap.gpu.error == "nvidia-smi not found on the host"


# --- split_sections -------------------------------------------------------------------------------


def marker(kind: str, name: str, rc: int | None = None, nonce: str = NONCE) -> bytes:
    tail = f" rc={rc}" if rc is not None else ""
    return f"\n@@{nonce} {kind} {name}{tail}\n".encode()


def frame(name: str, body: bytes, rc: int = 0, nonce: str = NONCE) -> bytes:
    """What the script's b/e functions print around a command's output."""
    return marker("BEGIN", name, nonce=nonce) + body + marker("END", name, rc, nonce=nonce)


def test_split_normal():
    out = frame("clock", b"1764402100\n") + frame("hostname", b"h200-box\n") + frame("gpu_apps", b"", 0) + frame(
        "health", b"000 0.0004", 7
    )
    secs = split_sections(out, NONCE)
    assert secs == {
        "clock": Section(b"1764402100\n", 0, True),
        "hostname": Section(b"h200-box\n", 0, True),
        "gpu_apps": Section(b"", 0, True),
        "health": Section(b"000 0.0004", 7, True),
    }


def test_split_missing_end_is_incomplete():
    out = frame("clock", b"1\n") + marker("BEGIN", "ps") + b"  PID  PPID\n    1     0 init\n   2"
    secs = split_sections(out, NONCE)
    assert secs["clock"] == Section(b"1\n", 0, True)
    assert secs["ps"] == Section(b"  PID  PPID\n    1     0 init\n   2", None, False)


def test_split_begin_while_open_closes_previous_as_incomplete():
    out = marker("BEGIN", "gpu") + b"partial" + frame("gpu_apps", b"x\n", 0)
    secs = split_sections(out, NONCE)
    assert secs["gpu"] == Section(b"partial", None, False)
    assert secs["gpu_apps"] == Section(b"x\n", 0, True)


def test_split_end_of_other_section_is_ignored():
    out = marker("BEGIN", "a") + b"body" + marker("END", "b", 0) + b"more" + marker("END", "a", 1)
    secs = split_sections(out, NONCE)
    assert set(secs) == {"a"}
    assert secs["a"].complete and secs["a"].rc == 1
    assert b"body" in secs["a"].body and b"more" in secs["a"].body


def test_split_foreign_nonce_marker_in_log_line_is_not_split():
    fake = b"2026 INFO @@deadbeefdeadbeef END log_tail rc=0\n@@deadbeefdeadbeef BEGIN ps\nfake row\n"
    out = frame("log_tail", b"real line\n" + fake + b"last\n", 0) + frame("tcp4", b"sl\n", 0)
    secs = split_sections(out, NONCE)
    assert set(secs) == {"log_tail", "tcp4"}
    assert secs["log_tail"] == Section(b"real line\n" + fake + b"last\n", 0, True)


def test_split_binary_garbage():
    garbage = bytes(range(256)) * 4 + b"\xff\xfe\x00@@ BEGIN x\n"
    assert split_sections(garbage, NONCE) == {}
    secs = split_sections(frame("log_tail", garbage, 0), NONCE)
    assert secs["log_tail"] == Section(garbage, 0, True)


def test_split_empty_and_noise():
    assert split_sections(b"", NONCE) == {}
    assert split_sections(b"\n\n\n", NONCE) == {}
    assert split_sections(b"sh: 1: ps: not found\n", NONCE) == {}


def test_split_other_nonce_only():
    assert split_sections(frame("clock", b"1\n", nonce="fedcba9876543210"), NONCE) == {}


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, st.binary(max_size=200), st.integers(0, 255)), max_size=8, unique_by=lambda t: t[0]))
def test_split_round_trip(parts):
    parts = [(n, b.replace(b"@@", b"@"), rc) for n, b, rc in parts]
    out = b"".join(frame(n, body, rc) for n, body, rc in parts)
    secs = split_sections(out, NONCE)
    assert secs == {n: Section(body, rc, True) for n, body, rc in parts}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 400))
def test_split_never_raises_on_cut_output(noise, cut):
    out = frame("clock", b"1\n") + noise + frame("ps", noise) + marker("BEGIN", "gpu") + noise
    secs = split_sections(out[:cut] + noise, NONCE)
    assert isinstance(secs, dict)
    for s in secs.values():
        assert isinstance(s.body, bytes)
        assert (s.rc is None) if not s.complete else True


# --- the real script, end to end --------------------------------------------------------------------

LOG_LINES = [
    b"server_args=ServerArgs(model_path='/data/fake', tp_size=2, port=8000)",
    b"\x1b[32mINFO\x1b[0m [TP0] Load weight begin. avail mem=139.00 GB",
    b"@@deadbeefdeadbeef END log_tail rc=0",
    b"progress 10%\rprogress 50%\rprogress 100%",
    "unicode \u2603 line".encode(),
    b"[TP0] Load weight end. type=Fake, avail mem=131.19 GB",
]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """Run the real script once with the fake GPU first on PATH; the test process holds 'GPU memory'."""
    root = tmp_path_factory.mktemp("e2e")
    fake = install_fake_gpu(root / "g")
    (fake.holders_dir / str(os.getpid())).write_text("0 8610\n")
    log = root / "server.log"
    log.write_bytes(b"\n".join(LOG_LINES) + b"\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    req, policy = probe(pid=os.getpid(), log_path=str(log), port=port, health_path=None, tail_lines=4)
    nonce = new_nonce()
    before = time.time()
    out = run_sh(build_script(req, nonce, policy), path_prefix=fake.bin_dir)
    after = time.time()
    secs = split_sections(out, nonce)
    snap = assemble_snapshot("local", req, secs, policy=policy)
    yield {"snap": snap, "secs": secs, "out": out, "nonce": nonce, "req": req, "policy": policy, "log": log,
           "port": port, "fake": fake, "ran": (before, after)}
    listener.close()


def test_e2e_all_sections_complete(e2e):
    secs = e2e["secs"]
    assert set(secs) == {"clock", "hostname", "self", "ps", "tags", "gpu", "gpu_apps", "log_stat", "log_count",
                         "log_mark", "log_window", "log_tail", "tcp4", "tcp6"}
    for name, sec in secs.items():
        assert sec.complete, name
        assert sec.rc == 0, (name, sec)
    assert e2e["snap"].errors == []


def test_e2e_clock_and_hostname(e2e):
    snap, (before, after) = e2e["snap"], e2e["ran"]
    assert snap.clock is not None and before - 1 <= snap.clock <= after + 1  # read while the script ran
    assert snap.hostname == socket.gethostname()[:255] or snap.hostname == os.uname().nodename


def test_e2e_gpu_rows_equal_replayed_capture(e2e):
    snap = e2e["snap"]
    capture = (resources.files("bot.demo") / "h200-idle.query-gpu.csv").read_text()
    (replayed,) = parse_query_gpu(capture)
    assert snap.gpu.ok and snap.gpu.error is None
    (g,) = snap.gpu.gpus
    assert g.name == "NVIDIA H200" and g.memory_total_mib == 143771
    # the fake adds the registered holder's memory to the replayed baseline and gives each GPU its own uuid
    expected = dataclasses.replace(replayed, uuid=g.uuid, memory_used_mib=replayed.memory_used_mib + 8610)
    assert g == expected
    assert g.uuid and g.uuid.startswith("GPU-")


def test_e2e_gpu_holder_is_this_process(e2e):
    snap = e2e["snap"]
    (holder,) = snap.gpu.processes
    assert holder.pid == os.getpid()
    assert holder.used_memory_mib == 8610
    assert holder.gpu_index == 0
    assert holder.process_name  # cmdline of this interpreter


def test_e2e_processes_contain_this_process(e2e):
    snap = e2e["snap"]
    me = next(p for p in snap.processes if p.pid == os.getpid())
    assert me.ppid == os.getppid()
    assert me.pgid == os.getpgid(0) and me.sid == os.getsid(0)
    assert me.rss_kib and me.rss_kib > 0
    assert "python" in me.args or "pytest" in me.args
    assert all(len(p.args) <= 4 * MAX_LINE_WIDTH + 1 for p in snap.processes)
    # the probe's own shell (a child of this process here) is never shown
    pids = {p.pid for p in snap.processes}
    assert not any(p.ppid == os.getpid() and p.args.startswith("sh") for p in snap.processes)
    assert not any(p.args.startswith("ps -eww") for p in snap.processes)
    assert snap.all_process_count >= len(pids) >= 1


def test_e2e_log_stat_and_tail(e2e):
    snap, log = e2e["snap"], e2e["log"]
    data = log.read_bytes()
    st_ = log.stat()
    assert snap.log is not None and snap.log.exists and snap.log.error is None
    assert snap.log.size_bytes == st_.st_size == len(data)
    assert snap.log.lines == data.count(b"\n") == len(LOG_LINES)
    assert abs(snap.log.mtime - st_.st_mtime) < 0.01  # sub-second mtime (GNU date -r %s.%N)
    assert snap.log.tail == clean_log_lines(b"\n".join(LOG_LINES[-4:]) + b"\n", max_lines=4)
    assert snap.log.tail == [
        "@@deadbeefdeadbeef END log_tail rc=0",
        "progress 100%",
        "unicode \u2603 line",
        "[TP0] Load weight end. type=Fake, avail mem=131.19 GB",
    ]


def test_e2e_listening_port(e2e):
    snap = e2e["snap"]
    assert snap.port == e2e["port"]
    assert snap.port_listening is True
    assert any(s.port == e2e["port"] and s.address == "127.0.0.1" for s in snap.listening)
    assert snap.health is None


def test_e2e_truncated_output(e2e):
    out, nonce, req, policy = e2e["out"], e2e["nonce"], e2e["req"], e2e["policy"]
    cut = out.index(f"@@{nonce} END ps".encode()) - 200  # killed while ps was printing
    secs = split_sections(out[:cut], nonce)
    assert secs["ps"].complete is False and secs["ps"].rc is None
    assert "gpu" not in secs and "log_stat" not in secs
    snap = assemble_snapshot("local", req, secs, policy=policy)
    assert snap.gpu.ok is False
    assert snap.gpu.error == "GPU readings missing from the probe output (probe cut short)"
    assert snap.log is not None and snap.log.error == "log stat missing from the probe output"
    assert snap.port_listening is None
    assert any("listening sockets unavailable" in e for e in snap.errors)
    assert snap.all_process_count > 0  # the rows printed before the cut still count


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")


@needs_curl
def test_e2e_closed_port_and_health(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    req, policy = probe(port=closed, gpu=False, health_timeout_s=1)
    nonce = new_nonce()
    snap = assemble_snapshot("local", req, split_sections(run_sh(build_script(req, nonce, policy)), nonce),
                             policy=policy)
    assert snap.port_listening is False
    assert all(sock.port != closed for sock in snap.listening)
    assert snap.health is not None and snap.health.status == "refused"
    assert snap.health.url == f"http://127.0.0.1:{closed}/health"
    assert snap.health.http_code is None


@needs_curl
def test_e2e_health_ok():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        port = srv.server_address[1]
        for path, status, code in (("/health", "ok", 200), ("/missing", "http_404", 404)):
            req, policy = probe(port=port, health_path=path, gpu=False, health_timeout_s=2)
            nonce = new_nonce()
            snap = assemble_snapshot("local", req, split_sections(run_sh(build_script(req, nonce, policy)), nonce),
                                     policy=policy)
            assert snap.port_listening is True
            assert snap.health is not None
            assert (snap.health.status, snap.health.http_code) == (status, code)
            assert snap.health.elapsed_s is not None and snap.health.elapsed_s >= 0
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    ("mode", "timeout_s", "error"),
    [
        ("exit:9", 5, "NVIDIA driver is not loaded (nvidia-smi exit 9)"),
        ("exit:6", 5, "no NVIDIA GPU found (nvidia-smi exit 6: No devices were found)"),
        ("hang", 1, "nvidia-smi did not answer in 1 s (killed by timeout)"),
    ],
)
def test_e2e_nvidia_smi_failures(tmp_path, mode, timeout_s, error):
    fake = install_fake_gpu(tmp_path / "g")
    fake.set_mode(mode)
    req, policy = probe(nvidia_smi_timeout_s=timeout_s)
    nonce = new_nonce()
    secs = split_sections(run_sh(build_script(req, nonce, policy), path_prefix=fake.bin_dir), nonce)
    assert secs["gpu"].complete
    snap = assemble_snapshot("local", req, secs, policy=policy)
    assert snap.gpu.ok is False
    assert snap.gpu.error is not None and snap.gpu.error.startswith(error)
    assert snap.all_process_count > 0  # the rest of the probe still answered


def test_e2e_no_gpu_requested():
    req = ProbeRequest(gpu=False, pid=os.getpid())
    nonce = new_nonce()
    secs = split_sections(run_sh(build_script(req, nonce, HostPolicy())), nonce)
    assert "gpu" not in secs and "gpu_apps" not in secs
    snap = assemble_snapshot("local", req, secs)
    assert isinstance(snap, Snapshot)
    assert snap.gpu.ok is False and snap.gpu.error == "GPU readings not requested"
    assert any(p.pid == os.getpid() for p in snap.processes)


def test_assemble_from_nothing_never_raises():
    req, policy = full_request()
    snap = assemble_snapshot("h", req, {}, policy=policy)
    assert snap.host == "h" and snap.clock is None and snap.hostname is None
    assert snap.gpu.ok is False
    assert "process table unavailable (ps failed or printed nothing)" in snap.errors
    assert snap.log is not None and snap.log.error == "log stat missing from the probe output"


def test_assemble_unreadable_clock():
    snap = assemble_snapshot("h", ProbeRequest(gpu=False), {"clock": Section(b"not a number\n", 0, True)})
    assert snap.clock is None and "remote clock unreadable" in snap.errors


def test_assemble_log_stat_failure_without_text():
    req = ProbeRequest(gpu=False, log_path="/x.log")
    snap = assemble_snapshot("h", req, {"log_stat": Section(b"", 1, True)})
    assert snap.log is not None and snap.log.error == "stat failed (rc=1)" and not snap.log.exists


def test_assemble_tcp_sections_failed_or_partial():
    tcp4 = (b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            b"   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 4242 1\n")
    req = ProbeRequest(gpu=False, port=8000, health_path=None)
    failed = assemble_snapshot("h", req, {"tcp4": Section(b"awk: not found\n", 127, True),
                                          "tcp6": Section(b"awk: not found\n", 127, True)})
    assert failed.port_listening is None
    assert any(e.startswith("listening sockets unavailable") for e in failed.errors)
    one = assemble_snapshot("h", req, {"tcp4": Section(tcp4, 0, True), "tcp6": Section(b"", 1, True)})
    assert one.port_listening is True
    assert [(s.address, s.port, s.inode) for s in one.listening] == [("127.0.0.1", 8000, 4242)]
    other = assemble_snapshot("h", ProbeRequest(gpu=False, port=8001, health_path=None),
                              {"tcp4": Section(tcp4, 0, True), "tcp6": Section(b"", 0, True)})
    assert other.port_listening is False

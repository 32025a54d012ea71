"""Shared pieces of the `./dev bench` suite: the load header and footer, the bot's CPU clock, the loopback SSH
host the benchmarks probe (OpenSSH sshd, logged in as a user whose shell is /bin/sh), and helper processes
(sleeping processes, a health endpoint, a TCP delay proxy), each cleaned up in a `finally`.

Only public gpubot APIs and `tests.support` are used, so the benchmarks run against any checkout with the same
API (`python -m benchmarks --tree PATH`: `import bot` then resolves to PATH; the header prints where it came from).
Not a benchmark itself.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import json
import os
import pwd
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bot

HERE = Path(__file__).resolve().parent
#: The checkout `import bot` came from (the tree under test).
TREE = Path(bot.__file__).resolve().parents[1]
#: The login user of the benchmark host when running as root (root's login shell, bash, reads a .bashrc).
BENCH_USER = "gpubot-bench"
#: Helper processes of the benchmarks themselves (never counted as the bot's CPU).
HELPER_SCRIPTS = ("delay_proxy.py", "health_server.py", "loopback_host.py", "replay_host.py", "subreaper.py")


# ---------------------------------------------------------------------------------------------- header, figures


def parse_args(doc: str | None, add: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The common command line (`--quick` for fewer rounds) plus what `add` adds; `doc` is the help text."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run; medians are rougher)")
    if add is not None:
        add(ap)
    return ap.parse_args()


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def _commit(tree: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no git"
    return (out[:70] + (" (+ local changes)" if dirty else "")) if out else "no git"


def header(name: str, what: str) -> float:
    """Print the benchmark's header (what it measures, the load, where `bot` came from) and return its start
    time; from here on SIGINT and SIGTERM run the registered cleanups (see `cleanup`) and exit. Exits (status 2)
    when `GPUBOT_BENCH_TREE` names a tree that `import bot` did not come from."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupted)
    print(f"== {name}: {what}", flush=True)
    print(f"   before: {_load()}")
    print(f"   bot from {Path(bot.__file__).resolve()}  [{_commit(TREE)}]")
    print(f"   python {sys.version.split()[0]} {sys.executable} | benchmark code from {HERE}")
    wanted = os.environ.get("GPUBOT_BENCH_TREE")
    if wanted and Path(wanted).resolve() != TREE:
        print(f"   ERROR: asked for the tree {wanted}, but `import bot` came from {TREE}", flush=True)
        raise SystemExit(2)
    sys.stdout.flush()
    return time.monotonic()


def footer(start: float) -> None:
    """Print the load again and how long the benchmark took."""
    print(f"   after:  {_load()}; took {time.monotonic() - start:.0f} s", flush=True)


def figure(label: str, value: str, meaning: str) -> None:
    """One figure: a label, its value, and what it means in one line."""
    print(f"  {label:<34} {value:>16}   {meaning}", flush=True)


def note(text: str) -> None:
    """An indented remark."""
    print(f"  ({text})", flush=True)


def median(values: Sequence[float]) -> float:
    """Median (nan for no values)."""
    return statistics.median(values) if values else float("nan")


def ms(seconds: float) -> str:
    """Seconds as milliseconds text."""
    return f"{seconds * 1e3:.1f} ms"


def ratio(a: float, b: float) -> str:
    """a / b as `x1.23` (n/a when b is 0 or nan)."""
    return f"x{a / b:.2f}" if b and b == b and a == a else "n/a"


# ------------------------------------------------------------------------------------------------- cleanup

_CLEANUPS: dict[int, Callable[[], object]] = {}
_keys = itertools.count()


@contextlib.contextmanager
def cleanup(fn: Callable[[], object]) -> Iterator[None]:
    """Run `fn` when the block ends, however it ends; also when the benchmark is interrupted (SIGINT or SIGTERM
    after `header`: the handler runs every registered `fn`, newest first, then exits), since code under test
    may swallow the cancellation that asyncio.run turns Ctrl-C into. `fn` must be safe to run twice."""
    key = next(_keys)
    _CLEANUPS[key] = fn
    try:
        yield
    finally:
        _CLEANUPS.pop(key, None)
        fn()


def _interrupted(signum: int, _frame: object) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C does not interrupt the cleanup
    print(f"\n   interrupted ({signal.Signals(signum).name}): cleaning up", flush=True)
    for fn in reversed(list(_CLEANUPS.values())):
        with contextlib.suppress(Exception):
            fn()
    sys.stdout.flush()
    os._exit(128 + signum)


# ----------------------------------------------------------------------------------------------- CPU clocks

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int, *, children: bool = False) -> float:
    """utime+stime of process `pid` from /proc (with `children`: plus its reaped children's cutime+cstime),
    seconds; 0.0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


def _children(pid: int) -> list[int]:
    """Child PIDs of `pid` (the /proc children files of its threads; a /proc scan where the kernel has none)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except FileNotFoundError:
            return _children_by_scan(pid)
        except OSError:
            continue
    return out


def _children_by_scan(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _descendants(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        for k in _children(todo.pop()):
            out.append(k)
            todo.append(k)
    return out


def worker_pids() -> list[int]:
    """PIDs of the bot's own worker processes alive now: its CPU worker (bot.adapters.cpu, in trees that have
    one). Read from the bot's own state, not by walking the process tree: a walk over the benchmarks' thousand
    sleeping children would itself cost more than what it measures."""
    try:
        from bot.adapters import cpu  # type: ignore[attr-defined]
    except ImportError:
        return []
    worker = getattr(cpu, "_worker", None)
    return [worker.pid] if worker is not None and worker.poll() is None else []


def worker_cpu_s() -> float:
    """CPU seconds of the bot's live worker processes (`worker_pids`); 0.0 while it has none."""
    return sum(proc_cpu_s(pid) for pid in worker_pids())


def bot_cpu_s() -> float:
    """The bot's CPU seconds so far: user+sys of this process (resource.getrusage(RUSAGE_SELF)) plus the CPU of
    its live worker processes (`worker_cpu_s`). The SSH server is never in this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime + worker_cpu_s()


def children_cpu_s() -> float:
    """user+sys of this process's reaped children (resource.getrusage(RUSAGE_CHILDREN))."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------------------------- polling, temp


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.01) -> Any:
    """Poll `cond` until it returns something truthy (returned); TimeoutError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(step_s)


@contextlib.contextmanager
def shared_tmpdir(prefix: str) -> Iterator[Path]:
    """A temporary directory readable by every user (the host's login user reads logs and the fake GPU from
    it), removed at the end."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    with cleanup(lambda: shutil.rmtree(d, ignore_errors=True)):
        d.chmod(0o755)
        yield d


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the file system holding `path`."""
    return shutil.disk_usage(path).free


# ----------------------------------------------------------------------------------------------- processes


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group of `proc` (a session it leads) and reap `proc`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Close `proc`'s stdin (the helpers exit on that), then terminate it (then kill it) and reap it."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _group_count(pgid: int, comm: str) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                head, rest = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)
            except (OSError, ValueError):
                continue
            fields = rest.split()
            if head.endswith("(" + comm) and fields[0] != "Z" and int(fields[2]) == pgid:
                n += 1
    return n


@contextlib.contextmanager
def sleepers(n: int, seconds: int = 100000) -> Iterator[int]:
    """`n` real `sleep SECONDS` processes in one process group (a shell's, started here); yields the group id.
    The whole group is killed at the end. The shell's own command line does not contain `sleep SECONDS`."""
    script = f"s={int(seconds)}; i=0; while [ $i -lt {int(n)} ]; do sleep $s & i=$((i+1)); done; wait"
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    with cleanup(lambda: _kill_group(proc)):
        wait_for(lambda: _group_count(proc.pid, "sleep") >= n, 120, f"{n} sleeping processes", step_s=0.1)
        yield proc.pid


def _helper(script: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start a helper script of this folder by path in its own session; return it and its first stdout line."""
    proc = subprocess.Popen([sys.executable, str(HERE / script), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{script} exited before it was ready (rc={proc.wait()})")
        return proc, line.strip()
    except BaseException:
        _kill_group(proc)
        raise


@contextlib.contextmanager
def health_server() -> Iterator[int]:
    """A tiny HTTP server on 127.0.0.1 (its own process) answering 200 on /health; yields its port."""
    proc, line = _helper("health_server.py")
    with cleanup(lambda: _stop(proc)):
        yield int(line)


@contextlib.contextmanager
def delay_proxy(target_port: int, rtt_ms: float) -> Iterator[int]:
    """A TCP forwarder to 127.0.0.1:target_port delaying each direction by rtt_ms/2 (its own process, any number
    of connections); yields its port."""
    proc, line = _helper("delay_proxy.py", "--target-port", str(target_port), "--rtt-ms", str(rtt_ms))
    with cleanup(lambda: _stop(proc)):
        yield int(line)


# ----------------------------------------------------------------------------------------------- the SSH host


@dataclass
class BenchHost:
    """The loopback SSH host the benchmarks probe, with what `tests.support.builders.ssh_host` reads (host, port,
    username, client_key_path, known_hosts_path) plus `kind`, `shell`, `host_pub_key`, `server_pid` (the process
    whose reaped children are the host side's CPU: sshd's subreaper, or the asyncssh server's process),
    `idle_children` (how many descendants it has with no connection open) and `python` (an interpreter the
    login user can run)."""

    kind: str
    host: str
    port: int
    username: str
    shell: str
    client_key_path: Path
    known_hosts_path: Path
    host_pub_key: str
    server_pid: int
    python: str
    idle_children: int = 0

    def host_cpu_s(self) -> float:
        """CPU seconds of the server side: the server process and its direct children (the sshd listener), each
        with its reaped children. A session counts once its connection closed and it was reaped."""
        return proc_cpu_s(self.server_pid, children=True) + sum(
            proc_cpu_s(c, children=True) for c in _children(self.server_pid))

    def live_children(self) -> int:
        """How many processes serve connections now (0 once every closed connection was reaped)."""
        return len(_descendants(self.server_pid)) - self.idle_children

    def known_hosts_for(self, port: int, directory: Path) -> Path:
        """A known_hosts file (in `directory`) naming this host's key on `127.0.0.1:port` too (a proxy's port)."""
        path = directory / f"known_hosts.{port}"
        path.write_text(f"[{self.host}]:{self.port} {self.host_pub_key}\n[{self.host}]:{port} {self.host_pub_key}\n")
        return path

    def ssh_argv(self, *options: str, port: int | None = None, known_hosts: Path | None = None) -> list[str]:
        """An OpenSSH `ssh` client command line to this host (bench key, BatchMode, its known_hosts, no user
        config); append the remote command."""
        return ["ssh", "-F", "/dev/null", "-i", str(self.client_key_path), "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts or self.known_hosts_path}",
                "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR", *options,
                "-p", str(port or self.port), f"{self.username}@{self.host}"]


def ensure_bench_user() -> str | None:
    """As root: the user BENCH_USER (created once: a system user, no home, shell /bin/sh, a password field of
    `*` so sshd does not read the account as locked). None when not root, or when it cannot be created."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(BENCH_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", "/bin/sh", "--password", "*", BENCH_USER],
                              capture_output=True, text=True, check=False)
        if made.returncode != 0 and "already exists" not in made.stderr:
            note(f"could not create the user {BENCH_USER}: {made.stderr.strip()}; logging in as root")
            return None
    return BENCH_USER


def _python_for(user: str) -> str:
    """An interpreter `user` can execute: this one when every directory above it is world-searchable, else
    /usr/bin/python3."""
    if user == pwd.getpwuid(os.getuid()).pw_name:
        return sys.executable
    real = Path(os.path.realpath(sys.executable))
    if all(os.stat(p).st_mode & 0o001 for p in real.parents) and os.stat(real).st_mode & 0o001:
        return str(real)
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _open_sshd(tmp: Path, *, username: str | None, extra_config: list[str], max_sessions: int) -> Any:
    """An OpenSSHServer with `username` and `extra_config`; a tree whose OpenSSHServer predates those arguments
    gets them through a subclass."""
    from tests.support.fakes.sshd import OpenSSHServer

    params = inspect.signature(OpenSSHServer).parameters
    if "username" in params and "extra_config" in params:
        return OpenSSHServer(tmp, max_sessions=max_sessions, username=username, extra_config=extra_config)

    class _Compat(OpenSSHServer):  # type: ignore[misc, valid-type]
        def _write_config(self) -> None:
            super()._write_config()
            with open(self.config_path, "a") as f:
                f.write("".join(line + "\n" for line in extra_config))

    srv = _Compat(tmp, max_sessions=max_sessions)
    if username and username != srv.username:
        srv.username = username
        os.chmod(srv.dir, 0o755)
    return srv


@contextlib.contextmanager
def _loopback_host(tmp: Path, max_sessions: int) -> Iterator[BenchHost]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TREE), os.environ.get("PYTHONPATH", "")]).rstrip(":"))
    proc, line = _helper("loopback_host.py", str(tmp), str(max_sessions), env=env)
    with cleanup(lambda: _stop(proc)):
        info = json.loads(line)
        user = pwd.getpwuid(os.getuid()).pw_name
        yield BenchHost(kind="asyncssh LoopbackSSHServer in its own process (sshd not installed)",
                        host=info["host"], port=info["port"], username=info["username"], shell="/bin/sh -c",
                        client_key_path=Path(info["client_key_path"]),
                        known_hosts_path=Path(info["known_hosts_path"]), host_pub_key=info["host_pub_key"],
                        server_pid=proc.pid, python=_python_for(user))


@dataclass
class ReplayHost:
    """One replaying SSH server (benchmarks/replay_host.py), with what `host_config` reads, and its process."""

    host: str
    port: int
    username: str
    client_key_path: Path
    known_hosts_path: Path
    server_pid: int


@contextlib.contextmanager
def replay_hosts(tmp: Path, count: int, recording: Path, delay_ms: float, *,
                 max_sessions: int = 10) -> Iterator[list[ReplayHost]]:
    """`count` replaying SSH servers (benchmarks/replay_host.py), each a process of its own, answering every probe
    with `recording` after `delay_ms` ms of sleep; stopped on exit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TREE), os.environ.get("PYTHONPATH", "")]).rstrip(":"))
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(count):
            proc, line = _helper("replay_host.py", str(tmp / f"replay{i}"), str(max_sessions), str(recording),
                                 str(delay_ms), env=env)
            stack.enter_context(cleanup(lambda proc=proc: _stop(proc)))
            info = json.loads(line)
            servers.append(ReplayHost(host=info["host"], port=info["port"], username=info["username"],
                                      client_key_path=Path(info["client_key_path"]),
                                      known_hosts_path=Path(info["known_hosts_path"]), server_pid=proc.pid))
        yield servers


@contextlib.contextmanager
def bench_host(tmp: Path, *, max_sessions: int = 10, max_startups: int = 100) -> Iterator[BenchHost]:
    """The SSH host to probe: OpenSSH sshd on 127.0.0.1 when installed (as root, logged in as BENCH_USER so
    sessions start /bin/sh, not root's bash and its .bashrc), else the asyncssh LoopbackSSHServer in its own
    process (never in this one: its CPU would count as the bot's). GPUBOT_BENCH_SERVER=loopback forces the
    latter. `tmp` must be readable by every user. Prints which server, user and shell were used."""
    from tests.support.fakes.sshd import OpenSSHUnavailable, sshd_available

    if os.environ.get("GPUBOT_BENCH_SERVER") != "loopback" and sshd_available():
        user = ensure_bench_user()
        extra = [f"MaxStartups {int(max_startups)}"]
        srv = _open_sshd(tmp / "sshd", username=user, extra_config=extra, max_sessions=max_sessions)
        # sshd runs under benchmarks/subreaper.py: OpenSSH's monitor exits without reaping the session
        # process, whose CPU (the commands') would otherwise be lost to init
        wrapper = tmp / "sshd-under-subreaper"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'subreaper.py'} {srv.sshd} \"$@\"\n")
        wrapper.chmod(0o755)
        srv.sshd = str(wrapper)
        started = False
        with cleanup(srv.stop):
            try:
                srv.start()
                started = True
            except OpenSSHUnavailable as e:
                note(f"sshd did not start ({e}); using the asyncssh server instead")
            if started:
                shell = pwd.getpwnam(srv.username).pw_shell
                host = BenchHost(kind="OpenSSH sshd on 127.0.0.1", host=srv.host, port=srv.port,
                                 username=srv.username, shell=shell, client_key_path=Path(srv.client_key_path),
                                 known_hosts_path=Path(srv.known_hosts_path), host_pub_key=srv.host_pub_key,
                                 server_pid=srv.pid, python=_python_for(srv.username), idle_children=1)
                print(f"   host: {host.kind} (MaxSessions {max_sessions}, MaxStartups {max_startups}), "
                      f"login {host.username} (shell {host.shell})", flush=True)
                yield host
        if started:
            return
    with _loopback_host(tmp / "loopback", max_sessions) as host:
        print(f"   host: {host.kind}, login {host.username} ({host.shell})", flush=True)
        yield host


def host_config(host: BenchHost, **overrides: Any) -> Any:
    """A HostConfig for `host` (tests.support.builders.ssh_host) with generous timeouts; `overrides` win."""
    from tests.support.builders import ssh_host

    fields: dict[str, Any] = {"connect_timeout_s": 30, "command_timeout_s": 60, "keepalive_interval_s": 0}
    fields.update(overrides)
    return ssh_host(host, **fields)


def fake_gpu(directory: Path, host: BenchHost) -> Any:
    """The replaying fake nvidia-smi (bot.demo.fakegpu.install_fake_gpu) under `directory`, run by an
    interpreter the host's login user can execute."""
    from bot.demo.fakegpu import install_fake_gpu

    return install_fake_gpu(directory, gpu_count=1, python=host.python)


def query_fields() -> tuple[str, str]:
    """The nvidia-smi fields the tree's probe queries (--query-gpu, --query-compute-apps), comma-joined; a
    typical set where the tree does not name them."""
    try:
        from bot.core.parse import nvidia_smi

        return ",".join(nvidia_smi.GPU_QUERY_FIELDS), ",".join(nvidia_smi.APPS_QUERY_FIELDS)
    except (ImportError, AttributeError):
        return ("index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
                "pid,process_name,gpu_uuid,used_memory")


def static_gpu_stub(directory: Path, fake: Any) -> Path:
    """A `sh` stand-in for nvidia-smi that prints what the replaying fake (`fake`, from `fake_gpu`) printed
    once for the probe's two queries: the same rows at a few milliseconds of host CPU instead of a Python
    start-up per call (for benchmarks where one machine plays hundreds of hosts). Returns its path."""
    gpu, apps = query_fields()
    directory.mkdir(parents=True, exist_ok=True)
    for name, query in (("gpu.csv", f"--query-gpu={gpu}"), ("apps.csv", f"--query-compute-apps={apps}")):
        out = run_local([str(fake.nvidia_smi), query, "--format=csv,noheader,nounits"], timeout=60)
        (directory / name).write_bytes(out.stdout)
    stub = directory / "nvidia-smi"
    stub.write_text("#!/bin/sh\ncase \"$*\" in\n"
                    f"  *--query-compute-apps*) exec cat {directory / 'apps.csv'} ;;\n"
                    f"  *--query-gpu*) exec cat {directory / 'gpu.csv'} ;;\n"
                    "esac\necho 'stub nvidia-smi: unsupported arguments' >&2; exit 2\n")
    stub.chmod(0o755)
    return stub


async def timed(coro_fn: Callable[[], Any], rounds: int) -> list[float]:
    """Wall seconds of `await coro_fn()`, `rounds` times one after another."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        await coro_fn()
        out.append(time.perf_counter() - t)
    return out


def run_local(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """subprocess.run with output captured and no check."""
    return subprocess.run(list(argv), capture_output=True, check=False, **kwargs)


def free_port() -> int:
    """An ephemeral TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

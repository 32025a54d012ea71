"""gpubot against a real NVIDIA GPU, run on the GPU host itself (pytest marker `gpu`).

The whole product runs here, the way a user would run it, with only Slack faked:
- the "GPU host" `gpu-host-1` is this machine reached over real SSH (the project's asyncssh server on
  loopback, `tests/support/fakes/ssh_server.py`), with the REAL `nvidia-smi` on its PATH;
- two more hosts are this machine as `local: true`: `local-nvml` reads the GPUs through NVML (pynvml),
  `local-smi` through nvidia-smi (`use_nvml: false`), so the two backends are compared on one GPU;
- the bot is the real Bolt app talking to the local fake of Slack (`tests/support/slack.py` `start_stack`),
  with the readiness watcher running (small interval and silence threshold);
- the server variant `torch` is `tests/gpu/torch_server.py`: a launcher and 2 TP-rank worker processes,
  each holding real torch tensors on cuda:0 and logging SGLang-style phase lines; `mode=hang` goes silent
  after `Load weight end` with the memory held (case 00), `mode=ready` serves `/health`.

What is checked, against `nvidia-smi` and NVML read independently in the same run:
- `/gpu status all` (the posted text, and the snapshots behind it): GPU memory within 1 %, the same PIDs
  with the same memory each, on all three hosts (so the NVML and nvidia-smi backends agree);
- the hang gets ONE `silent_hang` alert in the launch's thread whose evidence carries the real GPU memory
  and 0 % utilization;
- the ready variant gets "ready";
- `/kill` brings the GPU memory back to the idle level, read through NVML.

Every figure measured goes to the JSON file named by $GPUBOT_GPU_RESULTS (when set) and is printed with a
`[gpu-results]` prefix; tests/gpu/RESULTS.md is written from it.

On a machine without a GPU (no nvidia-smi, or no torch with CUDA for this Python) every test here is
skipped, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bot.adapters.bundle import read_bundle
from bot.config import Config, WatchPolicy
from bot.core.diagnose import diagnose
from bot.core.models import LaunchState, Snapshot
from tests.support.builders import ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.procs import free_port, pids_of_launch, wait_until
from tests.support.slack import SlackStack, start_stack

SERVER = Path(__file__).with_name("torch_server.py")
HOSTS = ("gpu-host-1", "local-nvml", "local-smi")
OPERATOR, VIEWER, CHANNEL = "U0OPERATOR", "U0VIEWER", "C1"
MIB = float(1 << 20)
#: After a kill, NVML must read at most this much more than the idle level measured before the launch.
IDLE_SLACK_MIB = 64.0

# Small readiness-check settings: a check every second, a hang called after 4 s of silence once the
# weights are loaded. The start-up phases get generous grace: importing torch takes seconds.
# Once ready: a liveness check every second, an alert after 2 failed health checks in a row, 3 s of log
# silence for a serving hang.
POLICY = WatchPolicy(interval_s=1.0, silence_after_s=4.0, serving_interval_s=1.0, health_failures=2,
                     phase_grace_s={"comm_init": 90.0, "weight_loading": 60.0, "kv_cache_alloc": 30.0,
                                    "cuda_graph_capture": 60.0, "warmup": 30.0, "serving": 3.0})


def _gpu_missing() -> tuple[str | None, dict]:
    """(why the GPU tests cannot run here, or None; what torch reported)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU: nvidia-smi not found on PATH", {}
    try:
        out = subprocess.run([smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no NVIDIA GPU: nvidia-smi failed ({e})", {}
    if out.returncode != 0 or not out.stdout.strip():
        return f"no NVIDIA GPU: nvidia-smi exited {out.returncode}: {(out.stdout + out.stderr).strip()[:200]}", {}
    if importlib.util.find_spec("torch") is None:
        return f"no torch for {sys.executable}: the GPU test's server needs torch with CUDA", {}
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'available': torch.cuda.is_available(), 'count': torch.cuda.device_count()}))")
    try:
        probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        info = json.loads(probe.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return f"torch.cuda unavailable: importing torch failed ({type(e).__name__})", {}
    if not info.get("available") or not info.get("count"):
        return f"torch.cuda unavailable (torch {info.get('torch')}, CUDA {info.get('cuda')})", info
    return None, info


WHY_NOT, TORCH_INFO = _gpu_missing()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "a GPU is present"),
    pytest.mark.timeout(240),
]

# --- results -------------------------------------------------------------------------------------------

RESULTS: dict = {}


def record(**items) -> None:
    """Keep figures for RESULTS.md: into $GPUBOT_GPU_RESULTS (JSON, rewritten each time) and stdout."""
    RESULTS.update(items)
    path = os.environ.get("GPUBOT_GPU_RESULTS")
    if path:
        Path(path).write_text(json.dumps(RESULTS, indent=2, sort_keys=True, default=str))
    for k, v in items.items():
        print(f"[gpu-results] {k}: {json.dumps(v, sort_keys=True, default=str)}", flush=True)


# --- independent readings: NVML and nvidia-smi, not through the bot ------------------------------------


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_read() -> dict:
    """Every GPU through pynvml: used/total MiB (memory v2, as nvidia-smi), v1 `used`, util %, processes."""
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:  # v2: `used` without the driver's reserved memory, which is what nvidia-smi shows
                m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError, TypeError, AttributeError):
                m2 = m1
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            procs = {}
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs[int(p.pid)] = None if used is None else used / MIB
            gpus.append({"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)), "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
                         "used_mib": m2.used / MIB, "total_mib": m2.total / MIB,
                         "reserved_mib": getattr(m2, "reserved", 0) / MIB, "used_v1_mib": m1.used / MIB,
                         "util_pct": float(util.gpu), "procs": procs})
        return {"t": time.time(), "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "gpus": gpus}
    finally:
        pynvml.nvmlShutdown()


def _num(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None  # [N/A], [Not Supported]


def smi_read() -> dict:
    """Every GPU through the nvidia-smi CLI (CSV): used/total MiB, util %, the compute processes per GPU."""
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60, check=True)
    a = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=60, check=True)
    gpus = []
    for line in q.stdout.strip().splitlines():
        idx, uuid, name, used, total, util = (c.strip() for c in line.split(","))
        gpus.append({"index": int(idx), "uuid": uuid, "name": name, "used_mib": _num(used),
                     "total_mib": _num(total), "util_pct": _num(util), "procs": {}})
    for line in a.stdout.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit():
            for g in gpus:
                if g["uuid"] == cells[1]:
                    g["procs"][int(cells[0])] = _num(cells[2])
    return {"t": time.time(), "gpus": gpus}


def close(a: float | None, b: float | None, pct: float = 1.0, floor: float = 1.0) -> bool:
    """a and b agree within `pct` % of the larger (and at least `floor`, for rounding to whole MiB)."""
    if a is None or b is None:
        return False
    return abs(a - b) <= max(floor, pct / 100.0 * max(abs(a), abs(b)))


def pct_diff(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or max(abs(a), abs(b)) == 0:
        return None
    return round(100.0 * abs(a - b) / max(abs(a), abs(b)), 4)


# --- the stack ------------------------------------------------------------------------------------------


@pytest.fixture
async def real_ssh(tmp_path):
    """The loopback SSH server with this machine's own environment: the real nvidia-smi on PATH."""
    async with LoopbackSSHServer(tmp_path / "ssh") as srv:
        yield srv


def gpu_config(srv, tmp_path) -> Config:
    """`gpu-host-1` over SSH, `local-nvml` and `local-smi`; the `torch` variant on gpu-host-1, GPU 0. Kills:
    3 s from SIGTERM to SIGKILL, 10 s for the memory to be released. A small /dev/shm must not stop the GPU
    test itself: then the pre-launch /dev/shm check is lowered to 0 (and that is recorded)."""
    variant = {
        "host": "gpu-host-1",
        "command": "{{ python }} {{ server }} --workers {{ workers }} --gib {{ gib }} --kv-gib {{ kv_gib }}"
                   " --port {{ port }} --mode {{ mode }} --single {{ single }} --escape-gib {{ escape_gib }}"
                   " --oom-after {{ oom_after }} --compile-s {{ compile_s }}",
        "params": {
            "python": {"type": "path", "default": sys.executable},
            "server": {"type": "path", "default": str(SERVER)},
            "workers": {"type": "int", "default": 2, "min": 1, "max": 8},
            "gib": {"type": "float", "default": 4.0, "min": 0.5, "max": 120},
            "kv_gib": {"type": "float", "default": 1.0, "min": 0, "max": 16},
            "mode": {"type": "str", "default": "ready",
                     "choices": ["ready", "hang", "init_hang", "capture_spin", "compile_silent"]},
            "single": {"type": "int", "default": 0, "min": 0, "max": 1},
            "escape_gib": {"type": "float", "default": 0.0, "min": 0, "max": 16},
            "oom_after": {"type": "float", "default": 0.0, "min": 0, "max": 120},
            "compile_s": {"type": "float", "default": 40.0, "min": 0, "max": 300},
        },
        "port": free_port(),
        "gpus": [0],
        "health": "/health",
        "log": str(tmp_path / "logs" / "{{ variant }}-{{ launch_id }}.log"),
    }
    smi = {"nvidia_smi_timeout_s": 20, "command_timeout_s": 45}
    lifecycle: dict = {"kill_grace_s": 3, "release_timeout_s": 10}
    st = os.statvfs("/dev/shm")
    shm_free = st.f_bavail * st.f_frsize / MIB
    if shm_free < Config().lifecycle.min_shm_free_mib:
        record(shm_note=f"/dev/shm has {shm_free:.0f} MiB free; the pre-launch /dev/shm check was lowered to 0")
        lifecycle["min_shm_free_mib"] = 0.0
    py_spy = shutil.which("py-spy") or next((p for p in ("/tmp/site/bin/py-spy", "/tmp/pyspy/bin/py-spy")
                                             if os.access(p, os.X_OK)), "py-spy")
    return Config.model_validate({
        "hosts": {"gpu-host-1": ssh_host(srv, **smi, py_spy=py_spy).model_dump(),
                  "local-nvml": {"local": True, "use_nvml": True, **smi},
                  "local-smi": {"local": True, "use_nvml": False, **smi}},
        "default_host": "gpu-host-1",
        "variants": {"torch": variant},
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": [OPERATOR], "viewers": [VIEWER]},
        "lifecycle": lifecycle,
    })


@pytest.fixture
async def gpu_stack(real_ssh, tmp_path):
    """Factory: `await gpu_stack()` starts start_stack (real Bolt + fake Slack) on `gpu_config` (or on
    `make_config(srv, tmp_path)`) with the readiness watcher on POLICY. Every stack is stopped at teardown, even
    when the test failed: the processes its launches left are killed (by launch tag), then the checks, the
    outbox and the SSH connections stop."""
    stacks: list[SlackStack] = []

    async def start(make_config=gpu_config) -> SlackStack:
        stack = await start_stack(make_config(real_ssh, tmp_path), watch=True, watch_policy=POLICY)
        stacks.append(stack)
        return stack

    yield start
    for stack in reversed(stacks):
        await stack.stop()


def text_of(call) -> str:
    return call["params"].get("text") or ""


KILL_ANSWER = re.compile(r"(?:Killed|Could not kill|Cannot kill|Stopped the processes of) torch#1")


def is_alert(text: str) -> bool:
    """A watcher alert (not the launch's root message): `torch#1 on gpu-host-1: VERDICT ... (after 12s)`."""
    first = text.split("\n", 1)[0]
    return " on gpu-host-1: " in first and "(after " in first


async def new_answer(stack, seen: set[int], predicate, timeout: float) -> dict:
    """The first chat.postMessage or chat.update not in `seen` whose text matches: a slow command's answer
    can come as an edit of its placeholder message."""
    def match(c) -> bool:
        return (id(c) not in seen and c["method"] in ("chat.postMessage", "chat.update") and c["status"] == 200
                and bool(predicate(text_of(c))))

    try:
        return await wait_until(lambda: next((c for c in stack.fake.calls if match(c)), None), timeout,
                                what="a matching answer")
    except AssertionError:
        raise AssertionError(f"no matching answer in {timeout} s; since then: "
                             f"{[(c['method'], text_of(c)[:100]) for c in stack.fake.calls if id(c) not in seen]}"
                             ) from None


async def post_and_wait(stack, command: str, text: str, predicate, *, user=OPERATOR, timeout=60.0) -> dict:
    """Push a slash command through fake Slack; return the first NEW message (posted or edited) that matches."""
    seen = {id(c) for c in stack.fake.calls}
    await stack.fake.push_slash_command(command, text, user_id=user, channel_id=CHANNEL)
    return await new_answer(stack, seen, predicate, timeout)


async def launch_torch(stack, params: str, variant: str = "torch"):
    """`/launch VARIANT PARAMS` through fake Slack as the operator; asserts it launched and returns launch 1."""
    reply = await post_and_wait(stack, "/launch", f"{variant} {params}",
                                lambda t: f"{variant}#1" in t and ("Launched" in t or "refused" in t or "Cannot" in t))
    assert f"Launched {variant}#1" in text_of(reply), text_of(reply)
    return stack.runtime.launches.get(1)


KILL_ASK = re.compile(r"Kill torch#1 on gpu-host-1\?")


async def kill_launch(stack) -> tuple[dict, str | None]:
    """`/kill 1` as the operator, the way a user does it: when the bot asks for confirmation, click its
    [Kill] button. Returns (the kill's answer, the confirmation question's text or None)."""
    seen = {id(c) for c in stack.fake.calls}
    first = await post_and_wait(stack, "/kill", "1", lambda t: KILL_ANSWER.search(t) or KILL_ASK.search(t),
                                timeout=60)
    if KILL_ANSWER.search(text_of(first)):
        return first, None
    ask_ts = first["params"]["ts"] if first["method"] == "chat.update" else first["response"]["ts"]
    value = next((el.get("value") for b in first["params"].get("blocks") or [] if b.get("type") == "actions"
                  for el in b.get("elements", []) if el.get("action_id") == "gpubot_kill_confirm"), "1")
    await stack.fake.push_block_action("gpubot_kill_confirm", value=value, user_id=OPERATOR, channel_id=CHANNEL,
                                       message_ts=ask_ts)
    return await new_answer(stack, seen, KILL_ANSWER.search, 90), text_of(first)


def root_ts(stack) -> str | None:
    """The ts of the launch's root message (`torch#1 on gpu-host-1: starting`), where its thread hangs."""
    for c in stack.fake.calls_for("chat.postMessage"):
        if text_of(c).startswith("torch#1 on gpu-host-1: ") and not c["params"].get("thread_ts"):
            return c["response"]["ts"]
    return None


async def wait_ranks_logged(la, text: str, ranks: int, timeout: float) -> None:
    """Wait until `text` is in the launch's log once per rank; fail early (with the log) when it died."""
    seen = {"log": ""}

    def logged() -> bool:
        log = seen["log"] = Path(la.log_path).read_text(errors="replace") if os.path.exists(la.log_path) else ""
        if log.count(text) >= ranks:
            return True
        if "Traceback" in log or "Received sigquit" in log or (log and not pids_of_launch(la)):
            raise AssertionError(f"the server died before {ranks} ranks logged {text!r}; log:\n{log[-4000:]}")
        return False

    try:
        await wait_until(logged, timeout, what=f"{text!r} logged by {ranks} ranks", every=0.25)
    except AssertionError as e:
        if "died" in str(e):
            raise
        raise AssertionError(f"{text!r} not logged by {ranks} ranks; log:\n{seen['log'][-4000:]}") from None


async def wait_gpu_settled(timeout: float = 30.0) -> dict:
    """NVML readings until GPU 0's memory and process list stop changing (two reads at least 0.5 s apart);
    the last reading (also when it never settled within `timeout`: the comparisons after it tell)."""
    last = {"reading": await asyncio.to_thread(nvml_read), "at": time.monotonic()}

    async def settled() -> bool:
        if time.monotonic() - last["at"] < 0.5:
            return False
        cur = await asyncio.to_thread(nvml_read)
        a, b = last["reading"]["gpus"][0], cur["gpus"][0]
        last.update(reading=cur, at=time.monotonic())
        return abs(a["used_mib"] - b["used_mib"]) <= 2 and a["procs"].keys() == b["procs"].keys()

    with contextlib.suppress(AssertionError):
        await wait_until(settled, timeout, what="GPU 0 to settle", every=0.1)
    return last["reading"]


async def wait_idle(idle_mib: float, gone: set[int], timeout: float = 30.0) -> tuple[dict, float]:
    """NVML until GPU 0 is back at the idle level and none of `gone` holds memory: (the last reading, seconds;
    also when it never got there within `timeout`: the assertions after it tell)."""
    t0 = time.monotonic()
    last: dict = {}

    async def idle() -> bool:
        cur = last["reading"] = await asyncio.to_thread(nvml_read)
        g = cur["gpus"][0]
        return g["used_mib"] <= idle_mib + IDLE_SLACK_MIB and not gone & g["procs"].keys()

    with contextlib.suppress(AssertionError):
        await wait_until(idle, timeout, what="GPU 0 back at the idle level", every=0.25)
    return last["reading"], time.monotonic() - t0


# --- /gpu status against nvidia-smi and NVML --------------------------------------------------------------

_HOST_RE = re.compile(r"^== (\S+)")
_GPU_RE = re.compile(r"^\s*(\d+) (.{14}) +([\d.]+) / ([\d.]+) +(\S+)%")
_HOLDER_RE = re.compile(r"^\s+(?:\?\s+)?pid (\d+) +([\d.]+|-) GiB")


def parse_status_text(text: str) -> dict[str, dict]:
    """The `/gpu status` text: per host, GPU rows (GiB used/total, util) and holders (pid -> GiB)."""
    hosts: dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        if m := _HOST_RE.match(line):
            cur = hosts.setdefault(m.group(1), {"gpus": {}, "holders": {}})
        elif cur is not None and (m := _GPU_RE.match(line)):
            cur["gpus"][int(m.group(1))] = {"name": m.group(2).strip(), "used_gib": float(m.group(3)),
                                            "total_gib": float(m.group(4)), "util": m.group(5)}
        elif cur is not None and (m := _HOLDER_RE.match(line)):
            cur["holders"][int(m.group(1))] = None if m.group(2) == "-" else float(m.group(2))
    return hosts


async def status_round(stack, stage: str, workers: set[int], problems: list[str]) -> dict:
    """`/gpu status all` through Slack, bracketed by nvidia-smi and NVML readings; compare and record."""
    smi1, nv1 = await asyncio.to_thread(smi_read), await asyncio.to_thread(nvml_read)
    call = await post_and_wait(stack, "/gpu", "status all", lambda t: t.startswith("GPU status"), user=VIEWER)
    snaps = await stack.runtime.hosts.status(list(HOSTS))  # the probes behind the text, MiB-exact
    smi2, nv2 = await asyncio.to_thread(smi_read), await asyncio.to_thread(nvml_read)
    text = text_of(call)
    parsed = parse_status_text(text)
    s_gpu, n_gpu = smi1["gpus"][0], nv1["gpus"][0]
    smi_pids, nvml_pids = set(s_gpu["procs"]), set(n_gpu["procs"])
    fig: dict = {
        "nvidia_smi": {"used_mib": s_gpu["used_mib"], "total_mib": s_gpu["total_mib"], "util_pct": s_gpu["util_pct"],
                       "procs": s_gpu["procs"], "used_mib_after": smi2["gpus"][0]["used_mib"]},
        "nvml": {"used_mib": n_gpu["used_mib"], "total_mib": n_gpu["total_mib"], "util_pct": n_gpu["util_pct"],
                 "used_v1_mib": n_gpu["used_v1_mib"], "reserved_mib": n_gpu["reserved_mib"], "procs": n_gpu["procs"],
                 "used_mib_after": nv2["gpus"][0]["used_mib"]},
        "worker_pids": sorted(workers),
        "nvidia_smi_lists_pids": bool(smi_pids),
        "nvml_lists_pids": bool(nvml_pids),
        "status_text": text,
        "hosts": {},
    }

    def expect(ok: bool, what: str) -> None:
        if not ok:
            problems.append(f"{stage}: {what}")

    ref_used = s_gpu["used_mib"]
    expect(close(s_gpu["used_mib"], n_gpu["used_mib"]), f"nvidia-smi {s_gpu['used_mib']} vs NVML {n_gpu['used_mib']}")
    expect(smi_pids == nvml_pids, f"nvidia-smi PIDs {sorted(smi_pids)} vs NVML PIDs {sorted(nvml_pids)}")
    if smi_pids:
        expect(smi_pids == workers, f"nvidia-smi PIDs {sorted(smi_pids)} are not the workers {sorted(workers)}")
    for host, snap in zip(HOSTS, snaps, strict=True):
        if not isinstance(snap, Snapshot) or not snap.gpu.ok or not snap.gpu.gpus:
            problems.append(f"{stage}: {host}: no GPU reading: {snap}")
            continue
        g = next(x for x in snap.gpu.gpus if x.index == 0)
        holders = {p.pid: p.used_memory_mib for p in snap.gpu.processes if p.gpu_index == 0}
        shown = parsed.get(host, {"gpus": {}, "holders": {}})
        row = shown["gpus"].get(0, {})
        fig["hosts"][host] = {
            "source": snap.gpu.source.value, "name": g.name, "used_mib": g.memory_used_mib,
            "total_mib": g.memory_total_mib, "util_pct": g.utilization_gpu_pct, "holders_mib": holders,
            "text_used_gib": row.get("used_gib"), "text_total_gib": row.get("total_gib"),
            "text_holders_gib": shown["holders"],
            "diff_pct_vs_nvidia_smi": pct_diff(g.memory_used_mib, ref_used),
            "diff_pct_vs_nvml": pct_diff(g.memory_used_mib, n_gpu["used_mib"]),
            "text_diff_pct_vs_nvidia_smi": pct_diff((row.get("used_gib") or 0) * 1024, ref_used),
        }
        expect(snap.gpu.source.value == ("nvml" if host == "local-nvml" else "nvidia-smi"),
               f"{host}: read through {snap.gpu.source.value}")
        expect(close(g.memory_used_mib, ref_used), f"{host}: status {g.memory_used_mib} MiB vs nvidia-smi {ref_used}")
        expect(close(g.memory_used_mib, n_gpu["used_mib"]), f"{host}: status {g.memory_used_mib} MiB vs NVML "
               f"{n_gpu['used_mib']:.0f}")
        expect(close(g.memory_total_mib, s_gpu["total_mib"]),
               f"{host}: total {g.memory_total_mib} vs {s_gpu['total_mib']}")
        # the posted text: one decimal of GiB, so within 1 % or the 0.05 GiB of rounding
        expect(row.get("used_gib") is not None and close(row["used_gib"] * 1024, ref_used, floor=0.05 * 1024 + 1),
               f"{host}: text shows {row.get('used_gib')} GiB, nvidia-smi {ref_used} MiB")
        expect(set(holders) == smi_pids, f"{host}: holders {sorted(holders)} vs nvidia-smi PIDs {sorted(smi_pids)}")
        expect(set(shown["holders"]) == smi_pids,
               f"{host}: text holders {sorted(shown['holders'])} vs {sorted(smi_pids)}")
        for pid, mib in holders.items():
            ref = s_gpu["procs"].get(pid)
            if ref is not None:
                expect(close(mib, ref), f"{host}: pid {pid} {mib} MiB vs nvidia-smi {ref}")
            nref = n_gpu["procs"].get(pid)
            if nref is not None:
                expect(close(mib, nref), f"{host}: pid {pid} {mib} MiB vs NVML {nref:.0f}")
    expect(text.count("[torch#1 ") == len(smi_pids), "gpu-host-1 labels each worker [torch#1 by ...]")
    # the two backends, side by side
    a, b = fig["hosts"].get("local-nvml"), fig["hosts"].get("local-smi")
    if a and b:
        fig["backends_agree"] = (close(a["used_mib"], b["used_mib"]) and close(a["total_mib"], b["total_mib"])
                                 and a["holders_mib"].keys() == b["holders_mib"].keys())
        expect(fig["backends_agree"], f"NVML backend {a} vs nvidia-smi backend {b}")
    record(**{f"status_{stage}": fig})
    return fig


def record_log(key: str, launches) -> None:
    """The server log of launch 1 (what the watcher read), for RESULTS.md."""
    la = launches.get(1)
    if la is not None and la.log_path and os.path.exists(la.log_path):
        record(**{key: Path(la.log_path).read_text(errors="replace")[-6000:]})


def environment(idle_nv: dict) -> dict:
    g = idle_nv["gpus"][0]
    cuda = idle_nv.get("cuda_driver")
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu_name": g["name"], "gpu_count": len(idle_nv["gpus"]),
            "gpu_total_mib": g["total_mib"], "driver": idle_nv["driver"],
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda,
            "torch": TORCH_INFO.get("torch"), "torch_cuda": TORCH_INFO.get("cuda"), "python": platform.python_version(),
            "kernel": platform.release(), "executable": sys.executable}


def need_idle(g0: dict) -> None:
    """The tests take GPU 0 for themselves: skip (with what holds it) when something else uses it."""
    if g0["used_mib"] >= 1024 or g0["procs"]:
        pytest.skip(f"GPU 0 is in use ({g0['used_mib']:.0f} MiB, PIDs {sorted(g0['procs'])}): "
                    "the GPU tests need it idle")


def hang_gib(total_mib: float) -> float:
    """GiB per rank for the hang: 2 ranks together hold ~60 % of the card, as case 00's weights did (52 %)."""
    env = os.environ.get("GPUBOT_GPU_HANG_GIB")
    return float(env) if env else float(max(4, math.floor(0.3 * total_mib / 1024)))


# --- the tests ------------------------------------------------------------------------------------------


async def test_hang_gets_silent_hang_with_real_gpu_evidence_and_kill_frees_the_memory(gpu_stack):
    problems: list[str] = []
    idle = await asyncio.to_thread(nvml_read)
    idle_smi = await asyncio.to_thread(smi_read)
    g0 = idle["gpus"][0]
    record(environment=environment(idle), idle_before_hang={"nvml_used_mib": g0["used_mib"],
                                                           "nvidia_smi_used_mib": idle_smi["gpus"][0]["used_mib"],
                                                           "nvml_procs": g0["procs"]})
    need_idle(g0)
    gib = hang_gib(g0["total_mib"])
    stack = await gpu_stack()  # stopped by the fixture, processes killed, even when the test fails
    launches = stack.runtime.launches
    try:
        t0, t0_wall = time.monotonic(), time.time()
        la = await launch_torch(stack, f"mode=hang gib={gib:g}")
        await wait_ranks_logged(la, "Load weight end", 2, timeout=150)
        loaded_s = time.monotonic() - t0
        held = await wait_gpu_settled()
        workers = set(pids_of_launch(la)) - {la.pid, la.pgid}
        record(hang_load={"gib_per_rank": gib, "seconds_launch_to_weights_loaded": round(loaded_s, 1),
                          "nvml_used_mib": held["gpus"][0]["used_mib"], "nvml_procs": held["gpus"][0]["procs"],
                          "launcher_pid": la.pid, "worker_pids": sorted(workers)})
        assert len(workers) == 2, (la.pid, workers)
        fig = await status_round(stack, "hang", workers, problems)
        during = fig["nvidia_smi"]["used_mib"]

        # the watcher's verdict: one silent_hang in the launch's thread, quoting the real GPU figures
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": silent_hang" in text_of(c),
            timeout=90)
        alert_wall = time.time()
        at_alert = await asyncio.to_thread(nvml_read)
        text = text_of(alert)
        silent_for = alert_wall - os.path.getmtime(la.log_path)
        m = re.search(r"GPU 0: ([\d.]+) GiB / ([\d.]+) GiB, (\d+) % util", text)  # GiB, as everywhere in chat
        record(hang_alert={
            "text": text, "seconds_launch_to_alert": round(time.monotonic() - t0, 1),
            "seconds_last_log_write_to_alert": round(silent_for, 1),
            "threshold_s": POLICY.silence_after_s, "interval_s": POLICY.interval_s,
            "evidence_gpu0_gib": m and float(m.group(1)), "evidence_gpu0_util_pct": m and int(m.group(3)),
            "nvml_at_alert_used_mib": at_alert["gpus"][0]["used_mib"],
            "nvml_at_alert_util_pct": at_alert["gpus"][0]["util_pct"],
            "launched_at": t0_wall})
        assert alert["params"].get("thread_ts") == root_ts(stack), "the alert goes to the launch's thread"
        assert "Load weight end" in text and "no log progress" in text, text
        assert m is not None, f"no GPU 0 memory/util evidence in the alert:\n{text}"
        # one decimal of GiB: within 0.05 GiB (52 MiB) of what nvidia-smi and NVML read
        assert close(float(m.group(1)) * 1024, during, pct=0, floor=52), (
            f"alert says {m.group(1)} GiB, nvidia-smi {during} MiB")
        assert close(float(m.group(1)) * 1024, at_alert["gpus"][0]["used_mib"], pct=0, floor=52)
        assert int(m.group(3)) == 0 and "0 % util" in text, text
        assert "not listening" in text, text
        # the threshold, as the watcher measured it (the host's clock): the check that first judged the launch
        # silent_hang (the one that alerted) saw at least `silence_after_s` without log progress
        observations = stack.runtime.store.observations
        judged = [r for r in observations.list(la.id) if r.verdict is not None]
        first_hang = next(r for r in judged if r.verdict == "silent_hang")
        measured_silence = first_hang.t - first_hang.last_progress_t
        record(hang_alert_check={"measured_silence_s": round(measured_silence, 1),
                                 "checks_before": judged.index(first_hang),
                                 "verdicts_before": [r.verdict for r in judged[:judged.index(first_hang)]]})
        assert measured_silence >= POLICY.silence_after_s, (measured_silence, first_hang)
        # more checks (three more recorded: the two before the last have finished, alerts included), all sent:
        # still one alert
        n_checks = len(observations.list(la.id))
        await wait_until(lambda: len(observations.list(la.id)) >= n_checks + 3, 60, what="three more checks")
        await wait_until(lambda: stack.runtime.store.outbox.pending_count() == 0, 30, what="the outbox to be empty")
        n_alerts = [c for c in stack.fake.calls_for("chat.postMessage") if ": silent_hang" in text_of(c)]
        assert len(n_alerts) == 1, [text_of(c)[:120] for c in n_alerts]

        # /kill: every process gone, the memory back to the idle level (NVML)
        tk = time.monotonic()
        killed, asked = await kill_launch(stack)
        after, idle_s = await wait_idle(g0["used_mib"], workers | {la.pid})
        record(hang_kill={"text": text_of(killed), "confirmation": asked,
                          "seconds_kill_command": round(time.monotonic() - tk, 1),
                          "seconds_until_nvml_idle": round(idle_s, 2),
                          "idle_before_mib": g0["used_mib"], "during_mib": during,
                          "after_mib": after["gpus"][0]["used_mib"], "after_procs": after["gpus"][0]["procs"]})
        assert "Killed torch#1" in text_of(killed) and "released" in text_of(killed), text_of(killed)
        assert pids_of_launch(la) == []
        assert after["gpus"][0]["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB, (g0, after)
        assert not (workers & after["gpus"][0]["procs"].keys())
    finally:
        record_log("hang_server_log", launches)
    assert not problems, "\n".join(problems)


async def test_ready_variant_reaches_ready_and_kill_frees_the_memory(gpu_stack):
    problems: list[str] = []
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    record(idle_before_ready={"nvml_used_mib": g0["used_mib"], "nvml_procs": g0["procs"]})
    need_idle(g0)
    if "environment" not in RESULTS:
        record(environment=environment(idle))
    stack = await gpu_stack()  # stopped by the fixture, processes killed, even when the test fails
    launches = stack.runtime.launches
    try:
        t0 = time.monotonic()
        la = await launch_torch(stack, "mode=ready gib=4 kv_gib=1")
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)), timeout=180)
        text = text_of(alert)
        took = time.monotonic() - t0
        log_text = Path(la.log_path).read_text(errors="replace")
        record(ready_alert={"text": text, "seconds_launch_to_ready_alert": round(took, 1)})
        assert ": ready" in text.split("\n", 1)[0], f"{text}\nlog:\n{log_text[-3000:]}"
        assert alert["params"].get("thread_ts") == root_ts(stack), "the alert goes to the launch's thread"
        assert "Phases:" in text, text
        with urllib.request.urlopen(f"http://127.0.0.1:{la.port}/health", timeout=5) as r:
            assert r.status == 200
        assert "The server is fired up and ready to roll!" in log_text
        workers = set(pids_of_launch(la)) - {la.pid, la.pgid}
        assert len(workers) == 2, (la.pid, workers)
        await wait_gpu_settled()
        fig = await status_round(stack, "ready", workers, problems)
        during = fig["nvidia_smi"]["used_mib"]
        assert during > g0["used_mib"] + 2 * 5 * 1024 * 0.99, f"2 ranks x 5 GiB not on the GPU: {during} MiB"

        tk = time.monotonic()
        killed, asked = await kill_launch(stack)
        after, idle_s = await wait_idle(g0["used_mib"], workers | {la.pid})
        record(ready_kill={"text": text_of(killed), "confirmation": asked,
                           "seconds_kill_command": round(time.monotonic() - tk, 1),
                           "seconds_until_nvml_idle": round(idle_s, 2), "idle_before_mib": g0["used_mib"],
                           "during_mib": during, "after_mib": after["gpus"][0]["used_mib"],
                           "after_procs": after["gpus"][0]["procs"]})
        assert "Killed torch#1" in text_of(killed) and "released" in text_of(killed), text_of(killed)
        assert pids_of_launch(la) == []
        assert after["gpus"][0]["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB, (g0, after)
        await wait_until(lambda: stack.runtime.store.outbox.pending_count() == 0, 30, what="the outbox to be empty")
        hangs = [c for c in stack.fake.calls_for("chat.postMessage") if ": silent_hang" in text_of(c)]
        assert not hangs, "a ready launch was called hung"
    finally:
        record_log("ready_server_log", launches)
    assert not problems, "\n".join(problems)


async def ready_torch(stack, launches) -> tuple:
    """Launch `torch mode=ready` (2 ranks, 2 GiB + 0.5 GiB each) and wait for its ready alert. Returns the
    launch and its worker PIDs."""
    la = await launch_torch(stack, "mode=ready gib=2 kv_gib=0.5")
    await stack.fake.wait_for_call("chat.postMessage", predicate=lambda c: is_alert(text_of(c))
                                   and ": ready" in text_of(c).split("\n", 1)[0], timeout=180)
    await wait_until(lambda: launches.get(1).ready_at is not None, 30, what="torch#1 recorded as ready")
    workers = sorted(set(pids_of_launch(la)) - {la.pid, la.pgid})
    assert len(workers) == 2, (la.pid, la.pgid, workers)
    return la, workers


async def test_ready_server_then_a_worker_killed_gets_a_died_alert(gpu_stack):
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    need_idle(g0)
    if "environment" not in RESULTS:
        record(environment=environment(idle))
    stack = await gpu_stack()
    launches = stack.runtime.launches
    try:
        la, workers = await ready_torch(stack, launches)
        t0 = time.monotonic()
        os.kill(workers[-1], signal.SIGKILL)  # one TP rank dies while serving
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and any(
                f": {v}" in text_of(c).split("\n", 1)[0] for v in ("crashed", "exited", "oom", "cuda_error")),
            timeout=60)
        took = time.monotonic() - t0
        text = text_of(alert)
        la = launches.get(1)
        record(serving_worker_killed={"text": text, "seconds_kill_to_alert": round(took, 1),
                                      "state": str(la.state), "interval_s": POLICY.serving_interval_s})
        assert la.state == LaunchState.FAILED, la
        assert "Received sigquit" in text or "exit status 1" in text, text
        # the launcher stopped the other rank as SGLang does: nothing is left, and /kill says so
        killed = await post_and_wait(stack, "/kill", "1 --yes", lambda t: "torch#1" in t and (
            "Nothing to kill" in t or "no process was left" in t or "Killed" in t), timeout=60)
        after, idle_s = await wait_idle(g0["used_mib"], set(workers) | {la.pid})
        record(serving_worker_killed_cleanup={"text": text_of(killed), "seconds_until_nvml_idle": round(idle_s, 2),
                                              "after_mib": after["gpus"][0]["used_mib"]})
        assert pids_of_launch(la) == []
        assert after["gpus"][0]["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB, (g0, after)
    finally:
        record_log("serving_worker_killed_log", launches)


async def test_ready_server_with_a_stopped_worker_gets_a_serving_hang_alert(gpu_stack):
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    need_idle(g0)
    stack = await gpu_stack()
    launches = stack.runtime.launches
    stopped = None
    try:
        la, workers = await ready_torch(stack, launches)
        stopped = workers[-1]
        t0 = time.monotonic()
        os.kill(stopped, signal.SIGSTOP)  # one TP rank wedged: /health goes through it and times out
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c))
            and ": silent_hang in serving" in text_of(c).split("\n", 1)[0], timeout=90)
        took = time.monotonic() - t0
        text = text_of(alert)
        held = await asyncio.to_thread(nvml_read)
        record(serving_hang={"text": text, "seconds_stop_to_alert": round(took, 1),
                             "nvml_used_mib": held["gpus"][0]["used_mib"], "nvml_util_pct": held["gpus"][0]["util_pct"],
                             "state": str(launches.get(1).state)})
        assert "times out" in text, text
        assert launches.get(1).state == LaunchState.RUNNING
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        killed, _asked = await kill_launch(stack)
        _after, idle_s = await wait_idle(g0["used_mib"], set(workers) | {la.pid})
        record(serving_hang_cleanup={"text": text_of(killed), "seconds_until_nvml_idle": round(idle_s, 2)})
        assert "released" in text_of(killed), text_of(killed)
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        record_log("serving_hang_log", launches)


async def test_ranks_hung_in_init_process_group_get_comm_init_with_where_they_wait_and_the_bundle_agrees(
        gpu_stack, tmp_path):
    """Issue 13's acceptance: 2 ranks, one never joins init_process_group: a silent_hang alert in comm_init
    whose evidence says where the ranks wait (py-spy, taken by the watcher itself); the bundle of the launch
    (`/gpu bundle`, the `!bundle` handler) diagnosed offline gives the same verdict and phase."""
    stack = await gpu_stack()  # stopped by the fixture, processes killed, even when the test fails
    launches = stack.runtime.launches
    try:
        t0 = time.monotonic()
        la = await launch_torch(stack, "mode=init_hang gib=1")
        await wait_ranks_logged(la, "Init torch distributed begin.", 2, timeout=150)
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": silent_hang" in text_of(c),
            timeout=POLICY.phase_grace_s["comm_init"] + 120)
        text = text_of(alert)
        blocks = json.dumps(alert["params"].get("blocks") or [])
        record(init_hang_alert={"text": text, "seconds_launch_to_alert": round(time.monotonic() - t0, 1)})
        assert "silent_hang in comm_init" in text.split("\n", 1)[0], text
        assert "stacks (py-spy, 2 ranks)" in text + blocks, text
        assert "rank 1 is in " in text + blocks and ("rank 0 waits in " in text + blocks), text
        offline = await post_and_wait(stack, "/gpu", "bundle 1", lambda t: "Bundle of torch#1" in t, timeout=120)
        record(init_hang_bundle={"text": text_of(offline)})
        assert "diagnosed offline: silent_hang in comm_init" in text_of(offline), text_of(offline)
        bundle = await stack.runtime.services.bundles.collect(launch=la, user=OPERATOR)
        root = bundle.write(tmp_path / "bundle")
        v = diagnose(read_bundle(root))
        record(init_hang_offline={"verdict": v.verdict, "phase": v.phase, "evidence": v.evidence[:4],
                                  "files": sorted(bundle.files)})
        assert (v.verdict, v.phase) == ("silent_hang", "comm_init"), v.summary
        assert any(e.startswith("stacks (py-spy, 2 ranks)") for e in v.evidence), v.evidence
    finally:
        record_log("init_hang_server_log", launches)

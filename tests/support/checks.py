"""Recorded checks of a launch, for the tests that judge them both ways (issue 44): what two probes of its host saw
(`Check`: the log's tail and time, its processes, GPUs, port, health, the wrapper's exit file), read as the watcher
reads them (`live_verdict`: observation_from_snapshot, then judge) and as a bundle of the same two probes
(`offline_verdict`: bot.core.collect.bundle_files, then bot.core.bundle.observation_from_files and diagnose).

The bundle's host captures are rendered here from the same readings, in the formats the real tools print:
`nvidia-smi` (driver 580's table, tests/fixtures/h200/hung.nvidia-smi.txt), `nvidia-smi --query-gpu=... --format=csv`
and `ss -ltnp` (iproute2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from bot.core.bundle import observation_from_files
from bot.core.collect import bundle_files, observed_from_probes
from bot.core.diagnose import SIGNATURES, LineMemo, Verdict, diagnose
from bot.core.models import GpuProcess, GpuReading, GpuSection, HealthResult, Launch, LogInfo, ProcessInfo, Snapshot
from bot.core.observe import judge, observation_from_snapshot, own_processes
from bot.core.parse.nvidia_smi import describe_exit
from bot.core.stackdump import ProcessDump

#: The watch policy both ways judge by (seconds of silence per phase, and when the phase is unknown).
GRACE_S = {"comm_init": 60.0, "weight_loading": 120.0, "kv_cache_alloc": 60.0, "cuda_graph_capture": 60.0,
           "warmup": 60.0, "serving": 60.0}
SILENCE_AFTER_S = 90.0


@dataclass
class Check:
    """What one probe of the launch's host saw: the host clock `t` (epoch s), the log's `lines` and when it was last
    written (`log_mtime`), the process table `procs` (the launch's rows carry its tag: `tagged`), the GPUs and their
    holders (or what `nvidia-smi` printed when it failed, `gpu_error`, with its exit status 15), the port, the health
    probe's status, the wrapper's exit status once the server ended (`exit`), and the ranks' stacks when the watcher
    took them."""

    t: float
    lines: Sequence[str]
    log_mtime: float
    procs: Sequence[ProcessInfo] = ()
    tagged: Sequence[int] = ()
    gpus: Sequence[GpuReading] = ()
    gpu_procs: Sequence[GpuProcess] = ()
    port_open: bool | None = None
    health: str | None = None
    exit: int | None = None
    gpu_error: str | None = None
    stacks: Sequence[tuple[str, ProcessDump]] = field(default_factory=tuple)

    def snapshot(self, la: Launch) -> Snapshot:
        """The Snapshot a probe of `la` returns for this check."""
        text = "".join(line + "\n" for line in self.lines)
        log = LogInfo(path=la.log_path or "/l", exists=True, size_bytes=len(text.encode()), mtime=self.log_mtime,
                      lines=len(self.lines), tail=list(self.lines), exit_checked=True,
                      exit_file=self.exit is not None, exit_status=self.exit)
        health = HealthResult(url=f"http://127.0.0.1:{la.port}/health", status=self.health,
                              http_code=200 if self.health == "ok" else None) if self.health else None
        holders = [p.pid for p in self.gpu_procs]
        gpu = GpuSection(ok=True, gpus=list(self.gpus), processes=list(self.gpu_procs)) if self.gpu_error is None \
            else GpuSection(ok=False, error=describe_exit(15, self.gpu_error))
        return Snapshot(host=la.host, clock=self.t, local_clock=self.t,
                        processes=[p for p in self.procs if p.pid in holders or p.pid in self.tagged],
                        gpu=gpu, log=log,
                        port=la.port, port_listening=self.port_open, health=health, tagged_pids=list(self.tagged),
                        launch_tags={pid: la.tag for pid in self.tagged if la.tag}, table=list(self.procs))


def live_verdict(la: Launch, first: Check, second: Check) -> Verdict:
    """The verdict the watcher reaches at its second check of `la` (observation_from_snapshot and judge, as
    bot.services.watch does; the ranks' stacks, when the check has them, as the watcher's busy-wait look adds
    them)."""
    memo = LineMemo()
    _, rec = observation_from_snapshot(first.snapshot(la), la, None, memo=memo)
    obs, now = observation_from_snapshot(second.snapshot(la), la, rec, memo=memo)
    if second.stacks:
        obs = replace(obs, rank_stacks=list(second.stacks))
    return judge(obs, rec, grace_s=GRACE_S, silence_after_s=SILENCE_AFTER_S, exit_code=now.exit_status,
                 launch_id=la.id, memo=memo)


def bundle_of(la: Launch, first: Check, second: Check) -> dict[str, str]:
    """The bundle `!bundle` collects from the same two probes (bot.services.bundles): name -> text."""
    a, b = first.snapshot(la), second.snapshot(la)
    own = own_processes(b, la)
    observed = observed_from_probes(a, b, pid=la.pid, started_at=la.created_at, own={p.pid for p in own},
                                    heartbeat=lambda line: SIGNATURES.heartbeat.first(line) is not None)
    observed["grace_s"] = {**SIGNATURES.default_grace_s, **GRACE_S}
    observed["silence_after_s"] = SILENCE_AFTER_S
    known = {p.pid for p in b.processes}
    extras = {"listen": (ss_text(la.port, bool(second.port_open)), 0), "dmesg": ("", 1),
              "nvidia-smi": (nvidia_smi_table(second.gpus, second.gpu_procs), 0),
              "nvidia-smi-csv": (query_gpu_csv(second.gpus), 0)}
    if second.gpu_error is not None:  # what nvidia-smi printed, as the extras script captures it
        extras["nvidia-smi"] = extras["nvidia-smi-csv"] = (second.gpu_error, 15)
    files = bundle_files(a, b, processes=[*b.processes, *(p for p in own if p.pid not in known)], extras=extras,
                         ranks=list(second.stacks), observed=observed, redact=lambda text: text,
                         what=f"{la.name} on {la.host}")
    return {name: data.decode() for name, data in files.items()}


def offline_verdict(la: Launch, first: Check, second: Check) -> Verdict:
    """What `gpubot diagnose` says of the bundle of the same two probes."""
    return diagnose(observation_from_files(bundle_of(la, first, second)))


def nvidia_smi_table(gpus: Sequence[GpuReading], procs: Sequence[GpuProcess]) -> str:
    """Plain `nvidia-smi` output (driver 580.159.04's layout) for `gpus` and their compute processes."""
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out = ["Sun Nov 29 07:22:04 2026       ",
           "+-----------------------------------------------------------------------------------------+",
           "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |",
           bar,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    for g in gpus:
        used, total = f"{g.memory_used_mib or 0:.0f}MiB", f"{g.memory_total_mib or 143771:.0f}MiB"
        out += [f"| {g.index:>3}  {g.name or 'NVIDIA H200':<26}On  |   00000000:00:0{6 + g.index}.0 Off |"
                "                    0 |",
                f"| N/A   39C    P0  {g.power_draw_w or 122:>13.0f}W /  700W | {used:>10} / {total:<9} |"
                f" {g.utilization_gpu_pct or 0:>7.0f}%      Default |",
                "|                                         |                        |             Disabled |",
                bar]
    out += ["", "+-----------------------------------------------------------------------------------------+",
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|=========================================================================================|"]
    for p in procs:
        out.append(f"|  {p.gpu_index or 0:>3}   N/A  N/A  {p.pid:>13}      C   {(p.process_name or 'python3')[:30]:<30}"
                   f"  {p.used_memory_mib or 0:>6.0f}MiB |")
    if not procs:
        out.append("|  No running processes found                                                             |")
    out.append("+-----------------------------------------------------------------------------------------+")
    return "\n".join(out) + "\n"


def query_gpu_csv(gpus: Sequence[GpuReading]) -> str:
    """`nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu,power.draw,power.limit,
    temperature.gpu,pstate --format=csv` for `gpus` (the bundle's extras script's query)."""
    rows = ["index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W], "
            "power.limit [W], temperature.gpu, pstate"]
    rows += [f"{g.index}, {g.name or 'NVIDIA H200'}, {g.memory_used_mib or 0:.0f} MiB, "
             f"{g.memory_total_mib or 143771:.0f} MiB, {g.utilization_gpu_pct or 0:.0f} %, "
             f"{g.power_draw_w or 122:.2f} W, 700.00 W, 39, P0" for g in gpus]
    return "\n".join(rows) + "\n"


def ss_text(port: int | None, listening: bool) -> str:
    """`ss -ltnp` output: sshd on 22, and the server's `port` when it listens."""
    rows = ["State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess",
            'LISTEN 0      128          0.0.0.0:22        0.0.0.0:*    users:(("sshd",pid=812,fd=3))']
    if listening and port:
        rows.append(f'LISTEN 0      2048         0.0.0.0:{port}      0.0.0.0:*    users:(("python3",pid=4242,fd=21))')
    return "\n".join(rows) + "\n"



"""A throwaway two-node Slurm cluster on this host, for the tests marked `slurm`: `slurmctld` and two `slurmd` (nodes
n1 and n2, 2 CPUs and 2 GPU gres each, the GPUs character devices made with `mknod /dev/fakegpuN c 1 3`) on free
loopback ports, their config, state and logs in a temporary directory, authenticated by the host's `munged` (started
when it is not running). The fixture's finalizer cancels every job and stops the daemons.

Needs root and the distribution's `slurm-wlm` and `munge` packages (`.ci/run` installs them); tests skip with the
reason otherwise. Recipe from Slurm 22.05's slurm.conf(5) and gres.conf(5): ProctrackType=proctrack/linuxproc,
TaskPlugin=task/none, SelectType=select/cons_tres, GresTypes=gpu; two NodeName entries with NodeAddr=127.0.0.1,
NodeHostname=<this host> and their own Port=; SlurmdSpoolDir and SlurmdPidFile with %n.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import free_port

#: GPUs per node, and the nodes.
GPUS_PER_NODE = 2
NODES = ("n1", "n2")
#: Seconds the cluster may take to come up (both nodes idle).
START_TIMEOUT_S = 60.0


def unavailable() -> str | None:
    """Why no cluster can be started here (None when one can)."""
    if os.geteuid() != 0:
        return "Slurm's daemons and mknod need root"
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "munged")
               if shutil.which(b) is None and not os.access(f"/usr/sbin/{b}", os.X_OK)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing: apt-get install slurm-wlm munge)"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _munge_up() -> bool:
    return subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True, timeout=10).returncode == 0


def ensure_munge() -> None:
    """Start the host's munged (as the munge user, with a key made if none exists) unless it answers already.
    Raises RuntimeError when it does not come up."""
    if _munge_up():
        return
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["mungekey", "-c"], check=False, capture_output=True)
    for d in ("/etc/munge", "/var/log/munge", "/var/lib/munge", "/run/munge"):
        os.makedirs(d, exist_ok=True)
        subprocess.run(["chown", "-R", "munge:munge", d], check=False, capture_output=True)
    subprocess.run(["runuser", "-u", "munge", "--", _bin("munged")], check=False, capture_output=True)
    deadline = time.monotonic() + 10
    while not _munge_up():
        if time.monotonic() > deadline:
            raise RuntimeError("munged did not come up (munge -n | unmunge fails)")
        time.sleep(0.2)


@dataclass
class SlurmCluster:
    """A running cluster: `conf` its slurm.conf (give it as SLURM_CONF), `dir` its directory, `env` an environment
    with SLURM_CONF set."""

    dir: Path
    conf: Path
    ctld: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster (text output, 30 s at most)."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=30)

    def jobs(self) -> list[str]:
        """Ids of the jobs it still has queued or running."""
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return [x.strip() for x in out.splitlines() if x.strip()]

    def cancel_all(self) -> None:
        """Cancel every job and wait (10 s at most) until the queue is empty."""
        ids = self.jobs()
        if ids:
            self.run("scancel", *ids)
        deadline = time.monotonic() + 10
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)

    def processes(self) -> list[int]:
        """Pids of every process that runs with this cluster's SLURM_CONF in its environment: its daemons, their step
        daemons and the jobs' processes (sbatch passes its environment on)."""
        needle = f"SLURM_CONF={self.conf}".encode()
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in f.read().split(b"\0"):
                            out.append(int(entry))
                except OSError:
                    continue
        return out

    def stop(self) -> None:
        """Cancel every job, stop the daemons, then kill whatever still runs with this cluster's SLURM_CONF (waiting
        10 s at most), and remove its directory."""
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + 10
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)


def start_cluster() -> SlurmCluster:
    """Write the config, start munged (if needed), slurmctld and both slurmd, and wait until both nodes are idle.
    Raises RuntimeError (with the controller's log) when it does not come up in START_TIMEOUT_S."""
    ensure_munge()
    d = Path(tempfile.mkdtemp(prefix="gpubot-slurm-"))
    host = socket.gethostname()
    for i in range(len(NODES) * GPUS_PER_NODE):
        dev = f"/dev/fakegpu{i}"
        if not os.path.exists(dev):
            subprocess.run(["mknod", dev, "c", "1", "3"], check=True)
    ports = [free_port() for _ in range(2 + len(NODES))]
    nodes = "\n".join(
        f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={ports[2 + i]} CPUs=2 Gres=gpu:{GPUS_PER_NODE} "
        "State=UNKNOWN" for i, n in enumerate(NODES))
    (d / "slurm.conf").write_text(f"""ClusterName=gpubot
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/ctld.log
SlurmdLogFile={d}/%n.log
ReturnToService=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MinJobAge=600
{nodes}
PartitionName=gpu Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
    gres = []
    for i, n in enumerate(NODES):
        first = i * GPUS_PER_NODE
        gres.append(f"NodeName={n} Name=gpu File=/dev/fakegpu[{first}-{first + GPUS_PER_NODE - 1}]")
    (d / "gres.conf").write_text("\n".join(gres) + "\n")
    (d / "ctld").mkdir()
    cluster = SlurmCluster(dir=d, conf=d / "slurm.conf")
    try:
        env = cluster.env
        subprocess.run([_bin("slurmctld"), "-f", str(cluster.conf)], env=env, check=True, capture_output=True)
        for n in NODES:
            (d / "spool" / n).mkdir(parents=True)
            subprocess.run([_bin("slurmd"), "-f", str(cluster.conf), "-N", n], env=env, check=True,
                           capture_output=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=False))
            if all(states.get(n) == "idle" for n in NODES):
                return cluster
            if time.monotonic() > deadline:
                log = (d / "ctld.log").read_text(errors="replace")[-2000:] if (d / "ctld.log").exists() else ""
                raise RuntimeError(f"the Slurm cluster did not come up in {START_TIMEOUT_S:g} s ({states}): {log}")
            time.sleep(0.3)
    except BaseException:
        cluster.stop()
        raise

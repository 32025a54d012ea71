"""How much does the one-round-trip probe save over probing by hand? Prints ratios; asserts nothing.

Compares, against a real SSH server on loopback (OpenSSH sshd when installed, else the asyncssh test
server), with the replaying fake nvidia-smi:
  A. gpubot's probe: ONE exec on a pooled connection (ps + log stat/tail + 2 nvidia-smi queries + /proc/net/tcp + curl)
  B. the same five checks as separate execs on one pooled connection
  C. the same five checks as separate fresh SSH connections (what `ssh host ps ...` by hand does)

Run: .venv/bin/python -m benchmarks.probe_roundtrip [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import asyncssh

from bot.config import Config
from bot.core.probe import ProbeRequest
from bot.demo.fakegpu import install_fake_gpu
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.fakes.sshd import OpenSSHServer, sshd_available

CHECKS = [
    "ps -eww -o pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args",
    "wc -l < {log}; tail -n 20 {log}",
    "{smi} --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits",
    "{smi} --query-compute-apps=pid,process_name,gpu_uuid,gpu_bus_id,used_memory --format=csv,noheader,nounits",
    "curl -s -m 2 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:9/health || true",
]


async def run(srv, smi: str, log: Path, rounds: int) -> dict[str, list[float]]:
    cfg = Config(hosts={"h": ssh_host(srv, nvidia_smi=smi, log_dirs=[str(log.parent)])})
    svc = HostService(cfg)
    times: dict[str, list[float]] = {"A one exec, pooled": [], "B 5 execs, pooled": [], "C 5 fresh connections": []}
    cmds = [c.format(log=log, smi=smi) for c in CHECKS]
    try:
        await svc.probe("h", ProbeRequest(log_path=str(log), port=9))  # warm the pooled connection
        conn = await asyncssh.connect(**srv.connect_kwargs())
        for _ in range(rounds):
            t = time.perf_counter()
            await svc.probe("h", ProbeRequest(log_path=str(log), port=9))
            times["A one exec, pooled"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for c in cmds:
                await conn.run(c, check=False)
            times["B 5 execs, pooled"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for c in cmds:
                async with asyncssh.connect(**srv.connect_kwargs()) as fresh:
                    await fresh.run(c, check=False)
            times["C 5 fresh connections"].append(time.perf_counter() - t)
        conn.close()
    finally:
        await svc.close()
    return times


def report(name: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["A one exec, pooled"])
    print(f"\n{name}: median milliseconds per full probe (ratio to gpubot's one-exec probe)")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:<26} {m * 1000:8.1f} ms   x{m / base:5.2f}")


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fake = install_fake_gpu(tmp / "gpu")
        log = tmp / "server.log"
        log.write_text("".join(f"[TP0] line {i}\n" for i in range(5000)))
        async with LoopbackSSHServer(tmp / "ssh") as srv:
            report("asyncssh loopback server", await run(srv, str(fake.nvidia_smi), log, rounds))
        if sshd_available():
            with OpenSSHServer(tmp / "sshd") as s:
                report("OpenSSH sshd on loopback", await run(s, str(fake.nvidia_smi), log, rounds))
        else:
            print("\n(OpenSSH sshd not installed: skipped)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    asyncio.run(main(ap.parse_args().rounds))

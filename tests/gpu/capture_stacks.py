"""Capture real py-spy dumps (JSON, plain and --native) of hung torch.distributed ranks, for the cross-rank
stack analysis tests (issue 13). Not a test: run on the GPU machine, writes DIR/<case>-rank<N>[-native].json.

Cases (one process per rank, on this machine's GPU 0 where a backend needs one):
  init_missing_rank  world_size 2, only rank 0 starts: it waits in init_process_group (TCPStore) for rank 1.
  allreduce_skipped  gloo, 2 ranks: rank 1 sleeps instead of entering all_reduce; rank 0 waits in it.
  nccl_init_one_gpu  nccl, 2 ranks both on cuda:0 (NCCL refuses or hangs in communicator init).

Run: python tests/gpu/capture_stacks.py DIR [--pyspy PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

RANK = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist
case, rank = sys.argv[1], int(sys.argv[2])
print(f"[TP{rank}] Init torch distributed begin.", flush=True)
backend = "nccl" if case == "nccl_init_one_gpu" else "gloo"
if backend == "nccl":
    torch.cuda.set_device(0)
dist.init_process_group(backend, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=600))
print(f"[TP{rank}] Init torch distributed end.", flush=True)
if backend == "nccl":
    t = torch.ones(4, device="cuda:0")
    dist.all_reduce(t)
    torch.cuda.synchronize()
else:
    t = torch.ones(4)
    if case == "allreduce_skipped" and rank == 1:
        time.sleep(3600)
    dist.all_reduce(t)
print(f"[TP{rank}] done", flush=True)
time.sleep(3600)
"""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    """Run each hang scenario, dump its ranks with py-spy (plain and --native) into OUT; returns exit status 0."""
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--pyspy", default="py-spy")
    p.add_argument("--settle-s", type=float, default=12.0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for case, ranks in (("init_missing_rank", [0]), ("allreduce_skipped", [0, 1]), ("nccl_init_one_gpu", [0, 1])):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NCCL_NVLS_ENABLE": "0"}
        procs = [subprocess.Popen([sys.executable, "-c", RANK, case, str(r)], env=env, start_new_session=True,
                                  stdout=open(out / f"{case}-rank{r}.log", "w"), stderr=subprocess.STDOUT)
                 for r in ranks]
        time.sleep(a.settle_s)
        summary[case] = {}
        for r, proc in zip(ranks, procs, strict=True):
            for native in (False, True):
                cmd = [a.pyspy, "dump", "--pid", str(proc.pid), "--json"] + (["--native"] if native else [])
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                name = f"{case}-rank{r}{'-native' if native else ''}.json"
                (out / name).write_text(res.stdout)
                summary[case][name] = {"rc": res.returncode, "stderr": res.stderr[-300:],
                                       "alive": proc.poll() is None}
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

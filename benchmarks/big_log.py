"""A probe of a 2 GiB log against `tail` (issue 21: within 1.5x of `tail`; never a wrong exact line count).

Writes a 2 GiB log of realistic server lines (a 1 MiB block of whole lines, written 2,048 times; deleted at the
end; skipped with a message when the disk has less than 5 GiB free) into a world-readable temp dir, counts its
lines once with `wc -l` (the truth), then over one warm connection to the loopback SSH host (OpenSSH sshd, see
benchmarks/support.py) takes, round-robin: HostService.probe with log= (tail 20 lines), the same probe without
log=, and the host's `tail -n 20 FILE`. Prints the first and second probe on their own (is the count reread
at every probe?), the medians, probe / tail, and whether the probe's line count (snap.log.lines) is the truth
and whether the probe says it is exact (a LogInfo field about exactness, where the tree has one).

    python -m benchmarks.big_log [--quick] [--gib 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from pathlib import Path

from benchmarks.support import (
    bench_host,
    fake_gpu,
    figure,
    footer,
    free_disk_bytes,
    header,
    host_config,
    median,
    ms,
    note,
    parse_args,
    ratio,
    run_local,
    shared_tmpdir,
)
from bot.config import Config
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

MIB = 1 << 20


def log_block() -> bytes:
    """About 1 MiB of whole, realistic inference-server log lines."""
    lines, size, i = [], 0, 0
    while True:
        line = (f"[2025-06-01 12:{i // 60 % 60:02d}:{i % 60:02d} TP{i % 8}] Decode batch. #running-req: {i % 97}, "
                f"#token: {31000 + i % 5000}, token usage: 0.{i % 100:02d}, gen throughput (token/s): "
                f"{1000 + i % 900}.{i % 100:02d}, #queue-req: {i % 7}\n")
        if size + len(line) > MIB:
            return "".join(lines).encode()
        lines.append(line)
        size += len(line)
        i += 1


def write_log(path: Path, gib: float) -> int:
    """Write `gib` GiB of log_block() to `path` (world-readable); return the lines written."""
    block = log_block()
    blocks = int(gib * 1024 * MIB // len(block))
    with open(path, "wb") as f:
        for _ in range(blocks):
            f.write(block)
    path.chmod(0o644)
    return blocks * block.count(b"\n")


def exactness(info: object) -> str:
    """What the tree's LogInfo says about the exactness of its line count (fields about exact/at least)."""
    fields = [f.name for f in dataclasses.fields(info)] if dataclasses.is_dataclass(info) else list(vars(info))
    said = {f: getattr(info, f) for f in fields if any(w in f for w in ("exact", "least", "partial", "complete"))}
    return ", ".join(f"{k}={v!r}" for k, v in said.items()) or "no exactness field: the count reads as exact"


async def main(args: argparse.Namespace) -> None:
    """Run the figures and print them."""
    rounds = 3 if args.quick else 6
    start = header("big_log", f"probe of a {args.gib:g} GiB log vs `tail -n 20` over the same warm connection")
    try:
        with shared_tmpdir("gpubot-bench-log-") as tmp:
            free = free_disk_bytes(tmp)
            if free < (args.gib + 3) * 1024 * MIB:
                print(f"  SKIPPED: {free / 1024 / MIB:.1f} GiB free under {tmp}; this needs {args.gib + 3:g} GiB")
                return
            log = tmp / "server.log"
            t = time.perf_counter()
            written = write_log(log, args.gib)
            took = time.perf_counter() - t
            note(f"wrote {log.stat().st_size / 1024 / MIB:.2f} GiB ({written} lines) in {took:.1f} s")
            t = time.perf_counter()
            truth = int(run_local(["wc", "-l", str(log)]).stdout.split()[0])
            wc_s = time.perf_counter() - t
            with bench_host(tmp) as host:
                fake = fake_gpu(tmp / "gpu", host)
                cfg = Config(hosts={"bench": host_config(host, nvidia_smi=str(fake.nvidia_smi),
                                                         log_dirs=[str(tmp)])})
                svc = HostService(cfg)
                with_log, without = ProbeRequest(log_path=str(log), tail_lines=20), ProbeRequest()
                times: dict[str, list[float]] = {"probe": [], "probe without log=": [], "tail": []}
                snaps = []
                try:
                    ex = svc.executor("bench")
                    await ex.run("true")  # connect
                    for _ in range(rounds):
                        for name in times:
                            t = time.perf_counter()
                            if name == "tail":
                                res = await ex.run(f"tail -n 20 {log}", timeout_s=60)
                                assert res.exit_status == 0, res.stderr
                            else:
                                snap = await svc.probe("bench", with_log if name == "probe" else without)
                                if name == "probe":
                                    snaps.append(snap)
                            times[name].append(time.perf_counter() - t)
                finally:
                    await svc.close()
            # the first probe with log= counts from the start (no cursor yet): shown on its own, not in the median
            probe = median(times["probe"][1:])
            bare, tail = (median(times[k]) for k in ("probe without log=", "tail"))
            figure("`wc -l` here (once)", ms(wc_s), f"the true count: {truth} lines")
            figure("first probe with log=", ms(times["probe"][0]), "HostService.probe, log= (tail 20), every section")
            first, second = times["probe"][0], times["probe"][1]
            figure("second probe with log=", ms(second),
                   "as dear as the first: the file is reread at every probe" if second > 0.5 * first
                   else "much cheaper than the first: the count is not reread")
            figure("probe with log=", ms(probe), f"median of the {rounds - 1} after the first")
            figure("probe without log=", ms(bare), "the same probe without the log (the rest of the sections)")
            figure("tail -n 20 FILE", ms(tail), "the host's tail on the same warm connection")
            figure("probe / tail", ratio(probe, tail), "the whole probe (ps, GPUs, tags, sockets too) over tail")
            figure("log part / tail", ratio(probe - bare, tail),
                   "(probe - probe without log=) / tail: what reading the log adds; issue 21 asks within x1.5")
            for i, snap in enumerate(snaps, 1):
                info = getattr(snap, "log", None)
                lines = getattr(info, "lines", None)
                if lines == truth:
                    verdict = "RIGHT"
                elif getattr(info, "lines_exact", True) is False and lines is not None and lines <= truth:
                    verdict = "not exact, and says so (at least)"
                else:
                    verdict = "WRONG"
                pct = f" ({lines / truth:.0%} of the truth)" if lines is not None and lines != truth else ""
                said = exactness(info) if info is not None else "no log in the snapshot"
                err = f"; error {info.error!r}" if info is not None and info.error else ""
                figure(f"probe {i}: line count", f"{lines}", f"{verdict}{pct}; {said}{err}")
    finally:
        footer(start)


def _add(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--gib", type=float, default=2.0, help="log size in GiB (default 2)")


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__, _add)))

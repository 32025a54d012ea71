"""Bot CPU per process row, for rows that are shown and rows that are filtered out (issue 21: at most 10 us).

Starts 1,000 real `sleep 100000` processes (one process group, killed at the end) beside the loopback SSH host
(OpenSSH sshd; see benchmarks/support.py), then probes that host with HostService.probe:
  filtered  ProbeRequest()                      a /gpu status probe: only GPU holders are shown (none here)
  shown     ProbeRequest(match="sleep 100000")  all 1,000 sleepers selected
Per probe it takes the bot's CPU (user+sys of this process plus live gpubot workers: support.bot_cpu_s) and
divides it by the ps rows the probe parsed (len(snap.table); the probe's own ~5 rows are not in it); medians
over the rounds after 2 warm-up probes. For reference, the host's own `ps` CPU per row (run here, the
RUSAGE_CHILDREN delta). Then the black box: the same two probes typed as `/probe bench match="sleep 100000"`
and `/gpu status bench` to a whole bot (tests.support.bots.start_bot: real grammar, dispatcher, services and
rendering; a RecordingSurface in place of Slack), bot CPU per row including rendering and the audit write
(half the rounds: each costs about a second of CPU).

    python -m benchmarks.row_cost [--quick] [--processes N]
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks.support import (
    bench_host,
    bot_cpu_s,
    children_cpu_s,
    fake_gpu,
    figure,
    footer,
    header,
    host_config,
    median,
    parse_args,
    run_local,
    shared_tmpdir,
    sleepers,
)
from bot.config import Config
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

PS = ["ps", "-eww", "-o", "pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args"]
MATCH = "sleep 100000"


async def _service_cpu(svc: HostService, req: ProbeRequest, warm: int, rounds: int) -> tuple[list[float], int, int]:
    """Per round: bot CPU seconds per parsed row; plus the rows parsed and shown by the last probe."""
    for _ in range(warm):
        await svc.probe("bench", req)
    per_row, rows, shown = [], 0, 0
    for _ in range(rounds):
        c0 = bot_cpu_s()
        snap = await svc.probe("bench", req)
        c1 = bot_cpu_s()
        table = getattr(snap, "table", None)
        if table is None:
            raise RuntimeError(f"probe failed: {getattr(snap, 'reason', snap)}")
        rows, shown = len(table), len(snap.processes)
        per_row.append((c1 - c0) / max(1, rows))
    return per_row, rows, shown


async def _black_box(cfg: Config, text: str, warm: int, rounds: int, rows: int) -> tuple[list[float], str]:
    """Per round: bot CPU seconds per row of `text` typed to a whole bot; the last answer's first line."""
    import inspect

    from tests.support.bots import start_bot

    # as the service starts (bot.slack.runner): with its start-up heap frozen, in trees whose service does that
    settle = {"settle_heap": True} if "settle_heap" in inspect.signature(start_bot).parameters else {}
    bot = await start_bot(cfg, **settle)
    try:
        for _ in range(warm):
            await bot.chat.say(text)
        out, first = [], ""
        for _ in range(rounds):
            c0 = bot_cpu_s()
            answer = await bot.chat.say(text)
            c1 = bot_cpu_s()
            out.append((c1 - c0) / max(1, rows))
            first = answer.text.splitlines()[0] if answer is not None and answer.text else "(no answer)"
        return out, first
    finally:
        await bot.close()


def _host_ps_per_row(rounds: int) -> tuple[float, int]:
    """The host's own `ps -eww -o ...` CPU per output row (run locally), median; and the rows."""
    per, rows = [], 0
    for _ in range(rounds):
        c0 = children_cpu_s()
        res = run_local(PS)
        c1 = children_cpu_s()
        rows = max(1, res.stdout.count(b"\n") - 1)
        per.append((c1 - c0) / rows)
    return median(per), rows


async def main(args: argparse.Namespace) -> None:
    """Run the figures and print them."""
    warm, rounds = (1, 4) if args.quick else (2, 10)
    start = header("row_cost", f"bot CPU per ps row, shown and filtered ({args.processes} sleeping processes)")
    try:
        with shared_tmpdir("gpubot-bench-rows-") as tmp, bench_host(tmp) as host, sleepers(args.processes):
            fake = fake_gpu(tmp / "gpu", host)
            cfg = Config(hosts={"bench": host_config(host, nvidia_smi=str(fake.nvidia_smi), log_dirs=[str(tmp)])},
                         state_dir=str(tmp / "state"))
            svc = HostService(cfg)
            try:
                filtered, rows, shown_f = await _service_cpu(svc, ProbeRequest(), warm, rounds)
                shown, rows_s, shown_s = await _service_cpu(svc, ProbeRequest(match=MATCH), warm, rounds)
            finally:
                await svc.close()
            ps_row, ps_rows = _host_ps_per_row(rounds)
            print(f"  HostService.probe, {rows} ps rows parsed per probe, median of {rounds} after {warm} warm:")
            figure("bot CPU per row, filtered", f"{median(filtered) * 1e6:.1f} us/row",
                   f"/gpu status probe (ProbeRequest()), {shown_f} rows shown")
            figure("bot CPU per row, shown", f"{median(shown) * 1e6:.1f} us/row",
                   f"match={MATCH!r}, {shown_s} of {rows_s} rows shown")
            figure("bot CPU per probe, shown", f"{median(shown) * rows_s * 1e3:.1f} ms",
                   "the same, per probe")
            figure("host's ps CPU per row", f"{ps_row * 1e6:.1f} us/row",
                   f"`ps -eww -o ...` run locally ({ps_rows} rows), RUSAGE_CHILDREN; reference")
            figure("bot / host ps, shown", f"x{median(shown) / ps_row:.1f}" if ps_row else "n/a",
                   "bot CPU per row over the host's own ps CPU per row")
            print(f"  black box: commands typed to a whole bot (grammar, dispatcher, rendering, audit), per "
                  f"{rows} rows, median of {max(2, rounds // 2)} after 1 warm:")
            bb_rounds = max(2, rounds // 2)
            bb_status, first_status = await _black_box(cfg, "/gpu status bench", 1, bb_rounds, rows)
            bb_probe, first_probe = await _black_box(cfg, f'/probe bench match="{MATCH}"', 1, bb_rounds, rows_s)
            figure("black box, filtered", f"{median(bb_status) * 1e6:.1f} us/row",
                   f"`/gpu status bench`: bot CPU per ps row incl. rendering ({first_status[:40]!r})")
            figure("black box, shown", f"{median(bb_probe) * 1e6:.1f} us/row",
                   f"`/probe bench match=...`: {shown_s} rows shown ({first_probe[:40]!r})")
            figure("black box / HostService, shown", f"x{median(bb_probe) / median(shown):.2f}",
                   "what the command path (rendering, audit) adds on top of the probe")
    finally:
        footer(start)


def _add(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--processes", type=int, default=1000, help="sleeping processes to start (default 1000)")


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__, _add)))

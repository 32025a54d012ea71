#!/usr/bin/env python3
"""A small but real multi-process "inference server" for the GPU tests: its workers hold real GPU memory.

The launcher (no torch import: it holds no GPU memory) starts `--workers` TP-rank worker processes, each a
fresh Python process (`subprocess`, like SGLang's `sglang::scheduler_TPn`). Each worker imports torch,
creates a CUDA context on `--device`, "loads weights" by allocating `--gib` GiB of tensors in `--shards`
steps (a progress line per shard), and logs SGLang-style phase lines, the formats `bot/core/diagnose/signatures.yaml`
knows (sglang 0.4/0.5)::

    [2026-11-29 10:00:00] server_args=ServerArgs(model_path='/data/torch-fake', tp_size=2, port=8000, ...)
    [2026-11-29 10:00:00 TP0] Init torch distributed begin.
    [2026-11-29 10:00:03 TP0] Init torch distributed ends. avail mem=139.19 GB
    [2026-11-29 10:00:03 TP0] Load weight begin. avail mem=139.00 GB
    Loading safetensors checkpoint shards: 50% Completed | 4/8 [00:00<00:00, 9.9it/s]
    [2026-11-29 10:00:04 TP0] Load weight end. type=TorchFakeForCausalLM, dtype=torch.bfloat16, ...

Then, by `--mode`:

- hang:  nothing after `Load weight end` (the SGLang report of case 00): the processes stay alive and hold
  the memory, sleeping, so the GPU shows 0 % utilization; the port never opens.
- init_hang: every rank but the last calls `torch.distributed.init_process_group` (NCCL, the TCPStore
  rendezvous on `--port` + 1) after `Init torch distributed begin.`; the last rank never joins (it sleeps),
  so the others wait in the rendezvous (natively `c10d::TCPStore::waitForWorkers`) for an hour.
- nccl_ready / collective_hang (one process per GPU: `--device per-rank` puts rank N on cuda:N): every rank
  joins `init_process_group("nccl")` and runs one real `all_reduce` (`NCCL communicator ready` after it).
  nccl_ready then goes on as ready; in collective_hang every rank but the last enters a second `all_reduce`
  (with TORCH_NCCL_BLOCKING_WAIT=1 its Python frame stays inside `all_reduce` while it waits), and the last
  rank sleeps instead: the others wait in the collective for an hour, holding their weights.
- capture_spin: as ready up to `Capture cuda graph begin` and the capture bar's 0 %, then a kernel that spins for
  hours (`torch.cuda._sleep`) while the host thread busy-waits for it in `torch.cuda.synchronize()`: the GPU at
  100 % at low power, one core at 100 %, the log silent, the port closed (a graph capture that never ends).
- compile_silent: as ready, but after `Capture cuda graph begin` `--compile-s` seconds of real torch.compile work
  with nothing logged and the GPU idle (an engine's first compile), then on to ready.
- ready: `KV Cache is allocated` (another `--kv-gib` GiB), `Memory pool end`, `Capture cuda graph begin`
  (a few real bf16 matrix products), `Capture cuda graph end`; once every rank is done the launcher logs
  `Uvicorn running on http://127.0.0.1:PORT` and `The server is fired up and ready to roll!` and serves
  GET /health on `--port`: 200 while every rank's heartbeat (a file it touches every 0.2 s) is fresh, no
  answer while a rank is stopped (SIGSTOP), as SGLang's /health goes through the scheduler.

`--single 1`: one process, no workers: the launcher itself is rank 0 (a thread of it loads the weights), so the
server's own PID holds the GPU memory, as a single-GPU vLLM or llama.cpp server does. `--escape-gib G` (G > 0):
once ready, the launcher starts a grandchild through a shell that exits at once, with `setsid env -i` (no session,
no environment of the launch: no GPUBOT_LAUNCH tag), which holds G GiB on cuda:0 and sleeps: the child that
escapes a launch. `--oom-after S` (ready mode): rank 0 logs decode lines for S s once ready, then a forward pass
asks for twice the GPU's memory: a real `torch.OutOfMemoryError` while serving, its traceback, exit 1.

A worker that fails (no CUDA, out of memory) prints its traceback and exits 1; the launcher then logs
`Received sigquit from a child process` and exits 1, like SGLang. SIGTERM ends every process (the default
action), and the driver frees the memory when the process is gone.

Usage: python3 torch_server.py --workers 2 --gib 4 --port 8000 --mode MODE [--kv-gib 1] [--device cuda:0|per-rank]
"""

from __future__ import annotations

import argparse
import http.server
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

GIB = 1 << 30


def log(msg: str, rank: int | None = None) -> None:
    """Print an SGLang-style line `[YYYY-MM-DD HH:MM:SS TPn] msg` and flush."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    tag = f"{ts} TP{rank}" if rank is not None else ts
    print(f"[{tag}] {msg}", flush=True)


def _allocate(torch, device, gib: float, pieces: int, on_piece=None) -> list:
    """`gib` GiB of uint8 tensors on `device`, in `pieces` parts, each written once (so the pages are real)."""
    total = int(gib * GIB)
    pieces = max(1, pieces)
    out = []
    for i in range(pieces):
        n = total // pieces + (total % pieces if i == pieces - 1 else 0)
        if n > 0:
            t = torch.empty(n, dtype=torch.uint8, device=device)
            t.fill_(1)
            out.append(t)
        torch.cuda.synchronize(device)
        if on_piece is not None:
            on_piece(i + 1, pieces)
    return out


def worker(args: argparse.Namespace) -> int:
    """One TP rank: CUDA context, weights, then hang or finish start-up."""
    rank = args.worker_rank
    t0 = time.monotonic()
    log("Init torch distributed begin.", rank)
    import torch  # slow (seconds): the CPU time grows meanwhile, which the watcher counts as progress

    device = torch.device(f"cuda:{rank}" if args.device == "per-rank" else args.device)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # the CUDA context
    dist = None
    if args.mode in ("nccl_ready", "collective_hang"):
        import datetime

        import torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port + 1}", rank=rank,
                                world_size=args.workers, timeout=datetime.timedelta(hours=1), device_id=device)
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        torch.cuda.synchronize(device)
        log(f"NCCL communicator ready: all_reduce of {args.workers} ranks gave {t.item():.0f}", rank)
    if args.mode == "init_hang":
        if rank == args.workers - 1:
            while True:  # the rank that never joins
                time.sleep(3600)
        import datetime

        import torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port + 1}", rank=rank,
                                world_size=args.workers, timeout=datetime.timedelta(hours=1))
    free, _total = torch.cuda.mem_get_info(device)  # device-wide, like SGLang's `avail mem`
    log(f"Init torch distributed ends. avail mem={free / GIB:.2f} GB", rank)
    log(f"Load weight begin. avail mem={free / GIB:.2f} GB", rank)

    def shard(done: int, of: int) -> None:
        el = time.monotonic() - t0
        print(f"Loading safetensors checkpoint shards: {100 * done // of}% Completed | {done}/{of} "
              f"[00:{int(el):02d}<00:00, {done / max(el, 1e-3):.2f}it/s]", flush=True)

    weights = _allocate(torch, device, args.gib, args.shards, shard)
    free, _ = torch.cuda.mem_get_info(device)
    log(f"Load weight end. type=TorchFakeForCausalLM, dtype=torch.bfloat16, avail mem={free / GIB:.2f} GB, "
        f"mem usage={args.gib:.2f} GB.", rank)
    if args.mode == "hang":
        while True:  # `weights` stays referenced: memory held, nothing running on the GPU, nothing logged
            time.sleep(3600)
    if args.mode == "collective_hang":
        if rank == args.workers - 1:
            while True:  # the rank that never enters the collective
                time.sleep(3600)
        t = torch.ones(1, device=device)
        dist.all_reduce(t)  # blocks in all_reduce (TORCH_NCCL_BLOCKING_WAIT=1): the last rank never comes
    kv = _allocate(torch, device, args.kv_gib, 1)
    tokens = int(args.kv_gib * GIB) // (2 * 2 * 8 * 128 * 64)  # K and V, bf16, 8 heads x 128 dims x 64 layers
    log(f"KV Cache is allocated. #tokens: {tokens}, K size: {args.kv_gib / 2:.2f} GB, "
        f"V size: {args.kv_gib / 2:.2f} GB", rank)
    free, _ = torch.cuda.mem_get_info(device)
    log(f"Memory pool end. avail mem={free / GIB:.2f} GB", rank)
    log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={free / GIB:.2f} GB", rank)
    if args.mode == "capture_spin":
        capture_spin(torch, device, free)
    if args.mode == "compile_silent":
        compile_silently(torch, device, args.compile_s)
    t1 = time.monotonic()
    a = torch.randn(2048, 2048, dtype=torch.bfloat16, device=device)
    for _ in range(8):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize(device)
    del a
    free, _ = torch.cuda.mem_get_info(device)
    log(f"Capture cuda graph end. Time elapsed: {time.monotonic() - t1:.2f} s. mem usage=0.00 GB. "
        f"avail mem={free / GIB:.2f} GB.", rank)
    ready_file = os.path.join(args.ready_dir, f"rank{rank}") if args.ready_dir else None
    if ready_file:
        open(ready_file, "w").close()
    held = (weights, kv)
    if args.oom_after > 0 and rank == 0:
        serve_then_oom(torch, device, args.oom_after, ready_file)
    while held:  # stay alive, holding the memory, until signalled; the heartbeat /health looks at
        if ready_file:
            try:
                os.utime(ready_file)
            except OSError:
                pass
        time.sleep(0.2)
    return 0


def capture_spin(torch, device, free: int) -> None:
    """The capture bar's 0 %, then a kernel that never finishes (torch's own `torch.cuda._sleep`, a spin of the GPU's
    clock for ~10^13 cycles: hours) while the host thread waits for it in `torch.cuda.synchronize()` (by default
    the CUDA runtime busy-waits: 100 % of a core). The GPU shows 100 % utilization at low power; nothing more is
    logged; the port never opens."""
    print(f"Capturing batches (bs=160 avail_mem={free / GIB:.2f} GB):   0%|          | 0/23 [00:00<?, ?it/s]",
          flush=True)
    torch.cuda._sleep(10**13)
    torch.cuda.synchronize(device)


def compile_silently(torch, device, seconds: float) -> None:
    """`seconds` of real torch.compile work with nothing logged and nothing running on the GPU: a small function
    compiled again and again (the compile caches reset between rounds, Inductor's compile threads off, so the host
    thread itself compiles), the way an engine's first torch.compile of a model keeps its log silent for minutes."""
    import torch._dynamo

    torch._inductor.config.compile_threads = 1
    x = torch.randn(64, 64, device=device)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        torch._dynamo.reset()
        scale = float(n % 7 + 1)

        def block(t, s=scale):
            for _ in range(8):
                t = torch.nn.functional.gelu(t @ t.T * s).softmax(-1)
            return t

        torch.compile(block, dynamic=False)(x + n)
        n += 1
    torch.cuda.synchronize(device)


def serve_then_oom(torch, device, after_s: float, ready_file: str | None) -> None:
    """Serve for `after_s` s (a decode line, a real bf16 product, every 0.5 s), then run out of memory in a
    forward pass: a real `torch.OutOfMemoryError` (twice the device's memory asked for) that nothing catches, so
    its traceback is printed and the rank exits 1, like an SGLang scheduler that OOMs on a large batch."""
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < after_s:
        a = torch.randn(1024, 1024, dtype=torch.bfloat16, device=device)
        (a @ a).sum().item()
        n += 1
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP0] Decode batch. #running-req: 1, #token: {64 * n}, "
              f"token usage: 0.01, gen throughput (token/s): 42.00, #queue-req: 0", flush=True)
        if ready_file:
            try:
                os.utime(ready_file)
            except OSError:
                pass
        time.sleep(0.5)
    _, total = torch.cuda.mem_get_info(device)

    def forward_decode(batch_tokens: int):
        return torch.empty(batch_tokens, dtype=torch.uint8, device=device)  # more than the GPU has

    forward_decode(2 * total)


class Health(http.server.BaseHTTPRequestHandler):
    """GET /health and /health_generate: 200 with an empty body while every rank's heartbeat is fresh (like
    SGLang's /health, which goes through the scheduler); with a rank stopped (SIGSTOP) the request hangs
    for 30 s, then 503. Anything else 404."""

    ready_dir: str | None = None
    workers = 0

    def _ranks_alive(self) -> bool:
        if not self.ready_dir:
            return True
        now = time.time()
        try:
            return all(now - os.stat(os.path.join(self.ready_dir, f"rank{r}")).st_mtime <= 2.0
                       for r in range(self.workers))
        except OSError:
            return False

    def do_GET(self) -> None:
        """Answer one GET request."""
        if self.path.startswith("/health") and not self._ranks_alive():
            time.sleep(30)  # a wedged scheduler: the request hangs
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a) -> None:
        """No access lines in the server log."""


def launcher(args: argparse.Namespace) -> int:
    """Start the TP ranks, wait for them, serve /health (ready) or wait (hang). Returns the exit code."""
    log(f"server_args=ServerArgs(model_path='/data/torch-fake', tp_size={args.workers}, port={args.port}, "
        f"mode={args.mode}, mem_per_rank_gib={args.gib})")
    ready_dir = tempfile.mkdtemp(prefix="torch-server-ready-")
    ranks = []
    if args.single:  # rank 0 in this very process
        one = argparse.Namespace(**{**vars(args), "worker_rank": 0, "ready_dir": ready_dir, "workers": 1})
        threading.Thread(target=worker, args=(one,), daemon=True).start()
    for rank in range(0 if args.single else args.workers):
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker-rank", str(rank),
               "--ready-dir", ready_dir]
        ranks.append(subprocess.Popen(cmd))
    serving = False
    while True:
        for p in ranks:
            rc = p.poll()
            if rc not in (None, 0):
                log(f"Received sigquit from a child process. It usually means the child failed. rc={rc}")
                for o in ranks:
                    if o.poll() is None:
                        o.terminate()
                return 1
        if args.mode in ("ready", "nccl_ready", "compile_silent") and not serving and \
                len(os.listdir(ready_dir)) >= (1 if args.single else args.workers):
            Health.ready_dir, Health.workers = ready_dir, (1 if args.single else args.workers)
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            log(f"Uvicorn running on http://127.0.0.1:{args.port} (Press CTRL+C to quit)")
            log("The server is fired up and ready to roll!")
            serving = True
            if args.escape_gib > 0:
                escape(args.escape_gib)
        time.sleep(0.2)


def escape(gib: float) -> None:
    """Start a grandchild that leaves the launch: `sh -c 'setsid env -i ... python -c CODE &'` (the shell exits at
    once, so nothing of the launch is its parent), holding `gib` GiB on cuda:0 until killed. Only PATH and
    PYTHONPATH are given back to it (to find torch); no GPUBOT_LAUNCH tag."""
    code = (f"import time, torch; t = torch.empty({int(gib * GIB)}, dtype=torch.uint8, device='cuda:0'); "
            "t.fill_(1); torch.cuda.synchronize(); print('escapee holds memory', flush=True); time.sleep(3600)")
    keep = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")
                    if os.environ.get(k))
    subprocess.run(["sh", "-c", f"setsid env -i {keep} {shlex.quote(sys.executable)} -c {shlex.quote(code)} &"],
                   check=False)
    log(f"started a child that escapes the launch ({gib:.1f} GiB)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description="multi-process torch server holding real GPU memory (gpubot GPU tests)")
    p.add_argument("--workers", type=int, default=2, help="TP ranks (worker processes)")
    p.add_argument("--gib", type=float, default=4.0, help="GiB of 'weights' each rank puts on the GPU")
    p.add_argument("--kv-gib", type=float, default=1.0, help="GiB of 'KV cache' each rank adds (ready mode)")
    p.add_argument("--shards", type=int, default=8, help="weight shards (one progress line each)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--mode", choices=["ready", "hang", "init_hang", "nccl_ready", "collective_hang", "capture_spin",
                                      "compile_silent"], default="ready")
    p.add_argument("--compile-s", type=float, default=40.0, help="compile_silent: seconds of silent torch.compile")
    p.add_argument("--device", default="cuda:0",
                   help="every rank's device (one GPU), or `per-rank`: rank N on cuda:N (one process per GPU)")
    p.add_argument("--single", type=int, default=0, help="1: one process (the launcher is rank 0), no workers")
    p.add_argument("--escape-gib", type=float, default=0.0,
                   help="once ready, start a grandchild with `setsid env -i` holding this many GiB")
    p.add_argument("--oom-after", type=float, default=0.0,
                   help="ready mode: rank 0 serves this many seconds, then a forward pass runs out of GPU memory")
    p.add_argument("--worker-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ready-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.workers <= 64 or args.gib < 0 or args.kv_gib < 0 or not 1 <= args.port <= 65534:
        p.error("need 1..64 workers, GiB >= 0 and a port in 1..65535")
    return args


def main() -> int:
    """Run the launcher or, with --worker-rank, one TP rank."""
    args = parse_args()
    if args.mode == "collective_hang":
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    if args.worker_rank is not None:
        return worker(args)
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A fake multi-process inference server for the demo and the tests. Standard library only.

The launcher spawns `--workers` TP-rank worker processes (like `sglang::scheduler_TP0..N`), each of which
"loads weights" (registers fake GPU memory with the fake nvidia-smi when `--gpu-state` is given) and logs
SGLang-style phase lines (sglang 0.4/0.5 formats). Then, by `--mode`:

- ready: KV cache and CUDA graph lines, then `The server is fired up and ready to roll!` and an HTTP
  server on `--port` answering GET /health with 200 (and /v1/models).
- hang:  nothing after `Load weight end`: processes alive, memory held, port closed (case 00).
- crash: a Python traceback from rank 0 (node 0's first rank), exit 1; its launcher then stops the other ranks and
  exits 1, and on a multi-node launch every other node's launcher, finding node 0 gone, logs a lost connection to
  it and does the same (as torch.distributed's peers end after rank 0's). `--fail-node N`: node N's first rank
  fails instead (the other nodes go on: under Slurm, srun --kill-on-bad-exit ends them).
- oom:   `torch.OutOfMemoryError: CUDA out of memory` from rank 0, exit 1, the other ranks as for crash.
- exit:  prints a shutdown line and exits 0.
- heartbeat: like hang, but the launcher keeps printing vLLM's `Waiting for 1 local, 0 remote core engine
  proc(s) to start.` heartbeat (not progress).
`--busy-in compile|synchronize` (with `--busy-s`) makes each rank spin silently at 100 % of a core after the graph
capture's first line, in a frame named as Inductor's compile (work) or as `torch.cuda.synchronize` (a busy-wait).
`--own-pgid-child` makes one extra child that calls setsid() (escapes the process group, stays in no
session of ours) to test that kills reach every process of a launch; `--cleared-env-child` one that also
clears its environment (`env -i`, as a container runtime does), so it carries no launch tag.

Once ready, each TP rank touches its ready file every 0.2 s and GET /health answers only while every rank
did so within 2 s (like SGLang's /health, which goes through the scheduler): a rank stopped with SIGSTOP
makes /health time out. With `--control DIR`: the file DIR/health-503 makes /health answer 503, and DIR/oom
makes rank 0 log a CUDA OOM and exit 1, after which the launcher stops the other ranks and exits 1; while
DIR/generate-hang exists, generation (POST /v1/completions, GET /health_generate) hangs while /health still
answers 200 (an HTTP front whose engine makes no tokens; /health_generate gives up after 3 s with SGLang's
`Health check failed` line and a 503), and DIR/generate-500 makes POST /v1/completions
answer 500.
"""

import argparse
import http.server
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def log(msg, rank=None):
    """Print an SGLang-style line `[YYYY-MM-DD HH:MM:SS TPn] msg` and flush."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    tag = f"{ts} TP{rank}" if rank is not None else ts
    print(f"[{tag}] {msg}", flush=True)


def register(state, pid, gpu, mib):
    """Register PID as holding MIB of fake memory on GPU index `gpu` (read by fake_nvidia_smi)."""
    if not state:
        return
    d = os.path.join(state, "holders")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, str(pid)), "w") as f:
        f.write(f"{gpu} {mib}\n")


def _create_c10d_store():
    """Stands for torch.distributed's rendezvous: waits for ranks that never come (py-spy shows this frame)."""
    threading.Event().wait()


def init_process_group():
    """Stands for torch.distributed.init_process_group: the rendezvous first."""
    _create_c10d_store()


def all_reduce():
    """Stands for torch.distributed.all_reduce: waits for a rank that never enters it."""
    threading.Event().wait()


def compile_fx_inner(seconds):
    """Stands for torch._inductor's compile: a pure-Python loop on one core for `seconds` (py-spy shows this frame,
    as it shows Inductor's own while it compiles: CPU time that is work)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def synchronize(seconds):
    """Stands for torch.cuda.synchronize() on a kernel that never ends: a busy-wait on one core, forever when
    `seconds` is 0 (py-spy shows this frame: CPU time that is no progress)."""
    end = time.monotonic() + seconds if seconds > 0 else math.inf
    while time.monotonic() < end:
        pass


def hang_loop(args):
    """A hung rank: sleep (or poll, `--poll-cpu`) forever."""
    while True:
        if args.poll_cpu > 0:  # a hung rank whose progress thread polls: CPU time, no progress
            end = time.monotonic() + 0.1 * args.poll_cpu
            while time.monotonic() < end:
                pass
            time.sleep(0.1 * (1 - args.poll_cpu))
        else:
            time.sleep(3600)


def worker(args):
    """A TP rank: load weights (fake GPU memory), then hang, crash, OOM or finish start-up by --mode. With
    `--hang-in rendezvous` every rank but the last waits in `init_process_group` before loading; with
    `--hang-in collective` every rank but the last waits in `all_reduce` after loading; the last rank sleeps."""
    rank = args.worker_rank
    odd = rank == args.workers - 1
    first = rank == 0 and args.node_rank == args.fail_node  # the rank that crashes or runs out of memory
    if args.mode == "hang" and args.hang_in == "rendezvous":
        log("Init torch distributed begin.", rank)
        if odd:
            hang_loop(args)
        init_process_group()
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else [0]
    gpu = gpus[rank % len(gpus)]
    log("Load weight begin. avail mem=139.00 GB", rank)
    steps = max(1, args.load_steps)
    for i in range(steps):
        time.sleep(args.load_s / steps)
        if steps > 1:
            print(f"Loading safetensors checkpoint shards: {int(100 * (i + 1) / steps)}% "
                  f"Completed | {i + 1}/{steps}", flush=True)
    register(args.gpu_state, os.getpid(), gpu, args.mem_mib)
    log(f"Load weight end. type=FakeForCausalLM, dtype=torch.bfloat16, avail mem={139 - args.mem_mib / 1024:.2f} GB, "
        f"mem usage={args.mem_mib / 1024:.2f} GB.", rank)
    if args.mode == "hang" and args.hang_in == "collective" and not odd:
        all_reduce()
    if args.mode in ("hang", "heartbeat"):
        hang_loop(args)
    if args.mode == "oom" and first:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
              "capacity of 139.81 GiB of which 1.19 GiB is free.", file=sys.stderr, flush=True)
        sys.exit(1)
    if args.mode == "crash" and first:
        raise RuntimeError("fake scheduler failed during init")
    log("KV Cache is allocated. #tokens: 1000000, K size: 10.00 GB, V size: 10.00 GB", rank)
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=50.00 GB", rank)
    if args.busy_in:  # silent, at 100 % of a core, in a compile (work) or a synchronize (a busy-wait)
        {"compile": compile_fx_inner, "synchronize": synchronize}[args.busy_in](args.busy_s)
    log("Capture cuda graph end. Time elapsed: 0.10 s. mem usage=0.50 GB. avail mem=49.50 GB.", rank)
    ready_file = os.path.join(args.ready_dir, f"rank{rank}") if args.ready_dir else None
    if ready_file:
        open(ready_file, "w").close()
    # serve until the launcher goes away or we are signalled: a heartbeat for /health, the OOM switch
    while True:
        if ready_file:
            try:
                os.utime(ready_file)
            except OSError:
                pass
        if args.control and first and os.path.exists(os.path.join(args.control, "oom")):
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                  "capacity of 139.81 GiB of which 0.19 GiB is free.", file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(0.2)


class Health(http.server.BaseHTTPRequestHandler):
    """GET /health and /health_generate: 200 empty while every rank is alive (else no answer for 30 s, then
    503), 503 while the control file `health-503` exists; /health_generate hangs while `generate-hang` exists;
    /v1/models: a one-model list; POST /v1/completions (do_POST); anything else 404."""

    ready_dir = None
    control = None
    workers = 0

    def _empty(self, status):
        """Answer `status` with an empty body."""
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _ranks_alive(self):
        if not self.ready_dir:
            return True
        now = time.time()
        for rank in range(self.workers):
            try:
                if now - os.stat(os.path.join(self.ready_dir, f"rank{rank}")).st_mtime > 2.0:
                    return False
            except OSError:
                return False
        return True

    def do_GET(self):
        """Answer one GET request."""
        if self.path.startswith("/health") and self.control and os.path.exists(os.path.join(self.control,
                                                                                             "health-503")):
            return self._empty(503)
        if self.path.startswith("/health") and not self._ranks_alive():
            time.sleep(30)  # a wedged scheduler: the request hangs
            return self._empty(503)
        if self.path == "/health_generate" and self._generation_hangs(give_up_s=3.0):
            # like SGLang: it gives up on the detokenizer after a while, says so in its log, and answers 503
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Health check failed. Server couldn't get a response from "
                  "detokenizer for last 3 seconds. tic start time: 0.0. last_heartbeat time: 0.0", flush=True)
            return self._empty(503)
        if self.path in ("/health", "/health_generate", "/v1/models"):
            body = b"" if self.path.startswith("/health") else json.dumps({"data": [{"id": "fake"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def _generation_hangs(self, give_up_s=600.0):
        """While the control file `generate-hang` exists, wait (up to `give_up_s` seconds) as an engine that makes
        no tokens would; True when it was there (the request then gets a 503, if anyone still waits)."""
        flag = os.path.join(self.control, "generate-hang") if self.control else None
        if flag is None or not os.path.exists(flag):
            return False
        end = time.monotonic() + give_up_s
        while os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.2)
        return True

    def do_POST(self):
        """POST /v1/completions (OpenAI style): one token, `{"choices": [{"text": "!"}]}`; it hangs while the
        control file `generate-hang` exists, and answers 500 while `generate-500` exists. Anything else 404."""
        length = min(int(self.headers.get("Content-Length") or 0), 65536)
        self.rfile.read(length)
        if self.path != "/v1/completions":
            return self._empty(404)
        if self.control and os.path.exists(os.path.join(self.control, "generate-500")):
            return self._empty(500)
        if self._generation_hangs():
            return self._empty(503)
        body = json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "!"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        """Keep the server log free of access lines."""
        pass


def launcher(args):
    """The launcher process: start the TP ranks, then serve /health (ready) or wait. Returns the exit code."""
    # beside the fake GPU state when there is one: a server killed with SIGKILL leaves no directory in /tmp
    base = args.gpu_state if args.gpu_state and os.path.isdir(args.gpu_state) else None
    ready_dir = tempfile.mkdtemp(prefix="fake-server-ready-", dir=base)
    try:
        return _launcher(args, ready_dir)
    finally:
        shutil.rmtree(ready_dir, ignore_errors=True)


def _launcher(args, ready_dir):
    log(f"server_args=ServerArgs(model_path='/data/fake', tp_size={args.workers}, port={args.port}, mode={args.mode})")
    children = []
    for rank in range(args.workers):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-rank", str(rank), *sys.argv[1:],
               "--ready-dir", ready_dir]
        children.append(subprocess.Popen(cmd))
    if args.own_pgid_child:
        children.append(subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
                                         start_new_session=True))
        log(f"helper process {children[-1].pid} started in its own session")
    if args.cleared_env_child:  # like a container runtime: no inherited environment, its own session
        sleeper = "import time\nwhile True: time.sleep(3600)"
        children.append(subprocess.Popen(["env", "-i", sys.executable, "-c", sleeper], start_new_session=True))
        log(f"helper process {children[-1].pid} started with a cleared environment in its own session")
    if args.mode == "exit":
        time.sleep(args.load_s)
        log("Shutting down (requested).")
        for c in children:
            c.terminate()
        return 0
    joined = _rendezvous(args) if args.nnodes > 1 and args.node_rank == 0 else None
    if args.mode == "ready":
        # like SGLang: the HTTP port opens only after every TP rank reported ready
        while len(os.listdir(ready_dir)) < args.workers:
            if any(c.poll() not in (None, 0) for c in children):
                log("A TP rank exited before it was ready.")
                return 1
            time.sleep(0.05)
        if args.nnodes > 1 and not _nodes_ready(args, joined, children):
            return 1
    if args.mode == "ready" and args.node_rank == 0:
        Health.ready_dir, Health.control, Health.workers = ready_dir, args.control, args.workers
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
        srv.daemon_threads = True
        log(f"Uvicorn running on http://127.0.0.1:{args.port} (Press CTRL+C to quit)")
        log("The server is fired up and ready to roll!")
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    peer = args.nnodes > 1 and args.node_rank > 0 and args.fail_node == 0 and args.mode in ("crash", "oom")
    seen_node0 = False
    while True:
        if peer:  # like torch.distributed's peers: node 0 gone (its rank 0 failed), this node's ranks end too
            up = _node0_listens(args)
            if seen_node0 and not up:
                log(f"torch.distributed.DistNetworkError: Connection to node 0 at {args.dist_init_addr} was lost "
                    "(Connection refused)")
                for o in children:
                    if o.poll() is None:
                        o.terminate()
                return 1
            seen_node0 = seen_node0 or up
        if args.mode == "heartbeat":
            print(f"(APIServer pid={os.getpid()}) DEBUG {time.strftime('%m-%d %H:%M:%S')} "
                  "[v1/engine/utils.py:1262] Waiting for 1 local, 0 remote core engine proc(s) to start.", flush=True)
        for c in children:
            rc = c.poll()
            if rc not in (None, 0) and args.mode in ("crash", "oom", "ready"):
                log(f"Received sigquit from a child process. It usually means the child failed. rc={rc}")
                for o in children:
                    if o.poll() is None:
                        o.terminate()
                return 1
        time.sleep(0.2)


def _rendezvous(args):
    """Node 0 of a multi-node launch: listen on --dist-init-addr's port for the other nodes; returns the set of
    node ranks that joined (filled by a thread as each node says `ready K`)."""
    import socket
    joined = set()
    port = int(args.dist_init_addr.rpartition(":")[2])
    srv = socket.create_server(("", port), reuse_port=False)

    def accept():
        while True:
            conn, _ = srv.accept()
            data = conn.recv(64).decode(errors="replace").split()
            if len(data) == 2 and data[0] == "ready" and data[1].isdigit():
                joined.add(int(data[1]))
    threading.Thread(target=accept, daemon=True).start()
    return joined


def _node0_listens(args):
    """Whether node 0's rendezvous port (--dist-init-addr) accepts a connection now."""
    import socket
    host, _, port = args.dist_init_addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _nodes_ready(args, joined, children):
    """After this node's ranks are ready: node 0 waits until every other node joined (True), logging once what it
    waits for; another node tells node 0 it is ready (retrying until node 0 listens) and returns True. False when a
    local rank exited meanwhile."""
    import socket
    if args.node_rank == 0:
        log(f"Waiting for {args.nnodes - 1} other node(s) to join at {args.dist_init_addr}")
        while len(joined) < args.nnodes - 1:
            if any(c.poll() not in (None, 0) for c in children):
                return False
            time.sleep(0.1)
        log(f"All {args.nnodes} nodes joined.")
        return True
    host, _, port = args.dist_init_addr.rpartition(":")
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2) as c:
                c.sendall(f"ready {args.node_rank}".encode())
            log(f"Node {args.node_rank} joined node 0 at {args.dist_init_addr}.")
            return True
        except OSError:
            if any(c.poll() not in (None, 0) for c in children):
                return False
            time.sleep(0.2)


def main():
    """Parse arguments and run a launcher or, with --worker-rank, one TP rank."""
    p = argparse.ArgumentParser(description="fake multi-process inference server")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpus", default="0")
    p.add_argument("--mem-mib", type=float, default=8610)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--mode", choices=["ready", "hang", "crash", "oom", "exit", "heartbeat"], default="ready")
    p.add_argument("--load-s", type=float, default=0.5)
    p.add_argument("--load-steps", type=int, default=1)
    p.add_argument("--gpu-state", default=None)
    p.add_argument("--own-pgid-child", action="store_true")
    p.add_argument("--cleared-env-child", action="store_true")
    p.add_argument("--poll-cpu", type=float, default=0.0,
                   help="fraction of a core each hung rank spins (0..1), like a polling progress thread")
    p.add_argument("--busy-in", choices=["compile", "synchronize"], default=None,
                   help="after `Capture cuda graph begin`, each rank spins silently in compile_fx_inner (work) or in "
                        "synchronize (a busy-wait) for --busy-s seconds (0: forever) before going on")
    p.add_argument("--busy-s", type=float, default=0.0)
    p.add_argument("--hang-in", choices=["sleep", "rendezvous", "collective"], default="sleep",
                   help="where --mode hang hangs: every rank asleep after loading, or all but the last rank in "
                        "init_process_group (before loading) or in all_reduce (after loading)")
    p.add_argument("--control", default=None,
                   help="a directory of switch files (health-503, oom, generate-hang, generate-500)")
    p.add_argument("--served-model-name", default=None, help="accepted and ignored, like a real server's")
    p.add_argument("--nnodes", type=int, default=1, help="nodes of a multi-node launch (like SGLang's)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 serves HTTP once all joined)")
    p.add_argument("--dist-init-addr", default=None, help="HOST:PORT where node 0 waits for the other nodes")
    p.add_argument("--hang-node", type=int, default=-1,
                   help="the node whose ranks hang in init_process_group before loading (-1: none)")
    p.add_argument("--fail-node", type=int, default=0,
                   help="with --mode crash/oom: the node whose first rank fails (another node than 0 leaves the "
                        "others running, as a rank lost on its own; Slurm's srun --kill-on-bad-exit ends them)")
    p.add_argument("--worker-rank", type=int, default=None)
    p.add_argument("--ready-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.nnodes > 1 and args.hang_node == args.node_rank:  # this node's ranks never join
        args.mode, args.hang_in = "hang", "rendezvous"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.worker_rank is not None:
        return worker(args)
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())

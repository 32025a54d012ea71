"""Builders of test configs: SSH hosts pointing at the loopback servers, and a GPU host with the fake
multi-process server as its variants (`base`, `helper`), fast watch settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bot.config import Config, HostConfig, WatchPolicy
from bot.core.models import Launch, LaunchState
from bot.demo.fakegpu import FakeGpu, install_fake_gpu
from tests.support.procs import FAKE_SERVER, free_port

OPERATOR, OTHER_OPERATOR, VIEWER = "U0OPERATOR", "U0OTHER", "U0VIEWER"

#: Readiness checks every 0.5 s; silence after 2 s in every start-up phase.
FAST_WATCH = WatchPolicy(interval_s=0.5, silence_after_s=2.0,
                         phase_grace_s={p: 2.0 for p in ("comm_init", "weight_loading", "kv_cache_alloc",
                                                         "cuda_graph_capture", "warmup")})


def ssh_host(srv: Any, **overrides: Any) -> HostConfig:
    """HostConfig pointing at a LoopbackSSHServer / OpenSSHServer (host keys verified)."""
    fields: dict[str, Any] = {
        "address": srv.host,
        "port": srv.port,
        "user": srv.username,
        "key_file": str(srv.client_key_path),
        "known_hosts": str(srv.known_hosts_path),
        "connect_timeout_s": 5,
        "command_timeout_s": 20,
        "nvidia_smi_timeout_s": 10,  # the replaying fake is a Python start: seconds on a loaded 2-core machine
        "keepalive_interval_s": 5,
        "log_dirs": ["/tmp"],
    }
    fields.update(overrides)
    return HostConfig(**fields)


def fake_variant(fake_gpu: FakeGpu, log_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The fake server as a variant on host `gpu-host-1`: params workers, mode (ready/hang/crash/oom/exit/
    heartbeat), load_s, model; TP workers on GPUs 0 and 1 of the replayed GPUs; a free port; its log under
    `log_dir`."""
    base: dict[str, Any] = {
        "host": "gpu-host-1",
        "command": "{{ python }} {{ server }} --workers {{ workers }} --gpus 0,1 --port {{ port }} --mode {{ mode }}"
                   " --load-s {{ load_s }} --gpu-state {{ state }}",
        "params": {
            "python": {"type": "path", "default": sys.executable},
            "server": {"type": "path", "default": FAKE_SERVER},
            "workers": {"type": "int", "default": 2, "min": 1, "max": 8},
            "mode": {"type": "str", "default": "hang",
                     "choices": ["ready", "hang", "crash", "oom", "exit", "heartbeat"]},
            "load_s": {"type": "float", "default": 0.2},
            "state": {"type": "path", "default": str(fake_gpu.state_dir)},
            "model": {"type": "str", "default": "fake", "regex": "[A-Za-z0-9_./-]+"},
        },
        "port": free_port(),
        "gpus": [0, 1],
        "log": str(log_dir / "{{ variant }}-{{ launch_id }}.log"),
    }
    base.update(overrides)
    return base


def launch_config(ssh_server: Any, fake_gpu: FakeGpu, tmp_path: Path, *, variants: dict[str, Any] | None = None,
                  permissions: dict[str, Any] | None = None, host: dict[str, Any] | None = None,
                  lifecycle: dict[str, Any] | None = None, **base_overrides: Any) -> Config:
    """A config with host `gpu-host-1` (the loopback SSH server, 2 replayed H200s), variants `base` (the
    fake server, overridden by `base_overrides`) and `helper` (base with a child in its own process group),
    plus `variants` (each a dict; `{"extends": "base", ...}` works). Operators U0OPERATOR and U0OTHER,
    viewer U0VIEWER; fast kills (grace 3 s, release timeout 10 s)."""
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=2)
    base = fake_variant(fake_gpu, tmp_path / "logs", **base_overrides)
    all_variants = {"base": base, "helper": {"extends": "base", "command": base["command"] + " --own-pgid-child"}}
    all_variants.update(variants or {})
    return Config.model_validate({
        "hosts": {"gpu-host-1": ssh_host(ssh_server, **(host or {})).model_dump()},
        "variants": all_variants,
        "state_dir": str(tmp_path / "state"),
        "permissions": permissions or {"operators": [OPERATOR, OTHER_OPERATOR], "viewers": [VIEWER]},
        "lifecycle": {"kill_grace_s": 3, "release_timeout_s": 10, **(lifecycle or {})},
    })


def launch_row(**overrides: Any) -> Launch:
    """A running `base#3` on host `h` (pid 100 in process group = session 99, GPU 0, tag `3-abc`, created at
    epoch 1000 s by U1 in C1), with `overrides` applied: for the pure tests of observe/serving."""
    fields: dict[str, Any] = dict(id=3, host="h", variant="base", params={}, command="", log_path="/l", port=None,
                                  gpus=[0], pid=100, pgid=99, sid=99, state=LaunchState.RUNNING, state_detail=None,
                                  created_by="U1", created_at=1000.0, ended_at=None, channel="C1", thread_ts="1.1",
                                  tag="3-abc")
    fields.update(overrides)
    return Launch(**fields)


def three_watched_variants(ssh_server: Any, fake_gpu: FakeGpu, tmp_path: Path, silence_s: float) -> dict[str, Any]:
    """launch_config's data (a dict, to edit and write as YAML) with variants v1, v2, v3 instead of base and helper:
    the fake server on GPUs 0-1, 2-3 and 4-5 of 6 replayed GPUs, each on a port of its own, watched every 0.5 s and
    called silent after `silence_s` seconds in any phase."""
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=6)
    data = cfg.model_dump(mode="json", exclude_none=True)
    base = data["variants"].pop("base")
    data["variants"].pop("helper")
    for i, gpus in enumerate(([0, 1], [2, 3], [4, 5]), start=1):
        data["variants"][f"v{i}"] = {**base, "gpus": gpus, "port": free_port(),
                                     "command": base["command"].replace("--gpus 0,1", "--gpus " +
                                                                        ",".join(map(str, gpus)))}
    data["watch"] = {"interval_s": 0.5, "silence_after_s": silence_s,
                     "phase_grace_s": {p: silence_s for p in ("comm_init", "weight_loading", "kv_cache_alloc",
                                                              "cuda_graph_capture", "warmup")}}
    return data

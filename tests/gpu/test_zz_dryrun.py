import os

import pytest

import tests.gpu.test_real_gpu as g
from bot.demo.fakegpu import install_fake_gpu
from tests.gpu.test_real_gpu import gpu_stack  # noqa: F401
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.procs import FAKE_SERVER

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fakegpu(tmp_path, monkeypatch):
    fg = install_fake_gpu(tmp_path / "fg", gpu_count=1)
    monkeypatch.setenv("PATH", f"{fg.bin_dir}:{os.environ['PATH']}")
    return fg


@pytest.fixture
async def real_ssh(tmp_path, fakegpu):
    async with LoopbackSSHServer(tmp_path / "ssh") as srv:
        yield srv


@pytest.fixture(autouse=True)
def fake_torch(tmp_path, fakegpu, monkeypatch):
    script = tmp_path / "torch_server.py"
    script.write_text(f'''
import argparse, os, sys
p = argparse.ArgumentParser(); p.add_argument("--workers"); p.add_argument("--gib", type=float)
p.add_argument("--kv-gib", type=float); p.add_argument("--port"); p.add_argument("--mode")
a = p.parse_args()
os.execv(sys.executable, [sys.executable, {FAKE_SERVER!r}, "--workers", a.workers, "--gpus", "0", "--mem-mib",
         str((a.gib + a.kv_gib) * 1024), "--port", a.port, "--mode", a.mode, "--load-s", "0.5",
         "--gpu-state", {str(fakegpu.state_dir)!r}])
''')
    monkeypatch.setattr(g, "SERVER", script)
    real_smi = g.smi_read

    def nvml():
        r = real_smi()
        for gg in r["gpus"]:
            gg.update(used_v1_mib=gg["used_mib"], reserved_mib=0.0)
        r.update(driver="fake", cuda_driver=12040)
        return r
    monkeypatch.setattr(g, "nvml_read", nvml)


async def test_hang(gpu_stack):  # noqa: F811
    await g.test_hang_gets_silent_hang_with_real_gpu_evidence_and_kill_frees_the_memory.__wrapped__(gpu_stack) \
        if hasattr(g.test_hang_gets_silent_hang_with_real_gpu_evidence_and_kill_frees_the_memory, "__wrapped__") \
        else await g.test_hang_gets_silent_hang_with_real_gpu_evidence_and_kill_frees_the_memory(gpu_stack)


async def test_ready(gpu_stack):  # noqa: F811
    await g.test_ready_variant_reaches_ready_and_kill_frees_the_memory(gpu_stack)

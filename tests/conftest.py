"""Shared fixtures: the fake GPU (replaying nvidia-smi), the loopback SSH server, fake servers, and whole
bots (runtime + chat) whose processes are stopped by a finalizer even when a test fails."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bot.config import Config
from bot.demo.fakegpu import FakeGpu, install_fake_gpu
from tests.support import postgres, slurm
from tests.support.bots import TestBot, start_bot
from tests.support.builders import launch_config, ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.procs import FakeServers


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """slack_sdk and aiohttp would route loopback traffic through a proxy from the environment."""
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def fake_gpu(tmp_path) -> FakeGpu:
    """A replaying fake nvidia-smi (1 H200) installed under tmp_path."""
    return install_fake_gpu(tmp_path / "fakegpu", gpu_count=1)


@pytest.fixture
async def ssh_server(tmp_path, fake_gpu):
    """A real asyncssh server on loopback; the fake nvidia-smi is first on its commands' PATH."""
    env = {"PATH": f"{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    async with LoopbackSSHServer(tmp_path / "ssh", env=env) as srv:
        yield srv


@pytest.fixture
def ssh_config(ssh_server) -> Config:
    """Config with one SSH host `gpu-host-1` reached through the loopback server."""
    return Config(hosts={"gpu-host-1": ssh_host(ssh_server)}, default_host="gpu-host-1")


@pytest.fixture
def gpu_config(ssh_server, fake_gpu, tmp_path) -> Config:
    """Config with `gpu-host-1` (loopback SSH, 2 replayed H200s) and the fake server as variants base and
    helper (tests.support.builders.launch_config)."""
    return launch_config(ssh_server, fake_gpu, tmp_path)


@pytest.fixture
def fake_servers(tmp_path, fake_gpu):
    """Factory of fake servers started directly (not through the bot); every group is killed at teardown."""
    servers = FakeServers(tmp_path, fake_gpu.state_dir)
    yield servers
    servers.stop_all()


@pytest.fixture
def start_fake_server(fake_servers):
    """`start_fake_server(mode=..., workers=..., **extra)` (see tests.support.procs.FakeServers.start)."""
    return fake_servers.start


@pytest.fixture
async def make_bot() -> AsyncIterator[Callable[..., Awaitable[TestBot]]]:
    """Factory: `await make_bot(config, watch=..., **build_runtime options)`; every bot it made is closed at
    teardown, after its launches' processes are killed."""
    bots: list[TestBot] = []

    async def make(config: Config, **options) -> TestBot:
        bot = await start_bot(config, **options)
        bots.append(bot)
        return bot

    yield make
    for bot in reversed(bots):
        await bot.close()


@pytest.fixture
async def bot(make_bot, gpu_config) -> TestBot:
    """A bot (no readiness checks) on `gpu_config`."""
    return await make_bot(gpu_config)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A two-node Slurm cluster on this host (tests/support/slurm.py), one per test module, stopped (every job and
    process with it) when the module ends; the module's tests are skipped with the reason where Slurm or munge is
    absent."""
    why = slurm.unavailable()
    if why:
        pytest.skip(why)
    c = slurm.start_cluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throwaway PostgreSQL cluster per test process (skipped, with the reason, where it cannot run)."""
    why = postgres.unavailable()
    if why:
        pytest.skip(why)
    cluster = postgres.start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(postgres_cluster) -> str:
    """URL of an empty PostgreSQL database of this test's own."""
    return postgres_cluster.new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """The test once on a SQLite file and once on a PostgreSQL database (skipped where PostgreSQL is missing)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gpubot.db"
    return request.getfixturevalue("pg_url")

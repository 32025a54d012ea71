"""Fixtures of the wire tests: the real Bolt app against the fake Slack, stopped (with every process its
launches left) even when a test fails."""

from __future__ import annotations

import pytest

from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.slack import GatedHost, SlackStack, start_stack


@pytest.fixture
async def slack_stacks():
    """Factory: `await slack_stacks(config, **start_stack options)`; every stack is stopped at teardown."""
    stacks: list[SlackStack] = []

    async def make(config, **options) -> SlackStack:
        stack = await start_stack(config, **options)
        stacks.append(stack)
        return stack

    yield make
    for stack in reversed(stacks):
        await stack.stop()


@pytest.fixture
async def slack(slack_stacks, ssh_config) -> SlackStack:
    """A Socket Mode bot on `ssh_config` (one SSH host, no variants)."""
    return await slack_stacks(ssh_config)


@pytest.fixture
async def gated_host(tmp_path, fake_gpu):
    """A GatedHost behind a loopback SSH server; opened and stopped at teardown (after the stacks)."""
    host = GatedHost(tmp_path / "gate", fake_gpu)
    async with LoopbackSSHServer(tmp_path / "slow", env={"PATH": host.path}) as srv:
        host.server = srv
        try:
            yield host
        finally:
            host.open()

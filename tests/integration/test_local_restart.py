"""A `local: true` launch outlives a restart of the bot (issue 26), on a machine without systemd: the server
runs in a session of its own (setsid), so stopping `gpubot run` (SIGTERM, as a service manager does) or killing it
leaves it running, and the restarted bot goes on watching it. (Under systemd the unit's cgroup is the other half:
see deploy/gpubot.service.)"""

from __future__ import annotations

import os
import socket

import pytest
import yaml
from cryptography.fernet import Fernet

from bot.adapters.store import Store
from bot.core.models import LaunchState
from bot.demo.fakegpu import install_fake_gpu
from tests.support.builders import OPERATOR, fake_variant
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import wait_until
from tests.support.service import ServiceBot, stop_everything

pytestmark = pytest.mark.timeout(180)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_local_launch_keeps_running_across_a_bot_restart(tmp_path, fake_gpu, how):
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=2)
    variant = fake_variant(fake_gpu, tmp_path / "logs", host="me")
    variant["params"]["mode"]["default"] = "ready"
    data = {"hosts": {"me": {"local": True, "use_nvml": False, "nvidia_smi": str(fake_gpu.nvidia_smi),
                             "log_dirs": [str(tmp_path)]}},
            "variants": {"base": variant}, "state_dir": str(tmp_path / "state"),
            "permissions": {"operators": [OPERATOR]}, "watch": {"interval_s": 0.5, "serving_interval_s": 0.5},
            "slack": {"post_interval_s": 0.0}}
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump(data))
    db = f"sqlite:///{tmp_path / 'state' / 'gpubot.db'}"
    store: Store | None = None
    bots: list[ServiceBot] = []
    async with FakeSlack() as fake:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLACK_BOT_TOKEN": "xoxb-test",
               "SLACK_APP_TOKEN": "xapp-test", "SLACK_API_URL": fake.api_url,
               "GPUBOT_SECRET_KEY": Fernet.generate_key().decode()}
        try:
            first = await ServiceBot("first", config, env, tmp_path).start()
            bots.append(first)
            await fake.wait_connected(60)
            await wait_until(lambda: _role(first), 60, what=f"the first bot up; log:\n{first.output()}")
            await fake.push_slash_command("/launch", "base workers=2", user_id=OPERATOR, channel_id="C1")
            store = Store(db)
            la = await wait_until(lambda: next((x for x in store.launches.live() if x.ready_at), None), 90,
                                  what="the launch ready")
            assert la.pid and alive(la.pid) and port_open(la.port)
            if how == "sigterm":
                assert await first.stop() == 0  # a clean stop, as `systemctl restart` begins
            else:
                await first.kill()
            assert alive(la.pid) and port_open(la.port), "the launch died with the bot"

            second = await ServiceBot("second", config, env, tmp_path).start()
            bots.append(second)
            await wait_until(lambda: _role(second), 60, what=f"the second bot up; log:\n{second.output()}")
            checks = len(store.observations.list(la.id))
            await wait_until(lambda: len(store.observations.list(la.id)) >= checks + 3, 60,
                             what=f"the second bot checking the launch; log:\n{second.output()}")
            now = next(x for x in store.launches.live() if x.id == la.id)  # live(): read, never this process's memo
            assert now.state == LaunchState.RUNNING and now.ready_at and now.pid == la.pid
            assert alive(la.pid) and port_open(la.port)
        except AssertionError:
            print("Slack got:", [c["params"].get("text", "")[:300] for c in fake.calls])
            print("launches:", [(x.name, x.state, x.state_detail) for x in (store.launches.live() if store else [])])
            for bot in bots:
                print(bot.name, bot.output())
            raise
        finally:
            await stop_everything(bots, store, db)


async def _role(bot: ServiceBot) -> str | None:
    return await bot.role()

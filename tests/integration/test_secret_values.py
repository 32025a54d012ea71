"""Secrets masked by value: a secret param passed under an ordinary flag (`--served-model-name {{ api_key }}`)
shows in every process command line, and the server may echo it in its log as vLLM and TGI do; it must
never appear in anything the bot posts, attaches or records."""

from __future__ import annotations

import json

import pytest

from tests.support.alerts import wait_alert
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import free_port, wait_log

pytestmark = pytest.mark.timeout(180)

SECRET = "OpaqueVal9876xyzQ"  # no known token shape: only its value can find it


async def test_a_secret_param_under_an_ordinary_flag_is_masked_everywhere(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    base = cfg.variants["base"].model_dump(exclude_unset=True)
    keyed = {**base, "port": free_port(), "command": base["command"] + " --served-model-name {{ api_key }}",
             "params": {**base["params"], "api_key": {"type": "str", "default": "none-given"}}}
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, variants={"keyed": keyed})
    bot = await make_bot(cfg, watch=True, watch_policy=FAST_WATCH)
    launched = await bot.chat.say(f"/launch keyed mode=ready workers=1 api_key={SECRET}")
    assert "Launched keyed#1" in launched.text, launched.text
    la = bot.launch(1)
    await wait_alert(bot, 1, {"ready"})
    # the server echoes its args the way vLLM and TGI log them
    with open(la.log_path, "a") as f:
        f.write(f"INFO non-default args: {{'model': 'x', 'api_key': ['{SECRET}']}}\n")
        f.write(f'Args {{ model_id: "x", api_key: Some("{SECRET}"), port: 80 }}\n')
        f.write(f"served as {SECRET}\n")
    await wait_log(la.log_path, "served as")
    for text in ("/gpu status", "/probe 1", "!logs 20", "/kill 1"):
        await bot.chat.say(text, thread=la.thread_ts if text.startswith("!") else None)
    await bot.chat.say("/kill 1 --yes")
    seen = []
    for p in bot.chat.posts:
        seen += [p.text, json.dumps(p.blocks)] + [data.decode("utf-8", "replace") for _, data in p.files]
        seen += [e.text + json.dumps(e.blocks) for e in getattr(p, "edits", [])]
    seen += [json.dumps([e.args, e.detail]) for e in bot.events()]
    seen += [bot.launch(1).command, json.dumps(bot.launch(1).params)]
    leaks = [s for s in seen if SECRET in s]
    assert not leaks, leaks[:2]
    assert any("[REDACTED]" in s for s in seen)  # the places it would have been say so

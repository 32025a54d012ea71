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


def keyed_config(ssh_server, fake_gpu, tmp_path, param: str, *, secret: bool = False):
    """The test config plus variant `keyed`: the fake server with str param `param` (`secret: true` when
    `secret`) passed under an ordinary flag, `--served-model-name {{ param }}`."""
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    base = cfg.variants["base"].model_dump(exclude_unset=True)
    spec = {"type": "str", "default": "none-given", **({"secret": True} if secret else {})}
    keyed = {**base, "port": free_port(), "command": base["command"] + f" --served-model-name {{{{ {param} }}}}",
             "params": {**base["params"], param: spec}}
    return launch_config(ssh_server, fake_gpu, tmp_path, variants={"keyed": keyed})


async def test_a_secret_param_under_an_ordinary_flag_is_masked_everywhere(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "api_key")
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


async def test_the_whole_secret_corpus_in_a_real_log_reaches_no_answer_alert_file_audit_row_or_log_line(
        make_bot, ssh_server, fake_gpu, tmp_path, caplog):
    """Every shape of tests/fixtures/secrets/shapes.yaml written into a real server's log, then an OOM so the
    alert quotes the log; /gpu status, /probe, !logs (attached), the kill preview and the kill: no 8-character
    piece of any secret in any post, block, attached file, audit row or log record of the bot."""
    import yaml

    from tests.support.paths import FIXTURES
    from tests.support.secrets import pieces

    corpus = yaml.safe_load((FIXTURES / "secrets" / "shapes.yaml").read_text(encoding="utf-8"))
    known = [v for e in corpus for v in e.get("known", [])]
    caplog.set_level("DEBUG")
    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "api_key", secret=True)
    # checks every 0.5 s after ready too (FAST_WATCH leaves the serving interval at its 60 s default)
    bot = await make_bot(cfg, watch=True, watch_policy=FAST_WATCH.model_copy(update={"serving_interval_s": 0.5}))
    bot.runtime.redactor.add_values(known[1:])  # the bot knows these (Slack tokens, ${NAME} values, ...)
    launched = await bot.chat.say(f"/launch keyed mode=ready workers=1 api_key={known[0]}")
    assert "Launched keyed#1" in launched.text, launched.text
    la = bot.launch(1)
    await wait_alert(bot, 1, {"ready"})
    with open(la.log_path, "a") as f:
        for e in corpus:
            f.write(e["text"] + "\n")
        f.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    await wait_alert(bot, 1, {"oom"}, timeout=60)
    thread = la.thread_ts
    for text in ("/gpu status", "/probe 1", "!logs 400", "/kill 1"):
        await bot.chat.say(text, thread=thread if text.startswith("!") else None)
    await bot.chat.say("/kill 1 --yes")
    seen = []
    for p in bot.chat.posts:
        seen += [p.text, json.dumps(p.blocks)]
        seen += [data.decode("utf-8", "replace") for _, data in p.files if not data.startswith(b"\x89PNG")]
        seen += [e.text + json.dumps(e.blocks) for e in getattr(p, "edits", [])]
    seen += [json.dumps([e.args, e.detail]) for e in bot.events()]
    seen += [caplog.text]
    blob = "\n".join(seen)
    assert "CUDA out of memory" in blob and any(name.endswith(".log.txt") for p in bot.chat.posts
                                                  for name, _ in p.files)  # the log was read and attached
    leaks = [(e["id"], s) for e in corpus for s in e["secrets"] if any(piece in blob for piece in pieces(s))]
    assert not leaks, leaks[:5]


async def test_a_log_window_that_starts_inside_a_secret_shows_none_of_it(make_bot, ssh_server, fake_gpu, tmp_path):
    """The probe reads the last 256 KiB of a log; when that window starts inside `DB_PASSWORD=...`, the cut line
    (its name gone) is shown as cut, not as a bare value."""
    from bot.core.parse.log import CUT_LINE
    from bot.core.probe import LOG_TAIL_BYTES

    secret = "Wn4dOw5sTa6rTi7nSi8dEx9sEc0rEt1x"
    log = tmp_path / "cut.log"
    head = "DB_PASSWORD="
    # the window (the last LOG_TAIL_BYTES bytes) starts 6 characters into the secret
    tail = "INFO ready\n"
    body = secret + "y" * (LOG_TAIL_BYTES - len(secret) - 1 + 6 - len(tail)) + "\n"
    log.write_text(head + body + tail)
    assert log.stat().st_size - LOG_TAIL_BYTES == len(head) + 6
    bot = await make_bot(launch_config(ssh_server, fake_gpu, tmp_path))
    answer = await bot.chat.say(f"/probe log={log}")
    shown = answer.text + json.dumps(answer.post.blocks)
    assert "INFO ready" in shown, answer.text
    assert CUT_LINE.split(" (")[0] in shown
    assert not [p for p in {secret[i:i + 8] for i in range(len(secret) - 7)} if p in shown]


async def test_a_restarted_bot_still_masks_a_launch_s_secret_and_relaunches_with_it(make_bot, ssh_server, fake_gpu,
                                                                                     tmp_path):
    """The secret param's value is in the database only sealed (bot.adapters.secretbox): after a restart the
    live server's command line and log are still masked by value, and /relaunch passes the real value again."""
    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "key", secret=True)
    first = await make_bot(cfg)
    launched = await first.chat.say(f"/launch keyed mode=ready workers=1 key={SECRET}")
    assert "Launched keyed#1" in launched.text, launched.text
    la = first.launch(1)
    with open(la.log_path, "a") as f:
        f.write(f"serving as {SECRET}\n")
    await first.runtime.close()
    state = tmp_path / "state"
    stored = b"".join(p.read_bytes() for p in state.iterdir() if p.name.startswith("gpubot.db"))
    assert SECRET.encode() not in stored  # only sealed, never in clear

    second = await make_bot(cfg, surface=first.surface)
    shown = []
    for text in ("/gpu status", "/probe 1", "/logs 1"):
        answer = await second.chat.say(text)
        shown += [answer.text, json.dumps(answer.post.blocks)]
    assert not [s for s in shown if SECRET in s], [s for s in shown if SECRET in s][:1]
    assert any("[REDACTED]" in s for s in shown)
    relaunched = await second.chat.say("/relaunch 1")
    assert "Launched keyed#2" in relaunched.text, relaunched.text
    new = second.launch(2)
    await wait_log(new.log_path, "tp_size")  # the server started and logged its args
    with open(f"/proc/{new.pid}/cmdline", "rb") as f:
        assert SECRET.encode() in f.read()  # the real value, not "[REDACTED]" nor the default


async def test_a_secret_param_in_a_denied_misspelled_or_malformed_launch_is_never_recorded(make_bot, ssh_server,
                                                                                          fake_gpu, tmp_path):
    """The value of a `secret: true` param is masked from the moment it is typed, not only once a launch
    starts: a viewer's /launch (denied), a misspelled variant, a bad param and a syntax error."""
    from tests.support.builders import VIEWER

    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "key", secret=True)
    bot = await make_bot(cfg)
    typed = [(f"/launch keyed key={SECRET}", VIEWER), (f"/launch keyedd key={SECRET}", None),
             (f"/launch keyed workers=zero key={SECRET}", None), (f'/launch keyed key={SECRET} "unclosed', None),
             # the grammar lower-cases names; a quoted value with spaces; a no-break space inside a value
             (f"/launch keyed KEY={SECRET}", VIEWER), (f'/launch keyed key="ab {SECRET}"', VIEWER),
             (f"/launch keyed Key=ab\u00a0{SECRET}", VIEWER)]
    answers = [await (bot.chat.say(text, user=user) if user else bot.chat.say(text)) for text, user in typed]
    assert all(a.text for a in answers)
    seen = [a.text + json.dumps(a.post.blocks if a.post else None) for a in answers]
    seen += [json.dumps([e.args, e.detail]) for e in bot.events()]
    assert len(bot.events()) >= len(typed)
    assert not [s for s in seen if SECRET in s], [s for s in seen if SECRET in s][:1]


async def test_a_dashed_secret_param_is_named_in_the_answer_with_its_value_masked(make_bot, ssh_server, fake_gpu,
                                                                                 tmp_path):
    """`--key=V` is not a param (params are `name=value`) and the answer names the word: V is masked, first
    time typed (the bot has not seen it before)."""
    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "key", secret=True)
    bot = await make_bot(cfg)
    answer = await bot.chat.say(f"/launch keyed --key={SECRET}")
    assert "is not a param" in answer.text and SECRET not in answer.text, answer.text
    assert SECRET not in json.dumps(answer.post.blocks if answer.post else None)
    assert not [e for e in bot.events() if SECRET in json.dumps([e.args, e.detail])]


async def test_a_relaunch_whose_secret_cannot_be_restored_is_refused_not_run_with_a_default(make_bot, ssh_server,
                                                                                            fake_gpu, tmp_path):
    """Without its sealed copy (no key, or the key changed) a secret param stored masked is asked for again."""
    cfg = keyed_config(ssh_server, fake_gpu, tmp_path, "key", secret=True)
    bot = await make_bot(cfg)
    assert "Launched keyed#1" in (await bot.chat.say(f"/launch keyed mode=ready workers=1 key={SECRET}")).text
    bot.runtime.store.launches.update(1, sealed_secrets=None)  # as if sealed by a key that is gone
    refused = await bot.chat.say("/relaunch 1")
    assert "cannot be reused" in refused.text and "key=" in refused.text, refused.text
    # the command to type is whole (its closing backquote kept) and holds no masked placeholder
    assert "`/relaunch 1 key=` with the value after the `=`" in refused.text, refused.text
    assert "[REDACTED]" not in refused.text
    assert bot.runtime.store.launches.get(2) is None and bot.launch(1).live  # nothing killed, nothing started
    again = await bot.chat.say(f"/relaunch 1 key={SECRET}")
    assert "Launched keyed#2" in again.text, again.text

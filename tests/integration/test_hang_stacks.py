"""A hang's alert says where each rank waits: the watcher dumps the ranks with py-spy itself (REAL py-spy on REAL
hung processes of the demo server, launched over the loopback SSH server) and puts the cross-rank summary in
the alert, with the full dump attached; without py-spy the alert still comes and says why there are no stacks."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bot.config import WatchPolicy
from tests.support.alerts import alerts, full_text, wait_alert
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import wait_log

pytestmark = pytest.mark.timeout(240)

PY_SPY = Path(sys.executable).parent / "py-spy"


def _py_spy() -> str:
    if shutil.which("py-spy", path=str(PY_SPY.parent)) is None:
        pytest.skip("py-spy is not installed in this environment (pip install py-spy)")
    return str(PY_SPY)


async def _hung(make_bot, cfg, text: str, marker: str, count: int):
    bot = await make_bot(cfg, watch_policy=FAST_WATCH)
    launched = await bot.chat.say(text)
    assert "Launched " in launched.text, launched.text
    await wait_log(bot.launch(1).log_path, marker, count=count)
    await bot.runtime.watcher.start()
    return bot


def _skip_without_ptrace(text: str) -> None:
    if "ptrace" in text and "rank" not in text.split("stacks (py-spy", 1)[-1][:40]:
        pytest.skip("py-spy cannot attach here (ptrace restricted)")


async def test_a_rank_that_skips_all_reduce_is_named_in_the_hang_alert(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": _py_spy()})
    cfg.variants["base"].command += " --hang-in collective"
    bot = await _hung(make_bot, cfg, "/launch base mode=hang workers=3", "Load weight end", 3)
    await wait_alert(bot, 1, {"silent_hang"})
    (alert,) = alerts(bot, "silent_hang")
    text = full_text(alert)
    _skip_without_ptrace(text)
    # the odd rank out, by its rank, while the others wait in the collective
    assert "stacks (py-spy, 3 ranks): rank 2 is in hang_loop" in text, text
    assert "2 ranks (rank 0, rank 1) wait in all_reduce (" in text, text
    assert "Stacks: rank 2 is in hang_loop" in alert.text  # the summary sentence too
    names = [n for n, _ in alert.files]
    assert "base-1-stackdump.txt" in names, names
    dump = dict(alert.files)["base-1-stackdump.txt"].decode()
    assert "all_reduce" in dump and "hang_loop" in dump
    assert "py-spy dump --pid" not in text  # the step "run py-spy by hand" is gone: it was done
    event = bot.events(action="stack_dump")[-1]
    assert event.result == "ok" and event.user_id == "watcher"


async def test_ranks_stuck_in_the_rendezvous_give_comm_init_from_their_stacks(make_bot, ssh_server, fake_gpu,
                                                                             tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": _py_spy()})
    cfg.variants["base"].command += " --hang-in rendezvous"
    bot = await _hung(make_bot, cfg, "/launch base mode=hang workers=2", "Init torch distributed begin.", 2)
    la = await wait_alert(bot, 1, {"silent_hang"})
    (alert,) = alerts(bot, "silent_hang")
    text = full_text(alert)
    _skip_without_ptrace(text)
    assert "base#1 on gpu-host-1: silent_hang in comm_init" in alert.text.splitlines()[0], alert.text
    assert "rank 1 is in hang_loop" in text and "rank 0 waits in _create_c10d_store" in text, text
    assert bot.store.observations.list(la.id)[-1].phase == "comm_init"


async def test_without_py_spy_the_hang_alert_still_comes_and_says_why(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": str(tmp_path / "no-such-py-spy")})
    bot = await _hung(make_bot, cfg, "/launch base mode=hang workers=2", "Load weight end", 2)
    await wait_alert(bot, 1, {"silent_hang"})
    (alert,) = alerts(bot, "silent_hang")
    text = full_text(alert)
    assert "stacks (py-spy): not taken: py-spy is not installed" in text, text
    assert [n for n, _ in alert.files] == ["base-1-evidence.txt", "base-1-timeline.png"]


async def test_stack_dumps_on_hang_can_be_turned_off(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": _py_spy()})
    bot = await make_bot(cfg, watch_policy=FAST_WATCH.model_copy(update={"stack_dump_on_hang": False}))
    await bot.chat.say("/launch base mode=hang workers=2")
    await wait_log(bot.launch(1).log_path, "Load weight end", count=2)
    await bot.runtime.watcher.start()
    await wait_alert(bot, 1, {"silent_hang"})
    (alert,) = alerts(bot, "silent_hang")
    assert "stacks (py-spy" not in full_text(alert)
    assert not bot.events(action="stack_dump")


#: Checks 3 s apart (ps TIME ticks in whole seconds: one spinning rank gains more than a tick between two of them,
#: even on a loaded machine) and 4 s of silence allowed in every step.
BUSY_WATCH = WatchPolicy(interval_s=3.0, silence_after_s=4.0,
                         phase_grace_s={p: 4.0 for p in ("comm_init", "weight_loading", "kv_cache_alloc",
                                                         "cuda_graph_capture", "warmup")})


async def test_a_rank_compiling_silently_past_its_grace_is_progress_not_a_hang(make_bot, ssh_server, fake_gpu,
                                                                               tmp_path):
    # silent for 24 s (six graces) at 100 % of a core in compile_fx_inner, then ready: the watcher's own stack dumps
    # fall in some checks' windows, and the work their stacks showed stands for those checks (the H100 run of issue
    # 44 alerted a hang there)
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": _py_spy()})
    cfg.variants["base"].command += " --busy-in compile --busy-s 24"
    bot = await make_bot(cfg, watch=True, watch_policy=BUSY_WATCH)
    launched = await bot.chat.say("/launch base mode=ready workers=1")
    assert "Launched " in launched.text, launched.text
    la = await wait_alert(bot, 1, {"ready", "silent_hang"}, timeout=150)
    dumps = bot.events(action="stack_dump")
    if dumps and all(e.result != "ok" for e in dumps):
        pytest.skip("py-spy cannot attach here (ptrace restricted)")
    assert la.alert_state == "ready", [p.text for p in alerts(bot)]
    assert not alerts(bot, "silent_hang"), alerts(bot, "silent_hang")[0].text
    verdicts = [r.verdict for r in bot.store.observations.list(1) if r.ok]
    assert "loading" in verdicts and "silent_hang" not in verdicts, verdicts
    assert any(e.user_id == "watcher" and e.result == "ok" for e in dumps), dumps  # its stacks told


async def test_a_rank_busy_waiting_in_synchronize_is_a_hang_although_its_cpu_time_grows(make_bot, ssh_server,
                                                                                      fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": _py_spy()})
    cfg.variants["base"].command += " --busy-in synchronize"
    bot = await make_bot(cfg, watch=True, watch_policy=BUSY_WATCH)
    launched = await bot.chat.say("/launch base mode=ready workers=1")
    assert "Launched " in launched.text, launched.text
    await wait_alert(bot, 1, {"silent_hang"}, timeout=150)
    (alert,) = alerts(bot, "silent_hang")
    text = full_text(alert)
    _skip_without_ptrace(text)
    assert "synchronize (bot/demo/fake_server.py" in text, text
    assert "cuda_graph_capture" in alert.text.splitlines()[0], alert.text

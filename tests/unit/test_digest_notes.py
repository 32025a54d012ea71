"""The fleet digest's notes (bot.core.fleet.digest_notes): idle GPUs held for over an hour, failed launches not cleaned
up, unreachable hosts; and who holds one GPU (bot.present.views.whois_view)."""

from __future__ import annotations

from bot.core.fleet import digest_notes
from bot.core.lifecycle import Holder
from bot.core.models import GpuProcess, GpuReading, GpuSection, HostFailure, LaunchState, ProcessInfo, Snapshot
from bot.present.views import whois_view
from bot.services.holders import GpuWhois
from tests.support.builders import launch_row
from tests.support.names import renderer


def _holder(pid: int, gpu: int, owner: str = "foreign", **kw) -> Holder:
    return Holder(pid=pid, gpu_index=gpu, mib=70000.0, command="python serve.py", state="S", owner=owner, **kw)


def _snap(host: str, gpus: list[tuple[int, float, float]], holders: list[tuple[int, int]],
          ages: dict[int, int]) -> Snapshot:
    snap = Snapshot(host=host)
    snap.gpu = GpuSection(ok=True, gpus=[GpuReading(index=i, memory_used_mib=m, utilization_gpu_pct=u)
                                         for i, m, u in gpus],
                          processes=[GpuProcess(pid=p, gpu_index=g, used_memory_mib=70000) for p, g in holders])
    snap.table = [ProcessInfo(pid=p, elapsed_s=a, args="python serve.py") for p, a in ages.items()]
    return snap


def test_idle_gpus_held_over_an_hour_are_listed_with_their_holders_and_busy_or_young_ones_are_not():
    snap = _snap("gpu-01", [(0, 70000, 0), (1, 70000, 0), (2, 70000, 35), (3, 70000, 0), (4, 10, 0)],
                 [(10, 0), (10, 1), (11, 2), (12, 3)], {10: 5 * 3600, 11: 9 * 3600, 12: 600})
    holders = [_holder(10, 0, "base#3", launch_id=3, launched_by="U1"), _holder(10, 1, "base#3", launch_id=3,
               launched_by="U1"), _holder(11, 2, user="bob"), _holder(12, 3, user="eve")]
    notes = digest_notes([snap], {"gpu-01": holders}, [], now=10_000.0, gpu_free_mib=1024)
    assert notes.idle == ["gpu-01 GPUs 0,1: 137 GiB held for 5 h+ at 0% util now, by base#3 by U1"]
    assert notes.uncleaned == [] and notes.unreachable == []


def test_failed_launches_left_standing_and_unreachable_hosts():
    hung = launch_row(id=4, host="gpu-01", alert_state="silent_hang")
    ready = launch_row(id=5, host="gpu-01", alert_state="ready")
    stuck = launch_row(id=6, host="gpu-01", state=LaunchState.KILL_FAILED)
    failed = launch_row(id=7, host="gpu-01", state=LaunchState.FAILED, ended_at=10_000.0 - 7200, tag="7-x")
    gone = launch_row(id=8, host="gpu-01", state=LaunchState.FAILED, ended_at=9000.0)  # nothing left: cleaned
    snap = _snap("gpu-01", [(0, 70000, 0)], [(20, 0)], {20: 60})
    down = HostFailure(host="gpu-02", reason="connection\nrefused")
    orphan = _holder(20, 0, "orphan of base#7", launch_id=7, launched_by="U1", orphan=True)
    notes = digest_notes([snap, down], {"gpu-01": [orphan]}, [hung, ready, stuck, failed, gone],
                         now=10_000.0, gpu_free_mib=1024)
    assert len(notes.uncleaned) == 3, notes.uncleaned
    assert notes.uncleaned[0].startswith("base#4 on gpu-01: silent_hang at its last check, still live: `")
    assert notes.uncleaned[1].startswith("base#6 on gpu-01: the kill did not finish: `")
    assert notes.uncleaned[2].startswith("base#7 on gpu-01: failed 2 h ago; its processes still hold GPU 0: `")
    assert notes.unreachable == ["gpu-02: connection refused"]


def test_whois_names_the_launcher_or_the_foreign_user_and_says_when_it_is_free():
    la = launch_row(id=3, host="gpu-01", gpus=[1], created_by="U0ALICE")
    holders = [Holder(pid=10, gpu_index=1, mib=8192.0, command="/usr/bin/python3 serve.py", state="S",
                      owner="base#3", launch_id=3, launched_by="U0ALICE"),
               Holder(pid=11, gpu_index=1, mib=1024.0, command="python train.py --token=hf_abcdefghijklmnopqrstuvwx",
                      state="S", owner="foreign", user="<!channel>")]
    view = whois_view(GpuWhois(host="gpu-01", index=1, gpu=GpuReading(index=1, name="NVIDIA H200",
                                                                       memory_used_mib=9216, memory_total_mib=143771),
                               holders=holders, elapsed_s={10: 7200}, launches={3: la}, claims=[la]))
    assert view["status"] == "H200, 9.0 / 140 GiB used" and not view["free"] and view["claims"] == []
    assert view["holders"][0]["who"] == "*base#3*, launched by <@U0ALICE>" and view["holders"][0]["age"] == "2h00m"
    text = renderer().text("whois", **view)
    assert "Free it with /kill 3 or /kill pid=11 host=gpu-01" in text, text
    foreign = view["holders"][1]
    assert foreign["who"].startswith("[foreign] user *") and "<!channel>" not in foreign["who"]
    assert "hf_abcdefghijklmnop" not in foreign["command"]
    idle = whois_view(GpuWhois(host="gpu-01", index=2, gpu=GpuReading(index=2, memory_used_mib=3), gpus=[0, 1, 2]))
    assert idle["free"] and idle["holders"] == []
    none = whois_view(GpuWhois(host="gpu-01", index=9, gpus=[0, 1]))
    assert none["status"] == "gpu-01 has no GPU 9 (its GPUs: 0, 1)" and not none["free"]

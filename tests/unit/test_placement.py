"""Placement of a launch on a host group (bot.core.placement, bot.config.variants.placement_plan): best fit order,
the GPUs taken, what a variant must say to be placed, and the line that says where it went and why."""

from __future__ import annotations

import pytest

from bot.config import ConfigError, parse_config, placement_plan, render_launch
from bot.core.fleet import HostLine
from bot.core.lifecycle import LaunchError
from bot.core.placement import PlacementNote, PlacementPlan, order_hosts, pick_gpus

KH = "/etc/gpubot/known_hosts"


def _line(name: str, free: tuple[int, ...], gpus: int = 8, util: float | None = 0.0, **kw) -> HostLine:
    return HostLine(name=name, gpus=gpus, free=free, util_pct=util, **kw)


def test_best_fit_first_then_the_least_busy_and_every_host_passed_over_says_why():
    plan = PlacementPlan(hosts=("a", "b", "c", "d", "e"), count=2, group="h200")
    lines = [_line("a", (0, 1, 2, 3)), _line("b", (5, 6), util=50.0), _line("c", (6, 7), util=10.0),
             _line("d", (7,)), HostLine(name="e", failed=True, reason="connection refused")]
    order, skipped = order_hosts(lines, plan)
    assert order == ["c", "b", "a"]  # two free (least busy first), then four
    assert skipped == {"d": "too few free GPUs: 1 of 8 free", "e": "down: connection refused"}
    fixed = PlacementPlan(hosts=("a", "b"), count=2, gpus=(2, 3), group="h200")
    assert order_hosts([_line("a", (0, 1, 2, 3)), _line("b", (3, 4))], fixed) == (
        ["a"], {"b": "GPUs taken: 2 not free"})


def test_the_gpus_taken_fixed_preferred_or_the_lowest_free():
    assert pick_gpus((5, 1, 3), PlacementPlan(hosts=("a",), count=2)) == (1, 3)
    assert pick_gpus((1,), PlacementPlan(hosts=("a",), count=2)) is None
    assert pick_gpus((0, 4, 5), PlacementPlan(hosts=("a",), count=2, prefer=(5, 4))) == (4, 5)
    assert pick_gpus((0, 4), PlacementPlan(hosts=("a",), count=2, prefer=(4, 5))) == (0, 4)  # 5 taken meanwhile
    assert pick_gpus((0, 1, 2), PlacementPlan(hosts=("a",), count=2, gpus=(2, 1))) == (2, 1)
    assert pick_gpus((0, 1), PlacementPlan(hosts=("a",), count=2, gpus=(1, 2))) is None


def test_the_line_says_where_and_why():
    plan = PlacementPlan(hosts=tuple("abcdef"), count=2, group="h200")
    note = PlacementNote(host="c", gpus=(6, 7), free_there=2, plan=plan, fitting=3,
                         skipped={"d": "too few free GPUs: 1 of 8 free", "e": "down: refused", "f": "down: timeout"})
    assert note.describe() == ("Placed on c, GPUs 6,7: best fit in group h200 (c had 2 free GPUs, the fewest of the 3 "
                               "hosts with room); passed over: 2 down (e, f), 1 too few free GPUs")
    one = PlacementNote(host="a", gpus=(3,), free_there=1, plan=PlacementPlan(hosts=("a",), count=1))
    assert one.describe() == "Placed on a, GPU 3 (1 free GPU there)"


def _config(**variant):
    return parse_config({
        "host_groups": {"h200": {"user": "u", "known_hosts": KH, "address": "{name}.internal"}},
        "hosts": {"gpu-[1-3]": {"group": "h200"}, "solo": {"address": "10.0.0.9", "known_hosts": KH}},
        "variants": {"svc": {"host": "group:h200", "gpu_count": 2, "command": "serve --gpus {{ gpus }}",
                             **variant}},
    })


def test_a_group_variant_is_planned_over_its_hosts_and_rendered_with_the_gpus_picked():
    cfg = _config()
    plan = placement_plan(cfg, "svc")
    assert plan == PlacementPlan(hosts=("gpu-1", "gpu-2", "gpu-3"), count=2, group="h200")
    assert placement_plan(cfg, "svc", "gpu-2", (4, 5)) == PlacementPlan(hosts=("gpu-2",), count=2, prefer=(4, 5))
    with pytest.raises(LaunchError, match="solo is not in group h200"):
        placement_plan(cfg, "svc", "solo")
    with pytest.raises(LaunchError, match="unknown host"):
        placement_plan(cfg, "svc", "gpu-9")
    r = render_launch(cfg, "svc", {}, launch_id=3, host="gpu-2", gpus=(4, 5))
    assert r.command == "serve --gpus 4,5" and r.env["CUDA_VISIBLE_DEVICES"] == "4,5" and r.gpus == [4, 5]
    with pytest.raises(LaunchError, match="the host is picked when it launches"):
        render_launch(cfg, "svc", {}, launch_id=3)
    fixed = parse_config({"hosts": {"solo": {"address": "10.0.0.9", "known_hosts": KH}},
                          "variants": {"one": {"host": "solo", "gpu_count": 1, "command": "serve"},
                                       "pinned": {"host": "solo", "gpus": [0], "command": "serve"}}})
    assert placement_plan(fixed, "one") == PlacementPlan(hosts=("solo",), count=1)
    assert placement_plan(fixed, "pinned") is None


@pytest.mark.parametrize(("variant", "message"), [
    ({"host": "group:nope"}, "no host is in group 'nope'; groups with hosts: h200"),
    ({"gpu_count": None}, "gpu_count: required when the variant is placed on a host group"),
    ({"gpus": [0, 1]}, "give fixed `gpus:` or a `gpu_count` to pick, not both"),
    ({"gpu_count": 0}, "gpu_count"),
])
def test_what_a_placed_variant_must_say(variant, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("`", ".")):
        _config(**variant)


def test_a_launch_of_a_variant_named_foreign_is_ours_in_the_fleet_line():
    from bot.core.fleet import host_line
    from bot.core.models import GpuProcess, GpuReading, GpuSection, Snapshot

    snap = Snapshot(host="h")
    snap.gpu = GpuSection(ok=True, gpus=[GpuReading(index=0, memory_used_mib=9000)],
                          processes=[GpuProcess(pid=100, gpu_index=0), GpuProcess(pid=101, gpu_index=0),
                                     GpuProcess(pid=102, gpu_index=0)])
    from bot.core.lifecycle import Holder

    def holder(pid: int, **kw) -> Holder:
        return Holder(pid=pid, gpu_index=0, mib=3000.0, command="x", state="S", **kw)

    line = host_line(snap, [], [holder(100, owner="foreign#3", launch_id=3, launched_by="U0ALICE"),
                                holder(101, owner="foreign", user="bob"), holder(102, owner="foreign")], 1024.0)
    assert line.foreign == 2 and line.foreign_users == ("bob",)


def test_a_group_name_written_as_a_host_gets_the_prefix_it_needs():
    with pytest.raises(ConfigError, match="'h200' is a host group, not a host; write `host: group:h200`"):
        _config(host="h200")

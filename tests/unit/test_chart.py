"""bot.present.chart: the launch timeline PNG (GPU memory, GPU utilization, log lines against time)."""

from __future__ import annotations

import io
import math
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.image import imread

import bot.present.chart
from bot.core.models import Launch, LaunchState
from bot.core.records import CheckRecord
from bot.present.chart import MAX_PLOTTED_POINTS, ChartPoint, launch_timeline_png, timeline_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _shape(png: bytes) -> tuple[int, int]:
    """(height, width) in pixels of a PNG, decoded for real."""
    assert png.startswith(PNG_SIGNATURE)
    img = imread(io.BytesIO(png), format="png")
    return img.shape[0], img.shape[1]


def _launch(n: int, gpus: int = 2, dt: float = 0.5) -> list[ChartPoint]:
    pts = []
    for i in range(n):
        t = i * dt
        mem = {g: 500.0 + min(i, n // 2) * 100.0 + g for g in range(gpus)}
        util = {g: (i * 7 + g * 13) % 100 for g in range(gpus)}
        pts.append(ChartPoint(t_s=t, gpu_mem_mib=mem, gpu_util_pct=util, log_lines=10 + 3 * i))
    return pts


def test_no_points_is_a_small_png():
    png = timeline_png([], title="launch 3")
    h, w = _shape(png)
    assert (h, w) == (100, 400)


def test_no_points_even_with_phases():
    assert _shape(timeline_png([], title="x", phases=[(0.0, "start")])) == (100, 400)


def test_points_with_non_finite_times_only_count_as_no_points():
    pts = [ChartPoint(math.nan, {0: 1.0}, {0: 1.0}, 1), ChartPoint(math.inf, {}, {}, None)]
    assert _shape(timeline_png(pts, title="x")) == (100, 400)


def test_one_point():
    png = timeline_png([ChartPoint(3.0, {0: 5000.0}, {0: 12.0}, 40)], title="one")
    assert _shape(png) == (700, 1000)


def test_one_point_at_zero_with_phase_at_zero():
    png = timeline_png([ChartPoint(0.0, {0: 0.0}, {0: 0.0}, 0)], title="zero", phases=[(0.0, "start")])
    assert _shape(png) == (700, 1000)


def test_many_points_eight_gpus_phases_and_verdicts():
    png = timeline_png(
        _launch(600, gpus=8),
        title="launch 17 - sglang tp=8",
        phases=[(0.0, "start"), (40.0, "load_weights"), (120.0, "ready")],
        verdicts=[(60.0, "slow_load"), (130.0, "healthy")],
    )
    assert _shape(png) == (700, 1000)


def test_points_out_of_order_and_repeated_times():
    pts = _launch(50)
    pts = pts[::-1] + pts[:5]
    assert _shape(timeline_png(pts, title="shuffled")) == (700, 1000)


def test_none_values_are_gaps_and_do_not_raise():
    pts = [
        ChartPoint(0.0, {0: None, 1: 100.0}, {0: None, 1: None}, None),
        ChartPoint(1.0, {0: 2000.0, 1: None}, {0: 50.0}, 10),
        ChartPoint(2.0, {0: None}, {0: None, 1: 30.0}, None),
        ChartPoint(3.0, {0: math.nan, 1: math.inf}, {0: -math.inf}, 12),
        ChartPoint(4.0, {}, {}, None),
    ]
    assert _shape(timeline_png(pts, title="gaps")) == (700, 1000)


def test_all_values_missing():
    pts = [ChartPoint(float(i), {0: None}, {0: None}, None) for i in range(5)]
    assert _shape(timeline_png(pts, title="nothing read")) == (700, 1000)


def test_no_gpus_only_log_lines():
    pts = [ChartPoint(float(i), {}, {}, i * 10) for i in range(20)]
    assert _shape(timeline_png(pts, title="no gpus")) == (700, 1000)


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")
def test_labels_with_mathtext_and_odd_text_do_not_raise():
    pts = _launch(10)
    png = timeline_png(
        pts,
        title="cost $5 and $\\frac{ {_^ " + "x" * 500,
        phases=[(1.0, "$bad$ math $"), (2.0, "line\nbreak\ttab"), (3.0, "é 漢字 " * 20), (math.nan, "dropped")],
        verdicts=[(4.0, "$\\undefined{"), (math.inf, "dropped")],
    )
    assert _shape(png) == (700, 1000)


def test_phases_outside_the_points_widen_the_axis_without_error():
    pts = _launch(10)
    png = timeline_png(pts, title="x", phases=[(-30.0, "before"), (500.0, "after")])
    assert _shape(png) == (700, 1000)


def test_ten_thousand_points_eight_gpus_draw_at_most_max_plotted_points(monkeypatch):
    # What keeps a long launch's chart cheap is that matplotlib never sees more than MAX_PLOTTED_POINTS
    # points per line (and no per-point markers); checked on the figure itself, not with a clock.
    figures = []
    real_png = bot.present.chart._png
    monkeypatch.setattr(bot.present.chart, "_png", lambda fig: figures.append(fig) or real_png(fig))
    pts = _launch(10_000, gpus=8, dt=0.1)
    png = timeline_png(pts, title="big", phases=[(0.0, "start"), (300.0, "ready")], verdicts=[(200.0, "slow")])
    assert _shape(png) == (700, 1000)
    (fig,) = figures
    ax_mem, ax_util, ax_log = fig.axes[:3]
    data = {ax: [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2] for ax in (ax_mem, ax_util, ax_log)}
    assert [len(data[ax]) for ax in (ax_mem, ax_util, ax_log)] == [8, 8, 1]  # a line per GPU, one for the log
    for lines in data.values():
        for line in lines:
            assert len(line.get_xdata()) == MAX_PLOTTED_POINTS
            assert line.get_marker() in (None, "None", "")
    # the peaks survive the reduction: the last memory value and the last log count
    assert max(np.nanmax(ln.get_ydata()) for ln in data[ax_mem]) == pytest.approx((500.0 + 5000 * 100.0 + 7) / 1024)
    assert np.nanmax(data[ax_log][0].get_ydata()) == 10 + 3 * 9_999
    assert data[ax_log][0].get_xdata()[-1] <= 999.9


def test_downsampling_keeps_peaks_and_whole_gaps():
    from bot.present.chart import _bucket_starts, _downsample

    n = MAX_PLOTTED_POINTS * 10
    values = np.zeros(n)
    values[1234] = 99.0
    values[5000:6000] = np.nan
    starts = _bucket_starts(n, MAX_PLOTTED_POINTS)
    out = _downsample(values, starts)
    assert len(out) == MAX_PLOTTED_POINTS
    assert np.nanmax(out) == 99.0
    assert np.isnan(out).sum() >= 90  # the 1000-point gap is ~100 buckets wide, minus the two edge buckets


def test_concurrent_renders_from_threads():
    results: list[bytes] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            results.append(timeline_png(_launch(50 + k), title=f"thread {k}", phases=[(1.0, "p")]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(results) == 4
    assert all(_shape(png) == (700, 1000) for png in results)


def test_no_pyplot_figures_leak():
    import sys

    timeline_png(_launch(5), title="x")
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:  # someone else imported pyplot; we must not have registered figures with it
        assert plt.get_fignums() == []


_value = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=200_000),
)
_point = st.builds(
    ChartPoint,
    t_s=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-10, max_value=1e5)),
    gpu_mem_mib=st.dictionaries(st.integers(0, 9), _value, max_size=9),
    gpu_util_pct=st.dictionaries(st.integers(0, 9), _value, max_size=9),
    log_lines=st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40)),
)
_mark = st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")
@pytest.mark.timeout(300)
@settings(max_examples=max(12, int(os.environ.get("GPUBOT_FUZZ_EXAMPLES", "12")) // 20), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    points=st.lists(_point, max_size=40),
    title=st.text(max_size=80),
    phases=st.lists(_mark, max_size=5),
    verdicts=st.lists(_mark, max_size=3),
)
def test_random_points_never_raise(points, title, phases, verdicts):
    png = timeline_png(points, title=title, phases=phases, verdicts=verdicts)
    assert png.startswith(PNG_SIGNATURE)
    assert _shape(png) in {(700, 1000), (100, 400)}


@pytest.mark.parametrize("value", [1e300, -1e300, 1e-300, 5e15])
def test_extreme_values_do_not_raise(value):
    pts = [ChartPoint(value, {0: value}, {0: value}, 1), ChartPoint(0.0, {0: value}, {0: 0.0}, 2)]
    assert _shape(timeline_png(pts, title="extreme", phases=[(value, "p")])) in {(700, 1000)}


# --- launch_timeline_png: a launch and its observation records -------------------------------------


def _la(**overrides) -> Launch:
    fields = dict(id=12, host="gpu-host-1", variant="base", params={}, command="serve", log_path=None, port=None,
                  gpus=[0, 1], pid=None, pgid=None, sid=None, state=LaunchState.RUNNING, state_detail=None,
                  created_by="U1", created_at=1_000.0, ended_at=None, channel=None, thread_ts=None)
    fields.update(overrides)
    return Launch(**fields)


def test_launch_timeline_turns_records_into_points_phases_and_verdict_changes(monkeypatch):
    calls = []
    monkeypatch.setattr(bot.present.chart, "timeline_png", lambda points, **kw: calls.append((points, kw)) or b"png")
    records = [
        {"t": 1_000.0, "gpu_mem_mib": {"0": 100.0, "1": 200.0}, "gpu_util_pct": {"0": 0.0}, "log_lines": 1,
         "phase": "start", "verdict": "starting"},
        {"t": 1_010.0, "error": "ssh: timed out"},  # a failed observation is not a point
        {"t": "later", "gpu_mem_mib": {"0": 1.0}},  # nor is one without a time
        {"t": 1_020.0, "gpu_mem_mib": {"0": 5_000.0}, "log_lines": 40, "phase": "start", "verdict": "starting"},
        {"t": 1_030.0, "gpu_util_pct": {"1": 90.0}, "phase": "weight_loading", "verdict": "silent_hang"},
        {"t": 995.0, "phase": "weight_loading", "verdict": "starting"},  # before the launch: clamped to 0
    ]
    typed = [r for r in map(CheckRecord.from_json, records) if r is not None]
    assert len(typed) == 5, "the record without a time does not read as one"
    assert launch_timeline_png(_la(), typed) == b"png"
    ((points, kw),) = calls
    assert points == [
        ChartPoint(0.0, {0: 100.0, 1: 200.0}, {0: 0.0}, 1),
        ChartPoint(20.0, {0: 5_000.0}, {}, 40),
        ChartPoint(30.0, {}, {1: 90.0}, None),
        ChartPoint(0.0, {}, {}, None),
    ]
    assert kw == {"title": "base#12 on gpu-host-1", "phases": [(0.0, "start"), (30.0, "weight_loading")],
                  "verdicts": [(0.0, "starting"), (30.0, "silent_hang"), (0.0, "starting")]}


def test_launch_timeline_is_a_png():
    records = [{"t": 1_000.0 + i, "gpu_mem_mib": {"0": 100.0 * i}, "gpu_util_pct": {"0": 50.0}, "log_lines": i}
               for i in range(20)]
    assert _shape(launch_timeline_png(_la(), [CheckRecord.from_json(r) for r in records])) == (700, 1000)
    assert _shape(launch_timeline_png(_la(), [])) == (100, 400)  # no observations yet

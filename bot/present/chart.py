"""PNG timeline of one launch's life: GPU memory, GPU utilization and log growth against time.

`timeline_png` draws three stacked panels that share the x axis (seconds since the launch started):

1. GPU memory used per GPU, in GiB (the samples are in MiB, as `nvidia-smi` reports them),
2. GPU utilization per GPU, in percent (0-100),
3. log lines written so far (a cumulative count),

plus a dashed vertical line with a label at each phase change and a marker at each verdict change.

Only the object-oriented matplotlib API is used (`matplotlib.figure.Figure` drawn by its own
`FigureCanvasAgg`), never `pyplot`: no global backend is selected, no global `rcParams` are changed and
no figure is registered anywhere, so nothing leaks and callers in different threads do not share a
figure. Callers still run one render at a time (bot.adapters.cpu.CpuPool does), because matplotlib does not
promise that its text and font caches are safe to use from several threads at once.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from bot.core.models import Launch
from bot.core.records import CheckRecord
from bot.core.redact import redact as redact_text

__all__ = ["MAX_PLOTTED_POINTS", "ChartPoint", "draw_timeline", "launch_timeline_png", "timeline_inputs",
           "timeline_png"]

#: Width and height of the timeline PNG in inches; at `DPI` that is 1000 x 700 pixels.
FIGSIZE_IN = (10.0, 7.0)
#: Width and height of the "no observations yet" PNG in inches; at `DPI` that is 400 x 100 pixels.
EMPTY_FIGSIZE_IN = (4.0, 1.0)
#: Dots per inch of every PNG.
DPI = 100
#: More points than this are reduced to this many time buckets before drawing (see `_downsample`).
MAX_PLOTTED_POINTS = 1500
#: Up to this many plotted points, every sample also gets a dot (a lone sample is otherwise invisible).
_MARKER_MAX_POINTS = 120
#: Phase and verdict labels are cut to this many characters.
_LABEL_MAX_CHARS = 32
_MIB_PER_GIB = 1024.0
#: A time or value whose magnitude is above this is nonsense (1e12 MiB is an exabyte, 1e12 s is 30 000
#: years) and is treated as missing: matplotlib's tickers and transforms overflow on such numbers.
_MAX_ABS = 1e12
#: A magnitude below this is drawn as 0 (denormal-sized spans also break matplotlib's tickers).
_MIN_ABS = 1e-9
_PHASE_COLOR = "0.35"
_VERDICT_COLOR = "#c0392b"
#: Above the grid (1.5) and below the data lines (2), so phase and verdict lines show but never hide data.
_MARK_ZORDER = 1.8
#: Half-transparent white under labels, so a label stays readable where it crosses a data line.
_LABEL_BOX = MappingProxyType({"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1.0})

@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One observation of a launch.

    t_s: seconds since the launch started (float; need not be an integer, may repeat).
    gpu_mem_mib: GPU index -> memory used on that GPU in MiB, or None when it was not read.
    gpu_util_pct: GPU index -> utilization of that GPU in percent (0-100), or None when not read.
    log_lines: lines in the server log so far (a cumulative count), or None when the log was not read.

    A None value is drawn as a gap in that line, never as a zero; so is NaN, inf, or a magnitude above
    1e12 (nonsense that would overflow matplotlib). A point whose t_s is one of those is dropped.
    """

    t_s: float
    gpu_mem_mib: dict[int, float | None] = field(default_factory=dict)
    gpu_util_pct: dict[int, float | None] = field(default_factory=dict)
    log_lines: int | None = None


def timeline_png(
    points: Sequence[ChartPoint],
    *,
    title: str,
    phases: Sequence[tuple[float, str]] = (),
    verdicts: Sequence[tuple[float, str]] = (),
) -> bytes:
    """Render a launch's timeline as PNG bytes (1000 x 700 px at 100 dpi).

    points: observations in any order; they are sorted by `t_s`, and points whose `t_s` is not finite
        are dropped. More than `MAX_PLOTTED_POINTS` points are reduced to that many time buckets, each
        keeping the largest value of every series, so peaks and wholly missing stretches survive.
    title: drawn above the panels.
    phases: (t_s, phase name) pairs, t_s in seconds since launch: a grey dashed vertical line across
        all panels, labelled in the top panel.
    verdicts: (t_s, new verdict) pairs, t_s in seconds since launch, one per verdict change: a red
        dotted line across all panels with a red triangle marker and the verdict's label in the log panel.

    With no usable points the result is a small (400 x 100 px) PNG saying "no observations yet".
    The x axis covers the points and every phase and verdict, so no label falls outside it.
    """
    timed = sorted(((t, p) for p in points if (t := _number(p.t_s)) is not None), key=lambda tp: tp[0])
    if not timed:
        return _empty_png(title)
    return _timeline_png(timed, title=title, phases=_marks(phases), verdicts=_marks(verdicts))


def _timeline_png(
    timed: list[tuple[float, ChartPoint]],
    *,
    title: str,
    phases: list[tuple[float, str]],
    verdicts: list[tuple[float, str]],
) -> bytes:
    t = np.array([t for t, _ in timed], dtype=float)
    pts = [p for _, p in timed]
    gpus = sorted({int(i) for p in pts for d in (p.gpu_mem_mib, p.gpu_util_pct) for i in d})
    mem_gib = {g: _series(pts, lambda p, g=g: p.gpu_mem_mib.get(g)) / _MIB_PER_GIB for g in gpus}
    util = {g: _series(pts, lambda p, g=g: p.gpu_util_pct.get(g)) for g in gpus}
    logs = _series(pts, lambda p: p.log_lines)

    if len(t) > MAX_PLOTTED_POINTS:
        starts = _bucket_starts(len(t), MAX_PLOTTED_POINTS)
        t = t[starts]
        mem_gib = {g: _downsample(v, starts) for g, v in mem_gib.items()}
        util = {g: _downsample(v, starts) for g, v in util.items()}
        logs = _downsample(logs, starts)

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax_mem, ax_util, ax_log = fig.subplots(3, 1, sharex=True, height_ratios=(3, 3, 2))
    fig.suptitle(_cut(title, 110), fontsize=12, parse_math=False)

    marker = "o" if len(t) <= _MARKER_MAX_POINTS else None
    colors = [f"C{i % 10}" for i in range(len(gpus))]
    for g, color in zip(gpus, colors, strict=True):
        ax_mem.plot(t, mem_gib[g], color=color, lw=1.3, marker=marker, ms=3, label=f"GPU {g}")
        ax_util.plot(t, util[g], color=color, lw=1.1, marker=marker, ms=3, label=f"GPU {g}")
    ax_log.plot(t, logs, color="C7", lw=1.4, marker=marker, ms=3, drawstyle="steps-post")

    ax_mem.set_ylabel("GPU memory used\n(GiB)")
    ax_util.set_ylabel("GPU utilization\n(%)")
    ax_log.set_ylabel("log lines\n(cumulative)")
    ax_log.set_xlabel("seconds since launch")
    ax_log.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax, values in ((ax_mem, mem_gib.values()), (ax_util, util.values()), (ax_log, [logs])):
        ax.grid(True, color="0.9", lw=0.8)
        _set_ylim(ax, list(values), top=100.0 if ax is ax_util else 1.0)
    if gpus:
        ax_mem.legend(
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            ncol=1 if len(gpus) <= 8 else 2,
            frameon=False,
            borderaxespad=0.0,
        )

    xs = [*t.tolist(), *(x for x, _ in phases), *(x for x, _ in verdicts)]
    lo, hi = min(xs), max(xs)
    pad = max((hi - lo) * 0.02, 0.5)
    ax_log.set_xlim(lo - pad, hi + pad)

    for x, name in phases:
        for ax in (ax_mem, ax_util, ax_log):
            ax.axvline(x, color=_PHASE_COLOR, ls="--", lw=1.0, zorder=_MARK_ZORDER)
        ax_mem.text(
            x, 0.98, name, transform=ax_mem.get_xaxis_transform(), rotation=90, ha="left", va="top",
            fontsize=8, color=_PHASE_COLOR, clip_on=True, parse_math=False, bbox=_LABEL_BOX, zorder=4,
        )  # fmt: skip
    for x, verdict in verdicts:
        for ax in (ax_mem, ax_util, ax_log):
            ax.axvline(x, color=_VERDICT_COLOR, ls=":", lw=1.2, zorder=_MARK_ZORDER)
        ax_log.plot([x], [1.0], marker="v", ms=9, color=_VERDICT_COLOR, transform=ax_log.get_xaxis_transform(),
                    clip_on=False, zorder=5)  # fmt: skip
        ax_log.text(
            x, 0.04, verdict, transform=ax_log.get_xaxis_transform(), rotation=90, ha="left", va="bottom",
            fontsize=8, color=_VERDICT_COLOR, fontweight="bold", clip_on=True, parse_math=False, bbox=_LABEL_BOX,
            zorder=4,
        )  # fmt: skip

    return _png(fig)


def _empty_png(title: str) -> bytes:
    """A 400 x 100 px PNG with the title and "no observations yet"."""
    fig = Figure(figsize=EMPTY_FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    fig.text(0.5, 0.68, _cut(title, 60), ha="center", va="center", fontsize=10, parse_math=False)
    fig.text(0.5, 0.32, "no observations yet", ha="center", va="center", fontsize=10, color="0.4", style="italic")
    return _png(fig)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _number(x: object) -> float | None:
    """`x` as a float fit to plot, or None (missing): None, NaN, inf, non-numbers and |x| > 1e12 are missing."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(v) or abs(v) > _MAX_ABS:
        return None
    return 0.0 if abs(v) < _MIN_ABS else v


def _series(pts: list[ChartPoint], get) -> np.ndarray:
    """One float per point; a missing value (see `_number`) becomes NaN, which matplotlib draws as a gap."""
    out = np.full(len(pts), np.nan)
    for i, p in enumerate(pts):
        v = _number(get(p))
        if v is not None:
            out[i] = v
    return out


def _bucket_starts(n: int, buckets: int) -> np.ndarray:
    """First index of each of `buckets` consecutive, nearly equal index ranges of 0..n-1."""
    return np.unique(np.linspace(0, n, buckets, endpoint=False).astype(np.intp))


def _downsample(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Largest value per bucket; NaN only where the whole bucket is NaN, so long gaps stay gaps."""
    return np.fmax.reduceat(values, starts)


def _set_ylim(ax, values: list[np.ndarray], *, top: float) -> None:
    """Fix the y range to cover 0, `top` (data units) and all data with 5% headroom; "no data" if all are gaps.

    Limits are always set explicitly, never autoscaled, so odd data cannot give matplotlib a degenerate range.
    """
    finite = [v[np.isfinite(v)] for v in values]
    finite = [v for v in finite if v.size]
    if not finite:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5", fontsize=9)
        ax.set_ylim(0.0, top)
        return
    lo = min(0.0, *(float(v.min()) for v in finite))
    hi = max(top, *(float(v.max()) for v in finite))
    span = hi - lo
    ax.set_ylim(lo - (span * 0.05 if lo < 0.0 else 0.0), hi + (span * 0.05 if hi > top else 0.0))


def _marks(marks: Sequence[tuple[float, str]]) -> list[tuple[float, str]]:
    """Finite (t_s, label) pairs with labels cut to a readable length."""
    return [(x, _cut(str(label), _LABEL_MAX_CHARS)) for t, label in marks if (x := _number(t)) is not None]


def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def timeline_inputs(la: Launch, records: Sequence[CheckRecord],
                    redact: Callable[[str], str] = redact_text) -> dict[str, Any]:
    """What `timeline_png` draws for a launch (its keyword arguments): per-GPU memory and utilization and log lines
    over the launch's life from its check `records`, with phase starts and verdict changes marked. Every label
    (title, phase and verdict names) passes through `redact` first (the bot's Redactor; default: the built-in
    rules). Cheap and picklable, so the drawing can happen in another process."""
    points, phases, verdicts = [], [], []
    seen_phases: set[str] = set()
    last_verdict = None
    for rec in records:
        if not rec.ok:
            continue
        rel = max(0.0, rec.t - la.created_at)
        points.append(ChartPoint(
            t_s=rel,
            gpu_mem_mib={int(k): v for k, v in rec.gpu_mem_mib.items() if k.isascii() and k.isdigit()},
            gpu_util_pct={int(k): v for k, v in rec.gpu_util_pct.items() if k.isascii() and k.isdigit()},
            log_lines=rec.log_lines,
        ))
        ph = rec.phase
        if ph and ph not in seen_phases:
            seen_phases.add(ph)
            phases.append((rel, redact(ph)))
        if rec.verdict and rec.verdict != last_verdict:
            last_verdict = rec.verdict
            verdicts.append((rel, redact(last_verdict)))
    return {"points": points, "title": redact(f"{la.name} on {la.host}"), "phases": phases, "verdicts": verdicts}


def draw_timeline(inputs: dict[str, Any]) -> bytes:
    """`timeline_png(**inputs)`: the PNG bytes (a module-level function of one picklable argument, for a process
    pool)."""
    return timeline_png(**inputs)


def launch_timeline_png(la: Launch, records: Sequence[CheckRecord],
                        redact: Callable[[str], str] = redact_text) -> bytes:
    """The launch's timeline (see `timeline_inputs`), drawn here. Returns PNG bytes."""
    return draw_timeline(timeline_inputs(la, records, redact))

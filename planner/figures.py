"""Interactive figures as SVG: the charts of the explorer page (``planner serve``), which a
notebook shows the same way (each ``Figure`` displays itself) and ``Figure.save`` writes to
a ``.svg`` file. Hover a shape for its numbers; the page and a notebook let the timeline
zoom (``planner/web/static/figures.js``). The static matplotlib plots stay in
``planner.plots``.

``memory_chart`` (memory per GPU by term and pipeline stage against the capacity and the
reserve), ``step_time_chart`` (step time by term, hidden communication shown),
``timeline_chart`` (every op of every micro-batch of the pipeline), ``frontier_chart``
(every configuration timed: step time or cost per million tokens against peak memory; each
dot carries ``data-i``, its index in the ``Frontier``) and ``whatif_chart`` (the plan on
other GPU counts and GPU types, ranked by time and by cost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from costmodel.errors import SpecError
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.memory import TERMS
from costmodel.formulas.steptime import COMM_KINDS, TIME_TERMS
from costmodel.units import GIB
from hardware_profiles.files import write_text
from planner.alternatives import describe
from planner.explore import Frontier, SweepPoint
from planner.svg import COLORS, Axis, Canvas
from planner.timeline import Timeline

__all__ = ["OP_NAMES", "Figure", "frontier_chart", "memory_chart", "step_time_chart",
           "timeline_chart", "whatif_chart"]

_MEMORY = dict(zip(TERMS, (COLORS["blue"], COLORS["orange"], COLORS["green"], COLORS["red"],
                           COLORS["purple"], COLORS["gray"]), strict=True))
_OPS = {"F": COLORS["blue"], "B": COLORS["green"], "I": COLORS["lightgreen"],
        "W": COLORS["yellowgreen"], "O": COLORS["purple"]}
#: What each pipeline op kind is, as the timelines' legends name it (here and in
#: ``planner.plots``).
OP_NAMES = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient",
            "O": "forward + another's backward, overlapped"}


def _script() -> str:
    """The figures' own script (timeline zoom), shared with the explorer page."""
    return resources.files("planner.web").joinpath("static/figures.js").read_text("utf-8")


@dataclass(frozen=True)
class Figure:
    """One chart: ``kind`` (``memory``, ``step_time``, ``timeline``, ``frontier``,
    ``whatif``), its ``title`` and the ``svg`` document. Shows itself in Jupyter (with the
    zoom script); ``save`` writes the SVG file."""

    kind: str
    title: str
    svg: str

    def _repr_html_(self) -> str:
        return (f'<div class="planner-figures">{self.svg}</div>'
                f"<script>{_script()}</script>")

    def save(self, path: str | Path) -> None:
        """Write the SVG to ``path`` whole or not at all (``SpecError`` on failure)."""
        write_text(path, self.svg + "\n", "the figure")


def memory_chart(est: Estimate) -> Figure:
    """Memory per GPU of each pipeline stage, stacked by term (GiB), against the GPU's
    capacity and the share the job keeps in reserve (``Job.memory_reserve``)."""
    n = len(est.stages)
    width, left, top, plot_h = 620.0, 64.0, 34.0, 230.0
    right = width - 170
    cap = est.memory_capacity_bytes / GIB
    usable = cap * (1 - est.memory_reserve)
    totals = [sum(getattr(s.memory, f"{t}_bytes") for t in TERMS) / GIB for s in est.stages]
    ymax = max([cap, *totals]) * 1.08
    y = Axis(0.0, ymax, top + plot_h, top)
    c = Canvas(width, top + plot_h + 46, "memory")
    title = f"Memory per GPU: {describe(est.config)}"
    c.text(left, 18, title, size=12, weight="bold")
    c.y_axis(y, left, "GiB per GPU", grid_to=right)
    slot = (right - left) / max(1, n)
    bar = min(60.0, slot * 0.7)
    for i, s in enumerate(est.stages):
        x = left + slot * (i + 0.5) - bar / 2
        base = 0.0
        for t in TERMS:
            v = getattr(s.memory, f"{t}_bytes") / GIB
            if v > 0:
                c.rect(x, y(base + v), bar, y(base) - y(base + v), _MEMORY[t],
                       title=f"stage {s.stage}: {t} {v:.2f} GiB",
                       data={"term": t, "stage": s.stage, "gib": f"{v:.4f}"})
            base += v
        if n <= 32 or i % max(1, n // 16) == 0:
            c.text(x + bar / 2, top + plot_h + 14, str(s.stage), size=10, anchor="middle")
    c.text((left + right) / 2, top + plot_h + 32, "pipeline stage", size=11, anchor="middle")
    c.line(left, y(cap), right, y(cap), "#000", dash="5 3", width=1.2,
           title=f"capacity {cap:.1f} GiB")
    if est.memory_reserve > 0:
        c.line(left, y(usable), right, y(usable), COLORS["brown"], dash="2 3",
               title=f"reserve: {100 * est.memory_reserve:.0f}% kept free ({usable:.1f} GiB "
                     "usable)")
    c.legend(right + 14, top, [(t, _MEMORY[t]) for t in TERMS]
             + [(f"capacity {cap:.1f} GiB", "#000")]
             + ([(f"reserve {100 * est.memory_reserve:.0f}%", COLORS["brown"])]
                if est.memory_reserve > 0 else []))
    return Figure("memory", title, c.render(title))


def step_time_chart(est: Estimate) -> Figure:
    """Step time by term (seconds): what each term adds to the step (solid) and, for
    communication, the part hidden behind compute (pale, outlined)."""
    bd = est.time_breakdown_s
    kinds = {f"{k}_comm" for k in COMM_KINDS}
    rows = [t for t in TIME_TERMS if bd.get(t, 0.0) > 0 or bd.get(f"{t}_total", 0.0) > 0]
    width, left, top, row_h = 620.0, 130.0, 34.0, 22.0
    right = width - 90
    xmax = max([bd.get(f"{t}_total", bd.get(t, 0.0)) for t in rows] + [1e-9]) * 1.05
    x = Axis(0.0, xmax, left, right)
    h = top + row_h * len(rows) + 46
    c = Canvas(width, h, "step_time")
    band = f" ± {100 * est.step_time_band:.0f}%" if est.step_time_band else ""
    title = f"Step {est.step_time_s:.3f} s{band}, MFU {100 * (est.mfu or 0):.1f}%"
    c.text(left, 18, title, size=12, weight="bold")
    for i, t in enumerate(rows):
        yy = top + row_h * i
        shown = bd.get(t, 0.0)
        total = bd.get(f"{t}_total", shown)
        color = COLORS["red"] if t in kinds else COLORS["blue"]
        c.text(left - 6, yy + 15, t, size=10, anchor="end")
        c.rect(left, yy + 3, x(shown) - left, row_h - 6, color,
               title=f"{t}: adds {shown:.4f} s", data={"term": t, "seconds": f"{shown:.9g}"})
        if total > shown:
            c.rect(x(shown), yy + 3, x(total) - x(shown), row_h - 6, color, opacity=0.18,
                   stroke=color, cls="hidden-comm",
                   title=f"{t}: {total - shown:.4f} s hidden behind compute (total "
                         f"{total:.4f} s)", data={"term": t, "hidden": f"{total - shown:.9g}"})
        c.text(x(total) + 4, yy + 15, f"{shown:.3g} s", size=10)
    c.x_axis(x, top + row_h * len(rows) + 2, "seconds per step (pale: hidden communication)")
    return Figure("step_time", title, c.render(title))


def timeline_chart(tl: Timeline) -> Figure:
    """The pipeline schedule, every op of every micro-batch: one row per pipeline rank, a
    box per op coloured by kind (forward, backward, input and weight gradient, overlapped
    pair) and labelled with its micro-batch where wide enough; each box carries its start
    and end (``data-s``, ``data-e``, seconds) so the page can zoom in time."""
    p = tl.num_stages
    width, left, top, row_h = 900.0, 60.0, 34.0, 24.0
    right = width - 20
    t0 = min(o.start for o in tl.ops)
    span = max(o.end for o in tl.ops) - t0 or 1e-9
    x = Axis(0.0, span, left, right)
    c = Canvas(width, top + row_h * p + 70, "timeline")
    v = f", v={tl.virtual_stages}" if tl.virtual_stages > 1 else ""
    title = (f"{tl.schedule}{v}: {tl.num_micro_batches} micro-batches on {p} ranks, "
             f"bubble {100 * tl.bubble_fraction:.1f}%")
    c.text(left, 18, title, size=12, weight="bold")
    for r in range(p):
        c.text(left - 6, top + row_h * r + 16, f"rank {r}", size=10, anchor="end")
    ops = Canvas(width, 0, "")
    for o in tl.ops:
        s, e = o.start - t0, o.end - t0
        yy = top + row_h * o.stage + 2
        what = OP_NAMES[o.kind]
        other = f" with backward {o.b_micro_batch}" if o.kind == "O" else ""
        tip = (f"rank {o.stage}: {what} of micro-batch {o.micro_batch}{other}, chunk "
               f"{o.chunk}; {1e3 * s:.2f} to {1e3 * e:.2f} ms")
        ops.rect(x(s), yy, x(e) - x(s), row_h - 4, _OPS[o.kind], title=tip, stroke="#fff",
                 data={"s": f"{s:.9g}", "e": f"{e:.9g}", "kind": o.kind,
                       "mb": o.micro_batch})
        ops.text((x(s) + x(e)) / 2, yy + 14, str(o.micro_batch), size=9, anchor="middle",
                 color="#fff", cls="op-label")
    c.group("zoom-layer", ops, {"span": f"{span:.9g}", "left": left, "right": right})
    axis = Canvas(width, 0, "")
    axis.x_axis(x, top + row_h * p + 4, "seconds from the first forward", fmt=_seconds)
    c.group("static-axis", axis)
    c.group("zoom-axis", Canvas(width, 0, ""), {"y": top + row_h * p + 4})
    kinds = sorted({o.kind for o in tl.ops}, key="FBIWO".index)
    for i, k in enumerate(kinds):
        c.rect(left + 170 * i, top + row_h * p + 44, 11, 11, _OPS[k])
        c.text(left + 170 * i + 15, top + row_h * p + 54, OP_NAMES[k], size=10)
    return Figure("timeline", title, c.render(title))


def _seconds(t: float) -> str:
    return f"{t:.4g}"


def frontier_chart(front: Frontier, *, cost: bool = False, plan: Estimate | None = None,
                   selected: int | None = None, usd_per_gpu_hour: float | None = None,
                   num_gpus: int = 1) -> Figure:
    """Every configuration kept in ``front``: step time (or, with ``cost``, US dollars per
    million tokens at ``usd_per_gpu_hour`` on ``num_gpus``) against peak memory per GPU (log
    scale); dots that fit in blue, the rest grey, the Pareto frontier as a line, the GPU's
    capacity dashed, the plan as a gold dot and ``selected`` ringed. Each dot has ``data-i``
    (its index in ``front``) and its configuration as a hover title."""
    if cost and not usd_per_gpu_hour:
        raise SpecError("a frontier by cost needs the GPU's price (usd_per_gpu_hour); its "
                        "profile has none: draw it by step time")
    per = (num_gpus * (usd_per_gpu_hour or 0.0) / 3600) / (front.tokens_per_step / 1e6)
    ys = [float(s) * (per if cost else 1.0) for s in front.step_time_s]
    mem = [float(m) / GIB for m in front.peak_memory_bytes]
    width, left, top, plot_h = 620.0, 70.0, 34.0, 300.0
    right = width - 20
    lo, hi = min(mem), max([*mem, front.capacity_bytes / GIB])
    x = Axis(lo / 1.2, hi * 1.2, left, right, log=True)
    y = Axis(0.0, max([v for v in ys if math.isfinite(v)] + [1e-9]) * 1.05, top + plot_h, top)
    c = Canvas(width, top + plot_h + 46, "frontier")
    what = "US$ per million tokens" if cost else "step time (s)"
    title = f"{front.total:,} configurations timed: {what} against memory"
    c.text(left, 18, title, size=12, weight="bold")
    c.y_axis(y, left, what, grid_to=right)
    c.x_axis(x, top + plot_h, "peak memory per GPU (GiB, log)")
    cap = front.capacity_bytes / GIB
    c.line(x(cap), top, x(cap), top + plot_h, COLORS["red"], dash="5 3",
           title=f"capacity {cap:.1f} GiB")
    dots = Canvas(width, 0, "")
    unit = "$/Mtok" if cost else "s"
    for i in range(len(ys)):
        cfg = front.configs[i] if front.configs else None
        trainer = front.frameworks[i] + ": " if front.frameworks else ""
        fits = bool(front.fits[i])
        tip = (f"{trainer}{describe(cfg) if cfg else ''}\n{ys[i]:.4g} {unit}, "
               f"{mem[i]:.1f} GiB{'' if fits else ' (does not fit)'}")
        dots.circle(x(mem[i]), y(ys[i]), 3.2, COLORS["blue"] if fits else COLORS["gray"],
                    opacity=0.55, title=tip, data={"i": i, "fits": int(fits)}, cls="pt")
    c.group("points", dots)
    c.path([(x(mem[i]), y(ys[i])) for i in front.pareto], "#000", width=1.2)
    if plan is not None:
        py = float(plan.step_time_s or 0.0) * (per if cost else 1.0)
        c.circle(x(plan.peak_memory_bytes / GIB), y(py), 7, COLORS["gold"], stroke="#000",
                 title=f"the plan: {describe(plan.config)}", cls="plan-star")
    if selected is not None and 0 <= selected < len(ys):
        c.circle(x(mem[selected]), y(ys[selected]), 8, "none", stroke=COLORS["red"],
                 cls="selected-ring")
    return Figure("frontier", title, c.render(title))


def whatif_chart(points: Sequence[SweepPoint], labels: Sequence[str],
                 current: int | None = None) -> Figure:
    """The plan at each what-if point (``labels``: e.g. ``"128 x h100-sxm"``), ranked by
    step time (left) and by US dollars per million tokens (right; unpriced GPUs last);
    ``current`` is the job as asked. Points where nothing fits are listed with the reason."""
    times: list[float | None] = []
    costs: list[float | None] = []
    configs: list[str] = []
    for p in points:
        e = p.plan.estimate if p.plan is not None else None
        ok = isinstance(e, Estimate)
        times.append(e.step_time_s if ok else None)  # type: ignore[union-attr]
        costs.append(e.usd_per_million_tokens if ok else None)  # type: ignore[union-attr]
        configs.append(describe(e.config) if ok else "")  # type: ignore[union-attr]
    n = len(points)
    row_h, top, width = 22.0, 52.0, 900.0
    c = Canvas(width, top + row_h * n + 16, "whatif")
    title = "The same job on other GPU counts and GPU types"
    c.text(10, 18, title, size=12, weight="bold")
    for k, (vals, name, x0) in enumerate(((times, "step time (s)", 10.0),
                                         (costs, "US$ per million tokens", 460.0))):
        _ranked(c, vals, name, x0, labels, points, current, "blue" if k == 0 else "green",
                configs)
    return Figure("whatif", title, c.render(title))


def _ranked(c: Canvas, vals: Sequence[float | None], name: str, x0: float,
            labels: Sequence[str], points: Sequence[SweepPoint], current: int | None,
            color: str, configs: Sequence[str]) -> None:
    """One ranking of the what-if strip: a bar per point, smallest first (``None`` last)."""
    order = sorted(range(len(vals)), key=lambda i: (vals[i] is None, vals[i] or 0.0))
    c.text(x0, 40, f"ranked by {name}", size=11, weight="bold")
    scale = Axis(0.0, max([v for v in vals if v is not None] + [1e-9]), x0 + 150, x0 + 370)
    top, row_h = 52.0, 22.0
    for r, i in enumerate(order):
        yy = top + row_h * r
        mine = i == current
        c.text(x0 + 144, yy + 15, labels[i] + (" (asked)" if mine else ""), size=10,
               anchor="end", weight="bold" if mine else "normal")
        v = vals[i]
        if v is None:
            why = points[i].error or "no price in the GPU profile"
            c.text(x0 + 150, yy + 15, "nothing fits" if points[i].plan is None else "no price",
                   size=10, color=COLORS["gray"])
            c.rect(x0 + 150, yy + 3, 1, row_h - 6, COLORS["gray"], title=why)
            continue
        c.rect(x0 + 150, yy + 3, scale(v) - x0 - 150, row_h - 6,
               COLORS["orange"] if mine else COLORS[color],
               title=f"{labels[i]}: {v:.4g}; {configs[i]}",
               data={"i": i, "label": labels[i], "value": f"{v:.6g}"})
        c.text(scale(v) + 4, yy + 15, f"{v:.3g}", size=10)

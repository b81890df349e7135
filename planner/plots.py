"""Plots (matplotlib, the ``plots`` extra): memory by term and stage, step time by term, the
throughput-vs-memory frontier, a pipeline schedule timeline, and what-if sweeps.

Each function draws on ``ax`` (a new figure when ``None``) and returns the axes, so it works
inline in Jupyter, in scripts (``fig.savefig``) and in subplots. The interactive SVG figures of
the explorer page (``planner serve``) are ``planner.figures``' charts, re-exported here:
``memory_chart``, ``step_time_chart``, ``timeline_chart``, ``frontier_chart``,
``whatif_chart`` (no matplotlib needed).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from costmodel.config import ParallelConfig
from costmodel.errors import SpecError, install_hint
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.memory import TERMS
from costmodel.formulas.steptime import COMM_KINDS, TIME_TERMS
from costmodel.units import GIB, plural
from hardware_profiles.files import write_bytes
from planner.explore import Frontier, SweepPoint
from planner.figures import (
    OP_NAMES,
    Figure,
    frontier_chart,
    memory_chart,
    step_time_chart,
    timeline_chart,
    whatif_chart,
)
from planner.plan import describe
from planner.result import Plan
from planner.timeline import Timeline

__all__ = ["Figure", "frontier_chart", "memory_chart", "plot_frontier", "plot_memory",
           "plot_plan", "plot_step_time", "plot_sweep", "plot_timeline", "step_time_chart",
           "timeline_chart", "whatif_chart"]

# One colour per memory term and per step-time term (matplotlib's tab10/tab20 palettes).
_MEMORY_COLORS = dict(zip(TERMS, ("tab:blue", "tab:orange", "tab:green", "tab:red",
                                  "tab:purple", "tab:gray"), strict=True))
_OP_COLORS = {"F": "tab:blue", "B": "tab:green", "I": "mediumseagreen", "W": "yellowgreen",
              "O": "tab:purple"}


def _axes(ax: Any, size: tuple[float, float] = (7.0, 4.0)) -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise SpecError(f"plots need matplotlib: {install_hint('plots')}") \
            from None
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


#: Why a serving plan is not drawn.
_SERVING = ("planner plot draws training plans; a serving plan's numbers are in "
            "'planner explain PLAN'")


def _estimate(obj: Estimate | Plan) -> Estimate:
    """The estimate of a training plan, or ``obj`` itself when it is one; ``SpecError`` for a
    serving plan."""
    if not isinstance(obj, Plan):
        return obj
    if not isinstance(obj.estimate, Estimate):
        raise SpecError(_SERVING)
    return obj.estimate


def plot_memory(est: Estimate | Plan, ax: Any = None) -> Any:
    """Per-GPU memory of each pipeline stage, stacked by term (GiB), with the GPU's
    capacity as a dashed line."""
    e = _estimate(est)
    ax = _axes(ax)
    x = [s.stage for s in e.stages]
    bottom = [0.0] * len(x)
    for t in TERMS:
        vals = [getattr(s.memory, f"{t}_bytes") / GIB for s in e.stages]
        ax.bar(x, vals, bottom=bottom, color=_MEMORY_COLORS[t], label=t, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.axhline(e.memory_capacity_bytes / GIB, color="black", linestyle="--", linewidth=1,
               label=f"capacity {e.memory_capacity_bytes / GIB:.1f} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_xticks(x)
    ax.set_title(f"Memory per GPU: {describe(e.config)}", fontsize=9)
    ax.set_ylim(top=max(max(bottom), e.memory_capacity_bytes / GIB) * 1.08)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def plot_step_time(est: Estimate | Plan, ax: Any = None) -> Any:
    """Step time by term (seconds): what each term adds to the step (solid), and for
    communication the part hidden behind compute (hatched)."""
    e = _estimate(est)
    ax = _axes(ax)
    bd = e.time_breakdown_s
    kinds = {f"{k}_comm" for k in COMM_KINDS}
    rows = [t for t in TIME_TERMS if bd.get(t, 0.0) > 0 or bd.get(f"{t}_total", 0.0) > 0]
    hidden_label: str | None = "communication hidden behind compute"
    for i, t in enumerate(rows):
        shown = bd.get(t, 0.0)
        ax.barh(i, shown, color="tab:red" if t in kinds else "tab:blue")
        hidden = bd.get(f"{t}_total", shown) - shown
        if hidden > 0:
            ax.barh(i, hidden, left=shown, color="white", edgecolor="tab:red", hatch="//",
                    label=hidden_label)
            hidden_label = None
        ax.annotate(f"{shown:.3g} s", (shown + max(hidden, 0.0), i), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (solid: what the term adds to the step)")
    ax.set_title(f"Step {e.step_time_s:.3f} s, MFU {100 * (e.mfu or 0):.1f}%: "
                 f"{describe(e.config)}", fontsize=9)
    if hidden_label is None:  # beside the bars, not over them
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def plot_frontier(front: Frontier, plan: Plan | None = None, ax: Any = None) -> Any:
    """Throughput (tokens/s) against peak memory per GPU of the configurations timed, the
    Pareto frontier as a line, the GPU's capacity, and the plan as a star."""
    ax = _axes(ax)
    mem = front.peak_memory_bytes / GIB
    tps = front.tokens_per_s
    ax.scatter(mem[front.fits], tps[front.fits], s=4, color="tab:blue", alpha=0.25,
               label="fits", rasterized=True)
    ax.scatter(mem[~front.fits], tps[~front.fits], s=4, color="tab:gray", alpha=0.2,
               label="does not fit", rasterized=True)
    ax.step(mem[front.pareto], tps[front.pareto], where="post", color="black", linewidth=1.2,
            label="frontier")
    ax.axvline(front.capacity_bytes / GIB, color="tab:red", linestyle="--", linewidth=1,
               label=f"capacity {front.capacity_bytes / GIB:.1f} GiB")
    if plan is not None:
        e = plan.estimate
        ax.scatter([e.peak_memory_bytes / GIB], [e.tokens_per_s], marker="*", s=220,
                   color="gold", edgecolor="black", zorder=5, label=f"plan: {describe(e.config)}")
    ax.set_xscale("log")
    ax.set_xlabel("peak memory per GPU (GiB, log)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{front.total:,} configurations timed", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def plot_timeline(tl: Timeline, ax: Any = None, max_micro_batches: int | None = None) -> Any:
    """The pipeline schedule: one row per pipeline rank, a box per forward (blue), backward
    (green), input-gradient and weight-gradient (light greens: zero bubble, the V schedules)
    and overlapped forward-backward pair (purple: DualPipeV, combined 1F1B) op, labelled with
    the (forward's) micro-batch. ``max_micro_batches``: draw only the ops of the first N
    micro-batches' worth of time (all by default)."""
    ax = _axes(ax, (9.0, 0.45 * tl.num_stages + 1.5))
    ops = tl.ops
    shown = ""
    if max_micro_batches is not None and max_micro_batches < tl.num_micro_batches:
        cut = max(o.end for o in ops if o.micro_batch < max_micro_batches and o.kind == "F")
        ops = tuple(o for o in ops if o.start < cut)
        shown = (f" (the first {max_micro_batches} micro-batches' time of "
                 f"{tl.num_micro_batches})")
    span = max(o.end for o in ops)
    # White gaps between ops only where ops are wide enough to show them; narrow ones would
    # be all gap.
    per_rank = len(ops) / max(1, tl.num_stages)
    edge = {"edgecolors": "white", "linewidth": 0.5} if per_rank <= 150 else \
        {"edgecolors": "none", "linewidth": 0}
    # One collection per rank and kind of op: a bar each would rescale the axes per op
    # (11,000 ops of a 1,536-micro-batch pipeline took matplotlib 100 s).
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for o in ops:
        bars.setdefault((o.stage, o.kind), []).append((o.start, o.end - o.start))
    for (stage, kind), spans in bars.items():
        ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=_OP_COLORS[kind], **edge)
    for o in ops:
        if (o.end - o.start) > span / 60:
            ax.text((o.start + o.end) / 2, o.stage, str(o.micro_batch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(tl.num_stages), [f"rank {r}" for r in range(tl.num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    kinds = sorted({o.kind for o in ops}, key="FBIWO".index)
    import matplotlib.patches as mpatches

    # Beside the ranks, not over the ops.
    ax.legend(handles=[mpatches.Patch(color=_OP_COLORS[k], label=OP_NAMES[k]) for k in kinds],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    v = f", v={tl.virtual_stages}" if tl.virtual_stages > 1 else ""
    ax.set_title(f"{tl.schedule}{v}: {plural(tl.num_micro_batches, 'micro-batch')} on "
                 f"{tl.num_stages} ranks{shown}, bubble {100 * tl.bubble_fraction:.1f}%",
                 fontsize=9)
    return ax


def plot_plan(plan: Plan, path: str | None = None, max_micro_batches: int | None = None
              ) -> Any:
    """A saved training plan on one figure: memory per stage, step time by term and the
    pipeline timeline; written to ``path`` (PNG, SVG or PDF by its suffix) when given.
    ``max_micro_batches``: draw the timeline's first N micro-batches' worth of time (default:
    all of them up to 4 per pipeline stage). Returns the figure."""
    import matplotlib.pyplot as plt

    from planner.timeline import timeline

    if not isinstance(plan.estimate, Estimate) or not isinstance(plan.config, ParallelConfig):
        raise SpecError(_SERVING)
    job, cfg, _ = plan.training()
    tl = timeline(plan.model, plan.cluster, job, cfg)
    cap = max_micro_batches or 4 * max(1, cfg.pp)
    fig, axes = plt.subplots(3, 1, figsize=(10.0, 11.0 + 0.3 * tl.num_stages),
                             gridspec_kw={"height_ratios": [3, 3, 1 + 0.3 * tl.num_stages]})
    plot_memory(plan, ax=axes[0])
    plot_step_time(plan, ax=axes[1])
    plot_timeline(tl, ax=axes[2], max_micro_batches=cap)
    fig.tight_layout()
    if path is not None:
        # Drawn in memory, then written whole (``write_bytes``): a failed write leaves an
        # existing file as it was.
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, bbox_inches="tight", dpi=120,
                        format=Path(path).suffix.lstrip(".").lower() or "png")
            write_bytes(path, buffer.getvalue(), "the plot")
        except SpecError:
            plt.close(fig)
            raise
        except (OSError, ValueError) as e:
            plt.close(fig)
            raise SpecError(f"cannot write the plot {str(path)[:200]!r}: {e}") from None
    return fig


def plot_sweep(points: Sequence[SweepPoint], ax: Any = None, label: str = "",
               per_gpu: bool = True) -> Any:
    """Throughput of the plan at each swept value (tokens/s per GPU when ``per_gpu``, else
    for the job), each point annotated with its configuration's degrees; values where
    nothing fits are marked with a cross on the axis."""
    ax = _axes(ax)
    xs = list(range(len(points)))
    ys, ok = [], []
    for i, p in enumerate(points):
        if p.plan is None:
            continue
        e = _estimate(p.plan)
        assert e.tokens_per_s is not None  # estimate() always times the step
        ys.append(e.tokens_per_s / (p.cluster.num_gpus if per_gpu else 1))
        ok.append(i)
        c = e.config
        ax.annotate(f"tp{c.tp} pp{c.pp} cp{c.cp}\nz{c.zero_stage}", (i, ys[-1]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
    ax.plot(ok, ys, marker="o", color="tab:blue")
    bad = [i for i, p in enumerate(points) if p.plan is None]
    if bad:
        ax.scatter(bad, [0] * len(bad), marker="x", color="tab:red", label="nothing fits")
        ax.legend(fontsize=8)
    ax.set_xticks(xs, [str(p.value) for p in points])
    ax.set_xlabel(label or "value")
    ax.set_ylabel("tokens/s per GPU" if per_gpu else "tokens/s")
    ax.set_ylim(bottom=0, top=1.2 * max(ys, default=1.0))
    return ax

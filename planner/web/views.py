"""What the explorer page shows, as JSON: the plan with its runners-up and why-not table,
one configuration in detail (its memory, step-time and timeline figures, band, cost), the
frontier and the what-if strip. Every figure is a ``planner.figures`` chart, the same a
notebook draws; every number comes from the public API (``plan``, ``estimate``,
``timeline``, ``frontier``, ``what_if``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from costmodel import ParallelConfig, SpecError, estimate
from costmodel.formulas.estimate import Estimate
from costmodel.units import GIB
from planner import figures
from planner.alternatives import describe
from planner.emit import TRAINING_TARGETS, emit
from planner.explore import frontier, what_if, what_if_label
from planner.plan import plan
from planner.result import Plan
from planner.timeline import timeline
from planner.web.problems import FormError, Problem

__all__ = ["DOWNLOADS", "download", "frontier_view", "plan_view", "search", "selection",
           "whatif_view"]

#: What the page offers to download for the selected configuration.
DOWNLOADS = ("plan", *TRAINING_TARGETS)
#: Dots the frontier draws (an even sample of the rest, always with the frontier itself).
FRONTIER_POINTS = 1500

Progress = Callable[[float], None]


def search(problem: Problem, progress: Progress) -> Plan:
    """The problem's plan: found once (``planner.plan``, as ``planner plan`` calls it)."""
    with problem.lock:
        if problem.plan is None:
            problem.plan = plan(problem.model, problem.cluster, problem.job,
                                constraints=problem.constraints, top_k=problem.top_k,
                                progress=progress)
        return problem.plan


def _alternative_rows(p: Plan) -> list[dict[str, Any]]:
    """The why-not table: each alternative with the CLI's words."""
    return [{"i": i, "framework": a.framework,
             "config": describe(a.config) if a.config is not None else "",
             "verdict": a.verdict, "reason": a.reason, "step_time_s": a.step_time_s,
             "peak_memory_gib": None if a.peak_memory_bytes is None
             else a.peak_memory_bytes / GIB,
             "selectable": isinstance(a.config, ParallelConfig)
             and a.verdict in ("slower", "does not fit")}
            for i, a in enumerate(p.alternatives)]


def plan_view(problem: Problem, progress: Progress) -> dict[str, Any]:
    """The plan, its command line and summary (the CLI's text), the why-not table and the
    plan's own configuration in detail."""
    p = search(problem, progress)
    return {"problem": problem.key, "command": problem.command,
            "model": problem.model.name, "gpus": problem.cluster.num_gpus,
            "gpu": problem.cluster.gpu.name, "summary": p.summary(rows=12),
            "counts": dict(p.counts), "search_seconds": p.search_seconds,
            "warnings": list(p.warnings), "alternatives": _alternative_rows(p),
            "selection": selection(problem, "plan")}


def chosen(problem: Problem, cand: str) -> Plan:
    """The configuration ``cand`` names as a plan of its own: ``plan`` (the plan),
    ``alt:I`` (the plan's I-th alternative), ``front:I`` (the frontier's I-th dot) or
    ``whatif:I`` (the I-th what-if point's plan)."""
    base = problem.plan
    if base is None:
        raise FormError("", "planner: error: search first: there is no plan yet")
    kind, _, index = cand.partition(":")
    if kind == "plan":
        return base
    if not index.isdigit():
        raise FormError("", f"planner: error: unknown selection {cand[:40]!r}")
    i = int(index)
    if kind == "whatif" and problem.whatif is not None and i < len(problem.whatif):
        found = problem.whatif[i].plan
        if found is None:
            raise FormError("", f"planner: infeasible: {problem.whatif[i].error}")
        return found
    if kind == "alt" and i < len(base.alternatives):
        a = base.alternatives[i]
        cfg, framework = a.config, a.framework
    elif kind == "front" and problem.frontier is not None and i < len(problem.frontier.configs):
        cfg, framework = problem.frontier.configs[i], problem.frontier.frameworks[i]
    else:
        raise FormError("", f"planner: error: unknown selection {cand[:40]!r}")
    if not isinstance(cfg, ParallelConfig):
        raise FormError("", "planner: error: that row has no configuration to show")
    job = dataclasses.replace(problem.job, framework=framework)
    est = estimate(problem.model, problem.cluster, job, cfg)
    return dataclasses.replace(base, job=job, config=cfg, estimate=est, alternatives=(),
                               counts={})


def _band(est: Estimate) -> dict[str, Any]:
    return {"fraction": est.step_time_band, "basis": est.step_time_band_basis,
            "extrapolated": est.step_time_band_extrapolated}


def selection(problem: Problem, cand: str) -> dict[str, Any]:
    """One configuration in detail: its numbers and its memory, step-time and timeline
    figures."""
    p = chosen(problem, cand)
    job, cfg, est = p.training()
    tl = timeline(p.model, p.cluster, job, cfg)
    return {"id": cand, "framework": job.framework, "config": describe(cfg),
            "config_fields": cfg.to_dict(), "gpus": p.cluster.num_gpus,
            "gpu": p.cluster.gpu.name, "step_time_s": est.step_time_s,
            "step_time_text": est.step_time_text, "tokens_per_s": est.tokens_per_s,
            "unit": job.unit, "mfu": est.mfu, "peak_memory_gib": est.peak_memory_bytes / GIB,
            "capacity_gib": est.memory_capacity_bytes / GIB, "fits": est.fits,
            "usd_per_million_tokens": est.usd_per_million_tokens, "band": _band(est),
            "figures": {"memory": figures.memory_chart(est).svg,
                        "step_time": figures.step_time_chart(est).svg,
                        "timeline": figures.timeline_chart(tl).svg},
            "downloads": list(DOWNLOADS)}


def frontier_view(problem: Problem, progress: Progress) -> dict[str, Any]:
    """The frontier drawn against step time and, when the GPU has a price, against cost."""
    p = search(problem, lambda f: None)
    with problem.lock:
        if problem.frontier is None:
            problem.frontier = frontier(problem.model, problem.cluster, problem.job,
                                        problem.constraints, max_points=FRONTIER_POINTS,
                                        keep_configs=True, progress=progress)
    front = problem.frontier
    _, _, est = p.training()
    price = problem.cluster.gpu.usd_per_gpu_hour
    return {"total": front.total, "points": len(front.step_time_s),
            "time": figures.frontier_chart(front, plan=est).svg,
            "cost": figures.frontier_chart(front, plan=est, cost=True, usd_per_gpu_hour=price,
                                           num_gpus=problem.cluster.num_gpus).svg
            if price else None}


def whatif_view(problem: Problem, progress: Progress) -> dict[str, Any]:
    """The same job on other GPU counts and GPU types, ranked by time and by cost."""
    with problem.lock:
        if problem.whatif is None:
            problem.whatif = what_if(problem.model, problem.cluster, problem.job,
                                     constraints=problem.constraints, progress=progress)
    points = problem.whatif
    labels = [what_if_label(pt) for pt in points]
    rows = []
    for i, pt in enumerate(points):
        est = pt.plan.estimate if pt.plan is not None else None
        row: dict[str, Any] = {"i": i, "label": labels[i], "error": pt.error,
                               "step_time_s": None, "usd_per_million_tokens": None,
                               "config": None}
        if isinstance(est, Estimate):
            row.update(step_time_s=est.step_time_s, config=describe(est.config),
                       usd_per_million_tokens=est.usd_per_million_tokens)
        rows.append(row)
    # what_if's first point is the job as asked.
    return {"svg": figures.whatif_chart(points, labels, 0).svg, "rows": rows, "current": 0}


def download(problem: Problem, cand: str, target: str) -> tuple[str, str]:
    """The file ``target`` (``DOWNLOADS``) for the configuration ``cand``: (file name,
    text)."""
    if target not in DOWNLOADS:
        raise FormError("", f"planner: error: unknown download {target[:40]!r}; choose one "
                        f"of {', '.join(DOWNLOADS)}")
    p = chosen(problem, cand)
    if target == "plan":
        return "plan.json", p.to_json() + "\n"
    try:
        out = emit(p, target)
    except SpecError as e:
        raise FormError("", f"planner: error: {e}") from None
    return out.filename, out.text

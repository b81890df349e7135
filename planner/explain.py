"""``explain(plan)``: why this plan, and why not the others, one choice at a time.

For each choice the search made (tensor, pipeline, context and expert parallel degrees, ZeRO
stage, sequence parallel, micro-batch, pipeline schedule and virtual stages, recompute,
offload, and the trainer when several were searched), every other value the space allows is
searched with that value fixed and everything else free. The fastest configuration with that
value either loses on time (by how much, and which step-time term grew most), or nothing with
that value fits (and the least memory it needs), or the value is never valid. The answers are
exact under the cost model: one branch-and-bound pass (``planner.search`` with ``by``) keeps
the best of every value, as a search per value with it fixed would find.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.config import ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.estimate import estimate, plan_capacity
from costmodel.formulas.memory import TERMS
from costmodel.formulas.roofline import aligned
from costmodel.formulas.steptime import TIME_TERMS
from costmodel.formulas.vschedules import as_dualpipe
from costmodel.frameworks import framework, padded_vocab
from costmodel.model import ModelSpec
from costmodel.units import GIB
from planner.alternatives import Choice, Option
from planner.inference import InferenceExplanation, explain_inference
from planner.plan import TERM_LABELS, describe, slower_reason
from planner.result import Plan
from planner.routing import ROUTING_FIELDS, routing_choices
from planner.search import Found, search
from planner.space import (
    _OFFLOAD_NAMES,
    _RECOMPUTE_NAMES,
    _SCHEDULE_NAMES,
    column_values,
    row_config,
    spaces,
)

__all__ = ["CHOICES", "Choice", "Explanation", "Option", "explain"]

#: The fields ``explain`` reports, with the column of the search space each reads.
CHOICES: dict[str, str] = {
    "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp", "zero_stage": "zero",
    "sequence_parallel": "sp", "micro_batch_size": "mbs", "pipeline_schedule": "schedule",
    "virtual_pipeline_stages": "v", "recompute": "recompute", "offload": "offload",
}
_DECODE: dict[str, Callable[[int], Any]] = {
    "sp": bool, "schedule": _SCHEDULE_NAMES.__getitem__,
    "recompute": _RECOMPUTE_NAMES.__getitem__, "offload": _OFFLOAD_NAMES.__getitem__,
}
_SHORT = {"zero_stage": "zero", "sequence_parallel": "sp", "micro_batch_size": "mbs",
          "pipeline_schedule": "schedule", "virtual_pipeline_stages": "v",
          "moe_dispatcher": "dispatcher", "moe_load": "load"}


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """Why ``plan`` won: what its step is made of, what fills its memory, and per choice
    (``choices``) what each other value would have cost."""

    plan: Plan
    choices: tuple[Choice, ...]
    search_seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def step_shares(self) -> list[tuple[str, float]]:
        """(term, seconds) of the step, largest first, zero terms left out."""
        bd = self.plan.training()[2].time_breakdown_s
        return sorted(((t, bd[t]) for t in TIME_TERMS if bd.get(t, 0.0) > 0),
                      key=lambda x: -x[1])

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form: the plan's ``config`` and ``estimate``, and ``choices``."""
        job, cfg, est = self.plan.training()
        return {"config": cfg.to_dict(),
                "estimate": est.to_dict(),
                "framework": job.framework,
                "choices": [c.to_dict() for c in self.choices],
                "notes": list(self.notes),
                "search_seconds": self.search_seconds}

    def summary(self) -> str:
        """A human-readable report."""
        job, cfg, e = self.plan.training()
        step = e.step_time_s or 0.0
        lines = [
            f"plan     {describe(cfg)}  ({job.framework})",
            f"         step {e.step_time_text}, {e.tokens_per_s:,.0f} {job.unit}/s, MFU "
            f"{100 * (e.mfu or 0):.1f}%",
            "step     " + ", ".join(f"{TERM_LABELS[t]} {100 * v / step:.0f}%"
                                    for t, v in self.step_shares()),
            f"memory   {e.peak_memory_bytes / GIB:.1f} of {e.memory_capacity_bytes / GIB:.1f} "
            f"GiB on stage {e.peak_stage}: " + ", ".join(
                f"{t} {getattr(e.memory, f'{t}_bytes') / GIB:.1f}" for t in TERMS
                if getattr(e.memory, f"{t}_bytes") > 0),
            *(f"note     {n}" for n in self.notes),
            "",
            "why each choice (for every other value: the fastest configuration with it)",
        ]
        for c in self.choices:
            tag = "the job's (what changing it would do)" if c.field in ROUTING_FIELDS else \
                "fixed by the constraints" if c.fixed else \
                "the only valid value" if not c.options else "chosen"
            lines.append(f"  {_label(c.field, c.chosen):<24s} {tag}")
            for o in c.options:
                head = f"{_label(c.field, o.value)}"
                where = f"   [{describe(o.config)}" + \
                    (f", {o.framework}]" if o.framework != job.framework else "]") \
                    if o.config else ""
                why = o.reason if o.verdict in ("slower", "faster") \
                    else f"{o.verdict}: {o.reason}"
                lines.append(f"    {head:<22s} {why}{where}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = []
        for c in self.choices:
            tag = "fixed" if c.fixed else "chosen"
            rows.append(f"<tr><td><b>{html.escape(_label(c.field, c.chosen))}</b></td>"
                        f"<td>{tag}</td><td></td><td></td></tr>")
            for o in c.options:
                rows.append(
                    f"<tr><td>&nbsp;&nbsp;{html.escape(_label(c.field, o.value))}</td>"
                    f"<td>{html.escape(o.verdict)}</td><td>{html.escape(o.reason)}</td>"
                    f"<td>{html.escape(describe(o.config)) if o.config else ''}</td></tr>")
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return (self.plan._repr_html_() + notes
                + "<h4>Why each choice</h4><table><tr><th>value</th><th>verdict</th>"
                "<th>why</th><th>fastest configuration with it</th></tr>"
                + "".join(rows) + "</table>")


def _chosen(cfg: ParallelConfig, field: str) -> Any:
    """The plan's value of a choice, as the search's column holds it (the experts' TP
    degree is ``tp`` where ``etp`` is unset)."""
    return cfg.expert_tp if field == "etp" else getattr(cfg, field)


def _label(field: str, value: Any) -> str:
    if field == "sequence_parallel":
        return f"sp={'on' if value else 'off'}"
    return f"{_SHORT.get(field, field)}={value}"


def _values(plan: Plan) -> dict[str, list[tuple[Any, int]]]:
    """(value, its code in the search space's column) of each explained field, for every
    value the field takes anywhere in the plan's searched space."""
    job = plan.training()[0]
    found: dict[str, set[int]] = {f: set() for f in CHOICES}
    for _, space in spaces(plan.model, plan.cluster, job, plan.constraints):
        for f, col in CHOICES.items():
            found[f] |= {int(x) for x in column_values(space, col)}
    out = {}
    for f, codes in found.items():
        decode = _DECODE.get(CHOICES[f], int)
        pairs = [(decode(c), c) for c in codes]
        out[f] = sorted(pairs, key=lambda p: str(p[0]) if f in (
            "pipeline_schedule", "recompute", "offload") else p[0])
    return out


def explain(plan: Plan | str | Path, *, fields: Sequence[str] | None = None,
            progress: Callable[[float], None] | None = None
            ) -> Explanation | InferenceExplanation:
    """Why ``plan`` won, choice by choice: for each field in ``fields`` (default: every
    field of ``CHOICES`` that varies in the searched space, the pipeline schedule and virtual
    stages only when the plan pipelines, plus ``framework`` when several trainers were
    searched), the fastest configuration for every other value under the plan's constraints
    with that value fixed (one pass of ``search(by=...)``); a mixture of experts' routing
    (``planner.routing.ROUTING_FIELDS``: each other dispatcher, even routing) by default or
    when ``fields`` names one of them, each a search of its own. ``progress``: called with the
    fraction done. A serving plan is explained by ``planner.inference.explain_inference``.
    ``plan`` may also be a saved plan's path (``Plan.from_json``)."""
    if isinstance(plan, str | Path):
        plan = Plan.from_json(plan)
    if not isinstance(plan, Plan):
        raise SpecError(f"explain takes a Plan (planner.plan(...)) or a saved plan's path, got "
                        f"{type(plan).__name__}")
    if plan.is_inference:

        return explain_inference(plan, fields=fields)
    t0 = time.perf_counter()
    job, cfg, _ = plan.training()
    cons = plan.constraints
    values = _values(plan)
    # The experts' own TP degree is a choice only where experts may fold (a MoE preset under
    # Megatron-LM); elsewhere it follows tp.
    folds = isinstance(plan.model, ModelSpec) and plan.model.is_moe \
        and "megatron" in (cons.frameworks or (job.framework,))
    # Without a pipeline the schedule is a choice only between 1F1B and Megatron-LM's
    # combined 1F1B, which pairs micro-batches on one stage too.
    pairs = any(v == "combined-1f1b" for v, _ in values["pipeline_schedule"])
    names = list(fields) if fields is not None else [
        f for f in CHOICES
        if (len(values[f]) > 1 or f in cons.fixed)
        and (cfg.pp > 1 or f != "virtual_pipeline_stages")
        and (cfg.pp > 1 or f != "pipeline_schedule" or pairs)
        and (f != "etp" or folds)]
    for f in names:
        if f not in CHOICES and f not in ROUTING_FIELDS:
            raise SpecError(f"cannot explain field {f!r}; choose from "
                            f"{', '.join([*CHOICES, *ROUTING_FIELDS])}")
    # The job's routing (dispatcher, load) is searched again per alternative: only when
    # every choice is explained or one of its fields is asked.
    routing = fields is None or any(f in ROUTING_FIELDS for f in names)
    names = [f for f in names if f not in ROUTING_FIELDS]
    frameworks = cons.frameworks or (job.framework,)
    asked = [f for f in names if f not in cons.fixed]
    others = [fw for fw in frameworks if fw != job.framework] if len(frameworks) > 1 else []
    steps = 1 + len(others)
    # One pass finds the fastest configuration (and the least memory) of every value of
    # every field asked: the same as one search per value with that value fixed.
    res = search(plan.model, plan.cluster, job, cons, top_k=1,
                 by=[CHOICES[f] for f in asked],
                 progress=None if progress is None else lambda x: progress(x / steps))
    outcomes: dict[str, list[Option]] = {}
    for f in asked:
        col = CHOICES[f]
        for v, code in values[f]:
            if v != _chosen(cfg, f):
                outcomes.setdefault(f, []).append(_option(
                    plan, v, res.best_by[col].get(code), res.least_by[col].get(code)))
    for i, fw in enumerate(others):
        one = search(plan.model, plan.cluster, job, replace(cons, frameworks=(fw,)), top_k=1)
        outcomes.setdefault("framework", []).append(_option(
            plan, fw, one.top[0] if one.top else None, one.least_memory))
        if progress is not None:
            progress((i + 2) / steps)
    if "pipeline_schedule" in asked:
        dual = _dualpipe_option(plan, outcomes.get("pipeline_schedule", []))
        if dual is not None:
            outcomes["pipeline_schedule"].append(dual)
    choices = []
    for f in [*names, *(["framework"] if len(frameworks) > 1 else [])]:
        chosen = job.framework if f == "framework" else _chosen(cfg, f)
        opts = sorted(outcomes.get(f, []), key=lambda o: (
            {"faster": 0, "slower": 0, "does not fit": 1, "invalid": 2}[o.verdict],
            o.step_time_s if o.step_time_s is not None else (o.peak_memory_bytes or 0.0)))
        choices.append(Choice(field=f, chosen=chosen, fixed=f in cons.fixed,
                              options=tuple(opts)))
    if routing:
        choices += routing_choices(plan)
    return Explanation(plan=plan, choices=tuple(choices),
                       search_seconds=time.perf_counter() - t0, notes=notes(plan))


def _dualpipe_option(plan: Plan, options: list[Option]) -> Option | None:
    """DeepSeek's DualPipe, which the planner costs for the plan's trainer but never searches
    (``Framework.costed_schedules``: no trainer it emits runs it), on the pipeline of the
    plan and of each other schedule's fastest configuration: the same ranks where they are
    even (four or more), twice the ranks for a DualPipeV (the DualPipe that costs as it); the
    fastest that fits, else the one needing least memory.
    None where the trainer does not cost it or no such pipeline is valid."""
    job, cfg, e = plan.training()
    if "dualpipe" not in framework(job.framework).costed_schedules:
        return None
    found = []
    for c in [cfg] + [o.config for o in options
                      if o.config is not None and o.framework == job.framework]:
        dual = as_dualpipe(c)
        if dual is None:
            continue
        try:
            found.append((dual, estimate(plan.model, plan.cluster, job, dual)))
        except SpecError:  # micro-batches DualPipe cannot take
            continue
    if not found:
        return None
    cap = plan_capacity(plan.cluster, job)
    fits = [(c, d) for c, d in found if d.peak_memory_bytes <= cap]
    how = "; costed, not searched: no trainer the planner emits runs it"
    if not fits:
        c, d = min(found, key=lambda x: x[1].peak_memory_bytes)
        return Option(value="dualpipe", verdict="does not fit", config=c,
                      framework=job.framework, peak_memory_bytes=d.peak_memory_bytes,
                      reason=f"needs {d.peak_memory_bytes / GIB:.1f} GiB per GPU, over the "
                             f"{cap / GIB:.1f} GiB a plan may fill" + how)
    c, d = min(fits, key=lambda x: x[1].step_time_s or 0.0)
    step, base = d.step_time_s or 0.0, e.step_time_s or 0.0
    if cfg.pipeline_schedule == "dualpipev" and (c.pp, c.dp) == (2 * cfg.pp, cfg.dp // 2):
        reason = (f"the plan's own ops ({step:.3f} s): its DualPipeV is DualPipe cut in half, "
                  "over half the ranks and twice the pipelines")
    elif step < base:
        reason = f"faster by {100 * (1 - step / base):.1f}% ({step:.3f} s)"
    else:
        reason = slower_reason(base, e.time_breakdown_s, e.peak_memory_bytes, step,
                               d.time_breakdown_s, d.peak_memory_bytes)
    return Option(value="dualpipe", verdict="faster" if step < base else "slower",
                  reason=reason + how, framework=job.framework, config=c, step_time_s=step,
                  peak_memory_bytes=d.peak_memory_bytes)


def notes(plan: Plan) -> tuple[str, ...]:
    """What the model itself costs the plan and the user can change, each with the estimate
    of the change: a vocabulary whose LM-head shard is off cuBLAS's 16-byte grid runs its
    matmuls on unaligned kernels (``costmodel.formulas.compute.gemm_time``); padded to a multiple of
    64 per tensor-parallel rank it would not."""
    m = plan.model
    if not isinstance(m, ModelSpec) or m.patch_size:
        return ()
    job, cfg, est = plan.training()
    if est.step_time_s is None:
        return ()
    e = 4 if job.precision == "fp32" else 2
    local = padded_vocab(framework(job.framework), m.vocab_size, np.array(cfg.tp)) / cfg.tp
    if aligned(local, 0, e):  # the vocabulary's dimension alone (0 is on the grid)
        return ()
    mult = 64 * cfg.tp
    padded = -(-m.vocab_size // mult) * mult
    fast = estimate(ModelSpec(**{**m.to_dict(), "vocab_size": padded}), plan.cluster, job, cfg)
    return (f"vocabulary {m.vocab_size} puts the LM head's matmuls off cuBLAS's 16-byte grid "
            f"(unaligned kernels); padded to {padded} the step would take "
            f"{fast.step_time_s:.3f} s instead of {est.step_time_s:.3f} s",)


def _option(plan: Plan, value: Any, best: Found | None, low: Found | None) -> Option:
    """The outcome of one value of a choice: ``best``, the fastest configuration with it that
    fits, else ``low``, the one with it needing the least memory (None: no valid one)."""
    job, _, e = plan.training()
    if best is not None:
        reason = slower_reason(e.step_time_s or 0.0, e.time_breakdown_s, e.peak_memory_bytes,
                               best.step_time, best.terms, best.peak_memory)
        return Option(value=value, verdict="slower", reason=reason, framework=best.framework,
                      config=row_config(np.array(best.row), plan.model),
                      step_time_s=best.step_time, peak_memory_bytes=best.peak_memory)
    if low is None:
        return Option(value=value, verdict="invalid",
                      reason="no valid configuration has it under these constraints")
    cap = plan_capacity(plan.cluster, job)
    if low.peak_memory > cap:
        why = (f"needs at least {low.peak_memory / GIB:.1f} GiB per GPU, "
               f"{(low.peak_memory - cap) / GIB:.1f} GiB over the {cap / GIB:.1f} GiB"
               + (" a plan may fill (the job's memory reserve kept free)"
                  if job.memory_reserve else ""))
    else:
        why = "what it offloads exceeds the GPU's share of host memory"
    return Option(value=value, verdict="does not fit", reason=why, framework=low.framework,
                  config=row_config(np.array(low.row), plan.model),
                  peak_memory_bytes=low.peak_memory)

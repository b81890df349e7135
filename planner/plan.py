"""``plan()``: the fastest configuration that fits, the runners-up, and why the rest lost.

A ``Plan`` is data: ``to_json()`` writes the model, the cluster (its profiles included), the
job, the chosen configuration and what the search found; ``Plan.from_json()`` reads it back
and re-estimates the configuration without searching, reproducing the same numbers.
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.estimate import NEAR_CAPACITY, Estimate, _html_table, estimate, plan_capacity
from costmodel.hardware import Cluster
from costmodel.inference import (
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    estimate_inference,
)
from costmodel.layercosts import LayerCosts
from costmodel.model import ModelSpec
from costmodel.units import GIB, count
from hardware_profiles.files import is_file, loads_json, printable, read_text, write_text
from planner.advice import (
    check_fixed_degrees,
    idle_warning,
    infeasible,
    position_warning,
    serving_warnings,
)
from planner.alternatives import (
    TERM_LABELS,
    Alternative,
    describe,
    slower_reason,
)
from planner.alternatives import (
    alternatives as lost_alternatives,
)
from planner.partition import partition as partition_stages
from planner.partition import stage_costs
from planner.search import SearchResult, search
from planner.space import FIELDS, Constraints, row_config

# Alternative, describe and the reasons live in planner.alternatives; re-exported here.
__all__ = ["SCHEMA_VERSION", "TERM_LABELS", "Alternative", "ModuleSource", "Plan",
           "PlanInvalid", "describe", "load_plan", "plan", "slower_reason"]

#: The most runners-up a plan ranks: each is re-estimated (stage partition) and explained.
MAX_TOP_K = 100
#: 2: a plan of a traced torch module carries its ``layer_costs`` (``LayerCosts``) where a
#: preset's carries its ``model``; version 1 files (presets only) read the same way.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class ModuleSource:
    """Where a traced module's plan came from, so that ``planner run`` can build the module
    again: ``model``, the ``module:attr`` that names it (``planner.models``), and the
    ``input_shapes`` (batch first) and ``input_dtype`` (``int64`` token ids or ``float32``)
    of the inputs it was traced with."""

    model: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtype: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        return {"model": self.model, "input_shapes": [list(s) for s in self.input_shapes],
                "input_dtype": self.input_dtype}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModuleSource:
        """The inverse of ``to_dict``."""
        return cls(str(d["model"]), tuple(tuple(int(x) for x in s) for s in d["input_shapes"]),
                   str(d["input_dtype"]))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The chosen configuration, its estimate, what lost and why.

    ``job`` is the job with the chosen trainer (``job.framework``); ``estimate`` comes from the
    public ``estimate()`` on ``config``; ``alternatives`` lists the runners-up (``verdict``
    ``slower``, fastest first), then for each mesh (dp, tp, pp, cp, ep) the best configuration
    that lost and why, then the validity rules that removed values; ``counts`` the
    configurations in the space, evaluated, fitting, not fitting, and skipped by the bound;
    ``search_seconds`` the wall time of the search. ``model``: a preset, or the
    ``LayerCosts`` of a traced torch module (with each op's layout per TP degree);
    ``module``: where that module comes from, when it was named by ``module:attr``.
    """

    model: ModelSpec | LayerCosts
    cluster: Cluster
    job: Job | InferenceJob
    config: ParallelConfig | InferenceConfig
    estimate: Estimate | InferenceEstimate
    alternatives: tuple[Alternative, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    constraints: Constraints = field(default_factory=Constraints)
    search_seconds: float = 0.0
    module: ModuleSource | None = None

    def preset(self, what: str) -> ModelSpec:
        """The plan's ``ModelSpec``; ``SpecError`` saying that ``what`` needs one when the
        plan is a traced torch module's (its ``LayerCosts``)."""
        spec = self.model if isinstance(self.model, ModelSpec) else self.model.spec
        if spec is None:
            raise SpecError(f"{what} takes the plan of a preset, config.json or ModelSpec; "
                            f"this plan is of a traced torch module ({self.model.name}), which "
                            f"{what} does not take yet")
        return spec

    @property
    def is_inference(self) -> bool:
        """Whether this plan serves the model (an ``InferenceJob``) rather than trains it."""
        return isinstance(self.job, InferenceJob)

    def training(self) -> tuple[Job, ParallelConfig, Estimate]:
        """The job, configuration and estimate of a training plan. Raises ``SpecError`` for a
        serving plan (an ``InferenceJob``), which has none of them."""
        job, cfg, est = self.job, self.config, self.estimate
        if isinstance(job, Job) and isinstance(cfg, ParallelConfig) and isinstance(est, Estimate):
            return job, cfg, est
        raise SpecError("this is a serving plan (an InferenceJob), not a training plan")

    @property
    def runners_up(self) -> tuple[Alternative, ...]:
        """The next fastest configurations that fit."""
        n = len(self.alternatives)
        end = next((i for i in range(n) if self.alternatives[i].config is None
                    or self.alternatives[i].verdict != "slower"), n)
        return self.alternatives[:end]

    def runners_up_within_band(self) -> int:
        """How many runners-up are slower than the plan by less than its step-time band
        (``Estimate.step_time_band``): configurations the estimate cannot tell apart."""
        e = self.estimate
        if not isinstance(e, Estimate):  # a serving estimate has no band
            return 0
        band, step = e.step_time_band, e.step_time_s
        if not band or step is None:
            return 0
        return sum(1 for a in self.runners_up if a.step_time_s is not None
                   and a.step_time_s <= step * (1 + band))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form; ``config`` and ``estimate`` are top-level keys."""
        return {
            "schema_version": SCHEMA_VERSION,
            "config": self.config.to_dict(),
            "estimate": self.estimate.to_dict(),
            "framework": "inference" if isinstance(self.job, InferenceJob)
            else self.job.framework,
            "model": self.model.to_dict() if isinstance(self.model, ModelSpec) else None,
            "layer_costs": self.model.to_dict() if isinstance(self.model, LayerCosts) else None,
            "module": self.module.to_dict() if self.module is not None else None,
            "cluster": self.cluster.to_dict(),
            "job": self.job.to_dict() if isinstance(self.job, InferenceJob)
            else dataclasses.asdict(self.job),
            "constraints": self.constraints.to_dict(),
            "warnings": list(self.warnings),
            "counts": dict(self.counts),
            "search_seconds": self.search_seconds,
            "runners_up_within_band": self.runners_up_within_band(),
            "alternatives": [a.to_dict() for a in self.alternatives],
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """The plan as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            write_text(path, text + "\n", "plan file")
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> Plan:
        """A plan from JSON text or a file path; the configuration is re-validated and
        re-estimated (no search), so the numbers are this installation's. Raises
        ``SpecError`` for a file that is not a plan, ``PlanInvalid`` (a ``SpecError``) for one
        whose configuration no longer runs on its cluster and job (degrees that do not
        multiply to its GPUs, a schedule its trainer lacks, ...)."""
        text = str(source)
        where = "plan"
        if not _is_text(source):
            where = f"plan file {str(source)[:200]!r}"
            text = read_text(source, "plan file")
        d = loads_json(text, None if where == "plan" else source,
                       "plan" if where == "plan" else "plan file")
        if isinstance(d, dict) and d.get("kind") == "graph":
            raise SpecError("this is a graph plan of a torch module, written by an earlier "
                            "planner (one sharding per op on 2-D meshes, now removed); plan "
                            "the module again ('planner plan --model module:attr') for a plan "
                            "that re-estimates, explains and runs")
        if not isinstance(d, dict):
            raise SpecError(f"{where} holds a JSON {type(d).__name__}, not a plan (a JSON "
                            "object written by 'planner plan -o')")
        version = d.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise SpecError(f"{where}: schema_version {version!r} is not {SCHEMA_VERSION}; "
                            "re-create the plan with this version of the planner")
        for key, kind in (("model", dict), ("layer_costs", dict), ("module", dict),
                          ("cluster", dict),
                          ("job", dict), ("config", dict),
                          ("alternatives", list), ("constraints", dict), ("counts", dict)):
            if key in d and d[key] is not None and not isinstance(d[key], kind):
                raise SpecError(f"{where}: field {key!r} should be a JSON "
                                f"{'object' if kind is dict else 'list'}, got {d[key]!r:.40}")
        serving = isinstance(d.get("job"), dict) and d["job"].get("kind") == "inference"
        try:
            model: ModelSpec | LayerCosts = (LayerCosts.from_dict(d["layer_costs"])
                                             if d.get("layer_costs") else ModelSpec(**d["model"]))
            cluster = Cluster.from_dict(d["cluster"])
            job: Job | InferenceJob = (InferenceJob.from_dict(d["job"]) if serving
                                       else Job(**d["job"]))
            cfg: ParallelConfig | InferenceConfig = (
                InferenceConfig(**d["config"]) if serving else ParallelConfig(**d["config"]))
            alts = tuple(Alternative.from_dict(a) for a in d.get("alternatives") or [])
            cons = Constraints.from_dict(d.get("constraints") or {})
            counts = {str(k): int(v) for k, v in (d.get("counts") or {}).items()}
            seconds = float(d.get("search_seconds") or 0.0)
            module = ModuleSource.from_dict(d["module"]) if d.get("module") else None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SpecError(f"{where} is missing or mangles a field ({type(e).__name__}: {e}); "
                            "re-create it with 'planner plan -o'") from e
        try:
            est: Estimate | InferenceEstimate
            if isinstance(job, InferenceJob) and isinstance(cfg, InferenceConfig):
                if not isinstance(model, ModelSpec):
                    raise SpecError(f"{where}: a serving plan needs a model, not layer costs")
                est = estimate_inference(model, cluster, job, cfg)
            else:
                assert isinstance(job, Job) and isinstance(cfg, ParallelConfig)  # not serving
                est = estimate(model, cluster, job, cfg)
        except SpecError as e:
            raise PlanInvalid(f"the plan's configuration cannot run on its cluster and job: "
                              f"{e}") from e
        return cls(model=model, cluster=cluster, job=job, config=cfg,
                   estimate=est, alternatives=alts,
                   counts=counts, constraints=cons, search_seconds=seconds, module=module)

    def emit(self, target: str, *, command: str | None = None, strict: bool = False) -> str:
        """The plan as a file for ``target`` (``planner.emit.TARGETS``: torchtitan, deepspeed,
        megatron, slurm). A feature the target cannot express is mapped to its nearest
        setting with a ``UserWarning`` (also written in the file's header), or refused with
        ``SpecError`` when ``strict``. See ``planner.emit.emit`` for the details."""
        import warnings

        from planner.emit import emit

        out = emit(self, target, command=command, strict=strict)
        for w in out.warnings:
            warnings.warn(f"{target}: {w}", UserWarning, stacklevel=2)
        return out.text

    def summary(self, rows: int = 12) -> str:
        """A human-readable report: the plan, its estimate, the runners-up and why others
        lost (``rows`` of them)."""
        e = self.estimate
        c = self.counts
        if isinstance(e, InferenceEstimate) and isinstance(self.job, InferenceJob):
            job = self.job
            target = "lowest latency" if job.objective == "latency" else "most output tokens/s"
            lines = [f"model    {self.model.name} on {self.cluster.num_gpus} x "
                     f"{self.cluster.gpu.name}, {job.prompt_len:,}-token prompts, "
                     f"{job.output_len:,} output tokens; objective: {target}",
                     *str(e).splitlines(),
                     f"searched {c.get('space', 0):,} configurations in "
                     f"{self.search_seconds:.2f} s: {c.get('fit', 0):,} fit, "
                     f"{c.get('feasible', 0):,} meet the bounds",
                     *(f"warning  {w}" for w in self.warnings)]
        else:
            lines = self._training_lines()
        lost = [a for a in self.alternatives if a.verdict != "invalid"][:rows]
        # With several trainers searched, each row says whose configuration it is.
        own = self.job.framework if isinstance(self.job, Job) else "inference"
        several = len({a.framework for a in self.alternatives} | {own}) > 1

        def whose(a: Alternative) -> str:
            return f" ({a.framework})" if several else ""

        if lost:
            lines.append("")
            lines.append("why not")
            for a in lost:
                head = describe(a.config) + whose(a) if a.config else ""
                lines.append(f"  {head:<52s} {a.reason}" if head else f"  {a.reason}")
        invalid = [a for a in self.alternatives if a.verdict == "invalid"]
        if invalid:
            lines.append("")
            lines.append("invalid")
            lines += [f"  {a.framework + ': ' if several else ''}{a.reason}" for a in invalid]
        return "\n".join(lines)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a user should know before running the plan: a peak above ``NEAR_CAPACITY``
        of the GPU's memory, or GPUs idle for most of the step (``idle_warning``)."""
        job, cfg, e = self.job, self.config, self.estimate
        if isinstance(e, InferenceEstimate) and isinstance(job, InferenceJob):
            return serving_warnings(job, e)
        if not (isinstance(e, Estimate) and isinstance(job, Job)
                and isinstance(cfg, ParallelConfig)):
            return ()
        out = []
        position = position_warning(self.model, job)
        if position:
            out.append(position)
        if e.near_capacity:
            out.append(f"the peak is above {100 * NEAR_CAPACITY:.0f}% of the GPU's memory: "
                       "allocator fragmentation and buffers the estimate does not count may "
                       "run it out of memory")
        idle = idle_warning(self.model, self.cluster, job, cfg, e)
        if idle:
            out.append(idle)
        return tuple(out)

    def _training_lines(self) -> list[str]:
        job, cfg, e = self.training()
        c = self.counts
        lines = [
            f"plan     {describe(cfg)}  ({job.framework})",
            f"         step {e.step_time_text}, {e.tokens_per_s:,.0f} {job.unit}/s, MFU "
            f"{100 * (e.mfu or 0):.1f}%, peak memory {e.peak_memory_bytes / GIB:.1f} of "
            f"{e.memory_capacity_bytes / GIB:.1f} GiB per GPU (headroom "
            f"{e.headroom_bytes / GIB:.1f} GiB)",
            f"searched {c.get('space', 0):,} configurations in {self.search_seconds:.2f} s: "
            f"{c.get('evaluated', 0):,} evaluated ({c.get('fit', 0):,} fit), "
            f"{c.get('bounded', 0):,} skipped by a lower bound",
        ]
        lines += [f"warning  {w}" for w in self.warnings]
        close = self.runners_up_within_band()
        if close:
            lines.append(f"band     {close} of the runners-up {'is' if close == 1 else 'are'} "
                         f"within the step time's ± {100 * (e.step_time_band or 0):.0f} % "
                         "band: the estimate cannot order them; time the closest on your "
                         "cluster before committing")
        if cfg.stage_layers:
            rec = cfg.stage_recompute_layers
            lines.append(f"stages   layers per pipeline stage {list(cfg.stage_layers)}"
                         + (f", fully recomputed {list(rec)}" if rec else ""))
        return lines

    def __repr__(self) -> str:
        """A few lines: what, where, the configuration and its prediction (the whole report
        is ``str(plan)`` / ``summary()``; the data ``to_dict()``)."""
        e = self.estimate
        config = self.config.describe() if isinstance(self.config, InferenceConfig) \
            else describe(self.config)
        step = f"step {e.step_time_s:.3f} s, " if isinstance(e, Estimate) and e.step_time_s \
            else ""
        return (f"Plan(model={self.model.name!r}, cluster='{self.cluster.num_gpus} x "
                f"{self.cluster.gpu.name}', config='{config}', {step}peak "
                f"{e.peak_memory_bytes / GIB:.1f} GiB per GPU)")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """Tables for Jupyter: the plan, its estimate, and the runners-up."""
        c = self.counts
        if isinstance(self.job, InferenceJob):
            return "<pre>" + html.escape(self.summary()) + "</pre>"
        head = [("model", f"{self.model.name} ({count(self.model.num_params())})"),
                ("cluster", f"{self.cluster.num_nodes} x {self.cluster.gpus_per_node} "
                 f"{self.cluster.gpu.name}"),
                ("job", f"{self.job.global_batch_size} x {self.job.seq_len} {self.job.unit}, "
                 f"{self.job.precision}, {self.job.framework}"),
                ("plan", describe(self.config)),
                ("searched", f"{c.get('space', 0):,} configurations in "
                 f"{self.search_seconds:.2f} s")]
        rows = [(describe(a.config) if a.config else "", a.verdict, a.reason)
                for a in self.alternatives if a.verdict != "invalid"][:12]
        out = "<h4>Plan</h4>" + _html_table(("", ""), head) + self.estimate._repr_html_()
        if rows:
            out += "<h4>Why not</h4>" + _html_table(("configuration", "verdict", "why"), rows)
        return out


class PlanInvalid(SpecError):
    """A saved plan whose configuration is not valid on its own cluster and job."""


def load_plan(source: str | Path, *, force: bool = False) -> tuple[Plan, list[str]]:
    """A saved plan, re-validated and re-estimated, and what to warn its user of.

    Raises ``Infeasible`` for a plan whose configuration no longer runs (``PlanInvalid``) or,
    unless ``force``, that does not fit its GPUs' memory or host memory; with ``force`` that
    becomes a warning. Warns too when the peak is above ``NEAR_CAPACITY`` of the GPU's memory
    and when the step time the file records is not this installation's estimate of it (an
    edited file, or an older cost model)."""
    try:
        p = Plan.from_json(source)
    except PlanInvalid as e:
        raise Infeasible(f"{_name(source)}: {e}") from e
    warnings = []
    est = p.estimate
    if isinstance(est, Estimate):
        if not est.fits:
            msg = (f"{_name(source)} does not fit: {est.peak_memory_bytes / GIB:.1f} GiB per "
                   f"GPU on stage {est.peak_stage} of {est.memory_capacity_bytes / GIB:.1f} GiB"
                   + (f", {est.cpu_memory_bytes / GIB:.1f} GiB offloaded per GPU of "
                      f"{est.host_memory_capacity_bytes / GIB:.1f} GiB of host memory"
                      if est.cpu_memory_bytes > est.host_memory_capacity_bytes else ""))
            if not force:
                raise Infeasible(f"{msg}; re-plan it ('planner plan'), or pass --force to use "
                                 "it anyway")
            warnings.append(f"{msg}; used anyway (--force)")
        elif est.near_capacity:
            share = est.peak_memory_bytes / est.memory_capacity_bytes
            warnings.append(f"{_name(source)} fills {100 * share:.0f}% of the GPU's memory: "
                            "allocator fragmentation and buffers the estimate does not count "
                            "may run it out of memory")
        recorded = _recorded_step(source)
        if recorded is not None and est.step_time_s and \
                abs(recorded / est.step_time_s - 1) > 1e-3:
            warnings.append(f"{_name(source)} records a step of {recorded:.3f} s; this "
                            f"installation estimates {est.step_time_s:.3f} s for its "
                            "configuration (the file was edited, or made by another version)")
    return p, warnings


def _is_text(source: str | Path) -> bool:
    """Whether ``source`` is a plan's JSON text rather than a file's path: a ``str`` that
    starts with ``{`` and names no file (a file called ``{x}.json`` is a file)."""
    return isinstance(source, str) and source.lstrip().startswith("{") and not is_file(source)


def _name(source: str | Path) -> str:
    return "the plan" if _is_text(source) else printable(source)


def _recorded_step(source: str | Path) -> float | None:
    """The step time a plan file records, if it is readable and has one."""
    try:
        text = str(source) if _is_text(source) else Path(source).read_text()
        d = json.loads(text)
        value = d["estimate"]["step_time_s"]
        return float(value) if isinstance(value, int | float) else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _constraints(value: Constraints | str | Mapping[str, Any] | None) -> Constraints:
    if value is None:
        return Constraints()
    if isinstance(value, Constraints):
        return value
    if isinstance(value, str):
        return Constraints.preset(value)
    if isinstance(value, Mapping):
        return Constraints.from_dict(value)
    raise SpecError(f"constraints must be a Constraints, a preset name or a dict, got "
                    f"{type(value).__name__}")


def plan(model: Any, cluster: Cluster, job: Job, *,
         constraints: Constraints | str | Mapping[str, Any] | None = None,
         top_k: int = 5, partition: bool = True,
         progress: Callable[[float], None] | None = None,
         example_inputs: Any = None, loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """The fastest configuration of ``job`` on ``cluster`` that fits in memory.

    ``model``: a ``ModelSpec``, a ``LayerCosts``, a ``LayerGraph`` or a ``torch.nn.Module``
    with ``example_inputs`` (one micro-batch of what its forward takes, or a function of the
    micro-batch size returning one). A module is traced on the meta device, each of its
    blocks costed per TP degree (``LayerCosts.from_graph``), and searched as a preset is,
    returning a ``Plan``: a pipeline stage holds a run of its layers, whatever their kinds
    (the blocks between its input and output sides, ``LayerCosts.layer_kinds``).
    ``loss_fn(output) -> scalar``: the loss a module's backward starts from, traced and
    costed with it (default ``costmodel.graph.training_loss``: the cross entropy over the
    output's last dim that ``planner run`` trains it with).

    ``constraints``: a ``Constraints``, a preset name (``planner.space.PRESETS``) or its dict
    form; ``constraints.frameworks`` searches several trainers. ``top_k``: how many
    configurations (the plan and its runners-up) to rank. ``partition``: let the stage DP
    (``planner.partition``) rebalance the layers (and recomputed layers) of the pipelined
    top configurations when that is faster than the uniform split. ``progress``: called with
    the fraction of the search done (0 to 1), e.g. a ``planner.progress.Progress`` bar.
    Deterministic: ties are broken by peak memory, then the trainer's order, then the
    configuration's columns ascending.
    Raises ``Infeasible`` when nothing fits, naming the memory or GPUs that would.
    """
    if not isinstance(model, ModelSpec | LayerCosts):
        return _plan_module(model, cluster, job, example_inputs, progress, constraints,
                            top_k, partition, loss_fn)
    for name, value, kind, what in (
            ("model", model, (ModelSpec, LayerCosts), "ModelSpec or LayerCosts"),
            ("cluster", cluster, Cluster, "Cluster"),
            ("job", job, (Job, InferenceJob), "Job or an InferenceJob")):
        if not isinstance(value, kind):
            raise SpecError(f"{name} must be a {what}, got {type(value).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise SpecError(f"top_k must be a whole number from 1 to {MAX_TOP_K} (each runner-up "
                        f"is estimated and explained again), got {top_k!r}")
    if isinstance(job, InferenceJob):
        from planner.inference import constraints_from, plan_inference

        if not isinstance(model, ModelSpec):
            raise SpecError("serving (an InferenceJob) plans a preset, config.json or "
                            "ModelSpec; a traced module is planned for training")
        return plan_inference(model, cluster, job, constraints=constraints_from(constraints),
                              top_k=top_k)
    cons = _constraints(constraints)
    ep = cons.fixed.get("ep", 1)
    if not model.is_moe and ep != 1:
        raise SpecError(f"ep={ep} needs a mixture-of-experts model; {model.name} is dense "
                        "(drop the expert-parallel constraint)")
    serving_only = sorted((set(cons.fixed) | set(cons.allowed) | set(cons.max))
                          - set(FIELDS))
    if serving_only:
        raise SpecError(f"constraint field(s) {', '.join(serving_only)} apply to serving "
                        f"(an InferenceJob); a training search takes {', '.join(FIELDS)}")
    check_fixed_degrees(cons, cluster)
    t0 = time.perf_counter()
    res = search(model, cluster, job, cons, top_k=top_k, progress=progress)
    if not res.top:
        raise infeasible(model, cluster, job, cons, res)
    best = res.top[0]
    chosen_job = res.jobs[best.framework]
    cfg = row_config(np.array(best.row), model)
    est = estimate(model, cluster, chosen_job, cfg)
    alternatives = lost_alternatives(res, plan_capacity(cluster, job))
    if partition:
        cfg, est, chosen_job, alternatives = _refine(model, cluster, res, cfg, est, chosen_job,
                                                     alternatives)
    return Plan(model=model, cluster=cluster, job=chosen_job, config=cfg, estimate=est,
                alternatives=alternatives, counts=dict(res.counts), constraints=cons,
                search_seconds=time.perf_counter() - t0)


def _plan_module(model: Any, cluster: Cluster, job: Job, example_inputs: Any,
                 progress: Callable[[float], None] | None, constraints: Any, top_k: int,
                 partition: bool, loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """A torch module (or its ``LayerGraph``): traced on one micro-batch, each distinct block
    sharded per TP degree (``LayerCosts.from_graph``, with and without sequence
    parallelism), then the one search (``plan`` of its ``LayerCosts``) over both."""

    graph = _traced(model, cluster, job, example_inputs, loss_fn)
    costs = LayerCosts.from_graph(graph, cluster, job, sequence_parallel="both")
    if _autocast_searched(model, job, _constraints(constraints)):
        try:
            costs = costs.with_autocast(
                _traced_under_autocast(model, job, example_inputs, loss_fn), cluster, job)
        except SpecError as e:
            import warnings

            warnings.warn(f"{graph.name} could not be costed under torch.autocast ({e}); "
                          "the configurations a trainer runs so (torchtitan's DDP: ZeRO 0 "
                          "without TP, PP or CP) are costed from its bf16 trace, which omits "
                          "the casts (constrain --zero to avoid them)", stacklevel=3)
    return plan(costs, cluster, job, constraints=constraints, top_k=top_k,
                partition=partition, progress=progress)


def _traced(model: Any, cluster: Cluster, job: Job, example_inputs: Any,
            loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """The ``LayerGraph`` ``plan`` reads for a module: ``model`` itself if it is one, else
    the module traced on one micro-batch of ``example_inputs`` (called with 1 when it is a
    function of the micro-batch size) in the job's precision, its backward from ``loss_fn``
    (default ``training_loss``)."""
    from costmodel.graph import LayerGraph, training_loss

    if not isinstance(cluster, Cluster):
        raise SpecError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    if not isinstance(job, Job):
        raise SpecError(f"job must be a training Job for a torch module, got "
                        f"{type(job).__name__}")
    if isinstance(model, LayerGraph):
        graph = model
    else:
        if not hasattr(model, "named_parameters"):
            raise SpecError(f"model must be a ModelSpec, a LayerCosts, a LayerGraph or a "
                            f"torch nn.Module, got {type(model).__name__}")
        if example_inputs is None:
            raise SpecError("planning a torch module needs example_inputs=: one micro-batch "
                            "of what its forward takes, or a function of the micro-batch "
                            "size returning one")
        inputs = example_inputs(1) if callable(example_inputs) else example_inputs
        graph = LayerGraph.from_module(model, inputs, dtype=trace_dtype(job),
                                       loss_fn=loss_fn or training_loss)
    if not graph.num_params():
        raise SpecError(f"{graph.name} has no parameters: training it has nothing to update "
                        "and nothing to split; plan the module that holds its weights")
    shape = graph.inputs[0] if graph.inputs else ()
    if job.seq_len > 1 and tuple(shape[1:2]) != (job.seq_len,):
        if len(shape) == 2:
            raise SpecError(f"the example inputs hold sequences of {shape[1]} tokens but the "
                            f"job trains {job.seq_len}; trace the job's sequence length")
        # The costs come from the trace alone; a sequence length other than the inputs' own
        # would only relabel the throughput (samples x seq_len "tokens"), a number nothing
        # measured. Sequences of vectors [batch, seq, ...] count their seq tokens.
        raise SpecError(f"the example inputs ({'x'.join(map(str, shape)) or 'none'}) are not "
                        f"sequences of {job.seq_len} tokens ([batch, seq] token ids or "
                        "[batch, seq, ...] vectors): a module fed other inputs is costed from "
                        "its trace; leave the sequence length at 1 (seq_len=1; on the "
                        "command line, no --seq-len) and its throughput counts samples")
    return graph


def _autocast_searched(model: Any, job: Job, cons: Constraints) -> bool:
    """Whether a searched trainer trains some rows under ``torch.autocast`` (torchtitan's
    DDP: ``costmodel.compute.autocast_rows``) and ``model`` is a module to trace so (a
    ``LayerGraph`` given is planned as traced)."""
    from costmodel.frameworks import framework
    from costmodel.graph import LayerGraph

    names = cons.frameworks or (job.framework,)
    return not isinstance(model, LayerGraph) and job.precision in ("bf16", "fp16") \
        and any(framework(n).autocast_ddp for n in names)


def _traced_under_autocast(model: Any, job: Job, example_inputs: Any,
                           loss_fn: Callable[[Any], Any] | None) -> Any:
    """The module traced as ``torch.autocast`` runs it: fp32 parameters, matmuls in the
    job's precision."""
    import torch

    from costmodel.graph import LayerGraph, training_loss

    inputs = example_inputs(1) if callable(example_inputs) else example_inputs
    return LayerGraph.from_module(model, inputs, dtype=torch.float32,
                                  autocast=trace_dtype(job), loss_fn=loss_fn or training_loss)


def trace_dtype(job: Job) -> Any:
    """The torch dtype a module is traced in: the job's precision (fp8 runs its matmuls on
    bf16 activations)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16}.get(job.precision, torch.bfloat16)


def _refine(model: ModelSpec | LayerCosts, cluster: Cluster, res: SearchResult, cfg: ParallelConfig,
            est: Estimate, job: Job, alternatives: tuple[Alternative, ...]
            ) -> tuple[ParallelConfig, Estimate, Job, tuple[Alternative, ...]]:
    """Give the pipelined configurations among the top ones a non-uniform stage partition
    (``planner.partition``; per-stage recompute counts when they recompute fully) and keep
    the fastest result; the uniform split it replaced becomes a runner-up."""
    uniform_s = est.step_time_s
    assert uniform_s is not None  # estimate() always times the step
    best = (uniform_s, cfg, est, job)
    for f in res.top:
        c = row_config(np.array(f.row), model)
        if c.pp < 2 or c.virtual_pipeline_stages > 1:
            continue
        j = res.jobs[f.framework]
        costs = stage_costs(model, cluster, j, c)
        part = partition_stages(costs, model.num_layers, plan_capacity(cluster, j),
                         per_stage=c.recompute == "full")
        if part is None:
            continue
        c2 = part.apply(c)
        e2 = estimate(model, cluster, j, c2)
        step2 = e2.step_time_s
        assert step2 is not None  # estimate() always times the step
        if e2.fits and e2.within_reserve and step2 < best[0]:
            best = (step2, c2, e2, j)
    if best[1] is cfg:
        return cfg, est, job, alternatives
    uniform = Alternative(
        framework=job.framework, config=cfg, verdict="slower",
        reason=f"the uniform stage split: slower by "
        f"{100 * (uniform_s / best[0] - 1):.1f}% than the partition the stage DP "
        f"found", step_time_s=uniform_s, peak_memory_bytes=est.peak_memory_bytes)
    return best[1], best[2], best[3], (uniform, *alternatives)

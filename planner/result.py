"""``Plan``: the answer of a search as data. It holds the model (a preset or a traced module's
``LayerCosts``), the cluster, the job, the chosen configuration, its estimate and what
lost and why; ``to_json()`` writes it and ``Plan.from_json()`` / ``load_plan`` read it back and
re-estimate the configuration without searching, reproducing the same numbers.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.estimate import (
    NEAR_CAPACITY,
    Estimate,
    _html_table,
    estimate,
)
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.moe import routing_words
from costmodel.formulas.steptime import host_words
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import (
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    estimate_inference,
)
from costmodel.units import GIB
from hardware_profiles.files import is_file, loads_json, printable, read_text, write_text
from planner.advice import (
    idle_warning,
    position_warning,
    serving_warnings,
)
from planner.alternatives import (
    Alternative,
    describe,
    layer_list,
    params_text,
)
from planner.space import Constraints

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
        if getattr(self.model, "is_moe", False):
            lines.append(f"routing  {routing_words(job)}")
        host = host_words(e.time_breakdown_s)
        if host:
            lines.append(f"host     {host}")
        lines += [f"warning  {w}" for w in self.warnings]
        close = self.runners_up_within_band()
        if close:
            lines.append(f"band     {close} of the runners-up {'is' if close == 1 else 'are'} "
                         f"within the step time's ± {100 * (e.step_time_band or 0):.0f} % "
                         "band: the estimate cannot order them; time the closest on your "
                         "cluster before committing")
        if cfg.stage_layers:
            rec = cfg.stage_recompute_layers
            what = "chunk (virtual order)" if cfg.chunk_layers else "stage"
            lines.append(f"stages   layers per pipeline {what} {layer_list(cfg.stage_layers)}"
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
        head = [("model", f"{self.model.name} ({params_text(self.model)})"),
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

"""``compare()``: several configurations or clusters side by side.

Each candidate is a (cluster, configuration) pair: a configuration given by the user is
estimated, a missing one is searched for (``plan``). A candidate that cannot run (a degree
that does not divide, nothing fits) stays in the table with the reason, so one bad column
does not hide the others.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.config import SCHEDULES, Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.estimate import Estimate, _html_table, estimate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import GIB
from planner.plan import describe, plan
from planner.space import Constraints

__all__ = ["RANKINGS", "Candidate", "Comparison", "compare", "parse_config"]

#: How ``Comparison.ranked`` orders candidates: tokens/s, or dollars per million tokens.
RANKINGS = ("throughput", "cost")

# Keys ``parse_config`` reads: the short names ``describe`` writes, and the field names.
_KEYS = {
    "dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp", "zero": "zero_stage",
    "zero_stage": "zero_stage", "shard": "sharding_group", "sharding_group": "sharding_group",
    "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
    "mbs": "micro_batch_size", "micro_batch_size": "micro_batch_size",
    "schedule": "pipeline_schedule", "pipeline_schedule": "pipeline_schedule",
    "v": "virtual_pipeline_stages", "virtual_pipeline_stages": "virtual_pipeline_stages",
    "recompute": "recompute", "recompute_num_layers": "recompute_num_layers",
    "offload": "offload", "stage_layers": "stage_layers",
    "stage_recompute_layers": "stage_recompute_layers",
}
_TEXT = ("pipeline_schedule", "recompute", "offload")
_LISTS = ("stage_layers", "stage_recompute_layers")


def parse_config(text: str, num_gpus: int | None = None) -> ParallelConfig:
    """A configuration from its one-line form, as ``planner.plan.describe`` writes it:
    ``"tp=8 pp=4 zero=1 sp mbs=2 recompute=selective interleaved-1f1b v=2"``.

    Keys: ``dp tp pp cp ep zero shard sp mbs v recompute recompute_num_layers offload
    schedule stage_layers`` (or the ``ParallelConfig`` field names); ``sp`` alone turns
    sequence parallel on (``sp=off`` off); a schedule name alone sets the schedule. Items are
    separated by spaces or commas. Without ``dp``, it is ``num_gpus / (tp * pp * cp)``.
    """
    fields = _fields(text)
    if "dp" not in fields:
        rest = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
        if num_gpus is None:
            raise SpecError(f"configuration {text!r} has no dp; add dp=N")
        if num_gpus % rest:
            raise SpecError(f"configuration {text!r}: tp*pp*cp = {rest} does not divide the "
                            f"{num_gpus} GPUs; change the degrees or add dp=N")
        fields["dp"] = num_gpus // rest
    return ParallelConfig(**fields)


def _fields(text: str) -> dict[str, Any]:
    """The fields a configuration's one-line form sets (syntax only)."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError("a configuration is empty; write it as e.g. 'tp=8 pp=4 zero=1'")
    # Lists such as stage_layers=[10, 10] hold separators: protect them before splitting.
    flat = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "").replace(",", ";"),
                  text)
    fields: dict[str, Any] = {}
    for item in re.split(r"[\s,]+", flat.strip()):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq:
            if key in SCHEDULES:
                key, value = "schedule", key
            elif key == "sp":
                value = "on"
            else:
                raise SpecError(f"configuration item {item!r} is not KEY=VALUE; keys: "
                                f"{', '.join(sorted(set(_KEYS)))}")
        if key not in _KEYS:
            raise SpecError(f"configuration key {key!r} is unknown; use one of "
                            f"{', '.join(sorted(set(_KEYS)))}")
        name = _KEYS[key]
        if name in fields:
            raise SpecError(f"configuration {text!r} sets {key} twice")
        fields[name] = _value(name, value, item)
    return fields


def _value(name: str, value: str, item: str) -> Any:
    """One value of ``parse_config``, typed for its field."""
    if name == "sequence_parallel":
        if value.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise SpecError(f"configuration item {item!r}: sp is on or off")
        return value.lower() in ("on", "true", "1")
    if name in _TEXT:
        return value
    if name in _LISTS:
        inner = value.strip()
        if not (inner.startswith("[") and inner.endswith("]")):
            raise SpecError(f"configuration item {item!r}: write a list as [8,8,8]")
        try:  # NxK: N repeated K times (planner.alternatives.layer_list)
            return tuple(int(n) for x in inner[1:-1].split(";") if x
                         for n, _, k in (x.partition("x"),) for _ in range(int(k or 1)))
        except ValueError:
            raise SpecError(f"configuration item {item!r}: the list holds integers (or NxK "
                            "for N repeated K times)") from None
    try:
        return int(value)
    except ValueError:
        raise SpecError(f"configuration item {item!r}: {name} is an integer") from None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One column of a comparison. ``searched``: the configuration came from ``plan`` (the
    fastest that fits) rather than from the user. ``error``: why the candidate has no
    estimate (invalid configuration, or nothing fits), else ``None``."""

    label: str
    cluster: Cluster
    job: Job
    config: ParallelConfig | None
    estimate: Estimate | None
    searched: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form, with ``config`` and ``estimate`` keys (``None`` on
        error)."""
        c = self.cluster
        return {"label": self.label, "searched": self.searched, "error": self.error,
                "framework": self.job.framework,
                "cluster": {"gpu": c.gpu.name, "num_nodes": c.num_nodes,
                            "gpus_per_node": c.gpus_per_node,
                            "inter_node_link": c.inter_link.name,
                            "nics_per_node": c.nics_per_node},
                "config": self.config.to_dict() if self.config else None,
                "estimate": self.estimate.to_dict() if self.estimate else None}


@dataclass(frozen=True)
class Comparison:
    """Candidates side by side; ``rows()`` gives the table, the first that runs is the
    reference for the speed-up column."""

    model: ModelSpec | LayerCosts
    candidates: tuple[Candidate, ...]

    def ranked(self, by: str = "throughput") -> Comparison:
        """The candidates best first: by ``"throughput"`` (tokens/s, for the whole cluster)
        or ``"cost"`` (US dollars per million tokens at the GPU profiles' rental prices;
        unpriced candidates after the priced ones). Candidates that cannot run go last; ties
        keep the given order."""
        if by not in RANKINGS:
            raise SpecError(f"rank by {by!r}: choose {' or '.join(RANKINGS)}")

        def key(c: Candidate) -> tuple[int, float]:
            e = c.estimate
            if e is None or not e.fits or not e.tokens_per_s:
                return (2, 0.0)
            if by == "cost":
                cost = e.usd_per_million_tokens
                return (0, cost) if cost is not None else (1, -e.tokens_per_s)
            return (0, -e.tokens_per_s)

        return Comparison(model=self.model, candidates=tuple(sorted(self.candidates, key=key)))

    def rows(self) -> list[dict[str, str]]:
        """One dict of formatted cells per candidate (what the text and HTML tables show);
        the ``$/Mtok`` column (US dollars per million tokens) appears when a GPU profile of
        the comparison has a price. A comparison of samples jobs (``Job.unit``) counts
        samples: ``samples/s``, ``smp/s/GPU``, ``$/Msmp``."""
        ref = next((c.estimate for c in self.candidates if c.estimate is not None), None)
        priced = any(c.cluster.gpu.usd_per_gpu_hour is not None for c in self.candidates)
        # What the throughput counts: samples where every candidate's job does (an image
        # model traced from a module, Job.unit), else tokens.
        samples = all(c.job.unit == "samples" for c in self.candidates)
        per_s, per_gpu, per_usd = (("samples/s", "smp/s/GPU", "$/Msmp") if samples
                                   else ("tokens/s", "tok/s/GPU", "$/Mtok"))
        out = []
        for c in self.candidates:
            e, cl = c.estimate, c.cluster
            row = {"candidate": c.label,
                   "GPUs": f"{cl.num_gpus} {cl.gpu.name}",
                   "inter-node": f"{cl.nics_per_node} x {cl.inter_link.name}"
                                 if cl.num_nodes > 1 else "- (one node)"}
            if e is None:
                row.update({"step": "-", per_s: "-", per_gpu: "-", "MFU": "-",
                            "memory": "-", "vs first": "-", "config": c.error or ""})
            else:
                assert e.step_time_s is not None and ref is not None \
                    and ref.step_time_s is not None
                close = e is not ref and e.within_band(ref)
                row.update({
                    "step": e.step_time_text,
                    per_s: f"{e.tokens_per_s:,.0f}",
                    per_gpu: f"{(e.tokens_per_s or 0) / cl.num_gpus:,.0f}",
                    "MFU": f"{100 * (e.mfu or 0):.1f}%",
                    "memory": f"{e.peak_memory_bytes / GIB:.1f}/"
                              f"{e.memory_capacity_bytes / GIB:.1f} GiB"
                              + ("" if e.fits else " NO FIT"),
                    "vs first": f"{ref.step_time_s / e.step_time_s:.2f}x"
                                + (" ~" if close else ""),
                    # A searched candidate is marked, unless its label says so already.
                    "config": ("plan: " if c.searched and c.label != "plan" else "")
                              + describe(e.config)
                              + f" ({c.job.framework})"})
            if priced:
                cost = e.usd_per_million_tokens if e is not None else None
                row[per_usd] = "-" if cost is None else f"{cost:.3f}"
                row["config"] = row.pop("config")  # keeps the config last
            out.append(row)
        return out

    def table(self) -> str:
        """The comparison as an aligned text table."""
        rows = self.rows()
        keys = list(rows[0]) if rows else []
        width = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys if k != "config"}
        lines = ["  ".join(k.ljust(width[k]) if k == "candidate" else k.rjust(width[k])
                           for k in width)]
        for r in rows:
            lines.append("  ".join(r[k].ljust(width[k]) if k == "candidate" else
                                   r[k].rjust(width[k]) for k in width))
        lines.append("")
        lines += [f"{r['candidate']}: {r['config']}" for r in rows]
        if any(r["vs first"].endswith("~") for r in rows):
            lines += ["", "~: within the first's step-time band (the estimates' likely error, "
                      "from published runs like it): the estimate cannot tell which is faster"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form: ``model`` and ``candidates``."""
        return {"model": {"name": self.model.name, "num_params": self.model.num_params()},
                "candidates": [c.to_dict() for c in self.candidates]}

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        rows = self.rows()
        keys = tuple(rows[0]) if rows else ()
        return _html_table(keys, [tuple(r[k] for k in keys) for r in rows])


def _cluster_label(c: Cluster) -> str:
    gpus = f"{c.num_gpus}x{c.gpu.name}"
    return f"{gpus}/{c.nics_per_node}x{c.inter_link.name}" if c.num_nodes > 1 else gpus


def compare(model: ModelSpec, clusters: Cluster | Sequence[Cluster], job: Job,
            configs: Sequence[ParallelConfig | str | None] = (None,), *,
            constraints: Constraints | str | dict[str, Any] | None = None,
            progress: Callable[[float], None] | None = None) -> Comparison:
    """Every (cluster, configuration) pair side by side.

    ``clusters``: one or several; ``configs``: each a ``ParallelConfig``, its one-line form
    (``parse_config``; without ``dp`` it adapts to each cluster) or ``None`` for the plan the
    search finds under ``constraints``. Candidates that cannot run keep their reason in
    ``Candidate.error``. Raises ``SpecError`` for a malformed configuration string.
    """
    cl = [clusters] if isinstance(clusters, Cluster) else list(clusters)
    if not cl:
        raise SpecError("compare needs at least one cluster")
    if not configs:
        raise SpecError("compare needs at least one configuration (None: search for a plan)")
    for c in cl:
        if not isinstance(c, Cluster):
            raise SpecError(f"clusters must be Cluster objects, got {type(c).__name__}")
    for k in configs:
        if isinstance(k, str):
            _fields(k)  # a typo is the user's to fix now, not a column of the table
    pairs = [(c, k) for c in cl for k in configs]
    many_clusters = len({_cluster_label(c) for c in cl}) > 1
    out = []
    for i, (c, k) in enumerate(pairs):
        tag = k if isinstance(k, str) else describe(k) if isinstance(k, ParallelConfig) \
            else "plan"
        label = f"{_cluster_label(c)}: {tag}" if many_clusters else tag
        if len(configs) == 1 and many_clusters:
            label = _cluster_label(c)
        out.append(_candidate(model, c, job, k, label, constraints))
        if progress is not None:
            progress((i + 1) / len(pairs))
    return Comparison(model=model, candidates=tuple(out))


def _candidate(model: ModelSpec, cluster: Cluster, job: Job,
               config: ParallelConfig | str | None, label: str,
               constraints: Constraints | str | dict[str, Any] | None) -> Candidate:
    try:
        if config is None:
            p = plan(model, cluster, job, constraints=constraints, top_k=1)
            return Candidate(label=label, cluster=cluster, job=p.job, config=p.config,
                             estimate=p.estimate, searched=True)
        cfg = parse_config(config, cluster.num_gpus) if isinstance(config, str) else config
        return Candidate(label=label, cluster=cluster, job=job, config=cfg,
                         estimate=estimate(model, cluster, job, cfg), searched=False)
    except Infeasible as e:
        return Candidate(label=label, cluster=cluster, job=job, config=None, estimate=None,
                         searched=config is None, error=f"infeasible: {e}")
    except SpecError as e:
        return Candidate(label=label, cluster=cluster, job=job, config=None, estimate=None,
                         searched=config is None, error=f"invalid: {e}")

"""Search for serving: tensor and pipeline parallel degrees, replicas, weight precision and
batch that meet the job's target, as a ``Plan`` with its runners-up and why the rest lost.

The space: every ``tp`` dividing the GPUs of a node (and the heads; the KV heads are split or
replicated), every ``pp`` up to the layers and the GPUs, ``replicas = GPUs // (tp * pp)``
copies (all the GPUs serve unless the constraints fix fewer), each weight precision the job
allows, and batches: the job's, or 1 for the ``latency`` objective, or for ``throughput``
every power of two up to the largest batch that fits the context, and that largest batch.
Validity is data (``RULES``), as for training. The whole space is evaluated in one pass of the
vectorized model (``costmodel.serving.inference.inference_table``), so the search is exact: it
equals
brute force over ``estimate_inference`` (``tests/test_inference.py``).

Ranking: configurations that fit and meet ``max_ttft_s`` / ``max_tpot_s``, by request latency
(``latency``) or by output tokens/s of all replicas (``throughput``); ties go to the higher
throughput (or lower latency), then less memory, then the wider weight format, then smaller
degrees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from costmodel.errors import Infeasible, SpecError
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import (
    WEIGHT_PRECISIONS,
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    InferenceTable,
    compute_dtype,
    estimate_inference,
    inference_table,
    weight_bytes_per_element,
)
from costmodel.units import GIB
from planner.advice import nothing_fits
from planner.alternatives import Alternative, Choice, Option
from planner.result import Plan
from planner.search import nodes_of
from planner.space import INFERENCE_FIELDS, Constraints, Rejections

__all__ = ["RULES", "InferenceSearch", "explain_inference",
           "plan_inference", "search_inference"]

MAX_SEARCH_BATCH = 4096

#: Rule name -> what it requires (the sentence a user reads when it rejects a value).
RULES: dict[str, str] = {
    "tp_node": "tensor parallel stays inside a node or NVLink domain: tp divides its GPUs",
    "tp_heads": "tp divides the attention heads, and divides or is a multiple of the KV heads",
    "tp_ffn": "tp divides the MLP (and expert MLP) hidden size",
    "pp_layers": "a pipeline stage holds at least one layer: pp <= layers",
    "gpus": "a replica's tp * pp GPUs fit in the cluster",
    "replicas": "replicas * tp * pp GPUs fit in the cluster",
    "dtype": "the GPU has the math the weight format runs in",
    "constraint": "excluded by the constraints given",
}
#: How each time term reads in a reason.
TERM_LABELS = {"compute": "compute and HBM reads", "tp_comm": "tensor-parallel all-reduces",
               "pp_comm": "pipeline hand-offs"}


@dataclass
class InferenceSearch:
    """Every configuration evaluated (``configs`` and their ``table``), which are
    ``feasible`` (fit and meet the bounds), the ranking ``order`` of the feasible ones (best
    first), ``rejected``: rule -> (values rejected, an example), and ``counts``."""

    configs: list[InferenceConfig]
    table: InferenceTable | None
    feasible: np.ndarray
    order: np.ndarray
    rejected: dict[str, tuple[int, str]]
    counts: dict[str, int]


def _check_constraints(cons: Constraints) -> None:
    named = set(cons.fixed) | set(cons.allowed) | set(cons.max)
    wrong = sorted(named - set(INFERENCE_FIELDS))
    if wrong:
        raise SpecError(f"constraint field(s) {', '.join(wrong)} apply to training; an "
                        f"inference search takes {', '.join(INFERENCE_FIELDS)}")
    if cons.frameworks is not None:
        raise SpecError("constraints name training frameworks; an inference search has none "
                        "(emit for a serving engine with 'planner emit --target vllm')")


def _tensor_parallel_degrees(model: ModelSpec, cluster: Cluster, cons: Constraints,
                             reject: Callable[[str, str], None]) -> list[int]:
    """The valid tensor-parallel degrees: dividing the GPUs of a scale-up domain, the
    attention heads (and the KV heads, or a multiple of them), and every MLP width; allowed
    by ``cons``."""
    g = cluster.scale_up
    kv = int(model.num_kv_heads or model.num_heads)
    ffns = [int(model.ffn_hidden_size or 0)] + ([int(model.moe_ffn_hidden_size or 0)]
                                                 if model.is_moe else [])
    tps = []
    for tp in range(1, g + 1):
        if g % tp:
            reject("tp_node", f"tp={tp}")
        elif model.num_heads % tp or (kv % tp and tp % kv):
            reject("tp_heads", f"tp={tp}")
        elif any(f % tp for f in ffns):
            reject("tp_ffn", f"tp={tp}")
        elif not cons.allows("tp", tp):
            reject("constraint", f"tp={tp}")
        else:
            tps.append(tp)
    return tps


def _weight_precisions(cluster: Cluster, job: InferenceJob, cons: Constraints,
                       reject: Callable[[str, str], None]) -> list[str]:
    """The job's weight precisions whose math the GPU has, allowed by ``cons``."""
    precisions = []
    for p in job.weight_precisions:
        dtype = compute_dtype(cluster.gpu, job, p)
        if not cluster.gpu.supports(dtype):
            reject("dtype", f"{p} ({dtype} on {cluster.gpu.name})")
        elif not cons.allows("weight_precision", p):
            reject("constraint", f"weight_precision={p}")
        else:
            precisions.append(p)
    return precisions


def _pipeline_degrees(model: ModelSpec, cluster: Cluster, tp: int, cons: Constraints,
                      reject: Callable[[str, str], None]) -> Iterator[int]:
    """The valid pipeline degrees beside tensor parallel ``tp``: at most the layers and the
    GPUs left, allowed by ``cons``. Lazily, so that the rejections of each degree are
    recorded in the order the search meets them (``Rejections`` keeps the first example)."""
    for pp in range(1, cluster.num_gpus // tp + 1):
        if pp > model.num_layers:
            reject("pp_layers", f"pp={pp}")
        elif not cons.allows("pp", pp):
            reject("constraint", f"pp={pp}")
        else:
            yield pp


def _replica_counts(cluster: Cluster, tp: int, pp: int, cons: Constraints,
                    reject: Callable[[str, str], None]) -> list[int]:
    """The valid replica counts of a ``tp`` x ``pp`` mesh: the fixed count of ``cons``, or
    as many as the GPUs hold; their GPUs fit the cluster and ``cons`` allows them."""
    n = cluster.num_gpus
    fixed = cons.fixed.get("replicas")
    reps = [fixed] if fixed is not None else [n // (tp * pp)]
    out = []
    for r in reps:
        if r * tp * pp > n:
            reject("replicas", f"replicas={r} with tp={tp} pp={pp}")
        elif not cons.allows("replicas", r):
            reject("constraint", f"replicas={r}")
        else:
            out.append(r)
    return out


def _meshes(model: ModelSpec, cluster: Cluster, job: InferenceJob, cons: Constraints,
            rej: Rejections) -> list[tuple[int, int, int, str]]:
    """Valid (tp, pp, replicas, precision) tuples; what each rule rejected goes to ``rej``."""
    reject = rej.add
    tps = _tensor_parallel_degrees(model, cluster, cons, reject)
    precisions = _weight_precisions(cluster, job, cons, reject)
    out = []
    for tp in tps:
        for pp in _pipeline_degrees(model, cluster, tp, cons, reject):
            for r in _replica_counts(cluster, tp, pp, cons, reject):
                out += [(tp, pp, r, p) for p in precisions]
    return out


def _table(model: ModelSpec, cluster: Cluster, job: InferenceJob,
           rows: Sequence[tuple[int, int, int, int, str]]) -> InferenceTable:
    a = np.array([r[:4] for r in rows], dtype=float).reshape(-1, 4)
    prec = np.array([WEIGHT_PRECISIONS.index(r[4]) for r in rows], dtype=int)
    return inference_table(model, cluster, job, a[:, 0], a[:, 1], a[:, 2], a[:, 3], prec)


def search_inference(model: ModelSpec, cluster: Cluster, job: InferenceJob,
                     cons: Constraints | None = None) -> InferenceSearch:
    """Evaluate every valid serving configuration of ``job`` under ``cons``."""
    cons = cons or Constraints()
    _check_constraints(cons)
    if model.causal is False or model.patch_size or model.num_token_types:
        raise SpecError(f"inference planning covers decoder-only language models; "
                        f"{model.name} is an encoder")
    rej = Rejections()
    meshes = _meshes(model, cluster, job, cons, rej)
    fixed_b = cons.fixed.get("batch_size", job.batch_size)
    rows: list[tuple[int, int, int, int, str]] = []
    if meshes and fixed_b is None and job.objective == "throughput":
        probe = _table(model, cluster, job, [(*m[:3], 1, m[3]) for m in meshes])
        cap = cons.max.get("batch_size", MAX_SEARCH_BATCH)
        for m, most in zip(meshes, probe.max_batch, strict=True):
            top = int(min(max(most, 1), cap))
            sizes = sorted({2**k for k in range(top.bit_length()) if 2**k <= top} | {top})
            rows += [(*m[:3], b, m[3]) for b in sizes if cons.allows("batch_size", b)]
    else:
        b = fixed_b if fixed_b is not None else 1
        if not cons.allows("batch_size", b):
            rej.add("constraint", f"batch_size={b}")
        else:
            rows = [(*m[:3], b, m[3]) for m in meshes]
    configs = [InferenceConfig(tp=r[0], pp=r[1], replicas=r[2], batch_size=r[3],
                               weight_precision=r[4]) for r in rows]
    counts = {"space": len(rows), "evaluated": len(rows)}
    rejected = {k: (int(v[0]), str(v[1])) for k, v in rej.counts.items()}
    if not rows:
        counts.update(fit=0, feasible=0)
        return InferenceSearch(configs=[], table=None, feasible=np.zeros(0, bool),
                               order=np.zeros(0, int), counts=counts, rejected=rejected)
    t = _table(model, cluster, job, rows)
    fits = t.fits
    ok = fits.copy()
    if job.max_ttft_s is not None:
        ok &= t.ttft <= job.max_ttft_s
    if job.max_tpot_s is not None:
        ok &= t.tpot <= job.max_tpot_s
    idx = np.flatnonzero(ok)
    wp = np.array([WEIGHT_PRECISIONS.index(r[4]) for r in rows])
    a = np.array([r[:4] for r in rows], dtype=float)
    primary, secondary = ((t.latency, -t.tokens_per_s) if job.objective == "latency"
                          else (-t.tokens_per_s, t.latency))
    # np.lexsort sorts by the last key first.
    keys = (a[idx, 2], a[idx, 3], a[idx, 1], a[idx, 0], wp[idx], t.peak[idx], secondary[idx],
            primary[idx])
    order = idx[np.lexsort(keys)]
    counts.update(fit=int(fits.sum()), feasible=int(ok.sum()))
    return InferenceSearch(configs=configs, table=t, feasible=ok, order=order, counts=counts,
                           rejected=rejected)


def _metric(job: InferenceJob, t: InferenceTable, i: int) -> float:
    return float(t.latency[i]) if job.objective == "latency" else float(t.tokens_per_s[i])


def _why_worse(job: InferenceJob, best: InferenceEstimate, t: InferenceTable, i: int) -> str:
    """Why row ``i`` lost to ``best``: by how much on the objective, and what grew."""
    if job.objective == "latency":
        pct = 100.0 * (float(t.latency[i]) / best.latency_s - 1.0)
        if pct < 0.05:
            return "as fast within 0.05%; ranked after the plan by the stated tie order"
        d_ttft = float(t.ttft[i]) - best.ttft_s
        d_dec = (job.output_len - 1) * (float(t.tpot[i]) - best.tpot_s)
        diff = {k: float(t.decode_terms[k][i]) - best.decode_terms[k]
                for k in TERM_LABELS}
        worst = max(diff, key=lambda k: (diff[k], k))
        where = (f"time per output token +{1e3 * (float(t.tpot[i]) - best.tpot_s):.2f} ms, "
                 f"mostly {TERM_LABELS[worst]}" if d_dec >= d_ttft else
                 f"first token +{1e3 * d_ttft:.0f} ms")
        return f"slower by {pct:.1f}% ({1e3 * (float(t.latency[i]) - best.latency_s):.0f} " \
               f"ms a request): {where}"
    pct = 100.0 * (1.0 - float(t.tokens_per_s[i]) / best.tokens_per_s)
    if pct < 0.05:
        return "as much throughput within 0.05%; ranked after the plan by the stated tie order"
    return (f"{pct:.1f}% less throughput ({float(t.tokens_per_s[i]):,.0f} vs "
            f"{best.tokens_per_s:,.0f} tokens/s), {1e3 * float(t.tpot[i]):.1f} ms per output "
            f"token")


def _bound_miss(job: InferenceJob, t: InferenceTable, i: int) -> str:
    parts = []
    if job.max_ttft_s is not None and t.ttft[i] > job.max_ttft_s:
        parts.append(f"first token {1e3 * float(t.ttft[i]):.0f} ms over the bound "
                     f"{1e3 * job.max_ttft_s:.0f} ms")
    if job.max_tpot_s is not None and t.tpot[i] > job.max_tpot_s:
        parts.append(f"{1e3 * float(t.tpot[i]):.1f} ms per output token over the bound "
                     f"{1e3 * job.max_tpot_s:.1f} ms")
    return "; ".join(parts)


def _alternatives(job: InferenceJob, res: InferenceSearch, best: InferenceEstimate,
                  top_k: int) -> tuple[Alternative, ...]:
    """Runners-up, then the best of every other (tp, pp, precision), then invalid rules."""

    t = res.table
    assert t is not None
    cap = t.capacity
    out: list[Alternative] = []

    def alt(i: int, verdict: str, reason: str) -> Alternative:
        return Alternative(framework="inference", config=res.configs[i], verdict=verdict,
                           reason=reason, step_time_s=float(t.latency[i]),
                           peak_memory_bytes=float(t.peak[i]))

    shown = set(int(i) for i in res.order[:top_k])
    out += [alt(int(i), "slower", _why_worse(job, best, t, int(i)))
            for i in res.order[1:top_k]]
    groups: dict[tuple[int, int, str], list[int]] = {}
    for i, c in enumerate(res.configs):
        groups.setdefault((c.tp, c.pp, c.weight_precision), []).append(i)
    ranked = {int(i): r for r, i in enumerate(res.order)}
    rows: list[tuple[int, float, Alternative]] = []
    for members in groups.values():
        good = [i for i in members if i in ranked]
        if good:
            i = min(good, key=ranked.__getitem__)
            if i not in shown:
                rows.append((0, ranked[i], alt(i, "slower", _why_worse(job, best, t, i))))
            continue
        fit = [i for i in members if t.peak[i] <= cap]
        if fit:
            i = min(fit, key=lambda j: (-_metric(job, t, j) if job.objective == "throughput"
                                        else _metric(job, t, j)))
            rows.append((1, float(t.latency[i]), alt(i, "misses the bound",
                                                      _bound_miss(job, t, i))))
        else:
            i = min(members, key=lambda j: float(t.peak[j]))
            rows.append((2, float(t.peak[i]), alt(
                i, "does not fit", f"needs {float(t.peak[i]) / GIB:.1f} GiB per GPU on stage "
                f"{int(t.peak_stage[i])}, {(float(t.peak[i]) - cap) / GIB:.1f} GiB over the "
                f"{cap / GIB:.1f} GiB")))
    rows.sort(key=lambda r: (r[0], r[1]))
    out += [r[2] for r in rows]
    for rule, (n, example) in sorted(res.rejected.items()):
        out.append(Alternative(framework="inference", config=None, verdict="invalid",
                               reason=f"{n} value(s) such as {example}: {RULES[rule]}"))
    return tuple(out)


def _least_gpus(model: ModelSpec, cluster: Cluster, job: InferenceJob,
                cons: Constraints) -> int | None:
    """The fewest GPUs (whole nodes, doubling; whole scale-up domains past one) on which one
    configuration fits."""
    nodes = cluster.num_nodes
    for _ in range(12):
        nodes *= 2
        bigger = replace(cluster, num_nodes=cluster.whole_domains(nodes))
        free = Constraints(fixed={k: v for k, v in cons.fixed.items() if k != "replicas"},
                           allowed=cons.allowed, max=cons.max)
        res = search_inference(model, bigger, job, free)
        if res.table is not None and res.table.fits.any():
            return bigger.num_gpus
    return None


def _infeasible(model: ModelSpec, cluster: Cluster, job: InferenceJob, cons: Constraints,
                res: InferenceSearch) -> Infeasible:
    t = res.table
    if t is None:
        rules = "; ".join(f"{RULES[r]} (rejected {ex})" for r, (_, ex) in
                          sorted(res.rejected.items()))
        return Infeasible(f"no valid serving configuration of {model.name} on "
                          f"{cluster.num_gpus} GPUs under these constraints: {rules or 'none'}")
    cap = t.capacity
    if not t.fits.any():
        i = int(np.argmin(t.peak))
        c = res.configs[i]
        msg = nothing_fits(cap, float(t.peak[i]), c.describe())
        more = _least_gpus(model, cluster, job, cons)
        if more:
            msg += f", or {nodes_of(more, cluster.gpus_per_node)}"
        width = weight_bytes_per_element(c.weight_precision, job.quant_group_size)
        narrower = [p for p in WEIGHT_PRECISIONS
                    if weight_bytes_per_element(p, job.quant_group_size) < width]
        if narrower:
            msg += f", or narrower weights ({', '.join(narrower)})"
        if c.batch_size > 1:
            msg += f", or a batch under {c.batch_size}"
        return Infeasible(msg + f", or a shorter context than {job.context_len:,} tokens")
    fit = np.flatnonzero(t.fits)
    parts = []
    if job.max_tpot_s is not None:
        i = int(fit[np.argmin(t.tpot[fit])])
        parts.append(f"the fastest time per output token that fits is "
                     f"{1e3 * float(t.tpot[i]):.2f} ms ({res.configs[i].describe()}), "
                     f"over the bound {1e3 * job.max_tpot_s:.2f} ms")
    if job.max_ttft_s is not None:
        i = int(fit[np.argmin(t.ttft[fit])])
        parts.append(f"the fastest first token that fits takes {1e3 * float(t.ttft[i]):.0f} "
                     f"ms ({res.configs[i].describe()}), bound "
                     f"{1e3 * job.max_ttft_s:.0f} ms")
    return Infeasible("no configuration that fits meets the latency bounds: "
                      + "; ".join(parts) + "; relax a bound, or add GPUs or a faster GPU")


def plan_inference(model: ModelSpec, cluster: Cluster, job: InferenceJob, *,
                   constraints: Constraints | None = None, top_k: int = 5) -> Plan:
    """The serving configuration that best meets ``job``'s objective (see the module
    docstring), as a ``Plan``; raises ``Infeasible`` naming what is missing."""

    cons = constraints or Constraints()
    t0 = time.perf_counter()
    res = search_inference(model, cluster, job, cons)
    if not len(res.order):
        raise _infeasible(model, cluster, job, cons, res)
    cfg = res.configs[int(res.order[0])]
    est = estimate_inference(model, cluster, job, cfg)
    alts = _alternatives(job, res, est, top_k)
    return Plan(model=model, cluster=cluster, job=job, config=cfg, estimate=est,
                alternatives=alts, counts=dict(res.counts), constraints=cons,
                search_seconds=time.perf_counter() - t0)


#: The fields ``explain_inference`` reports.
CHOICES = ("tp", "pp", "weight_precision", "batch_size")


@dataclass(frozen=True, kw_only=True)
class InferenceExplanation:
    """Why a serving plan won, per choice: for every other value of ``tp``, ``pp``,
    ``weight_precision`` and ``batch_size``, the best configuration with that value fixed."""

    plan: Plan
    choices: tuple[Any, ...]
    search_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"config": self.plan.config.to_dict(), "estimate": self.plan.estimate.to_dict(),
                "framework": "inference", "choices": [c.to_dict() for c in self.choices],
                "search_seconds": self.search_seconds}

    def summary(self) -> str:
        """A human-readable report."""
        lines = [str(self.plan.estimate), "",
                 "why each choice (for every other value: the best configuration with it)"]
        for c in self.choices:
            tag = "fixed by the constraints" if c.fixed else \
                "the only valid value" if not c.options else "chosen"
            lines.append(f"  {c.field}={c.chosen!s:<16s} {tag}")
            for o in c.options:
                why = o.reason if o.verdict == "slower" else f"{o.verdict}: {o.reason}"
                where = f"   [{o.config.describe()}]" if o.config else ""
                lines.append(f"    {c.field}={o.value!s:<14s} {why}{where}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(self.summary()) + "</pre>"


def explain_inference(plan: Plan, *, fields: Sequence[str] | None = None
                      ) -> InferenceExplanation:
    """For each choice of a serving plan, every other value searched again with that value
    fixed (under the plan's constraints): it loses on the objective, misses a latency
    bound, does not fit, or is never valid."""

    t0 = time.perf_counter()
    job = plan.job
    assert isinstance(job, InferenceJob)
    cons = plan.constraints
    names = list(fields) if fields is not None else list(CHOICES)
    for f in names:
        if f not in CHOICES:
            raise SpecError(f"cannot explain field {f!r}; choose from {', '.join(CHOICES)}")
    base = search_inference(plan.preset("serving"), plan.cluster, job, cons)
    values: dict[str, set[Any]] = {f: set() for f in CHOICES}
    for c in base.configs:
        for f in CHOICES:
            values[f].add(getattr(c, f))
    # Batches: powers of two (the search also tries each mesh's largest, which differ).
    values["batch_size"] = {b for b in values["batch_size"] if b & (b - 1) == 0}
    if job.objective == "latency" and job.batch_size is None:
        values["batch_size"] |= {1, 8, 64}
    choices = []
    verdicts = {"slower": 0, "misses the bound": 1, "does not fit": 2, "invalid": 3}
    for f in names:
        chosen = getattr(plan.config, f)
        ranked = []
        if f not in cons.fixed:
            for v in sorted(values[f], key=lambda x: (str(type(x)), x)):
                if v != chosen:
                    opt, metric = _option(plan, f, v, cons, Option)
                    ranked.append(((verdicts[opt.verdict], metric), opt))
        opts = [o for _, o in sorted(ranked, key=lambda r: r[0])]
        choices.append(Choice(field=f, chosen=chosen, fixed=f in cons.fixed,
                              options=tuple(opts)))
    return InferenceExplanation(plan=plan, choices=tuple(choices),
                                search_seconds=time.perf_counter() - t0)


def _option(plan: Plan, f: str, v: Any, cons: Constraints, option: type
            ) -> tuple[Any, float]:
    """The outcome of fixing ``f = v``, and a number to sort outcomes of one verdict by
    (the objective, best first; or the least memory)."""
    job, est = plan.job, plan.estimate
    # explain_inference explains serving plans only
    assert isinstance(job, InferenceJob) and isinstance(est, InferenceEstimate)
    fixed = cons.merge(Constraints(fixed={f: v}))
    if f == "weight_precision":
        job = replace(job, weight_precision=(v,))
    res = search_inference(plan.preset("serving"), plan.cluster, job, fixed)
    t = res.table
    sign = 1.0 if job.objective == "latency" else -1.0
    if t is None:  # nothing valid was evaluated (so nothing is ranked either)
        return option(value=v, verdict="invalid",
                      reason="no valid configuration has it under these constraints"), 0.0
    if len(res.order):
        i = int(res.order[0])
        return option(value=v, verdict="slower", reason=_why_worse(job, est, t, i),
                      framework="inference", config=res.configs[i],
                      step_time_s=float(t.latency[i]), peak_memory_bytes=float(t.peak[i])
                      ), sign * _metric(job, t, i)
    if t.fits.any():
        fit = np.flatnonzero(t.fits)
        i = int(fit[np.argmin(t.latency[fit])])
        return option(value=v, verdict="misses the bound", reason=_bound_miss(job, t, i),
                      framework="inference", config=res.configs[i],
                      step_time_s=float(t.latency[i]), peak_memory_bytes=float(t.peak[i])
                      ), float(t.latency[i])
    i = int(np.argmin(t.peak))
    cap = t.capacity
    return option(value=v, verdict="does not fit",
                  reason=f"needs at least {float(t.peak[i]) / GIB:.1f} GiB per GPU, "
                  f"{(float(t.peak[i]) - cap) / GIB:.1f} GiB over the {cap / GIB:.1f} GiB",
                  framework="inference", config=res.configs[i],
                  peak_memory_bytes=float(t.peak[i])), float(t.peak[i])


def constraints_from(value: Constraints | str | Mapping[str, Any] | None) -> Constraints:
    """Constraints for an inference search (no presets: they describe trainers)."""
    if value is None:
        return Constraints()
    if isinstance(value, Constraints):
        return value
    if isinstance(value, Mapping):
        return Constraints.from_dict(value)
    raise SpecError("an inference search takes Constraints or their dict form, not a "
                    f"training preset ({value!r})")

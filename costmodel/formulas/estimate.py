"""Estimate: what one configuration costs, and ``estimate()``, the scalar path.

``estimate()`` validates its inputs and evaluates the vectorized cost model on a table of one
row (``costmodel.formulas.memory.memory_table`` and ``costmodel.formulas.steptime.time_table``), so
its numbers
are exactly the search's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.fitting.uncertainty import band_for, model_key
from costmodel.formulas.checks import validate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import TERMS, ConfigArrays, memory_table
from costmodel.formulas.steptime import COMM_KINDS, TIME_TERMS, time_table
from costmodel.formulas.vschedules import costed_ranks, dualpipe_costing
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import GIB

__all__ = ["NEAR_CAPACITY", "Estimate", "MemoryBreakdown", "StageMemory", "estimate",
           "plan_capacity"]

# A peak above this share of the GPU's memory is flagged: the estimate counts what the model,
# its states, activations and buffers hold, and the CUDA context and NCCL's buffers, but not
# the caching allocator's fragmentation (``Job.memory_reserve``).
NEAR_CAPACITY = 0.95
# MFU is quoted against the dense bf16 peak for fp8 runs too (torchtitan, Megatron-LM; nvfp4
# the same), and against TF32 tensor cores for fp32.
PEAK_DTYPE = {"fp8": "bf16", "nvfp4": "bf16", "mxfp4": "bf16", "fp32": "tf32"}


def plan_capacity(cluster: Cluster, job: Job) -> float:
    """Bytes per GPU a plan's estimated peak may reach: the GPU's memory less the job's
    ``memory_reserve`` share."""
    return cluster.gpu.memory_bytes * (1 - float(job.memory_reserve))


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes per GPU by term. ``buffers`` are transient working sets at the peak (gathered
    ZeRO-3 parameters, gradient buckets, a recomputed layer, logits, communication buffers);
    ``overhead`` is the CUDA context, cuBLAS workspace and NCCL buffers."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    overhead_bytes: float

    @property
    def model_states_bytes(self) -> float:
        """Weights + gradients + optimizer states (the ZeRO paper's "model states")."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        """Sum of all terms."""
        return self.model_states_bytes + self.activations_bytes + self.buffers_bytes \
            + self.overhead_bytes

    def as_dict(self) -> dict[str, float]:
        """Terms by name (``weights_bytes`` ...) plus ``total_bytes``."""
        out = {f"{t}_bytes": getattr(self, f"{t}_bytes") for t in TERMS}
        out["total_bytes"] = self.total_bytes
        return out


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """One pipeline stage: what a GPU of it holds.

    ``layer_params`` and ``embedding_params`` are the parameters on one GPU of the stage after
    tensor and expert sharding (before ZeRO); ``in_flight_micro_batches`` is how many
    micro-batches' activations (of all its layers) it holds at its peak;
    ``layer_activations_bytes`` is the transformer layers' part of ``memory.activations_bytes``
    (the rest is the embedding and output layers'); ``cpu_bytes`` what offload keeps in host
    memory for it. ``resident_weights_bytes``: the stored (sharded) parameters alone, what
    ``memory.weights_bytes`` holds between steps (it adds the low-precision or unsharded
    copies that live from forward to backward). ``resident_gradients_bytes``: all the
    gradients after the backward pass, what the optimizer step reads; ``memory.gradients_bytes``
    counts only what the peak holds of them (less where they never coexist with the
    activations: torchtitan under FSDP with one micro-batch per step).
    """

    stage: int
    num_layers: int
    layer_params: float
    embedding_params: float
    in_flight_micro_batches: float
    layer_activations_bytes: float
    memory: MemoryBreakdown
    cpu_bytes: float
    resident_weights_bytes: float = 0.0
    resident_gradients_bytes: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """What a configuration costs. Memory in bytes per GPU; time fields in seconds.

    ``memory`` is the breakdown of the fullest GPU (stage ``peak_stage``), whose total is
    ``peak_memory_bytes``; ``fits`` compares it with the GPU's capacity, and what offload
    keeps in host memory per GPU (``cpu_memory_bytes``) with the GPU's share of its node's
    (``host_memory_capacity_bytes``).

    ``step_time_s``: seconds per optimizer step; ``tokens_per_s``: trained tokens per second
    for the whole job; ``model_tflops_per_gpu``: model FLOPs (PaLM App. B) per second per GPU,
    in TFLOP/s; ``mfu`` / ``hfu``: model / hardware (with recompute) FLOPs over the GPUs' dense
    peak. ``time_breakdown_s``: what each term adds to the step (``compute``, ``recompute``,
    ``<kind>_comm`` exposed communication for kind in tp, cp, ep, pp, fsdp, dp, ``bubble``,
    ``optimizer``, ``offload``; they sum to ``step_time_s``) and ``<kind>_comm_total``, the
    whole time of that communication, hidden or not. ``bottleneck_stage``: the pipeline stage
    whose time per micro-batch sets the pace. ``usd_per_million_tokens``: what training a
    million tokens costs at the GPU profile's rental price (US dollars; ``None`` when the
    profile has no price).
    """

    config: ParallelConfig
    memory: MemoryBreakdown
    peak_memory_bytes: float
    peak_stage: int
    stages: tuple[StageMemory, ...]
    memory_capacity_bytes: float
    cpu_memory_bytes: float
    num_micro_batches: int
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    time_breakdown_s: dict[str, float] = field(default_factory=dict)
    bottleneck_stage: int | None = None
    host_memory_capacity_bytes: float = float("inf")
    usd_per_million_tokens: float | None = None
    memory_reserve: float = 0.0
    #: The step time's likely relative error (0.09: +-9 %): the RMS error of published runs
    #: of the same GPU architecture, trainer and scale, each predicted with its source left
    #: out of the fit (costmodel.fitting.uncertainty); None without an installed fit.
    step_time_band: float | None = None
    step_time_band_basis: str = ""
    #: Whether the band is borrowed from published runs unlike this estimate (another GPU
    #: architecture, larger models): shown as "extrapolated".
    step_time_band_extrapolated: bool = False

    @property
    def step_time_text(self) -> str:
        """``"1.923 s (± 9 %)"``: the step time with its band (in milliseconds, three
        significant digits, under 0.1 s: a small model's ``0.000 s`` would say nothing)."""
        if self.step_time_s is None:
            return "-"
        extra = ", extrapolated" if self.step_time_band_extrapolated else ""
        band = f" (± {100 * self.step_time_band:.0f} %{extra})" if self.step_time_band else ""
        if self.step_time_s < 0.1:
            return f"{1e3 * self.step_time_s:.3g} ms{band}"
        return f"{self.step_time_s:.3f} s{band}"

    def within_band(self, other: Estimate) -> bool:
        """Whether the two step times are within each other's band: the estimates cannot
        tell which configuration is faster."""
        a, b = self.step_time_s, other.step_time_s
        if a is None or b is None:
            return False
        band = max(self.step_time_band or 0.0, other.step_time_band or 0.0)
        return abs(a - b) <= band * min(a, b)

    @property
    def headroom_bytes(self) -> float:
        """GPU memory left free at the peak (bytes; 0 when it does not fit)."""
        return max(self.memory_capacity_bytes - self.peak_memory_bytes, 0.0)

    @property
    def over_capacity_bytes(self) -> float:
        """How far the peak exceeds the GPU's memory (bytes; 0 when it fits)."""
        return max(self.peak_memory_bytes - self.memory_capacity_bytes, 0.0)

    @property
    def within_reserve(self) -> bool:
        """Whether the peak leaves the job's ``memory_reserve`` share of the GPU free (what a
        search asks of the plans it picks)."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes * (1 - self.memory_reserve)

    @property
    def near_capacity(self) -> bool:
        """Whether the peak is above ``NEAR_CAPACITY`` of the GPU's memory: a run this full
        may fail on what the estimate does not count (allocator fragmentation, a framework's
        buffers)."""
        return self.peak_memory_bytes > NEAR_CAPACITY * self.memory_capacity_bytes

    @property
    def fits(self) -> bool:
        """Whether the fullest GPU's total fits its memory, and offloaded states its share of
        the node's host memory."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes and \
            self.cpu_memory_bytes <= self.host_memory_capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (bytes and seconds, SI units)."""
        return {
            "step_time_s": self.step_time_s,
            "step_time_band": self.step_time_band,
            "step_time_band_basis": self.step_time_band_basis,
            "step_time_band_extrapolated": self.step_time_band_extrapolated,
            "peak_memory_bytes": self.peak_memory_bytes,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "fits": self.fits,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "over_capacity_bytes": self.over_capacity_bytes,
            "memory_reserve": self.memory_reserve,
            "within_reserve": self.within_reserve,
            "near_capacity": self.near_capacity,
            "host_memory_capacity_bytes": self.host_memory_capacity_bytes,
            "peak_stage": self.peak_stage,
            "num_micro_batches": self.num_micro_batches,
            "bottleneck_stage": self.bottleneck_stage,
            "time_breakdown_s": dict(self.time_breakdown_s),
            "memory": self.memory.as_dict(),
            "cpu_memory_bytes": self.cpu_memory_bytes,
            "stages": [
                {
                    "stage": s.stage,
                    "num_layers": s.num_layers,
                    "layer_params": s.layer_params,
                    "embedding_params": s.embedding_params,
                    "in_flight_micro_batches": s.in_flight_micro_batches,
                    "layer_activations_bytes": s.layer_activations_bytes,
                    "memory": s.memory.as_dict(),
                    "cpu_bytes": s.cpu_bytes,
                    "resident_weights_bytes": s.resident_weights_bytes,
                    "resident_gradients_bytes": s.resident_gradients_bytes,
                }
                for s in self.stages
            ],
        }

    def summary(self) -> str:
        """A short human-readable report (seconds, TFLOP/s, GiB)."""
        m = self.memory
        lines = []
        if self.step_time_s is not None:
            lines.append(
                f"step time: {self.step_time_text}   tokens/s: {self.tokens_per_s:,.0f}   "
                f"MFU: {100 * (self.mfu or 0):.1f}%   HFU: {100 * (self.hfu or 0):.1f}%   "
                f"model TFLOP/s per GPU: {self.model_tflops_per_gpu:.1f}"
                + (f"   ${self.usd_per_million_tokens:.3f} per million tokens"
                   if self.usd_per_million_tokens is not None else ""))
            for t in TIME_TERMS:
                v = self.time_breakdown_s.get(t, 0.0)
                if v > 0 or t in ("compute", "bubble"):
                    total = self.time_breakdown_s.get(f"{t}_total")
                    extra = f"   (total {total:.3f} s, hidden {total - v:.3f} s)" \
                        if total is not None and total > v else ""
                    lines.append(f"  {t:<12s} {v:10.3f} s{extra}")
        lines += [
            f"peak memory per GPU: {self.peak_memory_bytes / GIB:.2f} GiB of "
            f"{self.memory_capacity_bytes / GIB:.1f} GiB "
            f"({'fits' if self.fits else 'does NOT fit'}; stage {self.peak_stage}; "
            + (f"over by {self.over_capacity_bytes / GIB:.2f} GiB)" if self.over_capacity_bytes
               else f"headroom {self.headroom_bytes / GIB:.2f} GiB)"),
        ]
        if self.fits and self.near_capacity:
            lines.append(f"  warning: above {100 * NEAR_CAPACITY:.0f}% of the GPU's memory; "
                         "allocator fragmentation and buffers the estimate does not count may "
                         "run it out of memory")
        for t in TERMS:
            lines.append(f"  {t:<12s} {getattr(m, f'{t}_bytes') / GIB:10.2f} GiB")
        if self.cpu_memory_bytes:
            lines.append(f"  offloaded to CPU {self.cpu_memory_bytes / GIB:.2f} GiB per GPU")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """Tables for Jupyter: the headline numbers, step time by term, memory by term and
        per pipeline stage."""
        m = self.memory
        head = [("peak memory per GPU", f"{self.peak_memory_bytes / GIB:.2f} GiB of "
                 f"{self.memory_capacity_bytes / GIB:.1f} GiB (stage {self.peak_stage}, "
                 + ("fits)" if self.fits else "does NOT fit)"))]
        if self.step_time_s is not None:
            head = [("step time", f"{self.step_time_s:.3f} s"),
                    ("tokens/s", f"{self.tokens_per_s:,.0f}"),
                    ("model TFLOP/s per GPU", f"{self.model_tflops_per_gpu:.1f}"),
                    ("MFU / HFU", f"{100 * (self.mfu or 0):.1f}% / {100 * (self.hfu or 0):.1f}%"),
                    *([("US$ per million tokens", f"{self.usd_per_million_tokens:.3f}")]
                      if self.usd_per_million_tokens is not None else []),
                    *head]
        time_rows = []
        for t in TIME_TERMS:
            v = self.time_breakdown_s.get(t, 0.0)
            total = self.time_breakdown_s.get(f"{t}_total", v)
            if v > 0 or total > 0:
                share = 100 * v / self.step_time_s if self.step_time_s else 0.0
                time_rows.append((t, f"{1e3 * v:,.1f}", f"{1e3 * total:,.1f}", f"{share:.1f}%"))
        mem_rows = [(t, f"{getattr(m, f'{t}_bytes') / GIB:.2f}") for t in TERMS]
        mem_rows.append(("total", f"{self.peak_memory_bytes / GIB:.2f}"))
        parts = [_html_table(("", ""), head)]
        if time_rows:
            parts.append("<h4>Step time</h4>" + _html_table(
                ("term", "exposed ms", "total ms", "share of step"), time_rows))
        parts.append(f"<h4>Memory per GPU (stage {self.peak_stage})</h4>"
                     + _html_table(("term", "GiB"), mem_rows))
        if len(self.stages) > 1:
            parts.append("<h4>Pipeline stages</h4>" + _html_table(
                ("stage", "layers", "micro-batches in flight", "GiB"),
                [(s.stage, s.num_layers, f"{s.in_flight_micro_batches:.2f}",
                  f"{s.memory.total_bytes / GIB:.2f}") for s in self.stages]))
        return "".join(parts)


def _html_table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A plain HTML table, every cell escaped."""
    import html

    def row(cells: tuple[Any, ...], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + \
            "</tr>"

    return "<table>" + row(header, "th") + "".join(row(r, "td") for r in rows) + "</table>"


def mfu_peak_flops(cluster: Cluster, precision: str) -> float:
    """The dense peak FLOP/s of one GPU that MFU is measured against for a job in
    ``precision`` (fp8, nvfp4 and mxfp4 against bf16, fp32 against tf32: ``PEAK_DTYPE``)."""
    return cluster.gpu.peak_flops(PEAK_DTYPE.get(precision, precision))


def usd_per_million_tokens(cluster: Cluster, step_time_s: float, tokens_per_step: float
                           ) -> float | None:
    """US dollars to train a million tokens: GPU-seconds per step at the profile's rental
    price, per token (``None`` without a price)."""
    price = cluster.gpu.usd_per_gpu_second
    if price is None:
        return None
    return price * cluster.num_gpus * step_time_s / tokens_per_step * 1e6


def estimate(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, config: ParallelConfig
             ) -> Estimate:
    """Memory per GPU and step time of training ``model`` (a preset, or a traced graph's
    ``LayerCosts``) on ``cluster`` with ``config``.

    Raises SpecError naming the problem when the configuration cannot run (degrees that do not
    multiply to the GPUs, heads not divisible by tp, ...).
    """
    for name, value, kinds in (("model", model, (ModelSpec, LayerCosts)),
                               ("cluster", cluster, (Cluster,)), ("job", job, (Job,)),
                               ("config", config, (ParallelConfig,))):
        if not isinstance(value, kinds):
            raise SpecError(f"{name} must be a {' or '.join(k.__name__ for k in kinds)}, got "
                            f"{type(value).__name__}")
    validate(model, cluster, job, config)
    # DualPipe is costed as the DualPipeV that runs the same ops (vschedules.dualpipe_costing).
    costed = dualpipe_costing(config)
    # The headline numbers come from the search's own path (representative stage columns,
    # ``costmodel.formulas.tables``) on a table of one; the per-stage listing from every stage.
    rep = ConfigArrays.from_configs(model, [costed], all_stages=False)
    rep_mem = memory_table(model, cluster, job, rep)
    times = time_table(model, cluster, job, rep, rep_mem)
    arrays = ConfigArrays.from_configs(model, [costed])
    table = memory_table(model, cluster, job, arrays)
    stages = []
    for i in range(costed.pp):
        mem = MemoryBreakdown(**{f"{t}_bytes": float(table.terms[t][i, 0]) for t in TERMS})
        stages.append(StageMemory(
            stage=i,
            num_layers=int(table.num_layers[i, 0]),
            layer_params=float(table.layer_params[i, 0]),
            embedding_params=float(table.embedding_params[i, 0]),
            in_flight_micro_batches=float(table.in_flight[i, 0]),
            layer_activations_bytes=float(table.layer_activations[i, 0]),
            memory=mem,
            cpu_bytes=float(table.cpu[i, 0]),
            resident_weights_bytes=float(table.resident_weights[i, 0]),
            resident_gradients_bytes=float(table.resident_gradients[i, 0]),
        ))
    if costed is not config:  # DualPipe's rank r runs as its half rank min(r, pp - 1 - r)
        stages = [replace(stages[h], stage=r) for r, h in enumerate(costed_ranks(config))]
    peak = int(rep.stage_index[0, rep_mem.peak_stage[0]])
    step = float(times.step_time[0])
    breakdown = {t: float(times.terms[t][0]) for t in TIME_TERMS}
    breakdown.update({f"{k}_comm_total": float(times.comm_total[k][0]) for k in COMM_KINDS})
    peak_flops = mfu_peak_flops(cluster, job.precision)
    assert times.hardware_flops is not None  # a detailed table
    model_rate = times.model_flops / step / cluster.num_gpus
    return Estimate(
        config=config,
        memory=stages[peak].memory,
        peak_memory_bytes=float(rep_mem.peak[0]),
        peak_stage=peak,
        stages=tuple(stages),
        memory_capacity_bytes=cluster.gpu.memory_bytes,
        cpu_memory_bytes=max(s.cpu_bytes for s in stages),
        num_micro_batches=int(table.num_micro_batches[0]) * (config.pp // costed.pp),
        step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        model_tflops_per_gpu=model_rate / 1e12,
        mfu=model_rate / peak_flops,
        hfu=float(times.hardware_flops[0]) / step / cluster.num_gpus / peak_flops,
        usd_per_million_tokens=usd_per_million_tokens(cluster, step, job.tokens_per_step),
        time_breakdown_s=breakdown,
        bottleneck_stage=int(rep.stage_index[0, times.bottleneck_stage[0]]),
        host_memory_capacity_bytes=cluster.host_memory_bytes_per_gpu,
        memory_reserve=float(job.memory_reserve),
        **_band(model, cluster, job),
    )


def _band(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job) -> dict[str, Any]:
    """The step-time band fields of an estimate on ``cluster`` (costmodel.fitting.uncertainty)."""
    found = band_for(cluster.gpu.architecture, job.framework, cluster.num_gpus,
                     model.num_params(), gpu=cluster.gpu.name, assumed=cluster.gpu.assumed,
                     moe=model.num_experts > 0, model=model_key(model))
    if found is None:
        return {}
    return {"step_time_band": found[0], "step_time_band_basis": found[1],
            "step_time_band_extrapolated": found[2]}

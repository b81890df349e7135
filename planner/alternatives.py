"""Why not: the configurations that lost to a plan and the reason each lost (slower, and by
which term; does not fit, and by how much; never timed, with its bound; invalid, and which
rule), and how a configuration reads in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.config import ParallelConfig
from costmodel.serving.inference import InferenceConfig
from costmodel.units import GIB, count
from planner.search import Found, SearchResult
from planner.space import RULES, row_config

__all__ = ["TERM_LABELS", "Alternative", "alternatives", "describe", "slower_reason"]

#: How each step-time term reads in a reason.
TERM_LABELS = {
    "compute": "compute",
    "recompute": "recompute",
    "host": "the host launching MoE layers",
    "tp_comm": "exposed tensor-parallel communication",
    "cp_comm": "exposed context-parallel ring exchange",
    "ep_comm": "expert-parallel all-to-all",
    "pp_comm": "pipeline send/receive",
    "fsdp_comm": "exposed ZeRO-3/FSDP parameter gathers",
    "dp_comm": "exposed data-parallel gradient reduction",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "offload": "CPU offload",
}


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """A configuration that lost, and why. ``verdict``: ``slower`` (fits, but takes longer),
    ``does not fit`` (the least memory of its mesh is over the GPU's), ``bounded`` (never
    timed: a lower bound on its step time was already slower than the plan) or ``invalid``.
    Times in seconds, memory in bytes per GPU; ``None`` where not evaluated."""

    framework: str
    config: ParallelConfig | InferenceConfig | None
    verdict: str
    reason: str
    step_time_s: float | None = None
    peak_memory_bytes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"framework": self.framework,
                "config": self.config.to_dict() if self.config else None,
                "verdict": self.verdict, "reason": self.reason,
                "step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alternative:
        """The inverse of ``to_dict``."""
        cfg = d.get("config")
        kind = InferenceConfig if cfg and "replicas" in cfg else ParallelConfig
        return cls(framework=d["framework"], config=kind(**cfg) if cfg else None,
                   verdict=d["verdict"], reason=d["reason"], step_time_s=d.get("step_time_s"),
                   peak_memory_bytes=d.get("peak_memory_bytes"))


def params_text(model: Any) -> str:
    """A model's parameter count for a report line, the multi-token prediction modules'
    share named where it has them (DeepSeek-V3's 671B model is 682.64B with its MTP
    module)."""
    text = count(model.num_params())
    mtp = model.mtp_params() if hasattr(model, "mtp_params") else 0
    return f"{text} ({count(mtp, 'in its MTP modules')})" if mtp else text


def layer_list(values: tuple[int, ...]) -> str:
    """Layer counts as a list, a run of one count as ``NxK`` (``[1, 2x62, 1]`` for an
    interleaved pipeline's 64 chunks; ``planner compare`` reads it back)."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        n = j - i
        out.append(f"{values[i]}x{n}" if n > 2 else ", ".join([str(values[i])] * n))
        i = j
    return "[" + ", ".join(out) + "]"


def describe(cfg: ParallelConfig | InferenceConfig) -> str:
    """A configuration in one line: only what differs from the defaults, degrees first."""
    if isinstance(cfg, InferenceConfig):
        return cfg.describe()
    parts = [f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp}"]
    for key, default in (("cp", 1), ("ep", 1), ("etp", None), ("zero_stage", 0),
                         ("sharding_group", None),
                         ("sequence_parallel", False), ("micro_batch_size", None),
                         ("virtual_pipeline_stages", 1), ("recompute", "none"),
                         ("recompute_num_layers", None), ("offload", "none"),
                         ("stage_layers", None), ("stage_recompute_layers", None)):
        v = getattr(cfg, key)
        if v != default:
            name = {"zero_stage": "zero", "sequence_parallel": "sp", "micro_batch_size": "mbs",
                    "virtual_pipeline_stages": "v", "sharding_group": "shard"}.get(key, key)
            parts.append(name if v is True else f"{name}={layer_list(v)}"
                         if isinstance(v, tuple) else f"{name}={v}")
    if cfg.pp > 1:
        parts.append(str(cfg.pipeline_schedule))
    return " ".join(parts)


def slower_reason(best_time: float, best_terms: Mapping[str, float], best_peak: float,
                  other_time: float, other_terms: Mapping[str, float], other_peak: float) -> str:
    """Why a configuration taking ``other_time`` seconds lost to one taking ``best_time``: by
    how much, and the step-time term (``TIME_TERMS``) that grew most."""
    diff = {t: other_terms.get(t, 0.0) - best_terms.get(t, 0.0) for t in TERM_LABELS}
    worst = max(diff, key=lambda t: (diff[t], t))
    pct = 100.0 * (other_time / best_time - 1.0)
    if pct < 0.05:
        return (f"as fast within 0.05% ({other_time:.3f} s); ranked after the plan by "
                + ("peak memory" if other_peak > best_peak else "the stated tie order"))
    return (f"slower by {pct:.1f}% ({_duration(other_time - best_time)}), "
            f"mostly from {TERM_LABELS[worst]} (+{_duration(diff[worst])})")


def _duration(seconds: float) -> str:
    """A step-time difference in whole milliseconds, or microseconds under one (a small
    model's steps differ by less than a millisecond: '0 ms' would say nothing)."""
    if abs(seconds) < 1e-3:
        return f"{1e6 * seconds:.0f} us"
    return f"{1e3 * seconds:.0f} ms"


def _slower(best: Found, other: Found) -> str:
    return slower_reason(best.step_time, best.terms, best.peak_memory, other.step_time,
                         other.terms, other.peak_memory)


def _but_layers(cfg: ParallelConfig) -> ParallelConfig:
    """``cfg`` with every layer recomputed when it recomputes some (``recompute_num_layers``
    forgotten)."""
    return dataclasses.replace(cfg, recompute_num_layers=None)


def alternatives(res: SearchResult, capacity: float) -> tuple[Alternative, ...]:
    """The runners-up, then per mesh the best that lost and why, then the invalid rules."""
    best = res.top[0]
    out = []
    # One runner-up per configuration up to how many layers it recomputes: the variants of
    # recompute_num_layers lose for the same reason, by steps of one layer.
    seen = {_but_layers(row_config(np.array(best.row), res.model))}
    for f in res.top[1:]:
        cfg = row_config(np.array(f.row), res.model)
        if _but_layers(cfg) in seen:
            continue
        seen.add(_but_layers(cfg))
        out.append(Alternative(framework=f.framework, config=cfg, verdict="slower",
                               reason=_slower(best, f), step_time_s=f.step_time,
                               peak_memory_bytes=f.peak_memory))
    shown = {f.row for f in res.top}
    rows = []
    for (fw, *degrees), o in res.meshes.items():
        if o.best is not None and o.best.row not in shown:
            rows.append((0, o.best.step_time, Alternative(
                framework=fw, config=row_config(np.array(o.best.row), res.model), verdict="slower",
                reason=_slower(best, o.best), step_time_s=o.best.step_time,
                peak_memory_bytes=o.best.peak_memory)))
        elif o.best is None and o.nearest is not None:
            n = o.nearest
            why = (f"does not fit by {(n.peak_memory - capacity) / GIB:.2f} GiB on stage "
                   f"{n.peak_stage} (the least memory of this mesh: "
                   f"{n.peak_memory / GIB:.2f} of {capacity / GIB:.1f} GiB)"
                   if n.peak_memory > capacity else
                   "does not fit: what it offloads exceeds the GPU's share of host memory")
            rows.append((1, n.peak_memory, Alternative(
                framework=fw, config=row_config(np.array(n.row), res.model), verdict="does not fit",
                reason=why, peak_memory_bytes=n.peak_memory)))
        elif o.best is None and np.isfinite(o.floor):
            mesh = dict(zip(("dp", "tp", "pp", "cp", "ep", "etp"), degrees, strict=True))
            if mesh["etp"] == mesh["tp"]:
                del mesh["etp"]  # the experts split as the layer: nothing to say
            rows.append((2, o.floor, Alternative(
                framework=fw, config=None, verdict="bounded",
                reason=" ".join(f"{k}={v}" for k, v in mesh.items()) + ": slower: at least "
                f"{o.floor:.3f} s before any ZeRO-3 traffic, gradient reduction or optimizer "
                f"step ({100 * (o.floor / best.step_time - 1):.1f}% over the plan)")))
    rows.sort(key=lambda r: (r[0], r[1], r[2].reason))
    out += [r[2] for r in rows]
    for fw, rejected in res.rejected.items():
        for rule, (times, example) in sorted(rejected.items()):
            out.append(Alternative(framework=fw, config=None, verdict="invalid",
                                   reason=f"{times} value(s) such as {example}: {RULES[rule]}"))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Option:
    """One value of a choice. ``verdict``: ``chosen``, ``slower`` (the fastest configuration
    with this value fits but takes longer), ``does not fit`` (no configuration with it fits
    in memory; ``peak_memory_bytes`` is the least any needs) or ``invalid``. ``config``: that
    fastest (or least-memory) configuration; times in seconds, memory in bytes per GPU."""

    value: Any
    verdict: str
    reason: str
    framework: str | None = None
    config: ParallelConfig | None = None
    step_time_s: float | None = None
    peak_memory_bytes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"value": self.value, "verdict": self.verdict, "reason": self.reason,
                "framework": self.framework,
                "config": self.config.to_dict() if self.config else None,
                "step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes}


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One field of the configuration (a ``ParallelConfig`` name, or ``framework``): the
    value the plan chose, whether the constraints fixed it, and every other value's outcome
    (fastest first, then those that do not fit, least memory first)."""

    field: str
    chosen: Any
    fixed: bool
    options: tuple[Option, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"field": self.field, "chosen": self.chosen, "fixed": self.fixed,
                "options": [o.to_dict() for o in self.options]}

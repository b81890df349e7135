"""Fit the cost model's in-training efficiencies to published runs, and measure how well the
fit carries over to runs it was not fitted to (leave-one-source-out).

What is fitted (``planner calibrate``), one set for every GPU, trainer and scale, applied to
the profiles by ``hardware_profiles.apply_transfer``:

- per GPU architecture (``GPU.architecture``: ampere, hopper, ...), the ratio of the matmul
  fraction that training reaches to the microbenchmark fraction of the profile
  (``hardware_profiles/gpus/*.toml [efficiency]``, each with its source). An architecture
  with runs from fewer than ``ARCH_MIN_SOURCES`` sources takes the pooled ratio (the
  geometric mean of the fitted ones, weighted by their runs);
- the same ratio for the fused-attention fractions, per architecture alike (each
  architecture's profile quotes a different kind of attention figure: the A100's is
  FlashAttention-2's best case, the Hopper parts' FlashAttention-2's typical one), pooled for
  an architecture without runs;
- the fixed cost of one kernel (launch and tail), the same for every GPU;
- ``comm_slowdown``: the compute lost per second of communication overlapped with it.

The memory-bandwidth fraction is not fitted: it is measured directly (a copy benchmark).

Robust least squares on ``log(predicted / measured)`` (scipy, trust-region reflective within
physical bounds, soft-L1 loss; rows of ``medium`` confidence at ``MEDIUM_WEIGHT``), so that
step times and throughputs weigh alike. ``leave_one_source_out``
refits without each source in turn and predicts that source: the parameters of a fold are
one Gauss-Newton step from the all-source fit on the other sources' residuals and Jacobian
(the model is smooth in them; ``benchmarks/step_time_accuracy.py --exact`` refits each fold
from scratch to check), and the left-out runs are then predicted exactly.

Uncertainty bands (``bands``): the root-mean-square leave-one-source-out log error of the
runs like the one estimated, by GPU architecture, trainer and scale, falling back to broader
classes where a class has too few runs or sources (``BAND_MIN_RUNS``, ``BAND_MIN_SOURCES``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

import hardware_profiles
from costmodel.errors import SpecError
from costmodel.fitting.published import PublishedRun, predict_run, run_estimate
from costmodel.fitting.uncertainty import MOE_BAND, band_key, model_key, scale_class
from costmodel.formulas.estimate import Estimate
from costmodel.hardware import GPU
from costmodel.units import GIB
from hardware_profiles.files import to_toml

__all__ = ["BAND_MIN_RUNS", "BAND_MIN_SOURCES", "Fit", "Fold", "RunResult", "band_key", "bands",
           "cell", "compared_memory_gib", "fit_transfer", "leave_one_source_out", "load_fit",
           "loso_log_errors", "run_group", "scale_class",
           "transfer_toml", "unfitted", "validation_report"]

OVERHEAD_BOUNDS_US = (0.0, 50.0)
SLOWDOWN_BOUNDS = (0.0, 0.6)
RATIO_BOUNDS = (0.3, 1.3)
#: Robust loss: residuals beyond F_SCALE (log error) count linearly, not squared, so that a
#: source the model misses by a wide margin (a trainer behaviour it does not describe) cannot
#: drag the efficiencies every other run is predicted with (scipy least_squares, soft_l1).
LOSS = "soft_l1"
F_SCALE = 0.05
#: A run whose source leaves a setting unstated (``confidence = "medium"``, the assumption
#: named in its note) counts this much in the fit, a fully stated one 1.
MEDIUM_WEIGHT = 0.5
#: An architecture's own ratio is fitted only from runs of at least this many independent
#: sources; with fewer, its GPUs take the pooled ratio (one source's trainer or flags could
#: otherwise set a whole generation's efficiency).
ARCH_MIN_SOURCES = 2
#: A run steers the fit only when its (architecture, trainer) cell has runs from at least
#: this many independent sources: a lone source on new hardware or a new software stack (one
#: vendor's early B200 numbers) carries that stack's offset, which the shared parameters
#: would otherwise absorb for every other GPU. Such a run is still predicted, by a fit that
#: never saw its source: its error is out of sample, as a left-out source's is.
CELL_MIN_SOURCES = 2
#: A band needs this many runs from this many independent sources; else the next broader class.
BAND_MIN_RUNS = 6
BAND_MIN_SOURCES = 2
#: Positions of runs in a list of runs: a sequence, or an integer array (``np.flatnonzero``).
Indices: TypeAlias = Sequence[int] | np.ndarray


def run_group(run: PublishedRun) -> str:
    """The independent source a run comes from (its ``group``; the calibration set's rows
    are named ``<source>_<...>``)."""
    return run.group or run.id.split("_")[0]


@dataclass(frozen=True)
class Fit:
    """Fitted parameters: matmul ``ratios`` per architecture, ``pooled`` for the others;
    fused-attention ``attention_ratios`` per architecture, ``attention`` (pooled) for the
    others; ``kernel_overhead_us`` and ``comm_slowdown`` (``KernelEfficiency``)."""

    ratios: dict[str, float]
    pooled: float
    kernel_overhead_us: float
    comm_slowdown: float = 0.0
    attention: float = 1.0
    attention_ratios: dict[str, float] = field(default_factory=dict)

    def transfer_table(self) -> dict[str, Any]:
        """The fit as the ``[transfer]`` table of ``calibrated/transfer.toml``."""
        return {"gemm": self.pooled, "attention": self.attention, "memory": 1.0,
                "kernel_overhead_us": self.kernel_overhead_us,
                "comm_slowdown": self.comm_slowdown, "architecture": dict(self.ratios),
                "attention_architecture": dict(self.attention_ratios)}

    def vector(self, archs: Sequence[str]) -> np.ndarray:
        """``[log matmul ratio per arch..., log attention ratio per arch..., overhead,
        slowdown]``."""
        return np.array([math.log(self.ratios.get(a, self.pooled)) for a in archs]
                        + [math.log(self.attention_ratios.get(a, self.attention))
                           for a in archs]
                        + [self.kernel_overhead_us, self.comm_slowdown])


N_SHARED = 2  # kernel overhead, comm slowdown (after the per-arch matmul and attention ratios)


def _bounds(n_archs: int) -> tuple[list[float], list[float]]:
    lo = [math.log(RATIO_BOUNDS[0])] * (2 * n_archs) + [OVERHEAD_BOUNDS_US[0],
                                                        SLOWDOWN_BOUNDS[0]]
    hi = [math.log(RATIO_BOUNDS[1])] * (2 * n_archs) + [OVERHEAD_BOUNDS_US[1],
                                                        SLOWDOWN_BOUNDS[1]]
    return lo, hi


def _pooled(logs: np.ndarray, w: np.ndarray, default: float) -> float:
    """The geometric mean of per-architecture ratios weighted by their runs."""
    return float(np.exp((logs * w).sum() / w.sum())) if len(logs) and w.sum() > 0 else default


def _fit_from(x: np.ndarray, archs: Sequence[str], weights: Sequence[float]) -> Fit:
    n = len(archs)
    gemm = np.asarray(x[:n], dtype=float)
    attn = np.asarray(x[n:2 * n], dtype=float)
    w = np.asarray(weights, dtype=float)
    return Fit(ratios={str(a): float(np.exp(v)) for a, v in zip(archs, gemm, strict=True)},
               pooled=_pooled(gemm, w, 1.0),
               attention_ratios={str(a): float(np.exp(v))
                                 for a, v in zip(archs, attn, strict=True)},
               attention=_pooled(attn, w, 1.0), kernel_overhead_us=float(x[-2]),
               comm_slowdown=float(x[-1]))


def cell(run: PublishedRun) -> str:
    """The (GPU generation, trainer) cell of a run: ``"hopper/megatron"``."""
    return f"{run.cluster.gpu.architecture or '?'}/{run.job.framework}"


def unfitted(runs: Sequence[PublishedRun]) -> set[str]:
    """Ids of the runs whose cell has fewer than ``CELL_MIN_SOURCES`` sources: predicted, not
    fitted on."""
    sources: dict[str, set[str]] = {}
    for r in runs:
        sources.setdefault(cell(r), set()).add(run_group(r))
    return {r.id for r in runs if len(sources[cell(r)]) < CELL_MIN_SOURCES}


def fitted_architectures(runs: Sequence[PublishedRun], arch_of: Sequence[str]) -> list[str]:
    """The architectures whose ratio ``runs`` determine (``ARCH_MIN_SOURCES``), sorted."""
    sources: dict[str, set[str]] = {}
    for r, a in zip(runs, arch_of, strict=True):
        sources.setdefault(a, set()).add(run_group(r))
    need = min(ARCH_MIN_SOURCES, len(set().union(*sources.values())) if sources else 1)
    return sorted(a for a, s in sources.items() if len(s) >= need)


class _Model:
    """Predicts runs for parameter vectors; the raw (uncalibrated) GPU profiles cached."""

    def __init__(self, runs: Sequence[PublishedRun]) -> None:
        self.runs = list(runs)
        self._raw: dict[str, dict[str, Any]] = {}
        for r in self.runs:
            name = r.cluster.gpu.name
            if name not in self._raw:
                try:
                    self._raw[name] = hardware_profiles.load("gpus", name, calibrated=False)
                except SpecError:
                    raise SpecError(f"run {r.id!r}: its GPU {name!r} is not a shipped profile; "
                                    "calibrate fits the shipped profiles (see 'planner gpus')"
                                    ) from None
        self.arch_of = [r.cluster.gpu.architecture for r in self.runs]
        #: Runs predicted but not fitted on (``unfitted``).
        self.held = unfitted(self.runs)
        #: Square roots of the runs' weights in the fit (``MEDIUM_WEIGHT``; 0 for ``held``).
        self.root_w = np.sqrt([0.0 if r.id in self.held else
                               MEDIUM_WEIGHT if r.confidence == "medium" else 1.0
                               for r in self.runs])
        fitting = [i for i, r in enumerate(self.runs) if r.id not in self.held]
        self.archs = fitted_architectures([self.runs[i] for i in fitting],
                                          [self.arch_of[i] for i in fitting])

    def counts(self, archs: Sequence[str], idx: Indices | None = None) -> list[int]:
        """Runs (all, or those at ``idx``) on each of ``archs``: the pooled ratio's weights."""
        mine = [self.arch_of[i] for i in (range(len(self.runs)) if idx is None else idx)
                if self.runs[i].id not in self.held]
        return [mine.count(a) for a in archs]

    def gpus(self, fit: Fit) -> dict[str, GPU]:
        """Each run's GPU profile with ``fit`` applied, as ``GPU.preset`` applies a shipped
        fit (``hardware_profiles.apply_transfer``)."""
        out = {}
        for name, data in self._raw.items():
            eff, _ = hardware_profiles.apply_transfer(
                data["efficiency"], fit.transfer_table(),
                architecture=str(data.get("architecture", "")))
            out[name] = GPU.from_profile({**data, "efficiency": eff})
        return out

    def estimates(self, fit: Fit, idx: Indices | None = None) -> list[Estimate]:
        """The runs (all, or those at ``idx``) estimated with ``fit``."""
        gpus = self.gpus(fit)
        out = []
        for i in (range(len(self.runs)) if idx is None else idx):
            run = self.runs[i]
            cluster = replace(run.cluster, gpu=gpus[run.cluster.gpu.name])
            out.append(run_estimate(run, cluster))
        return out

    def log_errors(self, fit: Fit, idx: Indices | None = None) -> np.ndarray:
        """``log(predicted / measured)`` of the runs (all, or those at ``idx``)."""
        ids = range(len(self.runs)) if idx is None else idx
        return np.array([math.log(predict_run(self.runs[i], est) / self.runs[i].measured)
                         for i, est in zip(ids, self.estimates(fit, ids), strict=True)])

    def differences(self, x: np.ndarray, h: np.ndarray, archs: Sequence[str],
                    counts: Sequence[float], base: Fit, base_errors: np.ndarray,
                    weights: np.ndarray | float = 1.0) -> np.ndarray:
        """Forward differences of ``weights * log_errors`` at the parameter vector ``x``
        (the fit ``base``, under which the runs' log errors are ``base_errors``), one
        column per step ``h[j]`` of ``x[j]``. A fit reaches a run only through its GPU's
        profile, so a column estimates again only the runs whose GPU its step changes (a
        step in one architecture's ratios leaves the others' runs alone); the others keep
        their base errors, exactly what they would get."""
        old = self.gpus(base)
        f0 = weights * base_errors
        jac = np.empty((len(self.runs), len(x)))
        for j in range(len(x)):
            xj = x.copy()
            xj[j] = x[j] + h[j]
            fit = _fit_from(xj, archs, counts)
            new = self.gpus(fit)
            changed = [i for i, r in enumerate(self.runs)
                       if new[r.cluster.gpu.name] != old[r.cluster.gpu.name]]
            errors = np.array(base_errors, dtype=float)
            if changed:
                errors[changed] = self.log_errors(fit, changed)
            jac[:, j] = (weights * errors - f0) / (xj[j] - x[j])
        return jac


def fit_transfer(runs: Sequence[PublishedRun], start: Fit | None = None) -> tuple[Fit, np.ndarray]:
    """Fit the parameters (``Fit``) to ``runs``, from ``start`` where given; returns the fit
    and the runs' log errors under it."""
    from scipy.optimize import least_squares

    if not runs:
        raise SpecError("no runs to fit")
    model = _Model(runs)
    archs = model.archs
    counts = model.counts(archs)
    x0 = (start or Fit({}, 0.86, 5.0, 0.1, 0.6)).vector(archs)
    lo, hi = (np.array(b) for b in _bounds(len(archs)))
    x0 = np.clip(x0, lo, hi)

    last: dict[bytes, tuple[Fit, np.ndarray]] = {}  # the last point's fit and log errors

    def at(x: np.ndarray) -> tuple[Fit, np.ndarray]:
        key = np.asarray(x, dtype=float).tobytes()
        if key not in last:
            fit = _fit_from(x, archs, counts)
            last.clear()
            last[key] = (fit, model.log_errors(fit))
        return last[key]

    def residuals(x: np.ndarray) -> np.ndarray:
        return model.root_w * at(x)[1]

    def jacobian(x: np.ndarray) -> np.ndarray:
        # scipy's forward differences ('2-point', diff_step 1e-3, turned back at a bound),
        # each column estimating again only the runs its step reaches
        # (_Model.differences): the same numbers, a fraction of the estimates.
        x = np.asarray(x, dtype=float)
        sign = (x >= 0).astype(float) * 2 - 1
        h = 1e-3 * sign * np.abs(x)
        h = np.where((x + h) - x == 0, np.finfo(float).eps ** 0.5 * sign
                     * np.maximum(1.0, np.abs(x)), h)
        out_of = ((x + h) < lo) | ((x + h) > hi)
        h = np.where(out_of & (np.abs(h) <= np.maximum(x - lo, hi - x)), -h, h)
        return model.differences(x, h, archs, counts, *at(x), weights=model.root_w)

    sol = least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi),
                        x_scale=[0.1] * (2 * len(archs)) + [5.0, 0.1],
                        loss=LOSS, f_scale=F_SCALE)
    fit = _fit_from(sol.x, archs, counts)
    return fit, model.log_errors(fit)


@dataclass(frozen=True)
class Fold:
    """One source left out: the parameters fitted without it and its runs' log errors."""

    group: str
    fit: Fit
    log_errors: np.ndarray


def leave_one_source_out(runs: Sequence[PublishedRun], fit: Fit,
                         refit: Callable[[Sequence[PublishedRun], Fit], Fit] | None = None,
                         only: Collection[str] | None = None,
                         log_errors: np.ndarray | None = None) -> dict[str, Fold]:
    """For each source, the fit without it and the log errors it then makes on that source.

    Default: one Gauss-Newton step from ``fit`` (the all-source fit) on the other sources'
    residuals, with the Jacobian at ``fit`` by forward differences; an architecture that no
    other source ran on takes the pooled ratios of the rest, as a GPU without runs does.
    ``refit(runs, start)``: refit each fold from scratch instead (slow; for checking).
    ``only``: the sources to leave out (default: each in turn). ``log_errors``: the runs'
    log errors under ``fit``, where the caller has them.
    """
    model = _Model(runs)
    archs = model.archs
    groups = np.array([run_group(r) for r in runs])
    out: dict[str, Fold] = {}
    if refit is None:
        x = fit.vector(archs)
        r0 = model.log_errors(fit) if log_errors is None else np.asarray(log_errors)
        steps = np.array([1e-3] * (2 * len(archs)) + [0.05, 1e-3])
        jac = model.differences(x, steps, archs, counts=model.counts(archs), base=fit,
                                base_errors=r0)
    for g in dict.fromkeys(groups):
        if only is not None and g not in only:
            continue
        test = np.flatnonzero(groups == g)
        train = np.flatnonzero(groups != g)
        if refit is not None:
            fold_fit = refit([runs[int(i)] for i in train], fit)
        else:
            fitting = [int(i) for i in train if runs[int(i)].id not in model.held]
            seen = fitted_architectures([runs[i] for i in fitting],
                                        [model.arch_of[i] for i in fitting])
            n = len(archs)
            cols = np.array([archs.index(a) for a in seen]
                            + [n + archs.index(a) for a in seen]
                            + [2 * n + k for k in range(N_SHARED)], dtype=np.intp)
            w = model.root_w[train]
            xs = _robust_step(jac[np.ix_(train, cols)] * w[:, None], r0[train] * w, x[cols],
                              *_bounds(len(seen)))
            fold_fit = _fit_from(xs, seen, model.counts(seen, train))
        out[str(g)] = Fold(group=str(g), fit=fold_fit,
                           log_errors=model.log_errors(fold_fit, test))
    return out


def _robust_step(jac: np.ndarray, r0: np.ndarray, x0: np.ndarray, lo: Sequence[float],
                 hi: Sequence[float]) -> np.ndarray:
    """The minimum of the fit's robust loss on the linearized model ``r0 + jac (x - x0)``
    within the bounds: iteratively reweighted least squares with soft_l1's weights
    ``1 / sqrt(1 + (r / F_SCALE)^2)`` (scipy's loss, the one ``fit_transfer`` minimizes)."""
    x = x0.copy()
    for _ in range(30):
        r = r0 + jac @ (x - x0)
        w = np.sqrt(1.0 / np.sqrt(1.0 + (r / F_SCALE) ** 2))
        dx, *_ = np.linalg.lstsq(jac * w[:, None], -(r0 - jac @ x0) * w, rcond=None)
        new = np.clip(dx, lo, hi)
        if np.allclose(new, x, rtol=0, atol=1e-9):
            break
        x = new
    return x


def loso_log_errors(runs: Sequence[PublishedRun], folds: dict[str, Fold]) -> dict[str, float]:
    """Run id -> its log error with its source left out, for the runs of ``folds``."""
    by_group: dict[str, list[PublishedRun]] = {}
    for r in runs:
        by_group.setdefault(run_group(r), []).append(r)
    return {r.id: float(err) for g, fold in folds.items()
            for r, err in zip(by_group[g], fold.log_errors, strict=True)}


def bands(runs: Sequence[PublishedRun], folds: dict[str, Fold]) -> dict[str, dict[str, float]]:
    """Uncertainty bands from the leave-one-source-out errors: for each class (``band_key``)
    with at least ``BAND_MIN_RUNS`` runs from ``BAND_MIN_SOURCES`` sources, the RMS of their
    log errors as a relative band (``exp(rms) - 1``), with its run and source counts; and
    ``"extrapolated"``, the same over the runs of cells the fit had no second source in
    (``unfitted``): how far off an estimate in a generation/trainer cell without published
    runs has been; and ``"moe"`` (``MOE_BAND``), the same over the mixture-of-experts runs of
    every cell, the floor of an MoE estimate's band (``uncertainty.band_for``)."""
    errs: dict[str, list[float]] = {}
    srcs: dict[str, set[str]] = {}
    loso = loso_log_errors(runs, folds)
    for r in runs:
        if r.id not in loso:
            continue
        for key in band_key(r.cluster.gpu.architecture, r.job.framework, r.cluster.num_gpus):
            errs.setdefault(key, []).append(loso[r.id])
            srcs.setdefault(key, set()).add(run_group(r))
    held = unfitted(runs)
    errs["extrapolated"] = [loso[r.id] for r in runs if r.id in held and r.id in loso]
    srcs["extrapolated"] = {run_group(r) for r in runs if r.id in held}
    moe = [r for r in runs if r.model.num_experts and r.id in loso]
    errs[MOE_BAND] = [loso[r.id] for r in moe]
    srcs[MOE_BAND] = {run_group(r) for r in moe}
    out = {}
    for key, e in errs.items():
        if (len(e) >= BAND_MIN_RUNS and len(srcs[key]) >= BAND_MIN_SOURCES) or key == "*":
            rms = float(np.sqrt(np.mean(np.square(e))))
            out[key] = {"band": math.expm1(rms), "runs": len(e), "sources": len(srcs[key])}
    return out


def held_out_errors(fit: Fit, runs: Sequence[PublishedRun]) -> list[tuple[PublishedRun, float]]:
    """Each of ``runs``, which the fit never saw (the frontier runs,
    ``costmodel/data/frontier_runs.json``), predicted with ``fit``: (run, relative error of
    the predicted figure)."""
    model = _Model(runs)
    return [(r, predict_run(r, est) / r.measured - 1.0)
            for r, est in zip(model.runs, model.estimates(fit), strict=True)]


def _run_entry(run: PublishedRun, left_out: float | None, **errors: float) -> dict[str, Any]:
    """One run's ``[runs]`` line: its errors of the published figure (rounded); its cell,
    source and model shape (``uncertainty.model_key``: what ``band_for`` finds a planned
    model's own runs by); and ``step``, the error of its step time left out of the fit
    (``left_out``, the figure's: a rate, tokens/s or TFLOP/s, is the step time's inverse),
    where it has one."""
    entry: dict[str, Any] = {k: round(v, 4) for k, v in errors.items()}
    entry.update(cell=cell(run), source=run_group(run), model=model_key(run.model) or "")
    if left_out is not None:
        step = left_out if run.measure == "iteration_time_s" else 1.0 / (1.0 + left_out) - 1.0
        entry["step"] = round(step, 4)
    return entry


def transfer_toml(fit: Fit, runs: Sequence[PublishedRun], log_errors: np.ndarray,
                  folds: dict[str, Fold], provenance: str,
                  held_out: Sequence[tuple[PublishedRun, float]] = ()) -> str:
    """The ``calibrated/transfer.toml`` text: the fit, its bands and every run's fit and
    leave-one-source-out errors, and the errors of the runs ``held_out`` of it
    (``held_out_errors``)."""
    loso = {k: math.expm1(v) for k, v in loso_log_errors(runs, folds).items()}
    table = {
        "provenance": provenance,
        "transfer": {
            "gemm": round(fit.pooled, 4),
            "attention": round(fit.attention, 4),
            "memory": 1.0,
            "kernel_overhead_us": round(fit.kernel_overhead_us, 3),
            "comm_slowdown": round(fit.comm_slowdown, 4),
            "architecture": {a: round(v, 4) for a, v in sorted(fit.ratios.items())},
            "attention_architecture": {a: round(v, 4)
                                       for a, v in sorted(fit.attention_ratios.items())},
        },
        "bands": {key: {"band": round(b["band"], 4), "runs": b["runs"],
                        "sources": b["sources"]}
                  for key, b in sorted(bands(runs, folds).items())},
        "gpus": {g: sum(1 for r in runs if r.cluster.gpu.name == g)
                 for g in sorted({r.cluster.gpu.name for r in runs})},
        "cells": {c: {"runs": sum(1 for r in runs if cell(r) == c),
                      "sources": len({run_group(r) for r in runs if cell(r) == c})}
                  for c in sorted({cell(r) for r in runs})},
        "runs": {**{r.id: _run_entry(r, loso.get(r.id), fit=math.expm1(float(err)),
                                     **({"loso": loso[r.id]} if r.id in loso else {}))
                    for r, err in zip(runs, log_errors, strict=True)},
                 **{r.id: _run_entry(r, err, held_out=err) for r, err in held_out}},
    }
    notes = {
        "transfer": "In-training over microbenchmark matmul fraction (gemm: the pooled ratio, for "
                    "architectures\nwithout runs), fused attention kernels over theirs (attention: "
                    "pooled alike), the fixed\ncost of one kernel, and the seconds of compute lost "
                    "per second of communication\nrunning beside it.",
        "transfer.architecture": "The matmul ratio of each architecture with runs from at least "
                                 "two sources.",
        "transfer.attention_architecture": "The fused-attention ratio of the same "
                                           "architectures.",
        "bands": "Relative uncertainty of a step-time estimate: the RMS leave-one-source-out "
                 "error\nof the published runs of its class (architecture/trainer/GPUs), broadest "
                 "last.",
        "gpus": "Published runs per GPU profile: an estimate on a GPU whose profile assumes "
                "some\nefficiencies and that no run was on carries a widened band.",
        "cells": "Runs and sources per GPU generation and trainer; a cell with one source is "
                 "predicted,\nnot fitted on.",
        "runs": "Each run's error (of the figure its source publishes) under the fit and with its\n"
                "source left out of the fit (a frontier run's, held_out, under the fit, which\n"
                "never saw it); its cell, source and model shape; step: the left-out error of its\n"
                "step time (under 0: predicted faster than measured).",
    }
    return to_toml(table, "Written by `planner calibrate`; do not edit by hand, re-run the "
                   "command.", notes, inline=("bands", "cells", "runs"))


def load_fit(path: str | Path | None = None) -> Fit:
    """The fit in a ``transfer.toml`` (default: the one every GPU profile takes,
    ``hardware_profiles.transfer_path()``)."""
    p = Path(path) if path is not None else hardware_profiles.transfer_path()
    found = hardware_profiles.load_file(p).get("transfer")
    if not isinstance(found, dict) or "gemm" not in found or "kernel_overhead_us" not in found:
        raise SpecError(f"{str(p)!r} has no [transfer] table with gemm and kernel_overhead_us; "
                        "write one with 'planner calibrate'")
    t: dict[str, Any] = found
    table = t.get("architecture")
    arch = table if isinstance(table, dict) else {}
    table = t.get("attention_architecture")
    attn = table if isinstance(table, dict) else {}
    return Fit(ratios={str(k): float(v) for k, v in arch.items()}, pooled=float(t["gemm"]),
               kernel_overhead_us=float(t["kernel_overhead_us"]),
               comm_slowdown=float(t.get("comm_slowdown", 0.0)),
               attention=float(t.get("attention", t["gemm"])),
               attention_ratios={str(k): float(v) for k, v in attn.items()})


@dataclass(frozen=True)
class RunResult:
    """One run under the fit: ``predicted`` (in the run's measure), ``error`` = predicted /
    measured - 1, ``loso_error`` the same with the run's source left out of the fit (None
    where not computed), and the estimate's peak memory (GiB) and whether it fits."""

    run: PublishedRun
    predicted: float
    error: float
    loso_error: float | None
    peak_memory_gib: float
    fits: bool
    #: The estimate in the published peak's terms (GiB): the allocator's tensors (the peak
    #: less the CUDA context, cuBLAS and NCCL buffers), and for a "max reserved" figure
    #: over (1 - the allocator's fragmentation, software.toml [runtime]).
    compared_memory_gib: float = math.nan

    @property
    def memory_error(self) -> float | None:
        """Predicted over published peak memory - 1, where the source publishes it."""
        if self.run.peak_memory_gib is None:
            return None
        return self.compared_memory_gib / self.run.peak_memory_gib - 1.0


def compared_memory_gib(run: PublishedRun, est: Estimate) -> float:
    """The estimate's peak as the run's source measured it (``RunResult.compared_memory_gib``):
    PyTorch's allocator peak (``max_memory_allocated``) is the estimate less its
    ``overhead`` term, and its reserved peak (``max_memory_reserved``) that over
    ``1 - allocator_fragmentation``."""
    allocated = (float(est.peak_memory_bytes) - est.memory.overhead_bytes) / GIB
    if "reserved" in run.peak_memory_what:
        frag = float(hardware_profiles.load_software()["runtime"]["allocator_fragmentation"])
        return allocated / (1.0 - frag)
    return allocated


def validation_report(runs: Sequence[PublishedRun], fit: Fit, loso: bool = True,
                      folds: dict[str, Fold] | None = None) -> list[RunResult]:
    """Every run predicted with ``fit``, and with its source left out of it (``loso``; needs
    runs from at least two sources, and ``runs`` to be the fit's training rows; ``folds``:
    ones already computed)."""
    model = _Model(runs)
    ests = model.estimates(fit)
    if folds is None and loso and len({run_group(r) for r in runs}) > 1:
        log_errors = np.array([math.log(predict_run(r, est) / r.measured)
                               for r, est in zip(runs, ests, strict=True)])
        folds = leave_one_source_out(runs, fit, log_errors=log_errors)
    loso_of = {k: math.expm1(v) for k, v in loso_log_errors(runs, folds or {}).items()}
    out = []
    for r, est in zip(runs, ests, strict=True):
        pred = predict_run(r, est)
        out.append(RunResult(run=r, predicted=pred, error=pred / r.measured - 1.0,
                             loso_error=loso_of.get(r.id), fits=bool(est.fits),
                             peak_memory_gib=float(est.peak_memory_bytes) / GIB,
                             compared_memory_gib=compared_memory_gib(r, est)))
    return out

"""What ``planner validate`` and ``planner calibrate`` print: every published run predicted
under the fit and with its source left out of it, per source, and the peak memory where the
source publishes it (``costmodel.fitting.calibration``); and runs predicted with one GPU profile
(``costmodel.fitting.published.Comparison``: ``planner calibrate --gpu``, ``planner validate
--profile``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.fitting.calibration import Fit, RunResult, cell, run_group

if TYPE_CHECKING:
    from costmodel.fitting.published import Comparison

__all__ = ["UNITS", "cells", "comparison_rows", "comparison_summary", "describe",
           "print_comparisons", "print_results", "result_rows", "summary"]

UNITS = {"iteration_time_s": "s/iter", "tokens_per_s_per_gpu": "tok/s/GPU",
         "tflops_per_gpu": "TFLOP/s/GPU"}


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:+6.1f}%"


def result_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One JSON-ready dict per run: its figure predicted and measured, the error under the
    fit and with its source left out (``loso_error``, None where not computed), and the
    peak memory predicted and published (GiB)."""
    return [{"id": r.run.id, "group": run_group(r.run), "measure": r.run.measure,
             "predicted": r.predicted, "measured": r.run.measured, "error": r.error,
             "loso_error": r.loso_error, "fits": r.fits,
             "peak_memory_gib": r.peak_memory_gib,
             "compared_memory_gib": (r.compared_memory_gib
                                     if r.run.peak_memory_gib is not None else None),
             "published_memory_what": r.run.peak_memory_what or None,
             "published_peak_memory_gib": r.run.peak_memory_gib,
             "memory_error": r.memory_error}
            for r in results]


def _stats(errors: Sequence[float]) -> dict[str, float]:
    a = np.abs(np.asarray(errors, dtype=float))
    return {"mean_abs_error": float(a.mean()), "median_abs_error": float(np.median(a)),
            "max_abs_error": float(a.max())}


def _groups(groups: Iterable[str]) -> list[str]:
    """The sources in the order they first appear, then ``"all"``."""
    return [*dict.fromkeys(groups), "all"]


def summary(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    """Per source and for ``"all"``: runs, the fit's mean / median / max |error|, the same
    left out of the fit (``loso_*``, where computed); ``"memory"``: the runs that publish
    peak memory and the error on it, and how many published runs are predicted not to
    fit."""
    out: dict[str, dict[str, Any]] = {}
    for key in _groups(run_group(r.run) for r in results):
        mine = [r for r in results if key in ("all", run_group(r.run))]
        row: dict[str, Any] = {"runs": len(mine), **_stats([r.error for r in mine])}
        loso = [r.loso_error for r in mine if r.loso_error is not None]
        if len(loso) == len(mine):
            row.update({f"loso_{k}": v for k, v in _stats(loso).items()})
        out[key] = row
    mem = [r.memory_error for r in results if r.memory_error is not None]
    out["memory"] = {"runs": len(mem), "predicted_not_to_fit": [r.run.id for r in results
                                                                if not r.fits]}
    if mem:
        out["memory"].update(_stats(mem))
    return out


def cells(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    """Per (GPU generation, trainer) cell, ``"hopper/megatron"``: its runs, sources, the
    GPUs they ran on, the fit's and the left-out mean |error|, and the band an estimate in
    that cell carries (``costmodel.fitting.uncertainty.band_for``: extrapolated where the cell
    has too few runs)."""
    from costmodel.fitting.uncertainty import band_for

    out: dict[str, dict[str, Any]] = {}
    keyed: dict[str, list[RunResult]] = {}
    for r in results:
        keyed.setdefault(cell(r.run), []).append(r)
    for key, mine in sorted(keyed.items()):
        arch, trainer = key.split("/")
        loso = [r.loso_error for r in mine if r.loso_error is not None]
        band = band_for(arch, trainer, 64)
        out[key] = {"runs": len(mine), "sources": len({run_group(r.run) for r in mine}),
                    "gpus": sorted({r.run.cluster.gpu.name for r in mine}),
                    "mean_abs_error": float(np.mean([abs(r.error) for r in mine])),
                    **({"loso_mean_abs_error": float(np.mean(np.abs(loso)))}
                       if len(loso) == len(mine) else {}),
                    "band": band[0] if band else None,
                    "extrapolated": band[2] if band else True}
    return out


def _print_cells(results: Sequence[RunResult], mean_label: str = "fit mean") -> None:
    print(f"\n{'generation/trainer':<22s} {'runs':>4s} {'sources':>7s}  {mean_label:>8s}  "
          f"{'left out':>8s}  {'band':>6s}  gpus")
    for key, c in cells(results).items():
        loso = (f"{100 * c['loso_mean_abs_error']:>7.2f}%" if "loso_mean_abs_error" in c
                else f"{'-':>8s}")
        band = "-" if c["band"] is None else f"±{100 * c['band']:.0f}%"
        band += " extrapolated" if c["extrapolated"] else ""
        print(f"{key:<22s} {c['runs']:>4d} {c['sources']:>7d}  "
              f"{100 * c['mean_abs_error']:>7.2f}%  {loso}  {band:<6s}  "
              f"{', '.join(c['gpus'])}")


def print_results(results: Sequence[RunResult], fit: Fit | None, *, runs_table: bool = True,
                  held_out: bool = False) -> None:
    """The per-run table (unless ``runs_table`` is False), the per-source table and the
    memory check, as ``planner validate`` prints them. ``held_out``: runs the fit never saw
    (``planner validate --frontier`` or ``--runs FILE``), whose mean error under the fit is
    already out of sample: labelled so, with its summary line."""
    label = "held out" if held_out else "fit mean"
    has_loso = any(r.loso_error is not None for r in results)
    if runs_table:
        print(f"{'run':<50s} {'measure':<11s} {'predicted':>10s} {'measured':>10s} "
              f"{'error':>7s}" + (f" {'LOSO':>7s}" if has_loso else ""))
        for r in results:
            print(f"{r.run.id[:50]:<50s} {UNITS[r.run.measure]:<11s} {r.predicted:>10.2f} "
                  f"{r.run.measured:>10.2f} {_pct(r.error)}"
                  + (f" {_pct(r.loso_error)}" if has_loso else ""))
        print()
    sm = summary(results)
    head = f"{'source':<26s} {'runs':>4s}  {label:>8s} {'max':>7s}"
    if has_loso:
        head += f"  {'left out: mean':>14s} {'max':>7s}"
    print(head)
    for key, row in sm.items():
        if key == "memory":
            continue
        line = (f"{key:<26s} {row['runs']:>4d}  {100 * row['mean_abs_error']:>7.2f}% "
                f"{100 * row['max_abs_error']:>6.1f}%")
        if "loso_mean_abs_error" in row:
            line += (f"  {100 * row['loso_mean_abs_error']:>13.2f}% "
                     f"{100 * row['loso_max_abs_error']:>6.1f}%")
        print(line)
    _print_cells(results, label)
    allrow = sm["all"]
    if held_out:
        print(f"\nheld out of the fit (it never saw these runs), {allrow['runs']} runs: mean "
              f"|error| {100 * allrow['mean_abs_error']:.2f}%, median "
              f"{100 * allrow['median_abs_error']:.2f}%")
    if "loso_mean_abs_error" in allrow:
        print(f"\nleft out of the fit (leave-one-source-out), {allrow['runs']} runs: mean "
              f"|error| {100 * allrow['loso_mean_abs_error']:.2f}%, median "
              f"{100 * allrow['loso_median_abs_error']:.2f}%")
    _print_moe(results, "left out of the fit" if "loso_mean_abs_error" in allrow
               else "held out of the fit" if held_out else "under the fit")
    if "loso_mean_abs_error" in allrow:
        _print_own_bands()
    mem = sm["memory"]
    if mem["runs"]:
        print(f"peak memory, {mem['runs']} runs that publish it: mean |error| "
              f"{100 * mem['mean_abs_error']:.1f}%, max {100 * mem['max_abs_error']:.1f}%")
    nofit = mem["predicted_not_to_fit"]
    print(f"published runs predicted not to fit: {len(nofit)} of {len(results)}"
          + (f" ({', '.join(nofit)})" if nofit else ""))
    if fit is not None:
        print("fit: " + describe(fit))


def _print_moe(results: Sequence[RunResult], how: str) -> None:
    """The mixture-of-experts runs among ``results`` (where there are dense ones too): their
    count, sources and mean and median |error| (``how``: left out of the fit where each run's
    leave-one-source-out error was computed, else under the fit)."""
    moe = [r for r in results if getattr(r.run.model, "num_experts", 0)]
    if not moe or len(moe) == len(results):
        return
    errors = [r.loso_error if r.loso_error is not None else r.error for r in moe]
    st = _stats(errors)
    from costmodel.fitting.uncertainty import moe_band

    band = moe_band()
    print(f"mixture-of-experts runs among them, {len(moe)} from "
          f"{len({run_group(r.run) for r in moe})} sources, {how}: mean |error| "
          f"{100 * st['mean_abs_error']:.2f}%, median {100 * st['median_abs_error']:.2f}%"
          + (f"; an MoE estimate's band is at least ±{100 * band[0]:.0f}%" if band else ""))


#: The least widening (of the relative band) a model's own runs make that ``planner validate
#: --summary`` lists: narrower ones change no estimate's reading.
OWN_BAND_SHOWN = 0.02


def own_band_rows() -> list[dict[str, Any]]:
    """The models (by preset name) whose own published runs, left out of the fit, widen their
    band by at least ``OWN_BAND_SHOWN`` on 64 GPUs of their cell, so that an estimate of
    them carries theirs (``uncertainty.own_bands``), widest first: their shape, preset
    names, cell, band, runs and the band without them."""
    from costmodel.fitting.uncertainty import model_key, own_bands
    from costmodel.model import ModelSpec

    names: dict[str, list[str]] = {}
    for name in ModelSpec.preset_names():
        key = model_key(ModelSpec.preset(name))
        if key is not None:
            names.setdefault(key, []).append(name)
    return [{"shape": key, "models": names[key], "cell": cell, "band": band, "runs": runs,
             "band_without": base}
            for key, cell, band, runs, base in own_bands()
            if key in names and band - base >= OWN_BAND_SHOWN]


def _print_own_bands() -> None:
    """``own_band_rows``, a line each (``planner validate --summary``)."""
    found = [f"  {' / '.join(r['models'])} on {r['cell']}: ±{100 * r['band']:.0f}% "
             f"({r['runs']} run{'s' if r['runs'] > 1 else ''}; ±{100 * r['band_without']:.0f}% "
             "without them)" for r in own_band_rows()]
    if found:
        print("models whose own runs were further off than their cell's band (an estimate of "
              "them on 64 GPUs carries theirs):", *found, sep="\n")


def describe(fit: Fit) -> str:
    """The fitted parameters in one line."""
    ratios = ", ".join(f"{a} {v:.3f}" for a, v in sorted(fit.ratios.items()))
    attn = ", ".join(f"{a} {v:.3f}" for a, v in sorted(fit.attention_ratios.items()))
    return (f"matmul in-training/microbenchmark ratio {ratios} (others {fit.pooled:.3f}); "
            f"attention {attn} (others {fit.attention:.3f}); "
            f"kernel overhead {fit.kernel_overhead_us:.2f} us; "
            f"compute slowdown per second of overlapped communication {fit.comm_slowdown:.3f}")


def comparison_rows(comps: Sequence[Comparison]) -> list[dict[str, Any]]:
    """One JSON-ready dict per run predicted with one GPU profile
    (``costmodel.fitting.published.compare``): its figure predicted and measured, the error, the
    step time and whether it fits."""
    return [{"id": c.run.id, "group": run_group(c.run), "measure": c.run.measure,
             "predicted": c.predicted, "measured": c.measured, "error": c.error,
             "step_time_s": c.estimate.step_time_s, "fits": c.estimate.fits}
            for c in comps]


def comparison_summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per source of ``comparison_rows`` and for ``"all"``: runs and mean / max |error|."""
    out: dict[str, dict[str, Any]] = {}
    for key in _groups(r["group"] for r in rows):
        errors = [abs(r["error"]) for r in rows if key in ("all", r["group"])]
        out[key] = {"runs": len(errors), "mean_abs_error": sum(errors) / len(errors),
                    "max_abs_error": max(errors)}
    return out


def print_comparisons(rows: Sequence[dict[str, Any]]) -> None:
    """The table of ``comparison_rows`` and its per-source summary, as ``planner calibrate
    --gpu`` prints them."""
    print(f"{'run':<44s} {'measure':<12s} {'predicted':>10s} {'measured':>10s} {'error':>7s}")
    for r in rows:
        print(f"{r['id']:<44s} {UNITS[r['measure']]:<12s} {r['predicted']:>10.2f} "
              f"{r['measured']:>10.2f} {100 * r['error']:>+6.1f}%")
    print()
    for key, sm in comparison_summary(rows).items():
        print(f"{key:<30s} {sm['runs']:>3.0f} runs   mean |error| "
              f"{100 * sm['mean_abs_error']:5.2f}%   max {100 * sm['max_abs_error']:5.2f}%")

"""``planner validate``: the shipped published runs (or your own) predicted under the fit and
with their source left out of it, against what was measured; with ``--profile``, the runs on
that GPU predicted with the shipped profile and the measured one, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from costmodel import SpecError
from costmodel.hardware import GPU
from planner.cli.common import add_command, print_json

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner validate
  planner validate --summary
  planner validate --heldout --json
  planner validate --runs ../shared/data/calibration.json
  planner validate --frontier
  planner validate --heldout --profile h100-sxm-2026-11-22.toml"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner validate`` to ``sub``."""
    val = add_command(
        sub, "validate", help="predicted vs measured for published training runs",
        description="Predict every shipped published run (the calibration set and the "
        "published runs of other sources, costmodel/data) with the fitted efficiencies and "
        "compare with what was measured (iteration time, tokens/s per GPU or TFLOP/s per GPU, "
        "as the source reports), and again with the run's source left out of the fit "
        "(leave-one-source-out: the accuracy to expect on runs the fit has not seen). Per "
        "source: mean and worst error of both; then peak memory where the source publishes "
        "it, and which runs would be predicted not to fit.", epilog=EPILOG)
    val.add_argument("--runs", help="your own runs JSON file (calibration.json schema or the "
                     "planner's): their error under the shipped fit, which never saw them")
    val.add_argument("--heldout", action="store_true", help="only the published runs beyond "
                     "the calibration set")
    val.add_argument("--calibration", action="store_true", help="only the calibration set "
                     "(Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Table 5)")
    val.add_argument("--frontier", action="store_true", help="the shipped runs of frontier "
                     "architectures (DeepSeek-V3, Kimi K2, Qwen3-MoE at scale; "
                     "costmodel/data/frontier_runs.json), held out of the fit: their error "
                     "under it")
    val.add_argument("--summary", action="store_true", help="the per-source table only")
    val.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out "
                     "refits (a few seconds)")
    val.add_argument("--profile", metavar="FILE", help="also predict the runs on this "
                     "profile's GPU with it ('planner profile -o FILE') and show both")
    val.add_argument("--json", action="store_true", help="machine-readable output")
    val.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """``planner validate``: published runs predicted under the fit, and with their source
    left out of it (costmodel.fitting.calibration)."""
    from costmodel.fitting.calibration import load_fit, validation_report
    from costmodel.fitting.published import default_runs_path, load_runs
    from planner.accuracy import describe, own_band_rows, print_results, result_rows, summary

    chosen = [k for k in ("runs", "heldout", "calibration", "frontier") if getattr(args, k)]
    if len(chosen) > 1:
        raise SpecError("give one of --runs FILE, --heldout, --calibration and --frontier")
    if args.frontier:
        args.runs = str(default_runs_path("frontier"))
    if args.profile:
        path = args.runs or default_runs_path("published" if args.heldout else "calibration")
        return _validate_profile(args, path)
    fit = load_fit()
    if args.runs:
        # Runs outside the fit's training rows: their error under the fit is held out already.
        results = validation_report(load_runs(args.runs), fit, loso=False)
        shown = str(args.runs)
    else:
        calibration = load_runs(default_runs_path("calibration"))
        published = load_runs(default_runs_path("published"))
        results = validation_report(calibration + published, fit, loso=not args.no_loso)
        if args.heldout or args.calibration:
            keep = {r.id for r in (published if args.heldout else calibration)}
            results = [r for r in results if r.run.id in keep]
        shown = "shipped"
    if args.json:
        print_json({"runs_file": shown, "fit": describe(fit), "runs": result_rows(results),
                    "summary": summary(results),
                    **({} if args.runs else {"own_bands": own_band_rows()})})
    else:
        print_results(results, fit, runs_table=not args.summary, held_out=bool(args.runs))
    return 0


def _validate_profile(args: argparse.Namespace, path: str | Path) -> int:
    """``planner validate --profile FILE``: the runs on the profile's GPU predicted with the
    shipped profile and with the measured one, side by side."""
    from costmodel.fitting.published import compare, load_runs
    from planner.accuracy import comparison_rows, comparison_summary

    measured = GPU.from_file(args.profile)
    runs = load_runs(path)
    mine = [r for r in runs if r.cluster.gpu.name == measured.name]
    if not mine:
        have = sorted({r.cluster.gpu.name for r in runs})
        raise SpecError(f"no run in {str(path)!r} was measured on {measured.name!r}, the GPU "
                        f"of {args.profile!r} (its runs are on {', '.join(have)}); pass --runs "
                        "with runs on that GPU (the planner's runs JSON schema)")
    shipped = comparison_rows(compare(mine))
    profiled = comparison_rows(compare(mine, gpu=measured))
    summary = {"shipped": comparison_summary(shipped)["all"],
               "profile": comparison_summary(profiled)["all"]}
    if args.json:
        runs_out = [{"id": a["id"], "measure": a["measure"], "measured": a["measured"],
                     "shipped": {k: a[k] for k in ("predicted", "error", "step_time_s")},
                     "profile": {k: b[k] for k in ("predicted", "error", "step_time_s")}}
                    for a, b in zip(shipped, profiled, strict=True)]
        print_json({"runs_file": str(path), "profile": args.profile, "gpu": measured.name,
                    "runs": runs_out, "summary": summary})
        return 0
    print(f"{len(mine)} of {len(runs)} runs are on {measured.name}; predicted with the shipped "
          f"profile and with {args.profile}")
    print(f"{'run':<44s} {'measured':>10s} {'shipped':>10s} {'error':>7s} {'profile':>10s} "
          f"{'error':>7s}")
    for a, b in zip(shipped, profiled, strict=True):
        print(f"{a['id']:<44s} {a['measured']:>10.2f} {a['predicted']:>10.2f} "
              f"{100 * a['error']:>+6.1f}% {b['predicted']:>10.2f} {100 * b['error']:>+6.1f}%")
    print()
    for key, sm in summary.items():
        print(f"{key:<10s} mean |error| {100 * sm['mean_abs_error']:5.2f}%   max "
              f"{100 * sm['max_abs_error']:5.2f}%")
    return 0

"""``planner calibrate``: fit the efficiencies every GPU takes (or, with ``--gpu``, one GPU
profile's own) to published runs, and write them to the user's calibrated folder or
``-o``."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import hardware_profiles
from costmodel import SpecError
from costmodel.hardware import GPU
from hardware_profiles.files import write_text
from planner.cli.common import add_command, print_json

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner calibrate
  planner calibrate --groups megatron2021,korthikanti2022 -o /tmp/transfer.toml
  planner calibrate --gpu a100-80gb --runs ../shared/data/calibration.json -o /tmp/a100.toml"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner calibrate`` to ``sub``."""
    cal = add_command(
        sub, "calibrate", help="fit the GPU efficiencies to published runs",
        description="Fit the parameters the step-time model does not take from a datasheet "
        "or a microbenchmark: per GPU architecture, the ratio of the matmul fraction "
        "training reaches to the profile's microbenchmark fraction; the same for fused "
        "attention; the fixed cost of one kernel; and the compute lost per second of "
        "communication overlapped with it. scipy least squares on log error with a robust "
        "(soft L1) loss, over the shipped published runs or --runs FILE; --groups names the "
        "sources to fit on. Also refits without each source in turn and prints what that "
        "source's runs then get (leave-one-source-out), and writes the uncertainty bands "
        "estimates carry. Written, with its provenance, to your own "
        "~/.config/autoparallel-planner/calibrated/transfer.toml ($PLANNER_CONFIG_DIR or "
        "$XDG_CONFIG_HOME move it), which every GPU profile then takes, or to -o FILE; the "
        "installed package is never written. --gpu NAME instead fits that profile's own "
        "matmul fraction and kernel overhead to the runs on it.", epilog=EPILOG)
    cal.add_argument("--gpu", help="fit only this GPU profile's own efficiencies")
    cal.add_argument("--runs", action="append", help="runs JSON file (repeatable; default: "
                     "the shipped published runs)")
    cal.add_argument("--groups", help="comma-separated sources (a run's group) to fit on")
    cal.add_argument("-o", "--output", help="where to write the TOML (default: your own "
                     "calibrated/transfer.toml, or calibrated/<gpu>.toml with --gpu)")
    cal.add_argument("--json", action="store_true", help="machine-readable output")
    cal.add_argument("--reset", action="store_true", help="remove your own fit (of --gpu, "
                     "else the all-GPU one) so that estimates use the shipped fit again")
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``planner calibrate``: fit the efficiencies every GPU takes (or, with ``--gpu``, one
    GPU profile's own) to published runs, and write them."""
    if args.reset:
        return _reset(args)
    if args.gpu:
        return _calibrate_gpu(args)
    from costmodel.fitting.calibration import (
        fit_transfer,
        held_out_errors,
        leave_one_source_out,
        run_group,
        transfer_toml,
        validation_report,
    )
    from costmodel.fitting.published import default_runs_path, load_runs, shipped_runs
    from planner.accuracy import describe, print_results, result_rows, summary

    runs = [r for f in args.runs for r in load_runs(f)] if args.runs else shipped_runs()
    if args.groups:
        wanted = {g.strip() for g in args.groups.split(",") if g.strip()}
        have = {run_group(r) for r in runs}
        if not wanted <= have:
            raise SpecError(f"--groups names sources the runs do not have: "
                            f"{', '.join(sorted(wanted - have))}; they have "
                            f"{', '.join(sorted(have))}")
        runs = [r for r in runs if run_group(r) in wanted]
    fit, log_errors = fit_transfer(runs)
    folds = leave_one_source_out(runs, fit, log_errors=log_errors) \
        if len({run_group(r) for r in runs}) > 1 else {}
    shown = ", ".join(args.runs) if args.runs else "the shipped published runs"
    prov = (f"planner calibrate on {shown}"
            + (f" (sources {args.groups})" if args.groups else "")
            + f", {len(runs)} runs, {datetime.date.today().isoformat()}")
    out = Path(args.output) if args.output else \
        hardware_profiles.user_calibrated_path("transfer")
    # The frontier runs, which no fit sees, predicted with this one: their errors widen the
    # band of a model of their shape (costmodel.fitting.uncertainty.band_for).
    held = [] if args.runs or args.groups else \
        held_out_errors(fit, load_runs(default_runs_path("frontier")))
    write_text(out, transfer_toml(fit, runs, log_errors, folds, prov, held), "calibration")
    results = validation_report(runs, fit, folds=folds)
    if args.json:
        print_json({"fitted": dataclasses.asdict(fit), "written": str(out),
                    "runs": result_rows(results), "summary": summary(results)})
    else:
        mine = "" if args.output else (" (your own fit: every later estimate uses it; "
                                       "'planner calibrate --reset' goes back to the "
                                       "shipped one)")
        print(f"fitted: {describe(fit)}\nwritten to {out}{mine}\n")
        print_results(results, None, runs_table=False)
    return 0


def _calibrate_gpu(args: argparse.Namespace) -> int:
    """``planner calibrate --gpu NAME``: fit one GPU profile's own matmul fraction and
    per-kernel overhead to the runs measured on it, and write them."""
    from costmodel.fitting.published import (
        calibration_toml,
        default_runs_path,
        fit_efficiency,
        load_runs,
    )
    from planner.accuracy import comparison_rows, comparison_summary, print_comparisons

    if args.groups:
        raise SpecError("--groups selects the sources of the all-GPU fit; with --gpu every "
                        "run on that GPU is fitted")
    if args.runs and len(args.runs) > 1:
        raise SpecError("--gpu fits one runs file; give --runs once")
    gpu = GPU.preset(args.gpu, calibrated=False)
    path = args.runs[0] if args.runs else default_runs_path()
    values, comps = fit_efficiency(load_runs(path), gpu)
    shown = args.runs[0] if args.runs else "costmodel/data/calibration.json"
    text = calibration_toml(gpu, values, comps, shown, datetime.date.today().isoformat())
    out = Path(args.output) if args.output else \
        hardware_profiles.user_calibrated_path(gpu.name)
    write_text(out, text, "calibration")
    rows = comparison_rows(comps)
    if args.json:
        print_json({"gpu": gpu.name, "fitted": values, "written": str(out), "runs": rows,
                    "summary": comparison_summary(rows)})
    else:
        print(f"fitted {gpu.name}: " + ", ".join(f"{k} = {v:.4g}" for k, v in values.items()))
        print(f"written to {out}\n")
        print_comparisons(rows)
    return 0


def _reset(args: argparse.Namespace) -> int:
    """``planner calibrate --reset [--gpu NAME]``: remove the user's own fit."""
    if args.runs or args.groups or args.output:
        raise SpecError("--reset removes your own fit; it takes no --runs, --groups or -o")
    gpu = GPU.preset(args.gpu, calibrated=False).name if args.gpu else "transfer"
    path = hardware_profiles.user_calibrated_path(gpu)
    if not path.is_file():
        print(f"no fit of your own at {path}: estimates use the shipped fit")
        return 0
    try:
        path.unlink()
    except OSError as e:
        raise SpecError(f"cannot remove {str(path)!r}: {e.strerror}") from None
    print(f"removed {path}: estimates use the shipped fit again")
    return 0

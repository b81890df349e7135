"""``planner compare``: configurations, clusters and saved plans side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from costmodel import Job, ModelSpec, ParallelConfig, SpecError
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.layercosts import LayerCosts
from planner.alternatives import params_text
from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_USAGE,
    FORCE_HELP,
    add_command,
    add_common_args,
    load_clusters,
    load_constraints,
    load_saved_plan,
    model_arg,
    print_json,
    training_job,
)
from planner.compare import RANKINGS, Candidate, Comparison, compare
from planner.models import load_model
from planner.progress import Progress
from planner.space import PRESETS

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner compare --model llama-3-70b --gpus 64 --gpu h100-sxm --global-batch-size 512 \\
      --seq-len 8192 --config "tp=8 pp=4 zero=1 sp" --config "tp=2 cp=4 zero=3 sp"
  planner compare --model llama-3-70b --gpus 64 --gpus 128 --gpu h100-sxm --gpu h200 \\
      --global-batch-size 512 --seq-len 8192          # plan each of 4 clusters
  planner compare --plan a.json --plan b.json
  planner compare --model llama-3-8b --gpus 64 --gpu h100-sxm --gpu h200 --gpu a100-80gb \\
      --global-batch-size 512 --seq-len 8192 --rank-by cost   # cheapest per token first
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner compare`` to ``sub``."""
    cp = add_command(
        sub, "compare", help="configurations or clusters side by side",
        description="Estimate each --config on each cluster (or search for the plan when no "
        "--config is given) and print them side by side: step time, tokens/s, tokens/s per "
        "GPU, MFU, memory, and the speed-up over the first. Repeat --cluster, --gpus, --gpu, "
        "--inter-node or --num-nodes to compare clusters; --plan adds saved plans.",
        epilog=EPILOG)
    add_common_args(cp, model_required=False, many=True)
    cp.add_argument("--config", action="append", default=[], metavar="SPEC",
                    help="a configuration, e.g. 'tp=8 pp=4 zero=1 sp mbs=1 "
                    "recompute=selective'; without dp=, dp fills the cluster")
    cp.add_argument("--plan", action="append", default=[], metavar="FILE",
                    help="a saved plan (planner plan -o) to add as a candidate")
    cp.add_argument("--preset", choices=sorted(PRESETS),
                    help="constraints for the searched candidates")
    cp.add_argument("--max", action="append", default=[], metavar="FIELD=N",
                    help="cap a degree of the searched candidates, e.g. --max tp=4")
    cp.add_argument("--frameworks", help="trainers the searched candidates may use")
    cp.add_argument("--rank-by", choices=RANKINGS,
                    help="list the candidates best first: by tokens/s, or by cost (US$ per "
                    "million tokens at the GPU profiles' on-demand prices); default: as given")
    cp.add_argument("--json", action="store_true", help="machine-readable output")
    cp.add_argument("--force", action="store_true", help=FORCE_HELP)
    cp.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """``planner compare``: configurations and clusters side by side."""
    candidates: list[Candidate] = []
    model: ModelSpec | LayerCosts | None = None
    if args.model or not args.plan:
        model = load_model(model_arg(args))
        job = training_job(args, model)
        clusters = load_clusters(args)
        configs: list[str | None] = list(args.config) or [None]
        with Progress("comparing") as bar:
            cmp = compare(model, clusters, job, configs, constraints=load_constraints(args),
                          progress=bar)
        candidates += cmp.candidates
    for path in args.plan:
        candidate, planned = _saved_candidate(path, args)
        model = model or planned
        candidates.append(candidate)
    assert model is not None  # a --model, or at least one --plan
    result = Comparison(model=model, candidates=tuple(candidates))
    if args.rank_by:
        result = result.ranked(args.rank_by)
    if args.json:
        print_json(result.to_dict())
    else:
        print(f"model    {model.name}: {params_text(model)}\n")
        print(result.table())
    if all(c.estimate is None for c in candidates):
        infeasible = all((c.error or "").startswith("infeasible") for c in candidates)
        print(f"planner: {'infeasible' if infeasible else 'error'}: no candidate can run",
              file=sys.stderr)
        return EXIT_INFEASIBLE if infeasible else EXIT_USAGE
    return 0


def _saved_candidate(path: str, args: argparse.Namespace
                     ) -> tuple[Candidate, ModelSpec | LayerCosts]:
    """A saved training plan as a candidate, and its model."""
    p = load_saved_plan(path, args)
    job, config, est = p.job, p.config, p.estimate
    if not (isinstance(job, Job) and isinstance(config, ParallelConfig)
            and isinstance(est, Estimate)):
        raise SpecError(f"{path} is a serving plan; planner compare puts training plans "
                        "side by side (see the serving plan's own summary: "
                        "'planner explain PLAN')")
    return Candidate(label=Path(path).name, cluster=p.cluster, job=job, config=config,
                     estimate=est, searched=True), p.model

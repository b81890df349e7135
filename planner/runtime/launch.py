"""``planner run``: start the processes of a plan, or write the script that starts them.

On one node the launcher runs ``torchrun --standalone`` (as ``python -m
planner.runtime.torchrun``: torch's ``torch.distributed.run``, ending in one line when a
signal stops it) with one process per rank of the plan, each running the training script
(default the minimal loop ``planner.runtime.train``) with ``PLANNER_PLAN`` set to the plan
file; the script calls ``planner.apply(Plan.from_json(os.environ["PLANNER_PLAN"]), model)``.
``planner.runtime.supervise`` runs it so that a Ctrl-C or SIGTERM stops every process it
started (torchrun stops its workers; what is left after a grace period is killed). A plan for
several nodes cannot be started from here: the launcher writes an ``sbatch`` script that runs
``torchrun`` on every node with the c10d rendezvous and the NCCL environment of the cluster's links
(``planner.emit.slurm``), with the plan embedded, to submit with ``sbatch``.

Everything the runtime cannot execute is refused first (``planner.runtime.check``), before any
process starts. torch is not imported here.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts
from hardware_profiles.files import is_file, not_a_file, write_text
from planner.emit.common import header_lines
from planner.emit.slurm import here_document, sbatch_preamble, srun_torchrun
from planner.plan import describe
from planner.result import Plan, load_plan
from planner.runtime.checks import FORCE_ENV, check, traced_source
from planner.runtime.supervise import supervise

__all__ = ["DEFAULT_ENTRY", "Launch", "launch", "prepare", "sbatch_script"]

#: What each process runs when no script is given: the minimal training loop.
DEFAULT_ENTRY = ("-m", "planner.runtime.train")
#: The environment variable naming the plan file for the training script.
PLAN_ENV = "PLANNER_PLAN"


@dataclass(frozen=True)
class Launch:
    """How a plan is started: ``command`` (argv) and ``env`` additions for one node, or the
    ``sbatch`` script text for several (``command`` empty)."""

    plan: Plan
    command: tuple[str, ...]
    env: dict[str, str]
    sbatch: str | None = None


def _entry(script: str | None, script_args: list[str]) -> list[str]:
    if script is None:
        return [*DEFAULT_ENTRY, *script_args]
    if not is_file(script):
        raise not_a_file(script, "training script")
    return [script, *script_args]


def sbatch_script(plan: Plan, script: str | None, script_args: list[str], command: str,
                  force: bool = False) -> str:
    """The sbatch script that trains ``plan`` on its nodes: the plan embedded as
    ``plan.json``, ``PLANNER_PLAN`` pointing at it, torchrun on every node; with ``force``
    (``planner run --force``) its processes run the plan even if it does not fit."""
    job, cfg, est = plan.training()
    head = header_lines(plan, cfg, job, est, command, ())
    lines = sbatch_preamble(plan, head)
    lines += ["", *here_document("plan.json", plan.to_json()),
              f'export {PLAN_ENV}="$PWD/plan.json"  # read by the script: '
              "planner.apply(Plan.from_json(...), model)", ""]
    if force:
        lines[-1:-1] = [f"export {FORCE_ENV}=1  # planner run --force: run it though it does "
                        "not fit"]
    lines += srun_torchrun(plan.cluster.gpus_per_node, shlex.join(_entry(script, script_args)))
    return "\n".join(lines) + "\n"


def _traced_source(plan: Plan, model: str | None) -> list[str]:
    """What the minimal loop needs to build a traced module's plan again: the plan's
    ``module:attr``, or ``model`` (``planner run --model``); refused before any process
    starts when neither names it, or when the loop cannot feed its inputs. The loop's
    arguments for it (``--model``)."""
    traced = isinstance(plan.model, LayerCosts) and plan.model.spec is None
    if not traced:
        if model:
            raise SpecError(f"--model names the module of a traced plan; this plan's model "
                            f"{plan.model.name!r} is built from its spec: drop --model")
        return []
    traced_source(plan, model)
    return ["--model", model] if model else []


def prepare(plan_path: str, script: str | None = None, script_args: list[str] | None = None,
            command: str | None = None, force: bool = False, model: str | None = None
            ) -> Launch:
    """Read the plan (no search; re-validated and re-estimated, ``planner.plan.load_plan``:
    one that does not fit is refused unless ``force``), refuse what the runtime cannot run,
    and say how to start it: the torchrun command for one node, or the sbatch script for
    several."""
    plan, warnings = load_plan(plan_path, force=force)
    for w in warnings:
        print(f"planner: warning: {w}", file=sys.stderr)
    check(plan, reference=script is None, force=force)
    args = list(script_args or [])
    if script is None:
        args = _traced_source(plan, model) + args
    elif model:
        raise SpecError("--model names the module the minimal loop builds; with --script, "
                        "your script builds its own")
    path = str(Path(plan_path).resolve())
    if plan.cluster.num_nodes > 1:
        text = sbatch_script(plan, script, args,
                             command or f"planner run {shlex.quote(plan_path)}", force)
        return Launch(plan=plan, command=(), env={}, sbatch=text)
    cmd = (sys.executable, "-m", "planner.runtime.torchrun", "--standalone",
           f"--nproc-per-node={plan.config.world_size}", *_entry(script, args))
    env = {PLAN_ENV: path, **({FORCE_ENV: "1"} if force else {})}
    return Launch(plan=plan, command=cmd, env=env)


def launch(plan_path: str, script: str | None = None, script_args: list[str] | None = None,
           *, dry_run: bool = False, output: str | None = None,
           command: str | None = None, force: bool = False, model: str | None = None) -> int:
    """Start the plan's processes on this node and wait (returns their exit status), or,
    for a multi-node plan, write the sbatch script to ``output`` (default ``train.sbatch``;
    an existing file is kept unless ``force``). ``dry_run``: print the command, or the sbatch
    script, instead of running or writing it. ``force``: use a plan that does not fit.
    ``model``: the ``module:attr`` of a traced module's plan (default: the plan's own)."""
    how = prepare(plan_path, script, script_args, command, force, model)
    plan = how.plan
    say = f"{describe(plan.config)} ({plan.config.world_size} processes)"
    if how.sbatch is not None:
        out = output or "train.sbatch"
        if dry_run:  # a dry run writes nothing: the script goes to standard output
            sys.stdout.write(how.sbatch)
            return 0
        if Path(out).exists() and not force:
            raise SpecError(f"{out} exists; write the script elsewhere with -o FILE, or pass "
                            "--force to overwrite it")
        write_text(out, how.sbatch, "sbatch script")
        print(f"planner: {plan.cluster.num_nodes} nodes: wrote {out} for {say}; submit it "
              f"with: sbatch {out}", file=sys.stderr)
        return 0
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in how.env.items()) + " " + \
        shlex.join(how.command)
    if dry_run:
        print(line)
        return 0
    print(f"planner: starting {say}: {line}", file=sys.stderr, flush=True)
    return supervise(how.command, {**os.environ, **how.env})

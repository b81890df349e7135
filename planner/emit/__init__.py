"""Emit a ``Plan`` for the trainers people already run, and read the emitted files back.

``emit(plan, target)`` writes one file for ``target``:

- ``torchtitan``: a job-config TOML for torchtitan 0.2.x (``--job.config_file``; the PyPI
  release line that reads TOML job configs, checked against torchtitan 0.2.2's
  ``ConfigManager``). torchtitan 0.3 replaced TOML files with Python config registries;
  the same settings are its ``--parallelism.*`` / ``--training.*`` overrides.
- ``deepspeed``: a ``ds_config.json`` (checked against DeepSpeed 0.19's ``DeepSpeedConfig``),
  with the launcher line and the layout the training script must build in ``_comment``.
- ``megatron``: the ``pretrain_gpt.py`` argument list (checked against the argument parser of
  a pinned Megatron-LM commit, ``tests/data/megatron_args.json``).
- ``slurm``: an ``sbatch`` script: nodes, tasks, NCCL environment and the ``torchrun``
  rendezvous line that starts the plan's trainer.
- ``vllm`` / ``tensorrt-llm``: for a serving plan (an ``InferenceJob``), the engine's launch
  script with the plan's tp / pp sizes, quantization, context and batch
  (``planner.emit.serving``).

Each target first *lowers* the plan's configuration to what that trainer can run. A feature it
cannot express is mapped to the nearest setting it can, with a warning (kept in the file's
header, returned in ``Emitted.warnings`` and printed by the CLI), or refused with ``SpecError``
when there is no sensible neighbour, or always when ``strict=True``. The lowered configuration
is estimated again under the target trainer's conventions, so the header's predictions are
for what the file actually runs.

``read_back(target, text, model)`` parses an emitted file into a ``ParallelConfig`` and the
batch sizes, the inverse of ``emit`` (the round-trip tests use it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.estimate import Estimate, estimate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.roofline import attention_kernel
from costmodel.frameworks import framework
from costmodel.hardware import GPU
from costmodel.model import ModelSpec
from costmodel.serving.inference import InferenceConfig, InferenceEstimate, InferenceJob
from planner.emit import deepspeed, megatron, slurm, torchtitan
from planner.emit.common import GIB, Lowered, Planned, ReadBack, Target
from planner.emit.serving import SERVING_TARGETS, emit_serving

__all__ = ["SERVING_TARGETS", "TARGETS", "TRAINING_TARGETS", "Emitted", "ReadBack", "emit",
           "read_back"]

_TARGETS: dict[str, Target] = {m.TARGET.name: m.TARGET
                               for m in (torchtitan, deepspeed, megatron, slurm)}
#: Trainers' targets (a training plan) and serving engines' (an ``InferenceJob`` plan).
TRAINING_TARGETS: tuple[str, ...] = tuple(_TARGETS)
#: The targets ``emit`` writes, in the order the CLI lists them (training, then serving).
TARGETS: tuple[str, ...] = (*TRAINING_TARGETS, *SERVING_TARGETS)


@dataclass(frozen=True, kw_only=True)
class Emitted:
    """One emitted file. ``text``: its content; ``filename``: the name its trainer expects
    by convention; ``config`` / ``job``: what the file runs (the plan's, or the nearest the
    target can express); ``estimate``: the prediction for ``config`` under the target
    trainer's conventions; ``warnings``: each feature that was mapped, in words."""

    target: str
    text: str
    filename: str
    config: ParallelConfig | InferenceConfig
    job: Job | InferenceJob
    estimate: Estimate | InferenceEstimate
    warnings: tuple[str, ...] = ()


def _target(name: str) -> Target:
    if name not in _TARGETS:
        raise SpecError(f"unknown emit target {name!r}; choose one of: {', '.join(TARGETS)}")
    return _TARGETS[name]


def _delta(plan_est: Estimate, est: Estimate) -> str | None:
    """The change in predictions between the plan and what is emitted, or None."""
    a, b = plan_est.step_time_s or 0.0, est.step_time_s or 0.0
    if abs(b - a) <= 1e-9 * max(a, 1.0) and abs(est.peak_memory_bytes
                                                - plan_est.peak_memory_bytes) < 1.0:
        return None
    text = (f"predicted for the emitted file: step {b:.3f} s (plan {a:.3f} s), peak memory "
            f"{est.peak_memory_bytes / GIB:.1f} GiB per GPU (plan "
            f"{plan_est.peak_memory_bytes / GIB:.1f} GiB)")
    if not est.fits:
        text += (f"; it DOES NOT FIT in {est.memory_capacity_bytes / GIB:.1f} GiB per GPU: "
                 f"re-plan for this trainer instead")
    return text


def emit(plan: Planned, target: str, *, command: str | None = None,
         strict: bool = False) -> Emitted:
    """The plan as a file for ``target`` (one of ``TARGETS``).

    ``command``: the command line that produced the file, written in its header (default:
    the Python call). ``strict``: refuse, with ``SpecError``, any plan feature the target
    cannot express instead of mapping it to the nearest setting with a warning.
    """
    cmd = command or f"planner.emit.emit(plan, {target!r})"
    if target in SERVING_TARGETS or isinstance(plan.job, InferenceJob):
        if target not in SERVING_TARGETS:
            raise SpecError(f"this is a serving plan; emit it with --target "
                            f"{' or '.join(SERVING_TARGETS)} ({target} is a trainer)")
        return Emitted(target=target, text=emit_serving(plan, target, cmd),
                       filename="serve.sh", config=plan.config, job=plan.job,
                       estimate=plan.estimate)
    assert isinstance(plan.config, ParallelConfig) and isinstance(plan.estimate, Estimate)
    tgt = _target(target)
    # torchtitan takes a traced module's plan too (the user's train spec builds the module),
    # and so does a Slurm script that starts torchtitan on it; the other trainers' files
    # describe their own models.
    runs_torchtitan = target == "torchtitan" or (target == "slurm"
                                                 and plan.job.framework == "torchtitan")
    model = plan.model if (runs_torchtitan and isinstance(plan.model, LayerCosts)
                           and plan.model.spec is None) else plan.preset(
        f"planner emit --target {target}")
    assert isinstance(plan.job, Job)
    lowered: Lowered = tgt.lower(model, _kernel_it_runs(plan.job, plan.cluster.gpu, target),
                                 plan.config)
    notes = list(lowered.warnings)
    job, cfg = lowered.job, lowered.config
    if job.framework != plan.job.framework:
        notes.append(f"the plan was searched for {plan.job.framework}; {target} follows "
                     f"{job.framework}'s memory and overlap conventions, so the predictions "
                     f"in this header are re-estimated under them (re-plan with --frameworks "
                     f"{job.framework} for the best {job.framework} configuration)")
    if strict and notes:
        raise SpecError(f"the plan cannot be emitted for {target} unchanged (--strict): "
                        + "; ".join(notes))
    try:
        est = (plan.estimate if (cfg, job) == (plan.config, plan.job)
               else estimate(plan.model, plan.cluster, job, cfg))
    except SpecError as e:
        raise SpecError(f"the plan cannot be emitted for {target}: the nearest configuration "
                        f"{target} runs is not valid ({e})") from e
    delta = _delta(plan.estimate, est)
    if delta:
        notes.append(delta)
    text = tgt.render(plan=plan, config=cfg, job=job, estimate=est, command=cmd,
                      warnings=tuple(notes))
    return Emitted(target=target, text=text, filename=tgt.filename, config=cfg, job=job,
                   estimate=est, warnings=tuple(notes))


def _kernel_it_runs(job: Job, gpu: GPU, target: str) -> Job:
    """``job`` without its named attention kernel where the target's trainer cannot name one
    but runs that one anyway on ``gpu`` (``roofline.attention_kernel``): only a different
    kernel is a change its file cannot express (``common.to_framework``)."""
    trainer = job.framework if target == "slurm" else target
    if job.attention_kernel is None or framework(trainer).selects_attention_kernel:
        return job
    own = dataclasses.replace(job, framework=trainer, attention_kernel=None)
    if attention_kernel(own, gpu) == job.attention_kernel:
        return dataclasses.replace(job, attention_kernel=None)
    return job


def read_back(target: str, text: str, model: ModelSpec) -> ReadBack:
    """Parse a file ``emit`` wrote for ``target`` back into a ``ParallelConfig`` and the
    batch sizes; ``model`` gives the layer count that per-chunk settings are relative to."""
    return _target(target).read(text, model)

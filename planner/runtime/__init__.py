"""Run a plan: apply it to a torch model with torch.distributed, launch it, train.

``apply(plan, module)`` (in ``planner.runtime.apply``) builds the device mesh of the plan's
axes and parallelizes the module in torchtitan's order: pipeline stages
(``torch.distributed.pipelining``), tensor parallel (DTensor ``parallelize_module`` with a TP
plan given as data), activation checkpointing, then FSDP2 (``fully_shard``; ZeRO-2 keeps the
parameters unsharded from forward to backward, ZeRO-3 reshards them, HSDP shards over
``sharding_group``) or FSDP2's ``replicate`` for plain data parallel. It returns a
``Parallelized`` whose ``step`` runs one forward and backward over the rank's share of the
batch with the plan's micro-batches and pipeline schedule.

``check(plan)`` (``planner.runtime.checks``) needs no torch and runs before any process starts: it
raises ``SpecError``
naming every feature of the plan the runtime cannot execute (context and expert parallel,
ZeRO-1, fp16 and fp8, optimizer-only offload, tied embeddings across TP shards,
...) and what to do instead. ``planner.runtime.launch`` starts the processes (``planner
run``); ``planner.runtime.train`` is the minimal training loop the tests and examples use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.result import Plan
from planner.runtime.checks import FORCE_ENV, check, check_size, traced_source, unsupported

if TYPE_CHECKING:
    from planner.runtime.apply import Parallelized

__all__ = ["FORCE_ENV", "apply", "check", "check_size", "traced_source", "unsupported"]


def apply(plan: Plan, module: Any, **kwargs: Any) -> Parallelized:
    """Parallelize ``module`` as ``plan`` says; see ``planner.runtime.apply.apply``."""
    from planner.runtime.apply import apply as _apply

    return _apply(plan, module, **kwargs)



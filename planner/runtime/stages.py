"""Pipeline stages of a module for the runtime: the layer range of each stage and virtual chunk
(Megatron-LM's interleaved layout), each stage cut out of the module, the parameters tied
across stages (an embedding and its output layer) kept in step, and the schedule object
``torch.distributed.pipelining`` runs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from costmodel.config import ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.memory import even_split
from planner.runtime.attention import local_shard
from planner.runtime.model import Transformer
from planner.runtime.modules import module_blocks, pipeline_stages

if TYPE_CHECKING:
    from torch.distributed.pipelining.stage import _PipelineStageBase


def stage_layer_ranges(num_layers: int, pp: int, v: int,
                       stage_layers: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Layer ranges [start, end) of the ``pp * v`` pipeline chunks, chunk order.

    Uniform splits follow the cost model (``costmodel.formulas.memory.even_split``: the remainder
    goes
    to the last stages); interleaving cuts ``pp * v`` equal chunks, rank r holding chunks
    r, r + pp, ... (Narayanan et al. 2021, Sec. 2.2, Megatron-LM's layout).
    """
    if v > 1:
        chunk = num_layers // (pp * v)
        return [(c * chunk, (c + 1) * chunk) for c in range(pp * v)]
    sizes = list(stage_layers) if stage_layers else even_split(num_layers, pp)
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def _blocks(module: nn.Module, paths: list[str] | None = None
            ) -> list[tuple[str, nn.Module]]:
    """(module path, module) of the layers ``module`` (or a stage of it) holds: those at
    ``paths`` (a traced module's, ``planner.runtime.modules.layer_paths``), else the entries
    of its ``layers`` list (``ModuleDict`` or ``ModuleList``)."""
    if paths is None:
        layers = getattr(module, "layers", None)
        if not isinstance(layers, nn.ModuleDict | nn.ModuleList):
            return []
        paths = [f"layers.{key}" for key, _ in layers.named_children()]
    return module_blocks(module, paths)


def _cut_stage(module: nn.Module, lo: int, hi: int, first: bool, last: bool,
               copy_needed: bool) -> nn.Module:
    """The pipeline stage holding layers [lo, hi) of ``module`` (and the embeddings when
    ``first``, the final norm and head when ``last``)."""
    part = copy.deepcopy(module) if copy_needed else module
    tied = (part.tok_embeddings.weight if isinstance(part, Transformer) and part.tied
            and part.tok_embeddings is not None else None)
    layers = part.layers
    if isinstance(layers, nn.ModuleDict):
        for key in list(layers.keys()):
            if not lo <= int(key) < hi:
                del layers[key]
    else:
        assert isinstance(layers, nn.ModuleList)  # apply checked the blocks are in 'layers'
        part.layers = nn.ModuleList(list(layers)[lo:hi])
    if not first:
        for name in ("tok_embeddings", "pos_embeddings"):
            if hasattr(part, name):
                setattr(part, name, None)
    if not last:
        for name in ("norm", "output"):
            if hasattr(part, name):
                setattr(part, name, None)
        if isinstance(part, Transformer):
            part.has_head = False
    elif not first and tied is not None:
        # The last stage's copy of the tied word embedding, as its LM head (Megatron-LM's
        # embedding group: the copies start equal and their gradients are summed each step,
        # ``_tie_groups``).
        head = nn.Linear(tied.shape[1], tied.shape[0], bias=False, device=tied.device)
        head.weight = nn.Parameter(tied.detach().clone())
        part.output = head
    return part


def _reference_ties(module: nn.Module, num_stages: int) -> list[Tie]:
    """The reference transformer's tied word embedding over pipeline stages: the first
    stage's embedding and the last stage's head (``_cut_stage``)."""
    if isinstance(module, Transformer) and module.tied and num_stages > 1:
        return [{0: ["tok_embeddings.weight"], num_stages - 1: ["output.weight"]}]
    return []


def _tie_groups(mesh: DeviceMesh, cfg: ParallelConfig, ties: list[Tie]
                ) -> list[tuple[Any, int]]:
    """Per tie, (the process group joining this rank to the other ranks holding copies,
    the global rank in it whose copy the others start from, the lowest pipeline rank's):
    the pipeline ranks of its stages at
    the same data, context and tensor coordinates; ``None`` where one pipeline rank holds
    every copy, or this rank none. Every rank creates every group, in one order, as
    ``new_group`` needs."""
    ranks = mesh.mesh  # [pp, dp_replicate, dp_shard, cp, tp] -> global rank
    me = dist.get_rank()
    made: dict[tuple[int, ...], dict[int, tuple[Any, int]]] = {}
    out = []
    for tie in ties:
        pps = tuple(sorted({sid % cfg.pp for sid in tie}))
        if len(pps) > 1 and pps not in made:
            made[pps] = {}
            for rest in itertools.product(*(range(n) for n in ranks.shape[1:])):
                members = [int(ranks[(pp, *rest)]) for pp in pps]
                group = dist.new_group(members)
                for r in members:
                    made[pps][r] = (group, members[0])
        out.append(made[pps].get(me, (None, -1)) if len(pps) > 1 else (None, -1))
    return out


def _tied_copies(parts: list[nn.Module], stage_ids: list[int], ties: list[Tie],
                 groups: list[tuple[Any, int]]
                 ) -> list[tuple[list[nn.Parameter], Any, int]]:
    """Per tie this rank holds copies of: (those copies, the group of the ranks holding the
    others, the rank in it whose copy they start from)."""
    out = []
    for tie, (group, src) in zip(ties, groups, strict=True):
        mine = [part.get_parameter(path) for sid, part in zip(stage_ids, parts, strict=True)
                for path in tie.get(sid, [])]
        if mine:
            out.append((mine, group, src))
    return out


def _sync_tied(tied: list[tuple[list[nn.Parameter], Any, int]], grads: bool) -> None:
    """Keep the copies of each tied weight equal: their gradients summed over every copy
    (``grads``; Megatron-LM's embedding-group all-reduce), or their values set to one copy's
    (at the start)."""
    with torch.no_grad():
        for params, group, src in tied:
            if grads:
                local = [local_shard(p.grad) for p in params if p.grad is not None]
                total = torch.stack(local).sum(0) if local \
                    else torch.zeros_like(local_shard(params[0]))
                if group is not None:
                    dist.all_reduce(total, group=group)
                for g in local:
                    g.copy_(total)
            else:
                first = local_shard(params[0])
                if group is not None:
                    dist.broadcast(first, src=src, group=group)
                for p in params[1:]:
                    local_shard(p).copy_(first)


def _schedule(name: str, stages: list[PipelineStage], m: int,
              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
    """The torch.distributed.pipelining schedule for the plan's ``pipeline_schedule``:
    GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021; DAPPLE's early backward),
    interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2) and zero bubble (Qi et al. 2024)."""
    if name == "gpipe":
        return ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    if name == "1f1b":
        return Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    chunks: list[_PipelineStageBase] = list(stages)
    if name == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(chunks, m, loss_fn=loss_fn)
    return ScheduleInterleavedZeroBubble(chunks, m, loss_fn=loss_fn)


def _cut_stages(module: nn.Module, cfg: ParallelConfig, ranges: list[tuple[int, int]],
                stage_ids: list[int], home: torch.device, meta: bool,
                paths: list[str] | None, example: Any
                ) -> tuple[list[nn.Module], list[Tie]]:
    """The pipeline chunks ``stage_ids`` this rank holds (layer ``ranges`` of every chunk,
    ``stage_layer_ranges``), cut from ``module`` (the module itself when ``pp = 1``; by
    torch's pipeline tracer at the layer ``paths`` of a traced module, with ``example`` one
    micro-batch of its inputs), moved to ``home`` unless on the meta device; and the weights
    several chunks hold copies of (``Tie``)."""
    num_stages = cfg.pp * cfg.virtual_pipeline_stages
    if paths is not None and cfg.pp > 1:
        if example is None:
            raise SpecError("pipelining a traced module's plan cuts it with torch's pipeline "
                            "tracer: pass example_inputs= (one micro-batch of its inputs)")
        parts, ties = pipeline_stages(module, paths, ranges, stage_ids, example)
        return (parts if meta else [p.to(home) for p in parts]), ties
    ties = _reference_ties(module, num_stages) if cfg.pp > 1 else []
    parts = []
    for sid in stage_ids:
        lo, hi = ranges[sid]
        part = (_cut_stage(module, lo, hi, sid == 0, sid == num_stages - 1, len(stage_ids) > 1)
                if cfg.pp > 1 else module)
        if not meta:
            part.to(home)
        parts.append(part)
    return parts, ties


#: A weight held in several copies across pipeline stages: stage id -> the paths of its
#: copies in that stage (``planner.runtime.modules.pipeline_stages``).
Tie = dict[int, list[str]]

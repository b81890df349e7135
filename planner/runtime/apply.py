"""``apply(plan, module)``: split a torch model across processes as a ``Plan`` says.

Built on PyTorch's own distributed stack, in the order torchtitan applies it
(torchtitan/models/llama3/infra/parallelize.py): the device mesh of the plan's axes
``(pp, dp_replicate, dp_shard, cp, tp)``, tensor parallel innermost as the cost model places
it; pipeline stages cut from the module; tensor parallel on each stage (DTensor
``parallelize_module`` from a TP plan given as data, ``TP_PLAN``); activation checkpointing per
the plan's recompute; then FSDP2 ``fully_shard`` per block and per stage (ZeRO-3 reshards
parameters after forward, ZeRO-2 keeps them to backward, HSDP shards over ``sharding_group``
and replicates across the groups); ZeRO-0 is DDP (plain data parallel, torchtitan's
composable ``replicate``) or, combined with TP or PP, FSDP2's ``replicate`` (all-reduced
gradients);
finally the ``torch.distributed.pipelining`` schedule of the plan (GPipe, 1F1B, interleaved
1F1B with ``virtual_pipeline_stages`` chunks per rank in loop order, zero bubble).

The module is the project's reference transformer (``planner.runtime.model``) or a user
module following its layout: ``layers`` (a ``ModuleDict`` keyed by layer index or a
``ModuleList``) of transformer blocks, and optional ``tok_embeddings``, ``pos_embeddings``,
``norm`` and ``output`` attributes whose ``forward`` skips the ones set to ``None`` (how a
pipeline stage drops what it does not hold). A module built on the meta device is
materialised after sharding, each rank allocating only its shards, and initialised by its
``init_weights()``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._composable.replicate import replicate as ddp
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts
from planner.result import Plan
from planner.runtime.attention import HeadParallel, local_shard
from planner.runtime.checks import check, check_size
from planner.runtime.model import Transformer
from planner.runtime.modules import layer_paths, set_module
from planner.runtime.stages import (
    _blocks,
    _cut_stages,
    _schedule,
    _sync_tied,
    _tie_groups,
    _tied_copies,
    stage_layer_ranges,
)

__all__ = ["MESH_DIMS", "TP_PLAN", "Parallelized", "apply", "cross_entropy", "make_optimizer",
           "tp_style"]

#: Device-mesh axes, outermost first: tensor parallel innermost (inside a node), then context
#: parallel, the data-parallel shard and replicate axes, and pipeline parallel outermost, as
#: torchtitan lays out its mesh and ``costmodel.formulas.comm`` places the groups.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

#: The tensor-parallel plan of the reference transformer as data: module path ("*" matches
#: one path element, e.g. a layer index) -> style name (``tp_style``). Megatron-LM's split
#: (Shoeybi et al. 2019, Sec. 3): Q/K/V and the MLP's first linears column-wise, the output
#: projections row-wise, so each block needs one all-reduce forward (or, with sequence
#: parallel, an all-gather before and a reduce-scatter after, Korthikanti et al. 2022,
#: Sec. 4.2.2); embedding and LM head split over the vocabulary.
TP_PLAN: dict[str, str] = {
    "tok_embeddings": "vocab",
    "norm": "norm",
    "output": "head",
    "layers.*.attention_norm": "norm",
    "layers.*.attention": "block_input",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wk": "colwise",
    "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.ffn_norm": "norm",
    "layers.*.feed_forward": "block_input",
    "layers.*.feed_forward.w1": "colwise",
    "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
}


def tp_style(name: str, sequence_parallel: bool) -> ParallelStyle | None:
    """The DTensor style of a ``TP_PLAN`` entry; ``None`` where it needs none (norms and
    block inputs without sequence parallel).

    ``colwise``: weight split on the output dim; ``rowwise``: on the input dim, the partial
    sums all-reduced (or reduce-scattered over the sequence with SP); ``vocab``: embedding
    table split over the vocabulary; ``head``: LM head split over the vocabulary, logits
    gathered; ``norm``: sequence-parallel norm; ``block_input``: all-gather the sequence
    before a block's first linears (SP). The styles a traced module's layouts also name
    (``LayerCosts.tp_plan``): ``gathered``, split on the output dim with the output
    all-gathered (an embedding split by columns; with SP redistributed to sequence shards,
    an all-to-all); ``rowwise_replicated``, split on the
    input dim of a whole input, each rank taking its slice (a head split over its input
    features); ``heads``, an ``nn.MultiheadAttention`` split by heads
    (``planner.runtime.attention.HeadParallel``).
    """
    seq = Shard(1)
    out = seq if sequence_parallel else Replicate()
    styles: dict[str, Callable[[], ParallelStyle | None]] = {
        "colwise": ColwiseParallel,
        "rowwise": lambda: RowwiseParallel(output_layouts=out),
        "vocab": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=out),
        "head": lambda: ColwiseParallel(input_layouts=out, output_layouts=Replicate()),
        "gathered": lambda: ColwiseParallel(output_layouts=out),
        "rowwise_replicated": lambda: RowwiseParallel(input_layouts=Replicate(),
                                                      output_layouts=out),
        "heads": lambda: HeadParallel(sequence_parallel),
        "norm": lambda: SequenceParallel() if sequence_parallel else None,
        "block_input": lambda: (PrepareModuleInput(input_layouts=(seq,),
                                                   desired_input_layouts=(Replicate(),))
                                if sequence_parallel else None),
    }
    if name not in styles:
        raise SpecError(f"unknown tensor-parallel style {name!r}; use one of "
                        f"{', '.join(styles)} or a torch ParallelStyle")
    return styles[name]()


def _match(pattern: str, name: str) -> bool:
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(a in ("*", b) for a, b in zip(p, n, strict=True))


def _apply_tp(part: nn.Module, mesh: DeviceMesh, plan: Mapping[str, str | ParallelStyle],
              sequence_parallel: bool) -> int:
    """Tensor-parallelize the modules of ``part`` that ``plan`` names; returns how many."""
    exact: dict[str, ParallelStyle] = {}
    for name, _ in part.named_modules():
        for pattern, style in plan.items():
            if name and _match(pattern, name):
                s = tp_style(style, sequence_parallel) if isinstance(style, str) else style
                if s is not None:
                    exact[name] = s
    if exact:
        parallelize_module(part, mesh, exact)
    return len(exact)


def _apply_recompute(part: nn.Module, recompute: str, first_n: int | None,
                     paths: list[str] | None = None) -> None:
    """Activation checkpointing: ``full`` wraps the first ``first_n`` blocks (all when
    ``None``) in ``checkpoint_wrapper``; ``selective`` recomputes each block's attention core
    (the reference model's ``Attention.recompute_core``; other modules get their
    ``attention`` submodule checkpointed)."""
    blocks = _blocks(part, paths)
    if recompute == "full":
        for key, block in blocks[: len(blocks) if first_n is None else first_n]:
            set_module(part, key, checkpoint_wrapper(block))
    elif recompute == "selective":
        for _, block in blocks:
            attn = getattr(block, "attention", None)
            if attn is None:
                raise SpecError("selective recompute checkpoints each block's 'attention' "
                                "submodule; this module's blocks have none")
            if hasattr(attn, "recompute_core"):
                attn.recompute_core = True
            else:
                block.attention = checkpoint_wrapper(attn)


@dataclass
class Parallelized:
    """A module split as a plan says, on this process.

    ``parts``: the pipeline stages this rank holds (one, or ``virtual_pipeline_stages`` when
    interleaved; the whole module when ``pp = 1``); ``stage_ids`` their indices; ``mesh`` the
    device mesh over ``MESH_DIMS``; ``schedule`` the pipeline schedule (``None`` when
    ``pp = 1``); ``num_micro_batches`` per step and data-parallel rank; ``dp_rank`` /
    ``dp_size`` which share of the batch this rank trains; ``autocast``: forward under bf16
    autocast (DDP in mixed precision; FSDP casts through its MixedPrecisionPolicy);
    ``tied``: this rank's copies of weights several pipeline stages use (a tied word
    embedding), each with the group of the ranks holding its copies (``_tie_groups``),
    whose gradients ``step`` sums.
    """

    plan: Plan
    parts: list[nn.Module]
    stage_ids: list[int]
    mesh: DeviceMesh
    device: torch.device
    schedule: Any
    num_micro_batches: int
    dp_rank: int
    dp_size: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    autocast: bool = False
    tied: list[tuple[list[nn.Parameter], Any, int]] = field(default_factory=list)

    @property
    def _job(self) -> Job:
        """The plan's training job (``apply`` refuses serving plans)."""
        return self.plan.training()[0]

    @property
    def _config(self) -> ParallelConfig:
        """The plan's parallel configuration (``apply`` refuses serving plans)."""
        return self.plan.training()[1]

    @property
    def num_stages(self) -> int:
        """Pipeline chunks in all: ``pp * virtual_pipeline_stages``."""
        cfg = self._config
        return cfg.pp * cfg.virtual_pipeline_stages

    @property
    def local_batch_size(self) -> int:
        """Sequences per step this rank's data-parallel group trains:
        ``global_batch_size / dp``."""
        return self._job.global_batch_size // self.dp_size

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this rank holds (its shards), each once."""
        seen: dict[int, nn.Parameter] = {}
        for part in self.parts:
            for p in part.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def optimizer(self, cls: type[torch.optim.Optimizer] | None = None,
                  **kwargs: Any) -> torch.optim.Optimizer:
        """The plan's optimizer (``job.optimizer``, see ``make_optimizer``) over this rank's
        parameters; ``cls`` overrides the class, ``kwargs`` (e.g. ``lr``) go to it."""
        if cls is not None:
            return cls(self.parameters(), **kwargs)
        return make_optimizer(self._job.optimizer, self.parameters(), **kwargs)

    def local_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch [global_batch_size, ...] (its data-parallel
        share, the same on the ranks of one TP/PP group)."""
        n = self._job.global_batch_size
        if batch.shape[0] != n:
            raise SpecError(f"local_batch takes the global batch of {n} sequences, got "
                            f"{batch.shape[0]}")
        b = self.local_batch_size
        return batch[self.dp_rank * b:(self.dp_rank + 1) * b]

    def step(self, inputs: torch.Tensor | None, labels: torch.Tensor | None) -> float:
        """One forward and backward over this rank's share of the batch (``local_batch``),
        in ``num_micro_batches`` micro-batches (accumulated, or through the pipeline
        schedule); gradients are averaged over the batch. Returns the mean loss over the
        global batch, on every rank. Stages without the first layer ignore ``inputs``, those
        without the last ignore ``labels``."""
        cfg = self._config
        b = self.local_batch_size
        for what, t, needed in (("inputs", inputs, 0 in self.stage_ids),
                                ("labels", labels, self.num_stages - 1 in self.stage_ids)):
            if needed and (t is None or t.shape[0] != b):
                got = "None" if t is None else f"{t.shape[0]} sequences"
                raise SpecError(f"step takes this rank's {b} sequences of {what} "
                                f"(local_batch of the global batch), got {got}")
        inputs = inputs.to(self.device) if inputs is not None else None
        labels = labels.to(self.device) if labels is not None else None
        m = self.num_micro_batches
        holds_last = self.num_stages - 1 in self.stage_ids
        if self.schedule is None:
            part = self.parts[0]
            # Without a pipeline this rank holds the first and last layers: both checked above.
            assert inputs is not None and labels is not None
            total = torch.zeros((), device=self.device)
            xs = inputs.split(cfg.micro_batch_size)
            ys = labels.split(cfg.micro_batch_size)
            sync = (getattr(part, "set_requires_gradient_sync", None) if cfg.zero_stage == 0
                    else None)
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                if sync is not None:
                    sync(i == m - 1)  # all-reduce once per step
                with torch.autocast(self.device.type, dtype=torch.bfloat16,
                                    enabled=self.autocast):
                    loss = self.loss_fn(part(x), y)
                (loss / m).backward()
                total += loss.detach()
            local = total / m
        else:
            losses: list[torch.Tensor] = []
            kwargs: dict[str, Any] = {}
            if holds_last:
                kwargs = {"target": labels, "losses": losses}
            args = (inputs,) if 0 in self.stage_ids else ()
            self.schedule.step(*args, **kwargs)
            local = (torch.stack([x.detach().float() for x in losses]).mean() if losses
                     else torch.zeros((), device=self.device))
            # A tied embedding's gradient is the sum of its copies' (Megatron-LM's
            # embedding-group all-reduce).
            _sync_tied(self.tied, grads=True)
        # The global mean: one rank per data-parallel index contributes (the one holding the
        # last stage, first TP and CP coordinate), all others add zero.
        coord = dict(zip(MESH_DIMS, self.mesh.get_coordinate() or [], strict=True))
        speaks = holds_last and coord.get("tp", 0) == 0 and coord.get("cp", 0) == 0
        value = (local.float() / self.dp_size) if speaks else torch.zeros((), device=self.device)
        value = value.reshape(1).clone()
        dist.all_reduce(value)
        return float(value.item())

    def state_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """Bytes this rank holds of ``weights`` (its parameter shards), ``gradients`` and
        ``optimizer`` states (tensors of ``optimizer.state`` other than the scalar step
        count), what the memory estimator's model-state terms predict."""
        out = {"weights": 0, "gradients": 0, "optimizer": 0}
        for p in self.parameters():
            lp = local_shard(p)
            out["weights"] += lp.numel() * lp.element_size()
            if p.grad is not None:
                g = local_shard(p.grad)
                out["gradients"] += g.numel() * g.element_size()
            if optimizer is not None:
                for key, value in optimizer.state.get(p, {}).items():
                    if key != "step" and torch.is_tensor(value):
                        v = local_shard(value)
                        out["optimizer"] += v.numel() * v.element_size()
        return out


def make_optimizer(name: str, params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """The torch optimizer of a ``Job.optimizer`` name: ``adamw``, ``adam``, or ``sgd`` with
    momentum 0.9 (the cost model's SGD keeps one momentum buffer, 4 bytes per parameter).

    On GPUs Adam runs as torch's fused kernel (``fused=True``), as torchtitan builds it (its
    ``optimizer.implementation`` defaults to ``fused``) and as the cost model's optimizer step
    assumes (one pass over parameters, gradients and both states, ``optimizer_bytes``); the
    default ``foreach`` implementation makes about ten passes, measured 2.8x slower on an H100
    (35.6 against 12.9 ms a step for 1.3B parameters, 2026-11-22). ``kwargs`` may override
    it."""
    if name == "sgd":
        kwargs.setdefault("momentum", 0.9)
        return torch.optim.SGD(params, **kwargs)
    if name in ("adam", "adamw"):
        params = list(params)
        if params and all(p.device.type == "cuda" for p in params):
            kwargs.setdefault("fused", True)
        return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, **kwargs)
    raise SpecError(f"optimizer {name!r} is not built by planner.apply; use adamw, adam or sgd")


def _materialise(part: nn.Module, device: torch.device) -> None:
    """Allocate a meta-device module's (local shards of) parameters on ``device`` and
    initialise them with its ``init_weights()``."""
    init = getattr(part, "init_weights", None)
    if init is None:
        raise SpecError("the module is on the meta device but has no init_weights(); give it "
                        "one, or pass a materialised module")
    part.to_empty(device=device)
    with torch.no_grad():
        init()


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy, computed in fp32."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


def _init_distributed(world: int, device: torch.device) -> None:
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        elif world == 1:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            raise SpecError(f"the plan runs on {world} processes but torch.distributed is not "
                            "started; launch with 'planner run plan.json --script ...' "
                            "(torchrun)")
    if dist.get_world_size() != world:
        raise SpecError(f"the plan needs {world} processes (dp*tp*pp*cp), but "
                        f"{dist.get_world_size()} were started; launch with 'planner run'")


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _layer_paths(plan: Plan, module: nn.Module) -> list[str] | None:
    """The module paths of a traced module's layers when the plan is a traced module's and
    the module has no ``layers`` list (``planner.runtime.modules``); ``None`` otherwise."""
    costs = plan.model
    if isinstance(costs, LayerCosts) and costs.spec is None and not _blocks(module):
        return layer_paths(costs, module)
    return None


def _check_module(plan: Plan, module: nn.Module, cfg: ParallelConfig,
                  paths: list[str] | None) -> None:
    """Refuse a module ``apply`` cannot split as the plan says: not a torch module, a
    reference transformer of another depth, or, when the plan pipelines or recomputes, a
    module whose ``layers`` (or traced layer paths) do not hold the model's layers."""
    if not isinstance(module, nn.Module):
        raise SpecError(f"apply takes a torch nn.Module, got {type(module).__name__}")
    if isinstance(module, Transformer) and module.spec.num_layers != plan.model.num_layers:
        raise SpecError(f"the module has {module.spec.num_layers} layers but the plan's model "
                        f"{plan.model.name!r} has {plan.model.num_layers}")
    check_size(plan, module)
    blocks = _blocks(module, paths)
    needs_blocks = cfg.pp > 1 or cfg.recompute != "none"
    if needs_blocks and len(blocks) != plan.model.num_layers:
        raise SpecError(f"the plan cuts {plan.model.num_layers} transformer layers into stages "
                        "or recomputes them, but the module's 'layers' holds "
                        f"{len(blocks)}; give it a 'layers' ModuleDict/ModuleList of blocks")


def _shard_size(cfg: ParallelConfig) -> int:
    """Ranks one FSDP shard group spans: ``sharding_group`` (default all of ``dp``) for
    ZeRO-2/3, 1 otherwise (the data-parallel ranks replicate)."""
    return (cfg.sharding_group or cfg.dp) if cfg.zero_stage >= 2 else 1


def _device_mesh(cfg: ParallelConfig, dev: torch.device, shard: int) -> DeviceMesh:
    """The device mesh over ``MESH_DIMS``: pipeline, data-parallel replicas of shard groups
    of ``shard`` ranks, context and tensor parallel."""
    sizes = {"pp": cfg.pp, "dp_replicate": cfg.dp // shard, "dp_shard": shard, "cp": cfg.cp,
             "tp": cfg.tp}
    return init_device_mesh(dev.type, tuple(sizes[d] for d in MESH_DIMS),
                            mesh_dim_names=MESH_DIMS)


def _offload_policy(cfg: ParallelConfig, dev: torch.device) -> OffloadPolicy:
    """FSDP2's CPU offload for ``offload = "optimizer+params"`` on GPUs (on CPU processes
    the states are in host memory already: a warning, no policy); none otherwise."""
    if cfg.offload != "optimizer+params":
        return OffloadPolicy()
    if dev.type == "cpu":
        warnings.warn("offload 'optimizer+params' does nothing on CPU processes: the "
                      "states are in host memory already", UserWarning, stacklevel=3)
        return OffloadPolicy()
    return CPUOffloadPolicy()


def _recomputed_layers(cfg: ParallelConfig, sid: int) -> int | None:
    """How many leading layers of pipeline chunk ``sid`` recompute fully (``None``: all of
    them, or no full recompute): its ``stage_recompute_layers`` entry, else
    ``recompute_num_layers``."""
    if cfg.recompute != "full":
        return None
    if cfg.stage_recompute_layers is not None:
        return cfg.stage_recompute_layers[sid]
    return cfg.recompute_num_layers


def _fully_shard(part: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh, shard: int,
                 mp: MixedPrecisionPolicy, offload: OffloadPolicy, paths: list[str] | None
                 ) -> None:
    """ZeRO-2/3 as FSDP2, per block then the whole stage: parameters resharded after forward
    for ZeRO-3, kept to backward for ZeRO-2; HSDP (shard groups replicated) when the groups
    are smaller than ``dp``."""
    dp_mesh = mesh["dp_replicate", "dp_shard"] if cfg.dp > shard else mesh["dp_shard"]
    reshard = cfg.zero_stage == 3
    for _, block in _blocks(part, paths):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp,
                    offload_policy=offload)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp,
                offload_policy=offload)


def _replicate(part: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy,
               paths: list[str] | None) -> None:
    """ZeRO-0 beside tensor or pipeline parallel: DDP does not compose with DTensor (TP) or
    pipeline stages; FSDP2's replicate does, at the cost of an unsharded copy of the
    parameters from forward to backward, which the cost model counts."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError as e:
        raise SpecError("zero_stage 0 with tensor or pipeline parallel needs FSDP2's "
                        "replicate (torch 2.13 has it); upgrade torch or use "
                        "zero_stage 2") from e
    for _, block in _blocks(part, paths):
        replicate(block, mesh=mesh["dp_replicate"], mp_policy=mp)
    replicate(part, mesh=mesh["dp_replicate"], mp_policy=mp)


def _data_parallel(part: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh, shard: int,
                   mp: MixedPrecisionPolicy, offload: OffloadPolicy, dev: torch.device,
                   meta: bool, paths: list[str] | None) -> None:
    """Data parallelism on one stage: FSDP2 for ZeRO-2/3; for plain data parallel DDP, as
    torchtitan runs it (its composable ``replicate``, bucketed all-reduce overlapping
    backward; parameters broadcast from rank 0 at wrap time, so they are materialised
    first), with autocast for mixed precision; otherwise FSDP2's replicate."""
    if cfg.zero_stage >= 2:
        _fully_shard(part, cfg, mesh, shard, mp, offload, paths)
    elif _pure_dp(cfg):
        if meta:
            _materialise(part, dev)
        ddp(part, device_mesh=mesh["dp_replicate"])
    else:
        _replicate(part, mesh, mp, paths)


def _pure_dp(cfg: ParallelConfig) -> bool:
    """Whether the plan is plain data parallel: ZeRO-0 without tensor, pipeline or context
    parallelism (run as DDP)."""
    return cfg.zero_stage == 0 and cfg.tp == cfg.pp == cfg.cp == 1


def apply(plan: Plan, module: nn.Module, *, device: torch.device | str | None = None,
          tp_plan: Mapping[str, str | ParallelStyle] | None = None,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          force: bool = False, example_inputs: Any = None) -> Parallelized:
    """Parallelize ``module`` as ``plan`` says, on this process; returns ``Parallelized``.

    Call it in every process of the job (``planner run`` starts them with torchrun); it
    starts torch.distributed when needed (NCCL on GPUs, gloo on CPUs; a one-process plan
    needs no launcher). Before anything starts, ``planner.runtime.check`` refuses plan
    features the runtime cannot execute, with ``SpecError`` naming each.

    ``module``: the full model, on the meta device (each rank then allocates only its shards
    and calls ``module.init_weights()``) or materialised (the same weights on every rank,
    e.g. from one seed; they are cut and sharded). The module is modified in place when
    ``pp = 1``. ``device``: default the local CUDA device, else CPU. ``tp_plan``: module path
    pattern -> style name of ``tp_style`` or a torch ``ParallelStyle`` (default ``TP_PLAN``).
    ``loss_fn(logits, labels)``: default mean token cross entropy. ``force``: run a plan
    whose estimate does not fit the GPUs' memory (refused with ``Infeasible`` otherwise).
    A traced module's plan runs on a module whose layers are not a ``layers`` list too: its
    layers are the module paths the trace found, and its pipeline stages are cut by torch's
    pipeline tracer, which needs ``example_inputs`` (one micro-batch of its inputs).
    """
    check(plan, reference=isinstance(module, Transformer), force=force)
    job, cfg, _ = plan.training()
    paths = _layer_paths(plan, module) if isinstance(module, nn.Module) else None
    _check_module(plan, module, cfg, paths)
    dev = torch.device(device) if device is not None else _default_device()
    loss = loss_fn or cross_entropy

    _init_distributed(cfg.world_size, dev)
    shard = _shard_size(cfg)
    mesh = _device_mesh(cfg, dev, shard)
    coord = dict(zip(MESH_DIMS, mesh.get_coordinate() or [], strict=True))
    dp_rank = coord["dp_replicate"] * shard + coord["dp_shard"]

    v = cfg.virtual_pipeline_stages
    num_stages = cfg.pp * v
    ranges = stage_layer_ranges(plan.model.num_layers, cfg.pp, v, cfg.stage_layers)
    stage_ids = [coord["pp"] + k * cfg.pp for k in range(v)]
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if job.precision == "bf16" else MixedPrecisionPolicy())
    offload = _offload_policy(cfg, dev)
    # FSDP2's CPU offload keeps the sharded parameters (and so the optimizer) in host memory
    # and copies them in for each all-gather: they are materialised on the CPU, not on dev
    # (FSDPParamGroup._validate_cpu_offload_params).
    home = torch.device("cpu") if isinstance(offload, CPUOffloadPolicy) else dev

    meta = any(p.is_meta for p in module.parameters())
    parts, ties = _cut_stages(module, cfg, ranges, stage_ids, home, meta, paths,
                              example_inputs)
    pure_dp = _pure_dp(cfg)
    if tp_plan is None and cfg.tp > 1 and isinstance(plan.model, LayerCosts) \
            and plan.model.spec is None:
        # The layouts the ILP chose (check vetted them).
        tp_plan = plan.model.variant(cfg.sequence_parallel).tp_plan(cfg.tp)
    for sid, part in zip(stage_ids, parts, strict=True):
        if cfg.tp > 1 and not _apply_tp(part, mesh["tp"], tp_plan or TP_PLAN,
                                        cfg.sequence_parallel):
            raise SpecError("the tensor-parallel plan matched no module of the model; pass "
                            "tp_plan={module path pattern: style} naming its linears")
        _apply_recompute(part, cfg.recompute, _recomputed_layers(cfg, sid), paths)
        _data_parallel(part, cfg, mesh, shard, mp, offload, dev, meta, paths)
        if meta and not pure_dp:
            _materialise(part, home)

    tied = _tied_copies(parts, stage_ids, ties, _tie_groups(mesh, cfg, ties)) if ties else []
    _sync_tied(tied, grads=False)  # the copies start equal
    m = job.global_batch_size // (cfg.dp * cfg.micro_batch_size)
    schedule = None
    if cfg.pp > 1:
        group = mesh["pp"].get_group()
        stages = [PipelineStage(part, sid, num_stages, dev, group=group)
                  for sid, part in zip(stage_ids, parts, strict=True)]
        schedule = _schedule(str(cfg.pipeline_schedule), stages, m, loss)
    return Parallelized(plan=plan, parts=parts, stage_ids=stage_ids, mesh=mesh, device=dev,
                        schedule=schedule, num_micro_batches=m, dp_rank=dp_rank,
                        dp_size=cfg.dp, loss_fn=loss,
                        autocast=pure_dp and job.precision == "bf16", tied=tied)

"""``LayerCosts``: what each distinct block of a model costs per tensor-parallel degree, the
seam between "what the model is" and "what a split of it costs" (``DESIGN.md``).

A model is a short sequence of blocks: the input side (embeddings), one block per run of
identical layers (``repeat`` of them), the output side (final norm, head, loss). For each
block and each tensor-parallel degree ``t`` the figures are per instance, per rank of the
``t`` ranks that hold the same micro-batch, for one micro-batch of ``micro_batch_size``
sequences of ``seq_len`` tokens (``ShardCosts``): the parameters the rank holds, the model
FLOPs of its forward and backward pass, the activation bytes it saves for backward under
each recompute mode, the bytes of the block's input (what full recompute keeps) and the
tensor-parallel collectives the block issues (by kind, bytes of the whole tensor).

Two producers:

- ``LayerCosts.from_spec(spec, job)``: the analytic formulas of a transformer preset
  (Megatron-LM's column- and row-parallel layers, Shoeybi et al. 2019; activations of
  Korthikanti et al. 2022 as ``costmodel.memory`` generalizes them);
- ``LayerCosts.from_graph(graph, cluster, job)``: a traced ``LayerGraph``, each degree's
  layouts chosen by the sharding ILP (``costmodel.autoshard``, ``tensor_parallel=True``: the
  ranks see the same tokens and every weight matrix is split ``t`` ways), repeated blocks
  solved once.

For a preset the two agree (``tests/test_layercosts.py`` traces the reference transformer of
every preset it builds and compares).

The one consumer: the memory and step-time tables (``costmodel.memory``,
``costmodel.steptime``) read a model only through the row functions below
(``layer_compute``, ``head_compute``, ``layer_activations``, ``edge_activations``,
``layer_params_per_gpu``, ``edge_params_per_gpu``, ``tp_seconds``, ...), evaluated per row
of configurations: for a preset (``LayerCosts.of(spec)``, or ``from_spec``) by its formulas,
unchanged; for a traced graph from its blocks, the activations and kernels scaled to each
row's micro-batch (``costmodel.kernels``). A graph's layers are the blocks between its input
and output sides, each distinct block a kind of layer (``layer_kinds``; a preset's kinds are
its dense and MoE layers); it is costed with context parallelism where its layers mix
tokens in fused attention alone, and with expert parallelism where its layers route tokens
to experts (``costmodel.blockcosts``: a ``topk`` over a router's scores and the batched
matmuls of the experts' weights).

Model FLOPs follow PaLM (Chowdhery et al. 2022, App. B): ``2 m n k`` per matmul, the
attention scores and weighted sum over all ``s`` keys (no causal halving), backward twice
forward; the hardware's extra work (FlashAttention's recomputed scores, recompute) is the
cost model's business, not the block's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from costmodel.activations import layer_activations, layer_params_per_gpu
from costmodel.arrays import ConfigArrays, Distinct
from costmodel.compute import (
    LayerCompute,
    attention_kernel,
    autocast_rows,
    float8_gather,
    float8_gathered_rows,
    layer_compute,
    lm_head_compute,
    loss_kind,
    matmul_dtype,
)
from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.frameworks import framework
from costmodel.kernels import Gemm, Kernels, float8_cast_compute, kernel_compute
from costmodel.model import ModelSpec
from costmodel.sharding import aten_name
from costmodel.units import compute_bytes

if TYPE_CHECKING:
    from costmodel.comm import Topology
    from costmodel.graph import LayerGraph
    from costmodel.hardware import GPU, Cluster

__all__ = ["KINDS", "NONE_COMPILED", "OP_SELECTIVE", "OP_SELECTIVE_COMPILED", "RECOMPUTE_MODES",
           "BlockCosts", "LayerCosts", "ShardCosts", "SpreadCompute", "default_tp_degrees"]

#: Recompute modes an activation figure is given for (``ParallelConfig.recompute``).
RECOMPUTE_MODES = ("none", "selective", "full")
#: A traced layer's ``activation_bytes`` keys under torchtitan's per-op selective AC
#: (``Framework.selective_recompute`` "op"), eager and compiled (``costmodel.blockcosts``):
#: what "selective" keeps in that trainer.
OP_SELECTIVE = "selective-op"
#: ... and what a traced block keeps without recompute under ``torch.compile``
#: (``costmodel.blockcosts._compiled_saved``).
NONE_COMPILED = "none-compiled"
OP_SELECTIVE_COMPILED = "selective-op-compiled"
#: Block kinds: the input side, a repeated layer, anything between runs, the output side.
KINDS = ("embedding", "layer", "other", "head")


@dataclass(frozen=True)
class ShardCosts:
    """One instance of a block on one rank of a ``t``-rank tensor-parallel group, one
    micro-batch. ``params``: parameters the rank holds (count); ``forward_flops`` /
    ``backward_flops``: model FLOPs it executes; ``activation_bytes``: bytes saved for
    backward per recompute mode (``RECOMPUTE_MODES``); ``input_bytes``: bytes of the block's
    input on the rank; ``collectives``: collective kind (``all-reduce``, ``all-gather``,
    ``reduce-scatter``, ``all-to-all``) -> bytes of the whole tensors they move, forward and
    backward together, in ``collective_calls`` collectives of each kind (a graph's; each
    pays its latency); ``widest_elements``: elements of the largest tensor one of its ops
    makes on the rank (the logits of an LM head: what a loss's working set scales with);
    ``shared_params``: parameters it reads that another block holds (a tied LM head's word
    embedding), which a pipeline stage without that block needs a copy of; a traced block's
    forward ``kernels`` on the rank (``costmodel.kernels``), those selective recompute
    re-runs (``recomputed``) and its kernels under ``torch.compile`` (``compiled``: the
    memory-bound ops fused into regions, ``costmodel.blockcosts``); ``op_recomputed``: the
    matmuls torchtitan's per-op selective AC re-runs (with every memory-bound op; its
    activations under ``OP_SELECTIVE``), and the bytes of the forward all-gathers it runs
    again (``op_regather``, in ``op_regather_calls`` collectives); ``kv_bytes``: the keys
    and values its fused attention reads on the rank (what ring attention passes around the
    context-parallel ranks); ``expert_params``: of ``params``, a MoE layer's routed
    experts' (what expert parallelism splits further)."""

    params: float
    forward_flops: float
    backward_flops: float
    activation_bytes: Mapping[str, float]
    input_bytes: float
    collectives: Mapping[str, float] = field(default_factory=dict)
    collective_calls: Mapping[str, float] = field(default_factory=dict)
    widest_elements: float = 0.0
    shared_params: float = 0.0
    kernels: Kernels | None = None
    recomputed: Kernels | None = None
    kv_bytes: float = 0.0
    expert_params: float = 0.0
    compiled: Kernels | None = None
    op_recomputed: Kernels | None = None
    op_regather: float = 0.0
    op_regather_calls: float = 0.0

    @property
    def collective_bytes(self) -> float:
        """Bytes of all the tensors the block's collectives move, every kind together."""
        return float(sum(self.collectives.values()))


@dataclass(frozen=True)
class BlockCosts:
    """One distinct block: ``name`` (the traced module path, or the preset's part), ``kind``
    (``KINDS``), ``repeat`` instances in a row, ``output_bytes`` of one instance's output
    per micro-batch (the pipeline send size), its ``ShardCosts`` per TP degree, and a traced
    block's ``members``: the traced layers (module paths) it groups, e.g. an output side's
    final norm and head; ``mixes_tokens``: whether it reduces over the tokens outside a fused
    attention (``ShardingProblem.mixes_tokens``), which context parallelism cannot split;
    ``autocast``: a traced block's costs whole on one GPU under ``torch.autocast`` (fp32
    parameters and residual stream, the matmuls' inputs cast: ``LayerGraph.from_module``'s
    ``autocast``), which the rows trained so read (``costmodel.compute.autocast_rows``)."""

    name: str
    kind: str
    repeat: int
    output_bytes: float
    by_tp: Mapping[int, ShardCosts]
    members: tuple[str, ...] = ()
    mixes_tokens: bool = False
    autocast: ShardCosts | None = None

    def at(self, tp: int) -> ShardCosts:
        """The costs at tensor-parallel degree ``tp``; ``SpecError`` if it was not made."""
        if tp not in self.by_tp:
            raise SpecError(f"block {self.name!r} has no costs at tp={tp}; degrees: "
                            f"{', '.join(map(str, sorted(self.by_tp)))}")
        return self.by_tp[tp]


@dataclass(frozen=True)
class LayerCosts:
    """The blocks of a model in execution order, each with its costs per TP degree.

    ``source``: ``spec`` or ``graph``; ``micro_batch_size`` and ``seq_len``: the micro-batch
    the figures are for; ``sequence_parallel``: whether the norm and dropout regions are
    split over the TP ranks along the sequence (Korthikanti et al. 2022, Sec. 4.2.2);
    ``layouts``: for a graph, per TP degree, (node id, module path, op, strategy, output
    layout) of every op the ILP placed; ``sp_costs``: the same model costed the other way
    round (with sequence parallelism where ``sequence_parallel`` is false), which the rows
    that choose it read (``variant``): one search then weighs both. ``first_stage_layers``:
    the layers a pipeline's first stage must hold, a graph's that run before (or contain)
    its last op reading the model's own inputs (``costmodel.blockcosts.first_stage_layers``).
    ``top_k`` and ``num_experts``: a traced graph's routing, the experts each token goes to
    and the experts of a MoE layer (0 for a dense graph; a preset's are its spec's).
    ``multihead_attention``: a traced module's ``nn.MultiheadAttention`` paths (``None``:
    not recorded, costs saved before they were).
    """

    name: str
    source: str
    micro_batch_size: int
    seq_len: int
    sequence_parallel: bool
    blocks: tuple[BlockCosts, ...]
    layouts: Mapping[int, tuple[tuple[int, str, str, str, str], ...]] = field(
        default_factory=dict)
    spec: ModelSpec | None = None
    element_bytes: float = 2.0
    sp_costs: LayerCosts | None = None
    first_stage_layers: int = 0
    top_k: int = 0
    num_experts: int = 0
    multihead_attention: tuple[str, ...] | None = None

    @property
    def sp_options(self) -> tuple[bool, ...]:
        """The sequence-parallel settings these costs answer for (a traced graph's: what its
        blocks were sharded with, and ``sp_costs``')."""
        if self.sp_costs is None:
            return (self.sequence_parallel,)
        return tuple(sorted({self.sequence_parallel, self.sp_costs.sequence_parallel}))

    def variant(self, sequence_parallel: bool) -> LayerCosts:
        """The costs of configurations with or without sequence parallelism: ``self``, or
        ``sp_costs`` where it is the one sharded that way (``self`` when neither is: the
        tables then read the blocks as they were sharded; ``costmodel.config.validate``
        refuses such a configuration)."""
        if self.sp_costs is not None and sequence_parallel != self.sequence_parallel \
                and self.sp_costs.sequence_parallel == sequence_parallel:
            return self.sp_costs
        return self

    @property
    def tp_degrees(self) -> tuple[int, ...]:
        """The TP degrees every block has costs for."""
        if not self.blocks:
            return ()
        common = set.intersection(*(set(b.by_tp) for b in self.blocks))
        return tuple(sorted(common))

    @property
    def num_layers(self) -> int:
        """Layers, the units a pipeline splits: a preset's; a traced graph's instances of
        the blocks between its input and output sides."""
        if self.spec is not None:
            return self.spec.num_layers
        return len(self.layer_kinds)

    @cached_property
    def layer_kinds(self) -> tuple[int, ...]:
        """The kind of each layer in order (``costmodel.arrays.Layers``): a preset's 0 for
        dense and 1 for MoE layers; a traced graph's index in ``layer_blocks``."""
        if self.spec is not None:
            return self.spec.layer_kinds
        return tuple(k for k, b in enumerate(self.layer_blocks()) for _ in range(b.repeat))

    @property
    def kinds(self) -> int:
        """Kinds of layer the row functions take (``kind`` 0 .. ``kinds - 1``)."""
        if self.spec is not None:
            return 2 if self.spec.is_moe else 1
        return len(self.layer_blocks())

    @cached_property
    def kind_prefix(self) -> np.ndarray:
        """``[kinds, num_layers + 1]``: layers of each kind before each position (a stage's
        layers of kind k from layer i to j are ``kind_prefix[k, j] - kind_prefix[k, i]``)."""
        kinds = np.asarray(self.layer_kinds, dtype=np.int64)
        onehot = kinds[None, :] == np.arange(self.kinds)[:, None]
        return np.concatenate([np.zeros((self.kinds, 1), np.int64),
                               np.cumsum(onehot, axis=1)], axis=1)

    def routed(self, kind: int) -> bool:
        """Whether layers of ``kind`` route tokens to experts (a preset's MoE layers; a
        traced graph's layers holding routed experts' parameters)."""
        if self.spec is not None:
            return self.spec.is_moe and kind == 1
        if not self.num_experts:
            return False
        block = self.layer_blocks()[kind]
        return block.at(min(block.by_tp)).expert_params > 0

    def _sum(self, tp: int, attr: str) -> float:
        return float(sum(b.repeat * getattr(b.at(tp), attr) for b in self.blocks))

    def params(self, tp: int = 1) -> float:
        """Parameters one rank holds at degree ``tp`` (the whole model at 1)."""
        return self._sum(tp, "params")

    def flops(self, tp: int = 1) -> float:
        """Model FLOPs of one micro-batch's forward and backward on one rank."""
        return self._sum(tp, "forward_flops") + self._sum(tp, "backward_flops")

    def activation_bytes(self, tp: int = 1, recompute: str = "none") -> float:
        """Bytes saved for backward by one micro-batch on one rank, every block, under
        ``recompute``."""
        return float(sum(b.repeat * b.at(tp).activation_bytes[recompute] for b in self.blocks))

    def summary(self, tp: int | None = None) -> str:
        """A table of the blocks at degree ``tp`` (the smallest made by default)."""
        t = min(self.tp_degrees) if tp is None else tp
        lines = [f"{self.name} ({self.source}), tp={t}, micro-batch {self.micro_batch_size} x "
                 f"{self.seq_len} tokens",
                 f"{'block':<24s} {'kind':<9s} {'x':>4s} {'params':>14s} {'GFLOP':>10s} "
                 f"{'act MiB':>9s} {'coll MiB':>9s}"]
        for b in self.blocks:
            c = b.at(t)
            lines.append(f"{b.name:<24s} {b.kind:<9s} {b.repeat:>4d} {c.params:>14,.0f} "
                         f"{(c.forward_flops + c.backward_flops) / 1e9:>10.2f} "
                         f"{c.activation_bytes['none'] / 2**20:>9.2f} "
                         f"{c.collective_bytes / 2**20:>9.2f}")
        return "\n".join(lines)

    def tp_plan(self, tp: int) -> dict[str, str]:
        """The tensor-parallel plan the ILP chose at degree ``tp``, as DTensor styles by
        module path (``planner.runtime.apply.TP_PLAN``'s form: ``*`` for the index of a
        repeated block): a linear split by output features ``colwise`` (``head`` on the
        output side, its logits gathered), by input features ``rowwise`` where it follows
        a column-split linear of its block (it reads their split features) and
        ``rowwise_replicated`` where it reads a whole tensor (a head split over its
        input features); an embedding table split by columns ``gathered`` (its output
        all-gathered), by rows ``vocab``; a module that runs more than one matmul itself
        (``nn.MultiheadAttention``: its packed input projection and its output projection)
        ``heads`` where it is an ``nn.MultiheadAttention`` the ILP split as Megatron-LM
        splits attention (its input projections by output features, its attention by heads,
        its last projection by input features: ``planner.runtime.attention``), none where it
        left it whole, else ``custom``: no style runs it.
        With sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) also: ``norm``, a leaf
        module all of whose ops the ILP split along the sequence (its input and output
        sequence-sharded); ``block_input``, the module holding column-split linears that
        reads the sequence-sharded stream (its input all-gathered once for all of them);
        the row-split linears then reduce-scatter over the sequence, and the input side
        hands on, and the head reads, sequence shards. Modules the ILP left whole are not
        named. ``SpecError`` when the costs were not made at ``tp``, or where the gather a
        sequence-parallel layout needs falls inside a layer's own forward (no module
        boundary to put it on)."""
        if tp not in self.layouts:
            raise SpecError(f"{self.name}: no layouts at tp={tp}; degrees: "
                            f"{', '.join(map(str, sorted(self.layouts)))}")
        head = {m for b in self.blocks if b.kind == "head" for m in b.members}
        matmuls = ("mm", "addmm", "_scaled_mm")
        per_module: dict[str, int] = {}  # a module running two matmuls is not a Linear
        for _v, module, op, _label, _layout in self.layouts[tp]:
            if aten_name(op) in matmuls:
                per_module[module] = per_module.get(module, 0) + 1
        out: dict[str, str] = {}
        own: dict[str, list[tuple[str, str]]] = {}  # a multi-matmul module's (op, split)s
        block, fed_split = "", False  # the block of the last matmul, and whether n-split
        runs = {b.name: b.name.rsplit(".", 1)[0] + ".*" for b in self.blocks
                if b.repeat > 1 and "." in b.name}
        for _v, module, op, label, _layout in self.layouts[tp]:
            split = label.split("|")[-1]
            name = aten_name(op)
            if not module:
                continue
            here = ".".join(module.split(".")[:2])
            if per_module.get(module, 0) > 1:
                own.setdefault(module, []).append((name, split))
            if name in matmuls:
                fed = fed_split and here == block
                block, fed_split = here, split == "n"
                if per_module[module] > 1:
                    continue  # (below, from all of its ops)
                style = {"k": "rowwise" if fed else "rowwise_replicated",
                         "n": "head" if module.split(".")[0] in head else "colwise"
                         }.get(split, "")
            elif name == "embedding" and split != "R":
                style = "vocab" if split == "sum" else "gathered"
            else:
                continue
            if style:
                out[module] = style
        attention = self.multihead_attention
        for module, ops in own.items():
            style = _multi_matmul_style(ops, matmuls, self.micro_batch_size == 1)
            if style == "heads" and attention is not None and module not in attention:
                style = "custom"  # split by heads, but not an nn.MultiheadAttention
            if style:
                out[module] = style
        if self.sequence_parallel:
            out.update(self._sequence_styles(tp, out))
        return {_pattern(m, runs): style for m, style in out.items()}

    def tp_refusal(self, tp: int, sequence_parallel: bool) -> str:
        """Why ``planner.apply`` would not run this traced graph's layout at TP degree ``tp``
        (with or without sequence parallelism); ``""`` where it would, and always for tp 1
        and a preset's formulas. Refused: a module that runs more than one matmul itself,
        split in a layout no style runs (``tp_plan``'s ``custom``), and a sequence split the
        model's own forward would have to make (``tp_plan``'s ``SpecError``)."""
        if tp == 1 or self.spec is not None:
            return ""
        try:
            styles = self.variant(sequence_parallel).tp_plan(tp)
        except SpecError as e:
            return (f"tensor parallel (tp={tp}) of this traced module's plan is not run "
                    f"({e}); plan it with --tp 1 or without sequence parallel")
        custom = sorted(k for k, v in styles.items() if v == "custom")
        if not custom:
            return ""
        return (f"tensor parallel (tp={tp}): {', '.join(custom[:3])} runs more than one "
                "matmul itself, split in a layout no style runs (nn.MultiheadAttention runs "
                "split by heads, as many on each rank, so tp must divide its heads; asked "
                "for its weights it runs its attention unfused, whose "
                "split is known to be by heads only where the module was traced on one "
                "sequence: trace it so, or call it with need_weights=False); plan it with "
                "--tp 1")

    def _sequence_styles(self, tp: int, styles: Mapping[str, str]) -> dict[str, str]:
        """The ``norm`` and ``block_input`` styles of a sequence-parallel layout at ``tp``
        (``tp_plan``), by module path; ``styles``: the linears' and embeddings' styles."""
        ops = self.layouts[tp]
        seq = "d1"  # the strategy label of an op split along dim 1, the sequence
        modules = [m for _v, m, _op, _label, _out in ops]
        ancestors = {m: [".".join(m.split(".")[:i]) for i in range(m.count(".") + 1)]
                     for m in set(modules) if m}
        parents = {p for chain in ancestors.values() for p in chain[1:]}  # not leaves
        first: dict[str, int] = {}  # where each module's ops (its subtree's) begin
        for i, m in enumerate(modules):
            for p in ([m, *ancestors[m]] if m else []):
                first.setdefault(p, i)
        layers = {m for b in self.blocks for m in (b.name, *b.members)}
        out: dict[str, str] = {}
        own: dict[str, list[str]] = {}  # each module's ops' splits, a matmul's as "matmul"
        for _v, m, op, label, _out in ops:
            weighted = aten_name(op) in (
                "mm", "addmm", "_scaled_mm", "embedding")
            own.setdefault(m, []).append("matmul" if weighted else label.split("|")[-1])
        for m, splits in own.items():
            if m and m not in parents and m not in styles and all(x == seq for x in splits):
                out[m] = "norm"
            elif not m and any(x not in ("R", "matmul") for x in splits):
                raise SpecError(
                    f"{self.name}: with sequence parallelism, the model's own forward works on "
                    "split tensors between its modules (as adding learned positions to the "
                    "token embeddings does): no module boundary to scatter the sequence on; "
                    "plan it without sequence parallel")
        for m, style in styles.items():
            if style != "colwise":
                continue
            holder = m.rsplit(".", 1)[0] if "." in m else ""
            start = first.get(holder, first[m])
            if start == 0 or ops[start - 1][3].split("|")[-1] != seq:
                continue  # it reads a whole tensor
            if not holder or holder in layers:
                raise SpecError(
                    f"{self.name}: with sequence parallelism, {m} reads the sequence-"
                    f"sharded stream inside {holder or 'the model'}'s own forward: no module "
                    "boundary to all-gather it on; plan it without sequence parallel")
            out[holder] = "block_input"
        return out

    def num_params(self) -> int:
        """Parameters of the whole model."""
        return self.spec.num_params() if self.spec is not None else round(self.params(1))

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON values (TP degrees as string keys); ``from_dict``
        reads it back."""
        return {"name": self.name, "source": self.source,
                "micro_batch_size": self.micro_batch_size, "seq_len": self.seq_len,
                "sequence_parallel": self.sequence_parallel,
                "element_bytes": self.element_bytes,
                "first_stage_layers": self.first_stage_layers,
                "top_k": self.top_k, "num_experts": self.num_experts,
                "multihead_attention": (None if self.multihead_attention is None
                                        else list(self.multihead_attention)),
                "spec": self.spec.to_dict() if self.spec is not None else None,
                "layouts": {str(t): [list(x) for x in ops] for t, ops in self.layouts.items()},
                "blocks": [{"name": b.name, "kind": b.kind, "repeat": b.repeat,
                            "output_bytes": b.output_bytes, "members": list(b.members),
                            "mixes_tokens": b.mixes_tokens,
                            "by_tp": {str(t): shard_dict(c) for t, c in b.by_tp.items()},
                            "autocast": None if b.autocast is None
                            else shard_dict(b.autocast)}
                           for b in self.blocks],
                "sp_costs": self.sp_costs.to_dict() if self.sp_costs is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerCosts:
        """The inverse of ``to_dict``; ``SpecError`` names a missing or mangled field."""
        try:
            blocks = tuple(BlockCosts(str(b["name"]), str(b["kind"]), int(b["repeat"]),
                                      float(b["output_bytes"]),
                                      {int(t): _shard_from(c) for t, c in b["by_tp"].items()},
                                      tuple(str(m) for m in b.get("members") or ()),
                                      bool(b.get("mixes_tokens", False)),
                                      _shard_from(b["autocast"]) if b.get("autocast")
                                      else None)
                           for b in d["blocks"])
            layouts = {int(t): tuple((int(v), str(m), str(op), str(st), str(lay))
                                     for v, m, op, st, lay in ops)
                       for t, ops in (d.get("layouts") or {}).items()}
            spec = ModelSpec(**d["spec"]) if d.get("spec") else None
            other = cls.from_dict(d["sp_costs"]) if d.get("sp_costs") else None
            return cls(str(d["name"]), str(d["source"]), int(d["micro_batch_size"]),
                       int(d["seq_len"]), bool(d["sequence_parallel"]), blocks, layouts,
                       spec=spec, element_bytes=float(d.get("element_bytes", 2.0)),
                       sp_costs=other,
                       first_stage_layers=int(d.get("first_stage_layers", 0)),
                       top_k=int(d.get("top_k", 0)), num_experts=int(d.get("num_experts", 0)),
                       multihead_attention=None if d.get("multihead_attention") is None
                       else tuple(str(m) for m in d["multihead_attention"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"layer costs are missing or mangle a field ({type(e).__name__}: "
                            f"{e}); re-create them with LayerCosts.from_graph") from e

    # ---- what the memory and step-time tables read, per row of configurations ------------
    # A preset's rows are evaluated by its formulas (``spec``), exactly as the tables did
    # before this seam; a traced graph's from its blocks.

    def layer_blocks(self) -> tuple[BlockCosts, ...]:
        """A traced graph's blocks between its input and output sides, in order: each is a
        kind of layer (``layer_kinds``), ``repeat`` layers in a row; a pipeline stage holds
        a run of layers. A graph without repeated blocks has one layer per traced module."""
        return tuple(b for b in self.blocks if b.kind not in ("embedding", "head"))

    def layer_names(self) -> list[str]:
        """A traced graph's layers by module path, in order (``layer_kinds``' order): a block
        repeated ``n`` times from ``blocks.0`` is ``blocks.0`` .. ``blocks.{n-1}``.
        ``SpecError`` for a repeated block whose name is not an indexed path."""
        out: list[str] = []
        for b in self.layer_blocks():
            base, _, first = b.name.rpartition(".")
            if b.repeat == 1:
                out.append(b.name)
            elif first.isdigit():
                out += [f"{base}.{int(first) + i}" if base else str(int(first) + i)
                        for i in range(b.repeat)]
            else:
                raise SpecError(f"block {b.name!r} repeats {b.repeat} times but is not an "
                                "indexed module path; trace the module again")
        return out

    def edges(self) -> tuple[BlockCosts | None, BlockCosts | None]:
        """A traced graph's (input side, output side), ``None`` where it has none."""
        emb = next((b for b in self.blocks if b.kind == "embedding"), None)
        head = next((b for b in self.blocks if b.kind == "head"), None)
        return emb, head

    @cached_property
    def _twins(self) -> dict[int, BlockCosts]:
        """``sp_costs``' block for each of these blocks (by ``id``; the same order)."""
        if self.sp_costs is None:
            return {}
        return {id(b): t for b, t in zip(self.blocks, self.sp_costs.blocks, strict=True)}

    def _by_tp(self, block: BlockCosts | None, tp: np.ndarray,
               figure: Callable[[ShardCosts], float], sp: np.ndarray | None = None
               ) -> np.ndarray:
        """``figure`` of a block's costs at each row's TP degree (0 without the block), and
        with the row's sequence parallelism ``sp`` where ``sp_costs`` has the block sharded
        so."""
        tp = np.asarray(tp)
        if block is None:
            return np.zeros(np.shape(tp), dtype=float)
        twin = self._twins.get(id(block)) if sp is not None else None
        # A lookup table by (degree, sequence parallel): no sort of the rows' degrees.
        width = max(block.by_tp) + 1
        if twin is not None:
            width = max(width, max(twin.by_tp) + 1)
        lut = np.full(2 * width, np.nan)
        for t, c in block.by_tp.items():
            lut[2 * t + int(self.sequence_parallel and twin is not None)] = figure(c)
        if twin is not None:
            for t, c in twin.by_tp.items():
                lut[2 * t + int(not self.sequence_parallel)] = figure(c)
        idx = 2 * tp.astype(np.int64)
        if twin is not None:
            idx = idx + np.asarray(sp).astype(np.int64)
        out = lut[np.minimum(idx, len(lut) - 1)]
        bad = np.isnan(out) | (idx >= len(lut))
        if bad.any():
            self._missing(block, idx[bad].flat[0])
        return out

    def _autocast_by_tp(self, block: BlockCosts | None, a: ConfigArrays,
                        ac: np.ndarray | None, figure: Callable[[ShardCosts], float]
                        ) -> np.ndarray:
        """``_by_tp`` of each row, with the block's ``autocast`` costs on the rows ``ac``
        marks (trained under torch.autocast) where it has them."""
        out = self._by_tp(block, a.tp, figure, a.sp)
        if block is None or block.autocast is None or ac is None:
            return out
        return np.where(ac, figure(block.autocast), out)

    def _missing(self, block: BlockCosts, key: int) -> None:
        """``SpecError``: ``block`` has no costs at TP degree ``key // 2`` with sequence
        parallelism ``key % 2``."""
        t, sp = int(key) // 2, bool(key % 2)
        raise SpecError(f"block {block.name!r} has no costs at tp={t}"
                        f"{' with sequence parallelism' if sp else ''}; degrees: "
                        f"{', '.join(map(str, sorted(self.variant(sp).tp_degrees)))}")

    def _degree_rows(self, block: BlockCosts, a: ConfigArrays
                     ) -> list[tuple[int, ShardCosts, np.ndarray]]:
        """(TP degree, the block's costs there, mask of the rows at it) per degree of the rows
        of ``a`` (and per sequence parallelism where ``sp_costs`` holds the block sharded
        the other way); ``SpecError`` for a degree the block has no costs at."""
        twin = self._twins.get(id(block))
        if twin is None:
            out = [(t, c, a.tp == t) for t, c in block.by_tp.items()]
        else:
            other = a.sp.astype(bool) != self.sequence_parallel
            out = [(t, c, (a.tp == t) & ~other) for t, c in block.by_tp.items()] \
                + [(t, c, (a.tp == t) & other) for t, c in twin.by_tp.items()]
        out = [x for x in out if x[2].any()]
        if sum(int(x[2].sum()) for x in out) != a.rows:
            covered = np.logical_or.reduce([x[2] for x in out]) if out \
                else np.zeros(a.rows, bool)
            r = int(np.flatnonzero(~covered)[0])
            self._missing(block, 2 * int(a.tp[r]) + int(a.sp[r]))
        return out

    def _token_share(self, job: Job, a: ConfigArrays) -> np.ndarray:
        """Each row's tokens per micro-batch per GPU over the traced micro-batch's (a
        context-parallel rank holds 1/cp of each sequence: its queries attend to all the
        keys, so its attention FLOPs are 1/cp too)."""
        if np.any(a.cp != 1) and not self.context_parallel_ok:
            raise SpecError(f"{self.name}: context parallelism splits the sequence, but "
                            f"{self.token_mixer} reduces over the tokens outside a fused "
                            "attention; use cp=1")
        return job.seq_len / a.cp * a.mbs / float(self.micro_batch_size * self.seq_len)

    @property
    def token_mixer(self) -> str | None:
        """The first layer block that mixes tokens outside a fused attention (``None``)."""
        if self.spec is not None:
            return None
        return next((b.name for b in self.layer_blocks() if b.mixes_tokens), None)

    @property
    def context_parallel_ok(self) -> bool:
        """Whether context parallelism is costed: a preset's layers; a traced graph's that
        mix tokens only in fused attention (ring attention, Liu et al. 2023)."""
        return self.token_mixer is None

    def cp_kv_bytes(self, kind: int, job: Job, a: ConfigArrays) -> np.ndarray:
        """Bytes of the keys and values of one layer of ``kind`` that a context-parallel
        rank holds and passes on per ring step, per micro-batch, per row: a preset's
        ``2 e (s / cp) b kv_dim / tp``; a traced block's attention inputs."""
        if self.spec is not None:
            tokens = job.seq_len / a.cp * a.mbs
            return 2 * compute_bytes(job.precision) * tokens * self.spec.kv_dim / a.tp
        share = self._token_share(job, a)
        return self._by_tp(self.layer_blocks()[kind], a.tp, lambda c: c.kv_bytes,
                           a.sp) * share

    @cached_property
    def is_moe(self) -> bool:
        """Whether some layers route tokens to experts."""
        if self.spec is not None:
            return self.spec.is_moe
        return any(self.routed(k) for k in range(self.kinds))

    @property
    def hidden_size(self) -> int:
        """Elements per token of what passes between layers, what a pipeline send carries:
        a preset's residual stream; a traced graph's widest, the larger of a layer's output
        and all a layer reads from the layers before it (a decoder block's stream and the
        encoder's output beside it)."""
        if self.spec is not None:
            return self.spec.hidden_size
        t = min(self.tp_degrees)
        widest = max(max(b.output_bytes, b.at(t).input_bytes) for b in self.layer_blocks())
        return round(widest / self.element_bytes / (self.micro_batch_size * self.seq_len))

    def layer_params_per_gpu(self, tp: np.ndarray, ep: np.ndarray
                             ) -> tuple[tuple[np.ndarray, np.ndarray | None], ...]:
        """Per kind of layer, the parameters one GPU holds of one layer per row: (all but
        routed experts, the routed experts or ``None`` for a kind without them)
        (``costmodel.activations.layer_params_per_gpu``)."""
        if self.spec is not None:
            dense, moe, experts = layer_params_per_gpu(self.spec, tp, ep)
            return ((dense, None), (moe, experts)) if self.spec.is_moe else ((dense, None),)
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        for k, b in enumerate(self.layer_blocks()):
            held = self._by_tp(b, tp, lambda c: c.params)
            if not self.routed(k):
                out.append((held, None))
                continue
            experts = self._by_tp(b, tp, lambda c: c.expert_params)
            out.append((held - experts, experts / ep))
        return tuple(out)

    def layer_param_tensors(self, separate_projections: bool) -> tuple[tuple[int, int], ...]:
        """Per kind of layer (as ``layer_params_per_gpu``), its parameter tensors: (weight
        matrices, vectors: norm scales and shifts and biases), what a trainer that gathers
        each parameter by its own collective issues (``Job.zero3_synchronous_gather``).
        ``separate_projections``: q, k, v (and a gated MLP's gate and up) are separate
        matrices (``Framework.separate_projections``) rather than fused ones. SpecError for
        a traced module, whose layers do not list their tensors here, and for mixture of
        experts, which that trainer's releases predate."""
        model = self.spec
        if model is None or model.is_moe:
            what = "a traced module" if model is None else "a mixture-of-experts model"
            raise SpecError(f"Job.zero3_synchronous_gather (DeepSpeed's per-parameter ZeRO-3 "
                            f"gathers of 2021) is modelled for a dense preset model, not "
                            f"{what}; turn it off")
        qkv = 3 if separate_projections else 1
        up = 2 if model.gated_mlp and separate_projections else 1
        weights = qkv + 1 + up + 1
        vectors = 2 * (2 if model.norm == "layernorm" else 1)
        if model.bias:
            vectors += weights
        elif model.qkv_bias:
            vectors += qkv
        return ((weights, vectors),)

    def edge_params_per_gpu(self, tp: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input side, output side, tied) parameters one GPU of the first and of the last
        stage holds per row: the vocabulary-parallel embedding and LM head split over tp
        (Megatron-LM, torchtitan), learned positions, token types, norms and a ViT's patch
        projection replicated; the tied word embedding's share, which the last stage keeps
        a copy of when pp > 1 (Megatron-LM keeps both copies in sync by an all-reduce)."""
        if self.spec is None:
            emb, head = self.edges()
            return (self._by_tp(emb, tp, lambda c: c.params),
                    self._by_tp(head, tp, lambda c: c.params),
                    self._by_tp(head, tp, lambda c: c.shared_params))
        model = self.spec
        norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
        word = 0 if model.patch_size else model.vocab_size * model.hidden_size
        final_norm = norm if model.final_norm else 0
        emb_local = word / tp + (model.embedding_params() - word)
        head_local = (model.head_params() - final_norm) / tp + final_norm
        return emb_local, head_local, (word if model.tied_embeddings else 0) / tp

    def layer_activations(self, job: Job, a: ConfigArrays, kind: int, ac: np.ndarray
                          ) -> dict[str, np.ndarray]:
        """Bytes one layer of ``kind`` saves for backward per micro-batch per recompute
        mode, per row (``costmodel.activations.layer_activations``)."""
        return _per_group(a, ac, lambda g, g_ac: self._layer_activations(job, g, kind, g_ac))

    def _layer_activations(self, job: Job, a: ConfigArrays, kind: int, ac: np.ndarray | None
                           ) -> dict[str, np.ndarray]:
        if self.spec is not None:
            return layer_activations(self.spec, job, framework(job.framework), a,
                                     self.routed(kind), ac)
        layer, share = self.layer_blocks()[kind], self._token_share(job, a)
        op = framework(job.framework).selective_recompute == "op"
        keys = {"selective": OP_SELECTIVE_COMPILED if job.compile else OP_SELECTIVE} \
            if op else {}
        if job.compile:
            keys["none"] = NONE_COMPILED
        return {m: self._autocast_by_tp(layer, a, ac, partial(_saved, m, key=keys.get(m)))
                * share for m in RECOMPUTE_MODES}

    def edge_activations(self, job: Job, a: ConfigArrays, ac: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(input side, output side) bytes saved for backward per micro-batch per row.

        Korthikanti et al. 2022, Sec. 4.3: the embedding's dropout mask sbh/t; on the last
        stage the final norm's input 2sbh/t, the output layer's input 2sbh/t and the fp32
        logits 4sbv/t the cross entropy keeps, in all 4sbh/t (1 + v/h). Under autocast the
        final norm's input is fp32 (4 + e instead of 2e). A compiled loss
        (``costmodel.compute.loss_kind``) keeps the e-byte logits it was given instead of an
        fp32 log-softmax (measured, benchmarks/op_sac_memory.py)."""
        return _per_group(a, ac, lambda g, g_ac: self._edge_activations(job, g, g_ac))

    def _edge_activations(self, job: Job, a: ConfigArrays, ac: np.ndarray | None
                          ) -> tuple[np.ndarray, np.ndarray]:
        if self.spec is None:
            emb, head = self.edges()
            share = self._token_share(job, a)
            # The embedding and head are not recomputed.
            kept = partial(_saved, "none", key=NONE_COMPILED if job.compile else None)
            return (self._autocast_by_tp(emb, a, ac, kept) * share,
                    self._autocast_by_tp(head, a, ac, kept) * share)
        model = self.spec
        e = compute_bytes(job.precision)
        tp = a.tp.astype(float)
        tokens = job.seq_len / a.cp * a.mbs
        rep = np.where(a.sp == 1, 1.0 / tp, 1.0)
        h = float(model.hidden_size)
        emb_act = (1.0 if model.dropout else 0.0) * tokens * h * rep
        logit_b = e if loss_kind(framework(job.framework), job) == "compiled" else 4.0
        if ac is None:
            ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
        head_act = (np.where(ac, 4.0 + e, 2 * e) * tokens * h * rep
                    + logit_b * tokens * model.vocab_size / tp)
        return emb_act, head_act

    def logits_per_token(self, tp: np.ndarray) -> np.ndarray:
        """Logits one GPU of the last stage holds per token (the vocabulary over tp; for a
        traced graph, the widest tensor of its output side)."""
        if self.spec is None:
            return self._by_tp(self.edges()[1], tp, lambda c: c.widest_elements) \
                / float(self.micro_batch_size * self.seq_len)
        return self.spec.vocab_size / tp

    def moe_routing(self) -> tuple[int, int]:
        """(experts each token goes to, experts in a MoE layer)."""
        if self.spec is None:
            return (self.top_k, self.num_experts) if self.is_moe else (0, 0)
        return self.spec.top_k, self.spec.num_experts

    def layer_compute(self, gpu: GPU, job: Job, a: ConfigArrays, kind: int,
                      capacity_factor: float = 1.0, autocast: np.ndarray | None = None
                      ) -> LayerCompute:
        """One layer of ``kind``'s compute per micro-batch per row (``costmodel.compute``;
        a traced graph's: its kernels, ``costmodel.kernels``)."""
        return _per_group(a, autocast, lambda g, g_ac: self._layer_compute(
            gpu, job, g, kind, capacity_factor, g_ac))

    def _layer_compute(self, gpu: GPU, job: Job, a: ConfigArrays, kind: int,
                       capacity_factor: float, autocast: np.ndarray | None) -> LayerCompute:
        if self.spec is None:
            return self._kernel_compute(self.layer_blocks()[kind], gpu, job, a, autocast)
        moe = self.routed(kind)
        return layer_compute(self.spec, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=moe,
                             capacity_factor=capacity_factor, ep=a.ep if moe else None,
                             autocast=autocast,
                             float8_gathered=float8_gathered_rows(job.framework, job, a.zero))

    def head_compute(self, gpu: GPU, job: Job, a: ConfigArrays,
                     autocast: np.ndarray | None = None) -> tuple[LayerCompute, LayerCompute]:
        """(embedding, head) compute per micro-batch per row (``costmodel.compute``; a
        traced graph's: the kernels of its input and output sides)."""
        return _per_group(a, autocast, lambda g, g_ac: self._head_compute(gpu, job, g, g_ac))

    def _head_compute(self, gpu: GPU, job: Job, a: ConfigArrays, autocast: np.ndarray | None
                      ) -> tuple[LayerCompute, LayerCompute]:
        if self.spec is None:
            emb, head = self.edges()
            return (self._kernel_compute(emb, gpu, job, a, autocast),
                    self._kernel_compute(head, gpu, job, a, autocast))
        return lm_head_compute(self.spec, gpu, job, a.tp, a.cp, a.mbs, a.sp,
                               autocast=autocast)

    def _kernel_compute(self, block: BlockCosts | None, gpu: GPU, job: Job, a: ConfigArrays,
                        autocast: np.ndarray | None = None) -> LayerCompute:
        """A traced block's ``LayerCompute`` per row: its kernels at the row's TP degree
        (its ``autocast`` kernels on the rows ``autocast`` marks, where it has them), scaled
        to the row's micro-batch (zero without the block)."""
        share = self._token_share(job, a)
        fields = [f.name for f in dataclasses.fields(LayerCompute)]
        out = {name: np.zeros(np.shape(a.tp)) for name in fields}
        if block is None:
            return LayerCompute(**out)
        # The job's matmul dtype (tf32 for fp32, fp8), as the formulas run theirs; the bytes
        # moved are as traced. fp8 runs in the layers only: the input and output sides stay
        # in bf16 (``compute.lm_head_compute``).
        dtype = matmul_dtype(job)
        if dtype == "fp8" and block.kind != "layer":
            dtype = "bf16"
        fw = framework(job.framework)
        op = fw.selective_recompute == "op"
        # torchao's float8 training casts each Float8Linear's input and output gradient in
        # a layer (the formulas' ``compute.float8_cast_time``; the head stays in bf16).
        casts = fw.torchao_float8 and job.precision == "fp8" and block.kind == "layer"
        gathered = float8_gathered_rows(job.framework, job, a.zero)
        kernel = attention_kernel(job, gpu)
        for c, rows in _autocast_rows(block, self._degree_rows(block, a), autocast):
            run = (c.compiled if job.compile and c.compiled is not None else c.kernels) \
                or Kernels()
            again = c.recomputed
            if op and c.op_recomputed is not None:
                # torchtitan's per-op selective AC re-runs its matmuls and every
                # memory-bound kernel of the block (``costmodel.blockcosts``).
                again = dataclasses.replace(run, gemms=c.op_recomputed.gemms,
                                            attention_flops=0.0, attention_kernels=0,
                                            attention_backward=False,
                                            attention_flops_per_key=0.0)
            if dtype == "fp8" and block.kind == "layer":
                run, again = _fp8_operands(run), again and _fp8_operands(again)
            lc = kernel_compute(gpu, dtype, run, share[rows], again, ep=a.ep[rows],
                                attention_kernel=kernel)
            if casts:
                cast_f, cast_b = float8_cast_compute(gpu, job, run, share[rows],
                                                     gathered[rows])
                # Per-op AC re-runs every memory-bound kernel, the casts among them.
                lc = dataclasses.replace(lc, forward=lc.forward + cast_f,
                                         backward=lc.backward + cast_b,
                                         selective=lc.selective + cast_f if op
                                         else lc.selective)
            for name in fields:
                out[name][rows] = getattr(lc, name)
        return LayerCompute(**out)

    def tp_seconds(self, topo: Topology, a: ConfigArrays, job: Job
                   ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
        """A traced graph's tensor-parallel collectives per micro-batch per row, seconds:
        (one layer of each kind, the input side, the output side), forward and backward,
        all exposed (inside a node; ``costmodel.sharding.reshard_time``'s costs)."""
        emb, head = self.edges()
        share = self._token_share(job, a)
        gather = _float8_gather_share(job)

        def seconds(block: BlockCosts | None) -> np.ndarray:
            out = np.zeros(np.shape(a.tp))
            if block is None:
                return out
            for t, c, rows in self._degree_rows(block, a):
                for kind, nbytes in c.collectives.items():
                    if kind == "all-gather" and block.kind == "layer":
                        nbytes = nbytes * gather
                    out[rows] = out[rows] + _collective_seconds(
                        topo, kind, nbytes * share[rows], c.collective_calls.get(kind, 1.0), t)
            return out

        return tuple(seconds(b) for b in self.layer_blocks()), seconds(emb), seconds(head)

    def op_regather_seconds(self, topo: Topology, a: ConfigArrays, job: Job
                            ) -> tuple[np.ndarray, ...]:
        """A traced graph's all-gathers that torchtitan's per-op selective AC runs again in
        backward, seconds per micro-batch per row, one layer of each kind
        (``ShardCosts.op_regather``; a preset's are ``costmodel.stepterms``'s)."""
        share = self._token_share(job, a) * _float8_gather_share(job)
        out = []
        for block in self.layer_blocks():
            secs = np.zeros(np.shape(a.tp))
            for t, c, rows in self._degree_rows(block, a):
                if c.op_regather:
                    secs[rows] = _collective_seconds(topo, "all-gather",
                                                     c.op_regather * share[rows],
                                                     c.op_regather_calls, t)
            out.append(secs)
        return tuple(out)

    def model_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, forward and backward: ``6 N + 12 L q s`` (PaLM,
        Chowdhery et al. 2022, App. B), with N the parameters that take part in a matmul per
        token (active experts only; not the input embedding table, which is a lookup, unless
        tied to the output layer) and ``q = heads * head_dim``, counting the full s x s
        attention. A traced graph: its matmul, convolution and attention FLOPs per token
        (``torch.utils.flop_counter``)."""
        if self.spec is None:
            return self.flops(1) / float(self.micro_batch_size * self.seq_len)
        model = self.spec
        n = model.num_active_params() - model.embedding_params()
        if model.tied_embeddings and not model.patch_size:
            n += model.vocab_size * model.hidden_size
        return 6.0 * n + 12.0 * model.num_layers * model.q_dim * seq_len

    @classmethod
    def of(cls, model: ModelSpec | LayerCosts) -> LayerCosts:
        """``model``'s costs as the tables read them: a ``LayerCosts`` as it is (each row
        read with its own sequence parallelism where it has ``sp_costs``); a preset's
        formulas (no per-degree blocks are computed: the rows are evaluated directly)."""
        if isinstance(model, LayerCosts):
            return model
        return cls(model.name, "spec", 1, 0, False, (), spec=model)

    # ---- producers ----------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: ModelSpec, job: Job, *, tp_degrees: Sequence[int] | None = None,
                  micro_batch_size: int = 1, sequence_parallel: bool = False) -> LayerCosts:
        """The analytic costs of ``spec`` for ``job`` (precision, sequence length, attention
        kernel, trainer conventions) at each of ``tp_degrees`` (default:
        ``default_tp_degrees``)."""
        degrees = tuple(tp_degrees or default_tp_degrees(spec))
        kv = int(spec.num_kv_heads or spec.num_heads)
        for t in degrees:
            if spec.num_heads % t or kv % t:
                raise SpecError(f"{spec.name}: tp={t} does not divide {spec.num_heads} heads "
                                f"and {spec.num_kv_heads} KV heads")
        parts = [_spec_shards(spec, job, t, micro_batch_size, sequence_parallel)
                 for t in degrees]
        tokens = micro_batch_size * job.seq_len
        out = compute_bytes(job.precision) * tokens * spec.hidden_size
        # (name, kind, repeat, output bytes, index in _spec_shards' tuple) of each block; a
        # MoE preset's leading dense layers (DeepSeekMoE), then its MoE layers.
        moe = spec.num_moe_layers if spec.is_moe else 0
        layers = [(name, "layer", n, out, i) for name, n, i in
                  (("layers", spec.num_layers - moe, 1), ("moe layers", moe, 2)) if n > 0]
        names = [("embedding", "embedding", 1, out, 0), *layers, ("head", "head", 1, 0.0, 3)]
        blocks = tuple(BlockCosts(name, kind, repeat, out_bytes,
                                  {t: p[i] for t, p in zip(degrees, parts, strict=True)})
                       for name, kind, repeat, out_bytes, i in names)
        return cls(spec.name, "spec", micro_batch_size, job.seq_len, sequence_parallel, blocks,
                   spec=spec)

    @classmethod
    def from_graph(cls, graph: LayerGraph, cluster: Cluster, job: Job, *,
                   tp_degrees: Sequence[int] | None = None,
                   sequence_parallel: bool | Literal["both"] = False,
                   time_limit_s: float = 10.0,
                   autocast_graph: LayerGraph | None = None) -> LayerCosts:
        """The costs of a traced graph (one micro-batch: the batch it was traced with) at
        each TP degree (default: the divisors of a node's GPUs), each degree's layouts
        chosen by the sharding ILP (``costmodel.blockcosts.block_costs``), with or without
        sequence parallelism, or ``"both"``: the costs without, carrying those with as
        ``sp_costs`` (at the degrees above 1, the only ones it splits).
        ``autocast_graph``: the same module traced under ``torch.autocast``
        (``LayerGraph.from_module(..., dtype=torch.float32, autocast=torch.bfloat16)``),
        whose blocks' costs on one GPU the rows trained so read (``BlockCosts.autocast``;
        without it they read the graph's own).
        """
        costs = cls._from_graph(graph, cluster, job, tp_degrees, sequence_parallel,
                                time_limit_s)
        if autocast_graph is None:
            return costs
        return costs.with_autocast(autocast_graph, cluster, job, time_limit_s=time_limit_s)

    def with_autocast(self, autocast_graph: LayerGraph, cluster: Cluster, job: Job, *,
                      time_limit_s: float = 10.0) -> LayerCosts:
        """These costs of a traced graph with each block's one-GPU costs under
        ``torch.autocast`` from ``autocast_graph``, the same module traced so
        (``BlockCosts.autocast``); ``SpecError`` when its blocks are not these."""
        from costmodel.blockcosts import block_costs

        if self.spec is not None:
            raise SpecError(f"{self.name}: a preset's formulas cost autocast themselves; "
                            "with_autocast takes a traced graph's costs")
        under = block_costs(autocast_graph, cluster, job, tp_degrees=(1,),
                            sequence_parallel=False, time_limit_s=time_limit_s)
        shape = [(b.name, b.kind, b.repeat) for b in self.blocks]
        if [(b.name, b.kind, b.repeat) for b in under.blocks] != shape:
            raise SpecError(f"{self.name}: traced under autocast its blocks differ from the "
                            "graph's; trace the same module and inputs for both")
        return dataclasses.replace(self, blocks=tuple(
            dataclasses.replace(b, autocast=u.at(1))
            for b, u in zip(self.blocks, under.blocks, strict=True)))

    @classmethod
    def _from_graph(cls, graph: LayerGraph, cluster: Cluster, job: Job,
                    tp_degrees: Sequence[int] | None,
                    sequence_parallel: bool | Literal["both"], time_limit_s: float
                    ) -> LayerCosts:
        from costmodel.blockcosts import block_costs

        if sequence_parallel == "both":
            plain = block_costs(graph, cluster, job, tp_degrees=tp_degrees,
                                sequence_parallel=False, time_limit_s=time_limit_s)
            split = tuple(t for t in plain.tp_degrees if t > 1)
            if not split:
                return plain
            return dataclasses.replace(plain, sp_costs=block_costs(
                graph, cluster, job, tp_degrees=split, sequence_parallel=True,
                time_limit_s=time_limit_s))
        if not isinstance(sequence_parallel, bool):
            raise SpecError(f"sequence_parallel must be True, False or 'both', got "
                            f"{sequence_parallel!r}")
        return block_costs(graph, cluster, job, tp_degrees=tp_degrees,
                           sequence_parallel=sequence_parallel, time_limit_s=time_limit_s)


_Out = TypeVar("_Out")


def _autocast_rows(block: BlockCosts, by_degree: list[tuple[int, ShardCosts, np.ndarray]],
                   ac: np.ndarray | None) -> list[tuple[ShardCosts, np.ndarray]]:
    """(costs, mask of rows) of ``_degree_rows``' groups, the rows ``ac`` marks (trained
    under torch.autocast, whole on one GPU) taken out for the block's ``autocast`` costs
    where it has them."""
    if block.autocast is None or ac is None or not np.any(ac):
        return [(c, rows) for _, c, rows in by_degree]
    out = [(c, rows & ~ac) for _, c, rows in by_degree]
    return [x for x in out if x[1].any()] + [(block.autocast, np.asarray(ac, dtype=bool))]


def _per_group(a: ConfigArrays, ac: np.ndarray | None,
               fn: Callable[[ConfigArrays, np.ndarray | None], _Out]) -> _Out:
    """``fn(a, ac)`` (a layer's per-row compute or saved bytes, which depend on
    ``ConfigArrays.kernel_groups``' columns alone) computed once per group, on one row of
    each, and spread over the rows: the same values, for a few dozen rows' arithmetic."""
    groups = a.kernel_groups
    if len(groups.first) == a.rows:
        return fn(a, ac)
    out = fn(a.kernel_rows, None if ac is None else np.take(ac, groups.first))
    return _spread(out, groups)


def _spread(x: Any, groups: Distinct) -> Any:
    """``x``'s per-group arrays (in a ``LayerCompute``, dict or tuple) spread over the rows
    (a ``LayerCompute``'s each when first read)."""
    if isinstance(x, LayerCompute):
        return SpreadCompute(x, groups)
    if isinstance(x, dict):
        return {k: _spread(v, groups) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_spread(v, groups) for v in x)
    return groups.spread(x) if np.ndim(x) else x


class SpreadCompute(LayerCompute):
    """A ``LayerCompute`` per row made from ``per_group``, one per group of ``groups``: each
    field is spread over the rows when first read (a search reads half of them, depending on
    the job's overlap switches). What depends on a layer's compute and the kernel groups'
    columns alone can be computed from ``per_group`` too (``costmodel.stepterms``' TP)."""

    per_group: LayerCompute
    groups: Distinct

    def __init__(self, per_group: LayerCompute, groups: Distinct) -> None:
        object.__setattr__(self, "per_group", per_group)
        object.__setattr__(self, "groups", groups)

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not yet in the instance: the dataclass fields, once each.
        if name.startswith("_") or name in ("per_group", "groups"):
            raise AttributeError(name)
        value = _spread(getattr(self.per_group, name), self.groups)
        object.__setattr__(self, name, value)
        return value


#: Batched matmuls: an unfused attention's scores and weighted sum over ``[batch * heads]``.
BATCHED_MATMULS = ("bmm", "baddbmm")


def _multi_matmul_style(ops: Sequence[tuple[str, str]], matmuls: Sequence[str],
                        one_sequence: bool = False) -> str:
    """The TP style of a module running several matmuls itself, from its ops' (name, split)
    in order (``LayerCosts.tp_plan``): ``heads`` for Megatron-LM's split of attention (every
    matmul but the last split by output features, the last by input features, its core
    split by heads), ``""`` where all its matmuls are whole, else ``custom``. The core is a
    fused attention split by heads (``h``), or an unfused one (``nn.MultiheadAttention``
    asked for its weights) whose batched matmuls are split along their batch loop, which
    runs over the sequences and the heads: the heads where the module was traced on one
    sequence (``one_sequence``), else unknown (``custom``)."""
    splits = [split for name, split in ops if name in matmuls]
    if all(x == "R" for x in splits):
        return ""
    fused = [split for name, split in ops if "attention" in name]
    unfused = [split for name, split in ops if name in BATCHED_MATMULS]
    core = all(x == "h" for x in fused) and bool(fused or unfused) and (
        not unfused or (one_sequence and all(x == "b" for x in unfused)))
    if len(splits) >= 2 and all(x == "n" for x in splits[:-1]) and splits[-1] == "k" \
            and core:
        return "heads"
    return "custom"


def _pattern(module: str, runs: Mapping[str, str]) -> str:
    """``module``'s path with the index of a repeated block replaced by ``*`` (``runs``:
    the first instance's path -> its pattern)."""
    for run, pat in runs.items():
        if module == run or module.startswith(run + "."):
            return pat + module[len(run):]
    return module


def _fp8_operands(k: Kernels) -> Kernels:
    """``k`` with its fp8 matmuls (a layer's linears, ``Gemm.cast_in``, and routed experts)
    reading and writing one byte per element where the trace moved two, as the formulas
    time a layer's fp8 matmuls (``compute.gemm_time`` at one byte per element)."""
    return dataclasses.replace(k, gemms=tuple(
        dataclasses.replace(g, activation_bytes=g.activation_bytes / 2,
                            weight_bytes=g.weight_bytes / 2)
        if g.cast_in or g.expert else g for g in k.gemms))


def _float8_gather_share(job: Job) -> float:
    """The share of a traced layer's all-gather bytes (traced in bf16) that ``job`` moves:
    torchtitan's tensorwise float8 TP styles gather the float8 cast of a linear's input
    (``compute.float8_gather``; a layer's SP all-gathers are its linears' inputs and, in
    backward, their output gradients)."""
    return float8_gather(job.framework, job, 2.0)[0] / 2.0


def _collective_seconds(topo: Topology, kind: str, nbytes: np.ndarray, calls: float, t: int
                        ) -> np.ndarray:
    """Seconds of ``calls`` collectives of ``kind`` moving ``nbytes`` in all over ``t``
    ranks inside a node (``costmodel.sharding.reshard_time``'s costs: an all-to-all sends
    each rank's share), each paying its latency."""
    n = max(calls, 1.0)
    size = nbytes / n
    cost = topo.all_to_all(size / t, t, 1) if kind == "all-to-all" else {
        "all-reduce": topo.all_reduce, "all-gather": topo.all_gather,
        "reduce-scatter": topo.reduce_scatter}[kind](size, t, 1)
    return n * cost


def _saved(mode: str, c: ShardCosts, key: str | None = None) -> float:
    """What a block keeps for backward under recompute ``mode`` (``key``: the trainer's
    own figure for it where the block has one, ``OP_SELECTIVE``)."""
    return c.activation_bytes.get(key, c.activation_bytes[mode]) if key \
        else c.activation_bytes[mode]


def default_tp_degrees(spec: ModelSpec, largest: int = 8) -> tuple[int, ...]:
    """Powers of two up to ``largest`` (a node's GPUs) dividing the heads and KV heads."""
    out, t = [], 1
    kv = int(spec.num_kv_heads or spec.num_heads)
    while t <= largest:
        if spec.num_heads % t == 0 and kv % t == 0:
            out.append(t)
        t *= 2
    return tuple(out)


def _spec_shards(spec: ModelSpec, job: Job, tp: int, mbs: int, sp: bool
                 ) -> tuple[ShardCosts, ShardCosts, ShardCosts, ShardCosts]:
    """(embedding, dense layer, MoE layer, head) ``ShardCosts`` of ``spec`` at degree ``tp``
    (the MoE layer as the dense one for a dense model): parameters and activations as the
    tables' row functions give them for a one-row table, FLOPs and collectives by
    Megatron-LM's layout, the routed experts split over TP as Megatron-LM's expert tensor
    parallelism splits them (``expert_params`` at ep = 1: the tables split them further
    over ep)."""
    cfg = ParallelConfig(tp=tp, micro_batch_size=mbs, sequence_parallel=sp and tp > 1)
    a = ConfigArrays.from_configs(spec, [cfg])
    rows = LayerCosts.of(spec)
    ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    acts = {k: float(v[0]) for k, v in rows.layer_activations(job, a, 0, ac).items()}
    e = compute_bytes(job.precision)
    h, t = float(spec.hidden_size), float(tp)
    tokens = float(mbs * job.seq_len)
    rep = 1.0 / t if cfg.sequence_parallel else 1.0
    one = e * tokens * h  # one activation tensor [tokens, h], all of it

    # Layer: Megatron-LM's column-parallel QKV and MLP input, row-parallel outputs (Shoeybi
    # et al. 2019, Sec. 3): model FLOPs 2 T h (q + 2 kv) + 2 T q h + 4 T s q + MLP, over t.
    # A MoE layer's MLP: the router (2 T h experts), each token's top-k routed experts and
    # the shared ones, their MLPs split as the dense one; model FLOPs, shared evenly by the
    # t ranks (Megatron-LM runs the small router whole on each: hardware FLOPs).
    attn = (2 * tokens * h * (spec.q_dim + 2 * spec.kv_dim) + 2 * tokens * spec.q_dim * h
            + 4 * tokens * job.seq_len * spec.q_dim) / t
    widths = 3 if spec.gated_mlp else 2
    mlp = 2 * tokens * h * float(spec.ffn_hidden_size or 0) * widths / t
    # Two all-reduces forward (after the attention and MLP output projections) and two
    # backward (of the input gradients of the column-parallel inputs); with SP each is an
    # all-gather and a reduce-scatter (Korthikanti et al. 2022, Sec. 4.2.2, Fig. 5).
    coll = _tp_collectives(tp, cfg.sequence_parallel, 4 * one)
    per_layer = rows.layer_params_per_gpu(np.array([t]), np.array([1.0]))
    fwd = attn + mlp
    layer = ShardCosts(params=float(per_layer[0][0][0]), forward_flops=fwd,
                       backward_flops=2 * fwd, activation_bytes=acts, input_bytes=one * rep,
                       collectives=coll)
    moe_layer = layer
    if spec.is_moe:
        (moe, experts) = per_layer[1]
        assert experts is not None
        f_moe = float(spec.moe_ffn_hidden_size or 0)
        active = spec.top_k + spec.num_shared_experts
        fwd = attn + 2 * tokens * h * (spec.num_experts + f_moe * widths * active) / t
        moe_acts = {k: float(v[0]) for k, v in rows.layer_activations(job, a, 1, ac).items()}
        moe_layer = ShardCosts(params=float(moe[0] + experts[0]), forward_flops=fwd,
                               backward_flops=2 * fwd, activation_bytes=moe_acts,
                               input_bytes=one * rep, collectives=coll,
                               expert_params=float(experts[0]))

    # Input side: its output all-reduced (SP: reduce-scattered) forward. Output side: the
    # head's input gradient all-reduced (SP: its input all-gathered forward, the gradient
    # reduce-scattered); the vocabulary-parallel cross entropy all-reduces 3 fp32 values per
    # token (Megatron-LM's _VocabParallelCrossEntropy: max, sum of exponentials, target).
    emb_params, head_params, _ = rows.edge_params_per_gpu(np.array([t]))
    emb_act, head_act = (float(x[0]) for x in rows.edge_activations(job, a,
                                                                     np.zeros(1, dtype=bool)))
    emb = ShardCosts(params=float(emb_params[0]), forward_flops=0.0, backward_flops=0.0,
                     activation_bytes=dict.fromkeys(RECOMPUTE_MODES, emb_act),
                     input_bytes=0.0, collectives=_tp_collectives(tp, cfg.sequence_parallel, one))
    head_flops = 2 * tokens * h * spec.vocab_size / t
    head_coll = dict(_tp_collectives(tp, cfg.sequence_parallel, one))
    if tp > 1:
        head_coll["all-reduce"] = head_coll.get("all-reduce", 0.0) + 3 * 4.0 * tokens
    head = ShardCosts(params=float(head_params[0]), forward_flops=head_flops,
                      backward_flops=2 * head_flops,
                      activation_bytes=dict.fromkeys(RECOMPUTE_MODES, head_act),
                      input_bytes=one * rep, collectives=head_coll)
    return emb, layer, moe_layer, head


def _tp_collectives(tp: int, sp: bool, nbytes: float) -> dict[str, float]:
    """The collectives moving ``nbytes`` of activations between TP regions: all-reduces, or
    with SP all-gathers and reduce-scatters of the same tensors, one of each (an
    all-gather's gradient is a reduce-scatter and the other way round); none at ``tp`` 1."""
    if tp == 1:
        return {}
    if not sp:
        return {"all-reduce": nbytes}
    return {"all-gather": nbytes, "reduce-scatter": nbytes}


def shard_dict(c: ShardCosts) -> dict[str, Any]:
    """``c`` as plain JSON values."""
    return {"params": c.params, "forward_flops": c.forward_flops,
            "backward_flops": c.backward_flops, "activation_bytes": dict(c.activation_bytes),
            "input_bytes": c.input_bytes, "collectives": dict(c.collectives),
            "collective_calls": dict(c.collective_calls),
            "widest_elements": c.widest_elements, "shared_params": c.shared_params,
            "kernels": dataclasses.asdict(c.kernels) if c.kernels is not None else None,
            "recomputed": dataclasses.asdict(c.recomputed) if c.recomputed is not None
            else None, "kv_bytes": c.kv_bytes, "expert_params": c.expert_params,
            "compiled": dataclasses.asdict(c.compiled) if c.compiled is not None else None,
            "op_recomputed": dataclasses.asdict(c.op_recomputed)
            if c.op_recomputed is not None else None,
            "op_regather": c.op_regather, "op_regather_calls": c.op_regather_calls}


def _kernels_from(d: Mapping[str, Any] | None) -> Kernels | None:
    if d is None:
        return None
    rest = {k: v for k, v in d.items() if k != "gemms"}
    return Kernels(gemms=tuple(Gemm(**g) for g in d["gemms"]), **rest)


def _shard_from(d: Mapping[str, Any]) -> ShardCosts:
    """The inverse of ``shard_dict``."""
    return ShardCosts(params=float(d["params"]), forward_flops=float(d["forward_flops"]),
                      backward_flops=float(d["backward_flops"]),
                      activation_bytes={str(k): float(v)
                                        for k, v in d["activation_bytes"].items()},
                      input_bytes=float(d["input_bytes"]),
                      collectives={str(k): float(v) for k, v in d["collectives"].items()},
                      collective_calls={str(k): float(v)
                                        for k, v in (d.get("collective_calls") or {}).items()},
                      widest_elements=float(d.get("widest_elements", 0.0)),
                      shared_params=float(d.get("shared_params", 0.0)),
                      kernels=_kernels_from(d.get("kernels")),
                      recomputed=_kernels_from(d.get("recomputed")),
                      kv_bytes=float(d.get("kv_bytes", 0.0)),
                      expert_params=float(d.get("expert_params", 0.0)),
                      compiled=_kernels_from(d.get("compiled")),
                      op_recomputed=_kernels_from(d.get("op_recomputed")),
                      op_regather=float(d.get("op_regather", 0.0)),
                      op_regather_calls=float(d.get("op_regather_calls", 0.0)))

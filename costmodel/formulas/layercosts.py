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
  Korthikanti et al. 2022 as ``costmodel.formulas.memory`` generalizes them);
- ``costmodel.trace.blockcosts.costs_from_graph(graph, cluster, job)``: a traced ``LayerGraph``,
each degree's
  layouts chosen by the sharding ILP (``costmodel.trace.autoshard``, ``tensor_parallel=True``: the
  ranks see the same tokens and every weight matrix is split ``t`` ways), repeated blocks
  solved once.

For a preset the two agree (``tests/test_layercosts.py`` traces the reference transformer of
every preset it builds and compares).

The one consumer: the memory and step-time tables (``costmodel.formulas.memory``,
``costmodel.formulas.steptime``) read a model only through the row functions below
(``layer_compute``, ``head_compute``, ``layer_activations``, ``edge_activations``,
``layer_params_per_gpu``, ``edge_params_per_gpu``, ``tp_seconds``, ...), evaluated per row
of configurations: for a preset (``LayerCosts.of(spec)``, or ``from_spec``) by its formulas,
unchanged; for a traced graph from its blocks, the activations and kernels scaled to each
row's micro-batch (``costmodel.formulas.kernels``). A graph's layers are the blocks between its
input
and output sides, each distinct block a kind of layer (``layer_kinds``; a preset's kinds are
its dense and MoE layers); it is costed with context parallelism where its layers mix
tokens in fused attention alone, and with expert parallelism where its layers route tokens
to experts (``costmodel.trace.blockcosts``: a ``topk`` over a router's scores and the batched
matmuls of the experts' weights).

Model FLOPs follow PaLM (Chowdhery et al. 2022, App. B): ``2 m n k`` per matmul, the
attention scores and weighted sum over all ``s`` keys (no causal halving), backward twice
forward; the hardware's extra work (FlashAttention's recomputed scores, recompute) is the
cost model's business, not the block's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.arrays import ConfigArrays
from costmodel.formulas.compute import autocast_rows
from costmodel.formulas.layerqueries import LayerQueries
from costmodel.formulas.shardcosts import (
    RECOMPUTE_MODES,
    BlockCosts,
    ShardCosts,
    _shard_from,
    aten_name,
    shard_dict,
)
from costmodel.model import ModelSpec
from costmodel.units import compute_bytes

__all__ = ["LayerCosts", "default_tp_degrees"]


@dataclass(frozen=True)
class LayerCosts(LayerQueries):
    """The blocks of a model in execution order, each with its costs per TP degree.

    ``source``: ``spec`` or ``graph``; ``micro_batch_size`` and ``seq_len``: the micro-batch
    the figures are for; ``sequence_parallel``: whether the norm and dropout regions are
    split over the TP ranks along the sequence (Korthikanti et al. 2022, Sec. 4.2.2);
    ``layouts``: for a graph, per TP degree, (node id, module path, op, strategy, output
    layout) of every op the ILP placed; ``sp_costs``: the same model costed the other way
    round (with sequence parallelism where ``sequence_parallel`` is false), which the rows
    that choose it read (``variant``): one search then weighs both. ``first_stage_layers``:
    the layers a pipeline's first stage must hold, a graph's that run before (or contain)
    its last op reading the model's own inputs (``costmodel.trace.blockcosts.first_stage_layers``).
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
                            f"{e}); re-create them with costs_from_graph") from e

    # ---- what the memory and step-time tables read, per row of configurations ------------
    # A preset's rows are evaluated by its formulas (``spec``), exactly as the tables did
    # before this seam; a traced graph's from its blocks.

    def model_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, forward and backward: ``6 N + 12 L q s`` (PaLM,
        Chowdhery et al. 2022, App. B), with N the parameters that take part in a matmul per
        token (active experts only; not the input embedding table, which is a lookup, unless
        tied to the output layer) and ``q = heads * head_dim``, counting the full s x s
        attention (``6 L s (q + o)`` where the values are narrower, ``o = heads *
        v_head_dim``; a local layer's window in place of s, twice the keys a query sees);
        multi-token prediction modules (DeepSeek-V3) are layers more, each running the
        output layer again. A traced graph: its matmul, convolution and
        attention FLOPs per token (``torch.utils.flop_counter``)."""
        if self.spec is None:
            return self.flops(1) / float(self.micro_batch_size * self.seq_len)
        model = self.spec
        n = model.num_active_params() - model.embedding_params()
        if model.tied_embeddings and not model.patch_size:
            n += model.vocab_size * model.hidden_size
        n += model.mtp_layers * model.vocab_size * model.hidden_size
        # Keys per query as the whole s x s counts them; a local layer's twice the keys it
        # sees (ModelSpec.attended_keys), as s is twice the causal s / 2.
        keys = sum(2 * model.attended_keys(seq_len, local) if local else float(seq_len)
                   for _, local in model.layer_attributes)
        keys += model.mtp_layers * float(seq_len)
        return 6.0 * n + 6.0 * keys * (model.q_dim + model.o_dim)

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
        # One block per kind of layer (ModelSpec.kind_attributes: dense, then MoE, then the
        # local ones), as many layers as the model has of it, between the embedding and head.
        counts = np.bincount(spec.layer_kinds, minlength=len(spec.kind_attributes))
        names = ["local " * local + "moe " * routed + "layers"
                 for routed, local in spec.kind_attributes]
        blocks = (BlockCosts("embedding", "embedding", 1, out,
                             {t: p[0] for t, p in zip(degrees, parts, strict=True)}),
                  *(BlockCosts(name, "layer", int(n), out,
                               {t: p[1][k] for t, p in zip(degrees, parts, strict=True)})
                    for k, (name, n) in enumerate(zip(names, counts, strict=True))),
                  BlockCosts("head", "head", 1, 0.0,
                             {t: p[2] for t, p in zip(degrees, parts, strict=True)}))
        return cls(spec.name, "spec", micro_batch_size, job.seq_len, sequence_parallel, blocks,
                   spec=spec)


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
                 ) -> tuple[ShardCosts, tuple[ShardCosts, ...], ShardCosts]:
    """(embedding, one layer of each kind (``ModelSpec.kind_attributes``), head)
    ``ShardCosts`` of ``spec`` at degree ``tp``: parameters and activations as the tables'
    row functions give them for a one-row table, FLOPs and collectives by Megatron-LM's
    layout, the routed experts split over TP as Megatron-LM's expert tensor parallelism
    splits them (``expert_params`` at ep = 1: the tables split them further over ep)."""
    cfg = ParallelConfig(tp=tp, micro_batch_size=mbs, sequence_parallel=sp and tp > 1)
    a = ConfigArrays.from_configs(spec, [cfg])
    rows = LayerCosts.of(spec)
    ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    e = compute_bytes(job.precision)
    h, t = float(spec.hidden_size), float(tp)
    tokens = float(mbs * job.seq_len)
    rep = 1.0 / t if cfg.sequence_parallel else 1.0
    one = e * tokens * h  # one activation tensor [tokens, h], all of it

    # Layer: Megatron-LM's column-parallel QKV and MLP input, row-parallel outputs (Shoeybi
    # et al. 2019, Sec. 3): model FLOPs 2 T h (q + 2 kv) + 2 T q h + 4 T s q + MLP, over t
    # (the attention's as model FLOPs count it, the whole s x s; a local layer's twice the
    # keys a query sees, ModelSpec.attended_keys, as the whole s is twice the causal s / 2).
    # A MoE layer's MLP: the router (2 T h experts), each token's top-k routed experts and
    # the shared ones, their MLPs split as the dense one; model FLOPs, shared evenly by the
    # t ranks (Megatron-LM runs the small router whole on each: hardware FLOPs).
    widths = 3 if spec.gated_mlp else 2
    # Two all-reduces forward (after the attention and MLP output projections) and two
    # backward (of the input gradients of the column-parallel inputs); with SP each is an
    # all-gather and a reduce-scatter (Korthikanti et al. 2022, Sec. 4.2.2, Fig. 5).
    # MLA: the attention's column-parallel inputs are its latents (ModelSpec.
    # attention_input_dim), gathered forward (SP) and their gradient reduced backward.
    coll = _tp_collectives(tp, cfg.sequence_parallel,
                           (3 + spec.attention_input_dim / h) * one)
    per_layer = rows.layer_params_per_gpu(np.array([t]), np.array([1.0]))
    layers = []
    for kind, (routed, local) in enumerate(spec.kind_attributes):
        keys = 2 * spec.attended_keys(job.seq_len, local) if local else float(job.seq_len)
        attn = (2 * tokens * sum(i * o for i, o, _ in spec.attention_matmuls())
                + 2 * tokens * keys * (spec.q_dim + spec.o_dim)) / t
        acts = {k: float(v[0]) for k, v in rows.layer_activations(job, a, kind, ac).items()}
        held, experts = per_layer[kind]
        if routed:
            assert experts is not None
            f_moe = float(spec.moe_ffn_hidden_size or 0)
            active = spec.top_k + spec.num_shared_experts
            fwd = attn + 2 * tokens * h * (spec.num_experts + f_moe * widths * active) / t
        else:
            fwd = attn + 2 * tokens * h * float(spec.ffn_hidden_size or 0) * widths / t
        layers.append(ShardCosts(
            params=float(held[0] + (0.0 if experts is None else experts[0])),
            forward_flops=fwd, backward_flops=2 * fwd, activation_bytes=acts,
            input_bytes=one * rep, collectives=coll,
            expert_params=0.0 if experts is None else float(experts[0])))

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
    return emb, tuple(layers), head


def _tp_collectives(tp: int, sp: bool, nbytes: float) -> dict[str, float]:
    """The collectives moving ``nbytes`` of activations between TP regions: all-reduces, or
    with SP all-gathers and reduce-scatters of the same tensors, one of each (an
    all-gather's gradient is a reduce-scatter and the other way round); none at ``tp`` 1."""
    if tp == 1:
        return {}
    if not sp:
        return {"all-reduce": nbytes}
    return {"all-gather": nbytes, "reduce-scatter": nbytes}

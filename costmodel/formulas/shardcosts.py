"""What one block of a model costs on one rank of a tensor-parallel group: its parameters,
FLOPs, saved activations per recompute mode and collectives (``ShardCosts``), per TP degree
(``BlockCosts``), and their plain-dict form. The parts ``LayerCosts`` is made of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.errors import SpecError
from costmodel.formulas.kernels import Gemm, Kernels

#: Recompute modes an activation figure is given for (``ParallelConfig.recompute``).
RECOMPUTE_MODES = ("none", "selective", "full")


#: A traced layer's ``activation_bytes`` keys under torchtitan's per-op selective AC
#: (``Framework.selective_recompute`` "op"), eager and compiled (``costmodel.trace.blockcosts``):
#: what "selective" keeps in that trainer.
OP_SELECTIVE = "selective-op"


#: ... and what a traced block keeps without recompute under ``torch.compile``
#: (``costmodel.trace.fusion._compiled_saved``).
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
    forward ``kernels`` on the rank (``costmodel.formulas.kernels``), those selective recompute
    re-runs (``recomputed``) and its kernels under ``torch.compile`` (``compiled``: the
    memory-bound ops fused into regions, ``costmodel.trace.blockcosts``); ``op_recomputed``: the
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
    ``autocast``), which the rows trained so read (``costmodel.formulas.compute.autocast_rows``)."""

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


def _saved(mode: str, c: ShardCosts, key: str | None = None) -> float:
    """What a block keeps for backward under recompute ``mode`` (``key``: the trainer's
    own figure for it where the block has one, ``OP_SELECTIVE``)."""
    return c.activation_bytes.get(key, c.activation_bytes[mode]) if key \
        else c.activation_bytes[mode]


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


def aten_name(op: str) -> str:
    """An op's overload packet name, what the rules here are keyed by: ``mm`` of
    ``aten.mm.default``."""
    return op.removeprefix("aten.").split(".")[0]

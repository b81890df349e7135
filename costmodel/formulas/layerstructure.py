"""The shape of a model's ``LayerCosts``: its blocks in order, which of them are layers and of
which kind (a preset's dense and MoE layers; a traced graph's distinct blocks), the input and
output sides, the TP degrees and sequence-parallel settings its costs answer for, and the
routing of its MoE layers. ``LayerQueries`` reads costs per row through it.
"""

from __future__ import annotations

from functools import cached_property
from typing import Self

import numpy as np

from costmodel.errors import SpecError
from costmodel.formulas.shardcosts import BlockCosts
from costmodel.model import ModelSpec


class LayerStructure:
    """Which blocks are layers of which kind, their order and routing (``LayerCosts`` is
    one: a frozen dataclass defining the fields declared here)."""

    name: str
    micro_batch_size: int
    seq_len: int
    sequence_parallel: bool
    blocks: tuple[BlockCosts, ...]
    spec: ModelSpec | None
    element_bytes: float
    sp_costs: Self | None
    top_k: int
    num_experts: int

    @property
    def sp_options(self) -> tuple[bool, ...]:
        """The sequence-parallel settings these costs answer for (a traced graph's: what its
        blocks were sharded with, and ``sp_costs``')."""
        if self.sp_costs is None:
            return (self.sequence_parallel,)
        return tuple(sorted({self.sequence_parallel, self.sp_costs.sequence_parallel}))

    def variant(self, sequence_parallel: bool) -> Self:
        """The costs of configurations with or without sequence parallelism: ``self``, or
        ``sp_costs`` where it is the one sharded that way (``self`` when neither is: the
        tables then read the blocks as they were sharded; ``costmodel.formulas.checks.validate``
        refuses such a configuration)."""
        if self.sp_costs is not None and sequence_parallel != self.sequence_parallel \
                and self.sp_costs.sequence_parallel == sequence_parallel:
            return self.sp_costs
        return self

    @property
    def mtp_layers(self) -> int:
        """A preset's multi-token prediction modules (``ModelSpec.mtp_layers``; 0 for a
        traced graph)."""
        return self.spec.mtp_layers if self.spec is not None else 0

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
        """The kind of each layer in order (``costmodel.formulas.arrays.Layers``): a preset's
        index in ``ModelSpec.kind_attributes`` (0 for dense and 1 for MoE layers, more for
        local attention); a traced graph's index in ``layer_blocks``."""
        if self.spec is not None:
            return self.spec.layer_kinds
        return tuple(k for k, b in enumerate(self.layer_blocks()) for _ in range(b.repeat))

    @property
    def kinds(self) -> int:
        """Kinds of layer the row functions take (``kind`` 0 .. ``kinds - 1``; a preset's
        ``ModelSpec.kind_attributes``)."""
        if self.spec is not None:
            return len(self.spec.kind_attributes)
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
            return self.spec.kind_attributes[kind][0]
        if not self.num_experts:
            return False
        block = self.layer_blocks()[kind]
        return block.at(min(block.by_tp)).expert_params > 0

    def local(self, kind: int) -> bool:
        """Whether layers of ``kind`` attend to a window of keys (a preset's local layers,
        ``ModelSpec.layer_is_local``; a traced graph's attention is as it was traced)."""
        return self.spec is not None and self.spec.kind_attributes[kind][1]

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

    def moe_routing(self) -> tuple[int, int]:
        """(experts each token goes to, experts in a MoE layer)."""
        if self.spec is None:
            return (self.top_k, self.num_experts) if self.is_moe else (0, 0)
        return self.spec.top_k, self.spec.num_experts

"""Tensor parallelism of ``nn.MultiheadAttention`` by heads (the ``heads`` style of a traced
module's TP plan, ``LayerCosts.tp_plan``).

``nn.MultiheadAttention`` runs its packed input projection, the attention and its output
projection inside its own forward, so no DTensor style for a linear splits it. Megatron-LM
splits attention by heads (Shoeybi et al. 2019, Sec. 3): each of ``tp`` ranks holds the
query, key and value rows of ``num_heads / tp`` heads (a column split of the projections),
runs attention over its heads and multiplies by its columns of the output projection (a row
split), whose partial sums are all-reduced; the input's gradient is all-reduced in backward.
That is the layout the sharding ILP chooses for the module (its projections split by output
features, the attention by heads, the output projection by input features), and what
``HeadParallel`` runs: the packed weight's rows are reordered so that each rank's
contiguous shard holds its heads' query, key and value rows (``Shard(0)`` of the reordered
weight; the module's state dict keeps that order), the output projection's weight is split
by columns (``Shard(1)``) and its bias replicated, and the module's forward is replaced by
one over the local heads with ``nn.MultiheadAttention``'s arguments and masks. With sequence
parallelism (Korthikanti et al. 2022, Sec. 4.2.2) its inputs arrive split along the sequence
and are all-gathered, and its output is reduce-scattered back to sequence shards.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from costmodel.errors import SpecError

__all__ = ["HeadParallel", "local_shard"]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``t`` (a DTensor's local shard)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _rows_by_rank(embed_dim: int, tp: int) -> torch.Tensor:
    """The packed projection's rows in the order that puts rank ``r``'s heads' query, key
    and value rows (each an ``embed_dim / tp`` block of its part) in its contiguous shard."""
    block = embed_dim // tp
    return torch.cat([torch.arange(part * embed_dim + r * block, part * embed_dim
                                   + (r + 1) * block)
                      for r in range(tp) for part in range(3)])


class HeadParallel(ParallelStyle):
    """Split an ``nn.MultiheadAttention`` over the mesh's ranks by heads (module docstring).
    ``sequence_parallel``: its inputs arrive split along the sequence (Korthikanti et al.
    2022, Sec. 4.2.2) and are all-gathered, and its output is reduce-scattered back to
    sequence shards (in backward: a reduce-scatter of the inputs' gradients, an all-gather
    of the output's). ``SpecError`` for a module it does not split: not an
    ``nn.MultiheadAttention``, key and value widths of their own (``kdim``, ``vdim``),
    ``add_bias_kv`` or ``add_zero_attn``, or heads that the ranks do not divide."""

    def __init__(self, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.MultiheadAttention):
            raise SpecError(f"the 'heads' tensor-parallel style splits an "
                            f"nn.MultiheadAttention, not a {type(module).__name__}; plan it "
                            "with --tp 1")
        tp = device_mesh.size()
        problems = []
        if not module._qkv_same_embed_dim:
            problems.append("key and value widths of their own (kdim, vdim)")
        if module.bias_k is not None or module.add_zero_attn:
            problems.append("add_bias_kv or add_zero_attn")
        if module.num_heads % tp:
            problems.append(f"{module.num_heads} heads over {tp} ranks")
        if problems:
            raise SpecError("tensor parallel of nn.MultiheadAttention by heads does not run "
                            f"{'; '.join(problems)}; plan it with --tp 1")

        def put(t: torch.Tensor, placement: Any) -> nn.Parameter:
            return nn.Parameter(distribute_tensor(t.detach(), device_mesh, [placement],
                                                  src_data_rank=self.src_data_rank),
                                requires_grad=t.requires_grad)

        order = _rows_by_rank(module.embed_dim, tp).to(module.in_proj_weight.device)
        module.in_proj_weight = put(module.in_proj_weight.index_select(0, order), Shard(0))
        if module.in_proj_bias is not None:
            module.in_proj_bias = put(module.in_proj_bias.index_select(0, order), Shard(0))
        out = module.out_proj
        out.weight = put(out.weight, Shard(1))
        if out.bias is not None:
            out.bias = put(out.bias, Replicate())
        module._tp_mesh = device_mesh  # type: ignore[assignment]
        module._tp_sequence = self.sequence_parallel  # type: ignore[assignment]
        module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
        return module


def _enter(x: torch.Tensor, mesh: DeviceMesh, seq: int | None) -> torch.Tensor:
    """``x`` whole, as this rank's input to its heads: the same on every rank (``seq``
    None), or this rank's shard of the sequence along dim ``seq``, all-gathered (a DTensor
    as it is laid out). Its gradient, each rank's part, is all-reduced in backward
    (Megatron's ``f``), or reduce-scattered to the shards."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate() if seq is None else Shard(seq)],
                               run_check=False)
    return x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])


def _local_mask(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                batch: int, q_len: int, k_len: int, heads: slice, num_heads: int,
                dtype: torch.dtype) -> torch.Tensor | None:
    """The additive mask of this rank's heads, ``[batch or 1, heads or 1, q_len, k_len]``, as
    ``F.multi_head_attention_forward`` merges its masks (a boolean mask's True is
    ``-inf``; a 3-D ``attn_mask`` is per batch and head)."""
    def additive(m: torch.Tensor) -> torch.Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(
                m, float("-inf"))
        return m.to(dtype)

    mask = None
    if attn_mask is not None:
        mask = additive(attn_mask)
        mask = mask.view(batch, num_heads, q_len, k_len)[:, heads] if mask.dim() == 3 \
            else mask.view(1, 1, q_len, k_len)
    if key_padding_mask is not None:
        pad = additive(key_padding_mask).view(batch, 1, 1, k_len)
        mask = pad if mask is None else mask + pad
    return mask


def _forward(self: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
             need_weights: bool = True, attn_mask: torch.Tensor | None = None,
             average_attn_weights: bool = True, is_causal: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``nn.MultiheadAttention.forward`` over this rank's heads (``HeadParallel``)."""
    mesh: DeviceMesh = self._tp_mesh  # type: ignore[assignment]
    tp = mesh.size()
    local = self.num_heads // tp
    rank = mesh.get_local_rank()
    unbatched = query.dim() == 2
    seq = 1 if self.batch_first and not unbatched else 0  # the inputs' sequence dim
    sharded = seq if self._tp_sequence else None
    entered: dict[int, torch.Tensor] = {}  # one input, one reduction of its gradient
    for t in (query, key, value):
        if id(t) not in entered:
            entered[id(t)] = _enter(t, mesh, sharded)
    q_in, k_in, v_in = (entered[id(t)] for t in (query, key, value))
    if unbatched:
        q_in, k_in, v_in = (t.unsqueeze(0) for t in (q_in, k_in, v_in))
        key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
    elif not self.batch_first:
        q_in, k_in, v_in = (t.transpose(0, 1) for t in (q_in, k_in, v_in))
    batch, q_len, _ = q_in.shape
    k_len = k_in.shape[1]
    d = self.head_dim
    w = local_shard(self.in_proj_weight)
    b = local_shard(self.in_proj_bias) if self.in_proj_bias is not None else None
    wq, wk, wv = w.chunk(3)
    bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)

    def heads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              n: int) -> torch.Tensor:
        return F.linear(x, weight, bias).view(batch, n, local, d).transpose(1, 2)

    q, k, v = heads(q_in, wq, bq, q_len), heads(k_in, wk, bk, k_len), heads(v_in, wv, bv, k_len)
    if is_causal and attn_mask is None:
        raise RuntimeError("need attn_mask if specifying the is_causal hint")
    causal = is_causal and key_padding_mask is None and not need_weights
    mask = None if causal else _local_mask(
        attn_mask, key_padding_mask, batch, q_len, k_len,
        slice(rank * local, (rank + 1) * local), self.num_heads, q.dtype)
    dropout = self.dropout if self.training else 0.0
    weights = None
    if need_weights:
        scores = (q * math.sqrt(1.0 / d)) @ k.transpose(-2, -1)
        attn = (scores if mask is None else scores + mask).softmax(-1)
        if dropout > 0:
            attn = F.dropout(attn, p=dropout)
        out = attn @ v
        if average_attn_weights:
            weights = DTensor.from_local(attn.sum(1) / self.num_heads, mesh, [Partial()],
                                         run_check=False).full_tensor()
        else:
            weights = DTensor.from_local(attn, mesh, [Shard(1)], run_check=False).full_tensor()
        if unbatched:
            weights = weights.squeeze(0)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                             is_causal=causal)
    out = out.transpose(1, 2).reshape(batch, q_len, local * d)
    y = F.linear(out, local_shard(self.out_proj.weight))  # [batch, q_len, embed]: partial
    whole: torch.Tensor = DTensor.from_local(y, mesh, [Partial()], run_check=False).redistribute(
        mesh, [Shard(1) if self._tp_sequence else Replicate()])
    if self.out_proj.bias is not None:
        # (as DTensors: with sequence parallelism each rank adds the bias to its shard, and
        # the bias's gradient is summed over the shards)
        whole = whole + self.out_proj.bias
    y = local_shard(whole)
    if unbatched:
        y = y.squeeze(0)
    elif not self.batch_first:
        y = y.transpose(0, 1)
    return y, weights

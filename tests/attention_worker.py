"""Worker of ``test_runtime.test_multihead_attention_split_by_heads_equals_the_module``: on
each rank of a torchrun job, ``nn.MultiheadAttention`` split by heads over all ranks
(``planner.runtime.attention.HeadParallel``) against the module whole, on the same weights and
inputs: self- and cross-attention, batch first or not, with and without masks (a causal
float mask, or a random boolean one per batch and head, and a key padding mask), returning
the attention weights averaged over heads or per head or not at all, its inputs whole on
every rank or (sequence parallel) each rank's shard of the sequence. Rank 0 writes, per
case, the largest difference of the output, the returned weights and every gradient (inputs
and parameters, the split ones gathered back to the module's order) to the JSON file given."""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from planner.runtime.attention import HeadParallel, _rows_by_rank
from planner.runtime.train import exit_process


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def case(mesh: object, batch_first: bool, cross: bool, weights: str, masks: bool,
         sp: bool) -> float:
    torch.manual_seed(0)
    whole = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    split = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    split.load_state_dict(whole.state_dict())
    parallelize_module(split, mesh, HeadParallel(sequence_parallel=sp))
    tp, rank = mesh.size(), mesh.get_local_rank()
    seq = 1 if batch_first else 0
    b, q_len, k_len = 3, 6, (8 if cross else 6)
    shape = (lambda n: (b, n, 16)) if batch_first else (lambda n: (n, b, 16))
    x = torch.randn(shape(q_len))
    mem = torch.randn(shape(k_len)) if cross else x
    kw: dict[str, object] = {"need_weights": weights != "none",
                             "average_attn_weights": weights == "mean"}
    if masks:
        # Cross-attention: a boolean mask per batch and head ([batch * heads, q, k]).
        kw["attn_mask"] = (torch.rand(b * 4, q_len, k_len) > 0.8) if cross else torch.full(
            (q_len, k_len), float("-inf")).triu(1)
        pad = torch.zeros(b, k_len, dtype=torch.bool)
        pad[0, -1] = True
        kw["key_padding_mask"] = pad
    def mine(t: torch.Tensor) -> torch.Tensor:  # this rank's shard of the sequence
        return t.chunk(tp, seq)[rank] if sp else t

    diffs = []
    grads = []
    for module in (whole, split):
        xi = (mine(x) if module is split else x).clone().requires_grad_()
        mi = (mine(mem) if module is split else mem).clone().requires_grad_() if cross else xi
        out, w = module(xi, mi, mi, **kw)
        # Sequence parallel: each rank's loss is its shard's, their sum the module's (the
        # output's gradient is all-gathered in backward); the weights are whole.
        (out.square().sum() + (w.sum() if w is not None else 0)).backward()
        got = (out.detach(), None if w is None else w.detach(), xi.grad, mi.grad)
        grads.append(got if module is split else tuple(
            mine(t) if t is not None and i != 1 else t for i, t in enumerate(got)))
    for a, c in zip(grads[0], grads[1], strict=True):
        if a is not None:
            diffs.append((a - c).abs().max().item())
    order = _rows_by_rank(16, mesh.size())
    w_in = torch.empty_like(whole.in_proj_weight)
    w_in[order] = _full(split.in_proj_weight.grad)
    diffs.append((w_in - whole.in_proj_weight.grad).abs().max().item())
    diffs.append((_full(split.out_proj.weight.grad) - whole.out_proj.weight.grad).abs().max()
                 .item())
    diffs.append((_full(split.out_proj.bias.grad) - whole.out_proj.bias.grad).abs().max().item())
    return max(diffs)


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    for bf, cross, weights, masks, sp in itertools.product(
            (True, False), (False, True), ("none", "mean", "heads"), (False, True),
            (False, True)):
        out[f"batch_first={bf} cross={cross} weights={weights} masks={masks} sp={sp}"] = case(
            mesh, bf, cross, weights, masks, sp)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.barrier()  # both ranks leave together
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)

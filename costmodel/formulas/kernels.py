"""The kernels of one block instance on one rank, as a traced graph records them
(``costs_from_graph``), and their time on a GPU for a table of rows.

Each op of the block, sharded as the ILP placed it, is one kernel of the traced micro-batch:

- a matmul (or convolution): its FLOPs, the bytes of its activation operands and output,
  the bytes of its weight operand, whether cuBLAS's fast kernels take its shape
  (``compute.aligned``) and how many matmuls its backward runs (input and weight gradient);
- a fused attention: its forward FLOPs (its backward does ``FLASH_BACKWARD_FLOPS`` times
  as many, Dao 2023);
- a memory-bound op: the bytes it reads and writes (its backward moves ``BACKWARD_BYTES``
  times as many).

A row's micro-batch of ``r`` times the traced tokens scales the FLOPs and the activation
bytes by ``r`` and leaves the weights as they are, so each matmul is timed on the same
roofline as ``compute.gemm_time`` of the scaled shape: ``max(r F / (peak eff), (r A + W) /
(hbm mem)) + overhead``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.config import Job
from costmodel.formulas.eager import float8_casts, te_quantize
from costmodel.formulas.roofline import (
    FLASH_BACKWARD_FLOPS,
    LayerCompute,
    flash_attention_time,
    memory_time,
)
from costmodel.hardware import GPU
from costmodel.units import Num

__all__ = ["Gemm", "Kernels", "float8_cast_compute", "kernel_compute"]


@dataclass(frozen=True)
class Gemm:
    """One matmul (or convolution) kind of a block: ``flops``, ``activation_bytes`` (its
    activation operands and output) and ``weight_bytes`` on the rank for the traced
    micro-batch; ``aligned`` (cuBLAS's fast kernels); ``backward``: matmuls its backward runs
    (0-2); ``count``: how many such matmuls the block runs; ``expert``: a batched matmul of
    a MoE layer's routed experts, whose weights expert parallelism splits (each of ``ep``
    ranks holds 1/ep of the experts and runs ep times their tokens: the same FLOPs and
    activations, 1/ep of the weights). ``cast_in``, ``cast_out``, ``cast_weight``: for a
    linear that torchao's float8 training runs as a Float8Linear, the elements of its
    activation input, of its output and of its weight on the rank (what its dynamic casts
    read, and its row-wise backward rescales, ``float8_cast_compute``); zero for any other
    matmul. ``weight_grad``: the elements of the weight whose gradient one of its backward
    matmuls computes (a linear's weight-gradient matmul, timed with the gradient traffic of
    ``roofline.weight_grad_bytes``; the weights all ``ep`` ranks hold where ``expert``);
    zero where its backward computes none."""

    flops: float
    activation_bytes: float
    weight_bytes: float
    aligned: bool
    backward: int
    count: int = 1
    expert: bool = False
    cast_in: float = 0.0
    cast_out: float = 0.0
    cast_weight: float = 0.0
    weight_grad: float = 0.0


@dataclass(frozen=True)
class Kernels:
    """A block instance's forward kernels on one rank for the traced micro-batch: its
    matmuls, its fused attention (``attention_flops``, ``attention_kernels``; backward when
    ``attention_backward``; ``attention_flops_per_key``: the sum over its kernels of their
    FLOPs over their key tokens, what each query block's fixed work grows with:
    ``costmodel.formulas.compute.flash_attention_time``; ``attention_head_dim_flops``: the
    sum of their FLOPs times their head dimension, whose FLOP-weighted mean sets the rate),
    its memory-bound ops (``memory_bytes`` in
    ``memory_kernels`` launches; ``memory_backward_bytes`` in ``memory_backward_kernels`` of
    those with a gradient, already times ``BACKWARD_BYTES``), and the casts of its parameters
    (``weight_cast_bytes`` in ``weight_cast_kernels``, read and written: torch.autocast's
    cast of each weight to the compute dtype, once per forward pass whatever the tokens, and
    in backward the cast of its gradient back, moving as much)."""

    gemms: tuple[Gemm, ...] = ()
    attention_flops: float = 0.0
    attention_kernels: int = 0
    attention_backward: bool = False
    memory_bytes: float = 0.0
    memory_kernels: int = 0
    memory_backward_bytes: float = 0.0
    memory_backward_kernels: int = 0
    weight_cast_bytes: float = 0.0
    weight_cast_kernels: int = 0
    attention_flops_per_key: float = 0.0
    attention_head_dim_flops: float = 0.0

    def merged(self, other: Kernels) -> Kernels:
        """Both kernel lists as one (a block made of several layers)."""
        return Kernels(self.gemms + other.gemms, self.attention_flops + other.attention_flops,
                       self.attention_kernels + other.attention_kernels,
                       self.attention_backward or other.attention_backward,
                       self.memory_bytes + other.memory_bytes,
                       self.memory_kernels + other.memory_kernels,
                       self.memory_backward_bytes + other.memory_backward_bytes,
                       self.memory_backward_kernels + other.memory_backward_kernels,
                       self.weight_cast_bytes + other.weight_cast_bytes,
                       self.weight_cast_kernels + other.weight_cast_kernels,
                       self.attention_flops_per_key + other.attention_flops_per_key,
                       self.attention_head_dim_flops + other.attention_head_dim_flops)


def _gemm(gpu: GPU, dtype: str, g: Gemm, r: np.ndarray, ep: np.ndarray,
          grad_bytes: float | None = None) -> np.ndarray:
    """Seconds of one matmul of kind ``g`` at ``r`` times the traced tokens, ``ep`` the
    expert-parallel degree (``Gemm.expert``); with ``grad_bytes``, of its weight-gradient
    matmul instead: the same FLOPs, moving ``grad_bytes`` per element of the weight's
    gradient (``Gemm.weight_grad``) where the forward reads the weight."""
    eff = gpu.efficiency
    frac = eff.gemm_for(dtype) if g.aligned else eff.gemm_unaligned_for(dtype)
    compute = r * g.flops / (gpu.peak_flops(dtype) * frac)
    moved = g.weight_bytes if grad_bytes is None else grad_bytes * g.weight_grad
    weights = moved / ep if g.expert else moved
    memory = (r * g.activation_bytes + weights) \
        / (gpu.memory_bandwidth_bytes_per_s * eff.memory)
    return np.maximum(compute, memory) + eff.kernel_overhead_s


def kernel_compute(gpu: GPU, dtype: str, k: Kernels, r: Num,
                   recomputed: Kernels | None = None, ep: Num = 1.0,
                   attention_kernel: str = "flash", grad_bytes: float = 2.0) -> LayerCompute:
    """The ``LayerCompute`` of kernels ``k`` at ``r`` (per row) times the traced tokens (more
    sequences, the same length) and expert-parallel degree ``ep`` (per row); ``recomputed``:
    the kernels selective recompute re-runs in backward (an unfused attention's score ops);
    ``attention_kernel``: the fused attention kernel that runs (``"flash"``, ``"cudnn"``);
    ``grad_bytes``: what a weight-gradient matmul moves per element of its gradient
    (``roofline.weight_grad_bytes``).
    The matmul roles Megatron-LM overlaps tensor-parallel collectives with are not told
    apart in a graph (zero)."""
    r = np.asarray(r, dtype=float)
    ep = np.asarray(ep, dtype=float)
    zero = 0.0 * r
    fwd, bwd, gemm_flops, bwd_flops, routed = zero, zero, zero, zero, zero
    for g in k.gemms:
        t = g.count * _gemm(gpu, dtype, g, r, ep)
        if g.expert:
            routed = routed + t
        # Its backward: input-gradient matmuls as the forward, and a weight-gradient one.
        wgrad = int(g.weight_grad > 0 and g.backward > 0)
        bwd = bwd + (g.backward - wgrad) * t
        if wgrad:
            bwd = bwd + g.count * _gemm(gpu, dtype, g, r, ep, grad_bytes)
        fwd = fwd + t
        gemm_flops = gemm_flops + g.count * g.flops * r
        bwd_flops = bwd_flops + g.backward * g.count * g.flops * r
    core_f, core_b = zero, zero
    if k.attention_kernels:
        # The kernels' FLOP-weighted key count: their fixed work adds up as theirs would.
        keys = (k.attention_flops / k.attention_flops_per_key
                if k.attention_flops_per_key > 0 else None)
        head_dim = (k.attention_head_dim_flops / k.attention_flops
                     if k.attention_head_dim_flops > 0 else None)
        f, b = flash_attention_time(gpu, dtype, k.attention_flops * r, keys, attention_kernel,
                                    head_dim)
        eff = gpu.efficiency
        extra = (k.attention_kernels - 1) * eff.kernel_overhead_s  # one launch each
        core_f = f + extra
        core_b = (b + extra) if k.attention_backward else zero
        bwd_flops = bwd_flops + (FLASH_BACKWARD_FLOPS * k.attention_flops * r
                                 if k.attention_backward else zero)
    # A weight's cast moves the weight, whatever the tokens (autocast's, costmodel.formulas.compute
    # ``_weight_casts``).
    mem_f = memory_time(gpu, k.memory_bytes * r + k.weight_cast_bytes,
                        k.memory_kernels + k.weight_cast_kernels)
    mem_b = memory_time(gpu, k.memory_backward_bytes * r + k.weight_cast_bytes,
                        k.memory_backward_kernels + k.weight_cast_kernels)
    fwd_flops = gemm_flops + k.attention_flops * r
    selective = kernel_compute(gpu, dtype, recomputed, r, ep=ep).forward \
        if recomputed is not None else zero
    sel_flops = (recomputed.attention_flops + sum(g.count * g.flops for g in recomputed.gemms)) \
        * r if recomputed is not None else zero
    return LayerCompute(forward=fwd + core_f + mem_f, backward=bwd + core_b + mem_b,
                        selective=selective, flops=fwd_flops + bwd_flops,
                        selective_flops=sel_flops, forward_flops=fwd_flops,
                        core_forward=core_f, core_backward=core_b, qkv_gemm=zero,
                        up_gemm=zero, proj_gemm=zero, down_gemm=zero,
                        routed_forward=routed)


def te_quantize_compute(gpu: GPU, job: Job, k: Kernels, r: Num) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per row of Transformer Engine's quantize kernels for the
    linears among ``k``'s matmuls (``Gemm.cast_in``: a layer's linears; a traced MoE layer's
    expert matmuls are not marked, so their quantizes are not counted here) at ``r`` times
    the traced tokens (``costmodel.formulas.eager.te_quantize``, as the formulas count a
    layer's)."""
    r = np.asarray(r, dtype=float)
    linears = [g for g in k.gemms if g.cast_in]
    return te_quantize(gpu, job, sum(g.count * g.cast_in for g in linears) * r,
                       sum(g.count * g.cast_out for g in linears) * r,
                       sum(g.count for g in linears))


def float8_cast_compute(gpu: GPU, job: Job, k: Kernels, r: Num, gathered: Num | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per row of torchao's dynamic float8 casts of the
    Float8Linears among ``k``'s matmuls (``Gemm.cast_in``) at ``r`` (per row) times the
    traced tokens (``costmodel.formulas.eager.float8_casts``, as the formulas count a layer's;
    ``gathered``: its rows whose float8 weights FSDP gathers)."""
    r = np.asarray(r, dtype=float)
    linears = [g for g in k.gemms if g.cast_in]
    ins = sum(g.count * g.cast_in for g in linears) * r
    outs = sum(g.count * g.cast_out for g in linears) * r
    weights = sum(g.count * g.cast_weight for g in linears)
    return float8_casts(gpu, job, ins, outs, sum(g.count for g in linears), weights, gathered)

"""Compute time of the embedding and of the output layer with its loss (the LM head) for one
micro-batch on one GPU, for a table of configurations (``costmodel.formulas.compute`` holds
the transformer layers'): the vocab-parallel ``[T, h] x [h, V/tp]`` matmul, ``2 T h V``
FLOPs forward (Narayanan et al. 2021, Sec. 5.1), and the memory-bound lookup and cross
entropy.
"""

from __future__ import annotations

import numpy as np

from costmodel.config import Job
from costmodel.formulas.compute import CAST_BYTES
from costmodel.formulas.eager import loss_kind
from costmodel.formulas.roofline import (
    BACKWARD_BYTES,
    LayerCompute,
    _dtypes,
    gemm_time,
    high_precision,
    memory_time,
    weight_grad_bytes,
)
from costmodel.frameworks import framework, padded_vocab
from costmodel.hardware import GPU
from costmodel.model import ModelSpec

__all__ = ["lm_head_compute"]


def lm_head_compute(model: ModelSpec, gpu: GPU, job: Job, tp: np.ndarray, cp: np.ndarray,
                    mbs: np.ndarray, sp: np.ndarray, autocast: np.ndarray | None = None
                    ) -> tuple[LayerCompute, LayerCompute]:
    """(embedding, head) compute for one micro-batch, per row.

    Embedding: a gather of T rows of h (read + write). Head: final norm, the vocab-parallel
    ``[T, h] x [h, V/tp]`` matmul (V padded as the trainer pads it, ``padded_vocab``; its
    backward an input- and a weight-gradient matmul, ``weight_grad_bytes``), and the
    cross entropy over fp32 logits. Megatron-LM's vocabulary-parallel cross entropy, fused
    (``loss_kind``), casts the logits (read e, write 4), takes the softmax and loss in place
    (read and write 4) and, in backward, writes the logit gradient (read 4, write e); by
    default it runs op by op on the fp32 copy (megatron/core/tensor_parallel/
    cross_entropy.py): the cast (read e, write 4), the max (read 4), an in-place subtract,
    exp and divide (read and write 4 each) and the sum (read 4), 6 kernels, and in backward
    an in-place multiply (read and write 4) and the cast back (read 4, write e); compiled
    (``loss_kind``), torch's reads the logits in two passes forward and three backward. torch's
    ``F.cross_entropy`` on an fp32 copy (torchtitan, Hugging Face models) casts (read e,
    write 4), writes the log-softmax after a max and a sum pass (read 4 three times, write
    4); its backward writes a dense fp32 NLL gradient (4), the log-softmax gradient (read
    4 + 4, write 4) and casts it back (read 4, write e); without the upcast
    (``Job.loss_upcast``) the same passes move e bytes each and nothing is cast. ``autocast``: as in
    ``layer_compute`` (fp32 embedding output and final norm, the head's weight and input
    cast). A ViT has a patch projection and a small classifier instead, which this counts as
    the same matmul shapes with V = classes.
    """
    dtype, e, _ = _dtypes(job)
    fw = framework(job.framework)
    ac = np.zeros(np.shape(tp), dtype=bool) if autocast is None else np.asarray(autocast)
    h = float(model.hidden_size)
    t = tp.astype(float)
    tokens = job.seq_len / cp.astype(float) * mbs
    rep = np.where(sp == 1, 1.0 / t, 1.0)
    zero = 0.0 * tokens
    e_act = np.where(ac, 4.0, e)  # the residual stream's bytes per element
    emb_f = memory_time(gpu, 2 * e_act * tokens * h * rep, 1.0)
    emb = LayerCompute(forward=emb_f, backward=memory_time(gpu, 2 * e_act * tokens * h * rep,
                                                           1.0),
                       selective=zero, flops=zero, selective_flops=zero, forward_flops=zero,
                       core_forward=zero, core_backward=zero, qkv_gemm=zero, up_gemm=zero,
                       proj_gemm=zero, down_gemm=zero, routed_forward=zero)
    v = padded_vocab(fw, model.vocab_size, t) / t if not model.patch_size \
        else float(model.vocab_size) / t
    # An fp8 (or nvfp4) job keeps its output layer in bf16: Megatron-Core runs fp8 only inside its
    # transformer layers (Transformer Engine's fp8 autocast wraps each layer; the output
    # layer is a plain ColumnParallelLinear), and torchtitan's float8 converter leaves
    # ``output`` out of torchao's conversion (a fixed module filter in its 2024-25
    # releases, ``filter_fqns`` since: ``planner.emit.torchtitan`` writes it).
    head_gemm = gemm_time(gpu, high_precision(dtype), tokens, v, h,
                          bytes_per_element=e)
    head_wgrad = gemm_time(gpu, high_precision(dtype), tokens, v, h, bytes_per_element=e,
                           weight_bytes_per_element=weight_grad_bytes(job))
    logits = tokens * v
    norm = 2 * e_act * tokens * h * rep
    cast = np.where(ac, CAST_BYTES * (tokens * h + v * h), 0.0)  # input and weight casts
    # Per kind: bytes moved per logit and kernels, forward and backward.
    kind = loss_kind(fw, job)
    if kind == "vocab-parallel":  # six ops forward; the multiply and the cast back
        ce_fwd, ce_bwd = (e + 4.0 + 4.0 + 8.0 + 8.0 + 4.0 + 8.0) * logits, (8.0 + 4.0 + e) * logits
        kernels_f, kernels_b = 6.0, 2.0
    elif kind == "fused":
        ce_fwd, ce_bwd = (e + 4.0 + 4.0 + 4.0) * logits, (4.0 + e) * logits
        kernels_f = kernels_b = 2.0
    elif kind == "compiled":
        # Inductor fuses the cast, log-softmax and label gather into one reduction kernel,
        # which reads each 128k-wide row twice (max, then the exponent sum: a row outgrows one
        # block), and the backward into one kernel that takes the two reductions again and
        # writes the gradient (read 3e, write e). Measured on an H200 (benchmarks/
        # op_sac_memory.py): 3.1 ms for 8192 x 128256 logits, 14 bytes per logit at the
        # profile's bandwidth, where this counts 12.
        ce_fwd, ce_bwd = 2 * e * logits, 4 * e * logits
        kernels_f = kernels_b = 1.0
    elif job.loss_upcast:
        ce_fwd, ce_bwd = (e + 4.0 + 16.0) * logits, (4.0 + 12.0 + 4.0 + e) * logits
        kernels_f = kernels_b = 4.0
    else:  # the same on the compute-dtype logits: no cast either way (Job.loss_upcast)
        ce_fwd, ce_bwd = 4 * e * logits, (e + 3 * e) * logits
        kernels_f = kernels_b = 3.0
    head_f = head_gemm + memory_time(gpu, norm + ce_fwd + cast, 1.0 + kernels_f)
    head_b = head_gemm + head_wgrad + memory_time(gpu, BACKWARD_BYTES * norm + ce_bwd + cast,
                                         1.0 + kernels_b)
    head_flops = 3 * 2 * tokens * h * v
    if model.mtp_layers:
        # Each multi-token prediction module (its layer is counted with the layers:
        # stagelayout.stage_layout) looks the next tokens up again, norms them and the hidden state,
        # projects the two [2h -> h] and runs the shared output layer and its loss again
        # (DeepSeek-AI 2024, "DeepSeek-V3", Sec. 2.2, Eqs. 21-23).
        n = float(model.mtp_layers)
        eh = gemm_time(gpu, high_precision(dtype), tokens, h / t, 2 * h,
                       bytes_per_element=e)
        eh_wgrad = gemm_time(gpu, high_precision(dtype), tokens, h / t, 2 * h,
                             bytes_per_element=e,
                             weight_bytes_per_element=weight_grad_bytes(job))
        extra = memory_time(gpu, (2 * e_act + 3 * 2 * e) * tokens * h * rep, 4.0)
        head_f = head_f + n * (head_f + eh + extra)
        head_b = head_b + n * (head_b + eh + eh_wgrad + BACKWARD_BYTES * extra)
        head_flops = head_flops * (1 + n) + n * 3 * 2 * tokens * 2 * h * h / t
    head = LayerCompute(forward=head_f, backward=head_b, selective=zero, flops=head_flops,
                        selective_flops=zero, forward_flops=head_flops / 3,
                        core_forward=zero, core_backward=zero, qkv_gemm=zero, up_gemm=zero,
                        proj_gemm=zero, down_gemm=zero, routed_forward=zero)
    return emb, head

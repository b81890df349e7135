"""Compute time of one layer for one micro-batch on one GPU, for a table of configurations.

Every kernel is timed on a roofline with a fixed cost per kernel (Williams et al. 2009,
"Roofline"): ``max(flops / (peak * gemm), bytes / (hbm * memory)) + kernel_overhead``, with the
efficiencies of the GPU profile (``[efficiency]``, fitted by ``planner calibrate``). The curve
this gives for a matmul's achieved FLOP/s against its shape is the profile's efficiency curve:
large matmuls approach ``gemm * peak``; narrow ones (small hidden / tp, few tokens per expert,
small micro-batches) lose to the memory term and the fixed cost.

FLOPs of a matmul ``[M, K] x [K, N]`` are ``2 M N K`` (Narayanan et al. 2021, Sec. 5.1); its
backward runs two matmuls of the same size, for the input and the weight gradient. Per layer,
with T tokens of a micro-batch on one rank:

- attention projections ``2 T h (q + 2 kv) + 2 T q h`` (GQA: ``kv = kv_heads * head_dim``),
- attention core ``4 T s q`` (scores and weighted sum over the s keys; Narayanan et al. 2021,
  Eq. 3's ``s / 6h`` term). A fused causal kernel skips the masked half (Dao 2023, Sec. 3);
  its backward does 5 matmuls to the forward's 2 (it recomputes the scores), 2.5x the FLOPs,
- MLP ``2 T h f`` per projection, 2 projections or 3 when gated (Shazeer 2020),
- MoE: a router ``2 T h E`` and top_k experts per token, times the capacity factor when tokens
  are padded to capacity (Fedus et al. 2022, Sec. 2.1), plus shared experts,
- the LM head ``2 T h V``; the embedding lookup and the cross entropy are memory-bound.

Memory-bound kernels (norms, residual adds, activation functions, softmax, dropout, rotary
embeddings, token permutation) move the bytes listed in ``_elementwise_bytes``; their backward
reads the output gradient and the saved input and writes the input gradient: three tensors
where the forward moves two, so 1.5x the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hardware_profiles
from costmodel.config import Job
from costmodel.frameworks import Framework, framework, padded_vocab
from costmodel.hardware import GPU
from costmodel.model import ModelSpec
from costmodel.units import Num

__all__ = ["ALIGN_BYTES", "ATTENTION_NAMES", "LayerCompute", "aligned", "attention_kernel",
           "autocast_rows", "eager_bytes", "eager_cast_bytes", "flash_attention_time",
           "float8_cast_time", "float8_casts", "float8_gather", "float8_gathered_rows",
           "float8_param_gather", "gemm_time", "layer_compute", "lm_head_compute", "loss_kind",
           "matmul_dtype", "memory_time"]

BACKWARD_BYTES = 1.5  # elementwise backward: 3 tensors moved where forward moves 2
FLASH_BACKWARD_FLOPS = 2.5  # FlashAttention backward: 5 matmuls vs 2 forward (Dao 2023)


#: Bytes a matmul's leading dimensions must be a multiple of for cuBLAS's fast kernels
#: (NVIDIA, "Matrix Multiplication Background User's Guide", Tensor Core requirements).
ALIGN_BYTES = 16


def aligned(n: Num, k: Num, bytes_per_element: float) -> np.ndarray:
    """Whether ``[m, k] x [k, n]`` runs on cuBLAS's fast kernels (bool, per element): its
    leading dimensions k and n are multiples of ``ALIGN_BYTES`` (m never is one in these
    layouts; measured on an H100, hardware_profiles/software.toml [cublas])."""
    return (np.mod(np.asarray(n) * bytes_per_element, ALIGN_BYTES) == 0) \
        & (np.mod(np.asarray(k) * bytes_per_element, ALIGN_BYTES) == 0)


def gemm_time(gpu: GPU, dtype: str, m: Num, n: Num, k: Num, count: Num = 1.0,
              bytes_per_element: float = 2.0, weight_bytes_per_element: Num | None = None,
              grouped: bool = False) -> np.ndarray:
    """Seconds for ``count`` matmuls of shape ``[m, k] x [k, n]`` on ``gpu`` (roofline).

    Compute: ``2 m n k / (peak * gemm)``; memory: reading both operands and writing the
    result once, ``bytes_per_element * (m k + m n) + weight_bytes_per_element * k n`` over
    ``hbm * memory``; plus the fixed ``kernel_overhead_s`` per launch: one per matmul, or one
    for all ``count`` where ``grouped`` (a grouped GEMM, torch._grouped_mm).
    ``weight_bytes_per_element``: the bytes of one element of the ``[k, n]`` operand when it
    is stored narrower than the activations (a quantized weight, scales included); default
    ``bytes_per_element``.
    """
    eff = gpu.efficiency
    flops = 2.0 * m * n * k
    frac = np.where(aligned(n, k, bytes_per_element), eff.gemm_for(dtype),
                    eff.gemm_unaligned_for(dtype))
    compute = flops / (gpu.peak_flops(dtype) * frac)
    w = bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    traffic = bytes_per_element * (m * k + m * n) + w * k * n
    memory = traffic / (gpu.memory_bandwidth_bytes_per_s * eff.memory)
    launches = 1.0 if grouped else count
    return count * np.maximum(compute, memory) + launches * eff.kernel_overhead_s


#: What each fused attention kernel (``costmodel.config.ATTENTION_KERNELS``) is called.
ATTENTION_NAMES = {"flash": "FlashAttention-2", "cudnn": "cuDNN attention"}


def attention_kernel(job: Job, gpu: GPU) -> str:
    """The fused attention kernel the job runs on ``gpu`` (``costmodel.config.
    ATTENTION_KERNELS``): ``Job.attention_kernel`` where set, else the trainer's own choice,
    cuDNN's on the architectures of ``Framework.cudnn_attention_archs``, FlashAttention-2
    elsewhere."""
    if job.attention_kernel is not None:
        return job.attention_kernel
    return "cudnn" if gpu.architecture in framework(job.framework).cudnn_attention_archs \
        else "flash"


def flash_attention_time(gpu: GPU, dtype: str, flops: Num, keys: Num | None = None,
                         kernel: str = "flash") -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of a fused (flash) attention ``kernel`` (``"flash"`` or
    ``"cudnn"``: ``KernelEfficiency.attention_for``) doing ``flops`` in its forward pass over
    ``keys`` key tokens per query (the sequence, or a context-parallel chunk of it):
    ``flops * (1 + fixed_keys / keys) / (peak * attention) + kernel_overhead``, where each
    query block's fixed work (``hardware_profiles/software.toml [fused_attention]``, fitted
    to measured sweeps) weighs most on short sequences; ``keys=None`` leaves it out. The
    backward does ``FLASH_BACKWARD_FLOPS`` times the FLOPs at the ``attention_backward``
    fraction with its own fixed work (Dao 2023, Sec. 3). fp8 and tf32 jobs run attention in
    bf16 (FlashAttention has no tf32 or fp8 training kernel), so the peak is the bf16 one."""
    peak = gpu.peak_flops("bf16" if dtype in ("fp8", "tf32") else dtype)
    eff = gpu.efficiency
    frac_f, frac_b = eff.attention_for(kernel)
    flops = np.asarray(flops, dtype=float)
    grow_f: Num = 1.0
    grow_b: Num = 1.0
    if keys is not None:
        shape = hardware_profiles.load_software()["fused_attention"]
        k = np.asarray(keys, dtype=float)
        grow_f = 1.0 + float(shape["forward_fixed_keys"]) / k
        grow_b = 1.0 + float(shape["backward_fixed_keys"]) / k
    forward = flops * grow_f / (peak * frac_f) + eff.kernel_overhead_s
    backward = FLASH_BACKWARD_FLOPS * flops * grow_b / (peak * frac_b) + eff.kernel_overhead_s
    return forward, backward


def memory_time(gpu: GPU, num_bytes: Num, kernels: Num) -> np.ndarray:
    """Seconds for memory-bound kernels moving ``num_bytes`` in all, ``kernels`` launches."""
    eff = gpu.efficiency
    return (np.asarray(num_bytes, dtype=float)
            / (gpu.memory_bandwidth_bytes_per_s * eff.memory) + kernels * eff.kernel_overhead_s)


@dataclass(frozen=True)
class LayerCompute:
    """Compute of one layer (or the head) for one micro-batch on one GPU, per row, seconds
    and FLOPs. ``forward`` / ``backward``: time of the pass; ``selective``: what selective
    recompute re-runs in backward (the attention core when it is not fused); ``flops``: the
    FLOPs the GPU executes in forward + backward, without any recompute; ``forward_flops``
    those of the forward pass (what full recompute repeats); ``core_forward`` /
    ``core_backward``: the attention core's part of the times (what context-parallel ring
    exchanges overlap with); ``qkv_gemm`` / ``up_gemm``: one matmul of the column-parallel
    QKV and MLP input projections (their input- and weight-gradient matmuls each take as long;
    what Megatron-LM overlaps the backward tensor-parallel collectives with; ``up_gemm`` is
    zero for MoE layers, whose tensor-parallel exchange belongs to the token dispatcher);
    ``proj_gemm`` / ``down_gemm``: the same of the row-parallel attention output and MLP output
    projections (``down_gemm`` zero for MoE layers)."""

    forward: np.ndarray
    backward: np.ndarray
    selective: np.ndarray
    flops: np.ndarray
    selective_flops: np.ndarray
    forward_flops: np.ndarray
    core_forward: np.ndarray
    core_backward: np.ndarray
    qkv_gemm: np.ndarray
    up_gemm: np.ndarray
    proj_gemm: np.ndarray
    down_gemm: np.ndarray


def _dtypes(job: Job) -> tuple[str, float, float]:
    """(matmul dtype, bytes per activation element, bytes per matmul input element)."""
    if job.precision == "fp32":
        return "tf32", 4.0, 4.0
    if job.precision == "fp8":
        return "fp8", 2.0, 1.0
    return job.precision, 2.0, 2.0


def matmul_dtype(job: Job) -> str:
    """The dtype the job's matmuls run in (``GPU.peak_flops``'s key): tf32 for fp32 jobs, fp8
    for fp8 ones (their attention runs in bf16: ``flash_attention_time``)."""
    return _dtypes(job)[0]


def autocast_rows(job: Job, zero: np.ndarray, tp: np.ndarray, pp: np.ndarray,
                  cp: np.ndarray) -> np.ndarray:
    """Rows whose mixed precision is ``torch.autocast`` (bool per row): a trainer with
    ``autocast_ddp`` (torchtitan's ``maybe_enable_amp``) in bf16/fp16 without FSDP (ZeRO 0)
    and without tensor, pipeline or context parallel."""
    fw = framework(job.framework)
    on = fw.autocast_ddp and job.precision in ("bf16", "fp16")
    return on & (np.asarray(zero) == 0) & (np.asarray(tp) == 1) & (np.asarray(pp) == 1) \
        & (np.asarray(cp) == 1)


#: Bytes per element of torch.autocast's casts: an fp32 tensor read, its bf16 copy written.
CAST_BYTES = 6.0


@dataclass(frozen=True)
class _Rows:
    """What every term of one layer's compute reads, per row: the model, GPU, job and its
    trainer, the matmul dtype and bytes per activation and matmul-input element
    (``_dtypes``), the autocast rows, the TP degree, the tokens of a micro-batch on a rank,
    and ``rep`` (1/tp where sequence parallelism splits the norm and dropout regions, else
    1)."""

    model: ModelSpec
    gpu: GPU
    job: Job
    fw: Framework
    dtype: str
    e: float
    e_in: float
    ac: np.ndarray
    t: np.ndarray
    tokens: np.ndarray
    rep: np.ndarray
    mbs: np.ndarray
    cp: np.ndarray

    @property
    def h(self) -> float:
        """Hidden size."""
        return float(self.model.hidden_size)

    @property
    def q(self) -> float:
        """Query width (heads x head dim)."""
        return float(self.model.q_dim)

    @property
    def kv(self) -> float:
        """Key (or value) width (KV heads x head dim)."""
        return float(self.model.kv_dim)

    def gemm(self, m: Num, n: Num, k: Num, count: Num = 1.0, bytes_per_element: float = 2.0,
             grouped: bool = False) -> np.ndarray:
        """``gemm_time`` of ``count`` ``[m, k] x [k, n]`` matmuls in the job's dtype."""
        return gemm_time(self.gpu, self.dtype, m, n, k, count=count,
                         bytes_per_element=bytes_per_element, grouped=grouped)


@dataclass(frozen=True)
class _Core:
    """The attention core of one layer: forward and backward seconds, forward and backward
    model FLOPs, the memory-bound bytes and kernels it adds (an unfused core's softmax and
    dropout), and what selective recompute re-runs of it (seconds, FLOPs)."""

    forward: np.ndarray
    backward: np.ndarray
    flops: np.ndarray
    backward_flops: np.ndarray
    bytes: np.ndarray
    kernels: float
    selective: np.ndarray
    selective_flops: np.ndarray


@dataclass(frozen=True)
class _Mlp:
    """One layer's MLP (a MoE layer's router, routed and shared experts): forward seconds
    and FLOPs, the ffn-wide bytes its activation and routing move, its up and down
    projections' seconds (a dense MLP's; zero for MoE), the memory-bound kernels its routing
    adds, and the routed tokens (MoE; else None)."""

    forward: np.ndarray
    flops: np.ndarray
    act_bytes: np.ndarray
    up: np.ndarray
    down: np.ndarray
    kernels: float
    routed: np.ndarray | None


def layer_compute(model: ModelSpec, gpu: GPU, job: Job, tp: np.ndarray, cp: np.ndarray,
                  mbs: np.ndarray, sp: np.ndarray, moe: bool,
                  capacity_factor: float = 1.0, ep: np.ndarray | None = None,
                  autocast: np.ndarray | None = None,
                  float8_gathered: np.ndarray | None = None) -> LayerCompute:
    """Forward and backward time of one transformer layer for one micro-batch, per row.

    ``tp, cp, mbs, sp`` (and ``ep`` for MoE layers) are arrays over the rows. Matmuls are
    split over tp (Megatron column/row parallel); context parallel gives each rank s/cp
    queries attending to all s keys (ring attention, Liu et al. 2023). ``autocast``: rows
    trained under ``torch.autocast`` (``autocast_rows``), whose norms and residual stream are
    fp32, whose linears each cast their input, and whose weights are cast to the compute
    dtype on every forward pass (measured kernel by kernel on an H100 with
    ``torch.profiler``, benchmarks/single_gpu_accuracy.py). A trainer with
    ``separate_projections`` (torchtitan) runs q, k and v, and a gated MLP's gate and up
    projections, as separate matmuls: the same FLOPs in more kernels, each reading the input.
    ``float8_gathered``: the rows whose float8 weights FSDP gathers (``float8_gathered_rows``;
    None: ``float8_param_gather``).
    """
    dtype, e, e_in = _dtypes(job)
    t = tp.astype(float)
    r = _Rows(model, gpu, job, framework(job.framework), dtype, e, e_in,
              np.zeros(np.shape(tp), dtype=bool) if autocast is None else np.asarray(autocast),
              t, job.seq_len / cp.astype(float) * mbs,
              np.where(sp == 1, 1.0 / t, 1.0),  # norm/dropout regions: split by SP
              mbs, cp)
    h, q, kv, tokens = r.h, r.q, r.kv, r.tokens
    qkv_gemm, k_gemm, proj_gemm = _projections(r)
    attn_flops = 2 * tokens * h * (q + 2 * kv) / t + 2 * tokens * q * h / t  # projections
    core = _attention_core(r)
    mlp = _mlp_block(r, moe, capacity_factor, ep)
    fwd = qkv_gemm + proj_gemm + core.forward + mlp.forward
    bwd = 2 * (qkv_gemm + proj_gemm) + core.backward + 2 * mlp.forward
    f_flops = attn_flops + core.flops + mlp.flops
    b_flops = 2 * attn_flops + core.backward_flops + 2 * mlp.flops

    ew_bytes, ew_kernels, casts, nograd, nograd_bytes, (branch_sums, sum_kernels) = \
        _memory_bound(r, core, mlp, moe)
    w_cast, w_kernels = _weight_casts(r, moe, ep)
    ew_fwd = memory_time(gpu, ew_bytes + w_cast, ew_kernels + w_kernels)
    fwd = fwd + ew_fwd
    bwd = bwd + memory_time(gpu, BACKWARD_BYTES * (ew_bytes - nograd_bytes)
                            - (BACKWARD_BYTES - 1) * casts + branch_sums + w_cast,
                            ew_kernels - nograd + w_kernels + sum_kernels)
    if r.fw.torchao_float8 and job.precision == "fp8":
        cast_f, cast_b = float8_cast_time(model, gpu, job, tokens, t, moe, float8_gathered)
        fwd, bwd, ew_fwd = fwd + cast_f, bwd + cast_b, ew_fwd + cast_f
    selective, selective_flops = core.selective, core.selective_flops
    if r.fw.selective_recompute == "op":
        selective, selective_flops = _op_selective(r, moe, core, ew_fwd, qkv_gemm, k_gemm,
                                                   proj_gemm, mlp)
    return LayerCompute(forward=fwd, backward=bwd, selective=selective, flops=f_flops + b_flops,
                        selective_flops=selective_flops, forward_flops=f_flops,
                        core_forward=core.forward, core_backward=core.backward,
                        qkv_gemm=qkv_gemm, up_gemm=mlp.up, proj_gemm=proj_gemm,
                        down_gemm=mlp.down)


def _projections(r: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, k and v projection, the K projection's share of it, output projection) seconds:
    one fused QKV matmul, or three (``Framework.separate_projections``). The K share is what
    torchtitan's per-op selective AC re-runs."""
    h, q, kv, t, tokens = r.h, r.q, r.kv, r.t, r.tokens
    if r.fw.separate_projections:
        k_gemm = r.gemm(tokens, kv / t, h, bytes_per_element=r.e_in)
        qkv_gemm = r.gemm(tokens, q / t, h, bytes_per_element=r.e_in) + 2 * k_gemm
    else:
        qkv_gemm = r.gemm(tokens, (q + 2 * kv) / t, h, bytes_per_element=r.e_in)
        k_gemm = kv / (q + 2 * kv) * qkv_gemm
    return qkv_gemm, k_gemm, r.gemm(tokens, h, q / t, bytes_per_element=r.e_in)


def _attention_core(r: _Rows) -> _Core:
    """The attention core: fused (FlashAttention, Dao 2023: its backward does
    ``FLASH_BACKWARD_FLOPS`` times the forward's FLOPs, selective recompute has nothing to
    re-run), or two batched matmuls over ``mbs * heads / tp`` heads with a fused
    scale-mask-softmax and dropout on the scores between them."""
    model, job, t, tokens = r.model, r.job, r.t, r.tokens
    q, s_kv = r.q, float(job.seq_len)
    zero = 0.0 * tokens
    if job.flash_attention:
        causal = 0.5 if model.causal else 1.0
        flops = 4 * tokens * s_kv * q / t * causal
        # Context parallel runs the kernel over one chunk of the keys at a time (ring
        # attention, Liu et al. 2023).
        f, b = flash_attention_time(r.gpu, r.dtype, flops, s_kv / r.cp.astype(float),
                                    attention_kernel(job, r.gpu))
        return _Core(f, b, flops, FLASH_BACKWARD_FLOPS * flops, zero, 0.0, zero, zero)
    # Two batched matmuls: [s, d] x [d, s] and [s, s] x [s, d].
    heads = model.num_heads / t
    hd = float(model.head_dim or model.hidden_size // model.num_heads)
    s_q = job.seq_len / r.cp.astype(float)
    one = r.gemm(s_q, s_kv, hd, count=r.mbs * heads, bytes_per_element=r.e)
    f = 2 * one
    flops = 4 * tokens * s_kv * q / t
    scores = heads * tokens * s_kv
    drop = 1.0 if model.dropout else 0.0
    # Fused scale-mask-softmax reads and writes the scores; dropout reads them, writes
    # them and a one-byte mask (Korthikanti et al. 2022, Sec. 4.1 counts the same tensors).
    nbytes = 2 * r.e * scores + drop * (2 * r.e + 1) * scores
    kernels = 1.0 + drop
    return _Core(f, 2 * f, flops, 2 * flops, nbytes, kernels,
                 f + memory_time(r.gpu, nbytes, kernels), flops)


def _mlp(r: _Rows, ffn: float, m_tokens: np.ndarray, per_expert: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(forward time, forward FLOPs, activation bytes, input projection time, output
    projection time) of an MLP on ``m_tokens`` tokens.

    ``per_expert``: tokens per local expert (the matmuls' M) for a grouped expert GEMM.
    """
    model, h, t = r.model, r.h, r.t
    n_up = ffn * (2 if model.gated_mlp else 1) / t
    m_shape = m_tokens if per_expert is None else per_expert
    count = 1.0 if per_expert is None else m_tokens / per_expert
    # Local experts' matmuls as one grouped kernel per projection, or one each.
    grouped = per_expert is not None and r.fw.grouped_experts
    if r.fw.separate_projections and model.gated_mlp:  # gate and up as two matmuls
        up = 2 * r.gemm(m_shape, ffn / t, h, count=count, bytes_per_element=r.e_in,
                        grouped=grouped)
    else:
        up = r.gemm(m_shape, n_up, h, count=count, bytes_per_element=r.e_in, grouped=grouped)
    down = r.gemm(m_shape, h, ffn / t, count=count, bytes_per_element=r.e_in, grouped=grouped)
    fl = 2 * m_tokens * h * n_up + 2 * m_tokens * ffn / t * h
    width = 3 if model.gated_mlp else 2  # ffn-wide tensors the activation reads + writes
    return up + down, fl, width * r.e * m_tokens * ffn / t, up, down


def _mlp_block(r: _Rows, moe: bool, capacity_factor: float, ep: np.ndarray | None) -> _Mlp:
    """The layer's MLP: dense, or a MoE layer's router, its routed experts (``top_k`` copies
    of each token times ``capacity_factor``, ``ep`` experts' shares per rank as a grouped
    matmul) and its shared experts."""
    model, h, tokens = r.model, r.h, r.tokens
    if not moe:
        f, flops, act, up, down = _mlp(r, float(model.ffn_hidden_size or 0), tokens)
        return _Mlp(f, flops, act, up, down, 0.0, None)
    ffn = float(model.moe_ffn_hidden_size or 0)
    n_exp = float(model.num_experts)
    ep_f = (ep if ep is not None else np.ones_like(r.t)).astype(float)
    routed = tokens * model.top_k * capacity_factor
    router = r.gemm(tokens * r.rep, n_exp, h, bytes_per_element=r.e)
    f, flops, act, _, _ = _mlp(r, ffn, routed, routed * ep_f / n_exp)
    f = f + router
    flops = flops + 2 * tokens * r.rep * h * n_exp
    # Token permutation before the experts and un-permutation after: read + write each.
    act = act + 2 * 2 * r.e * routed * h + 4.0 * tokens * r.rep * n_exp
    kernels = 3.0
    if model.num_shared_experts:
        sh_f, sh_flops, sh_bytes, _, _ = _mlp(r, ffn * model.num_shared_experts, tokens)
        f, flops, act = f + sh_f, flops + sh_flops, act + sh_bytes
        kernels += 1.0
    zero = 0.0 * tokens
    return _Mlp(f, flops, act, zero, zero, kernels, routed)


def _memory_bound(r: _Rows, core: _Core, mlp: _Mlp, moe: bool
                  ) -> tuple[np.ndarray, Num, np.ndarray, float, np.ndarray,
                             tuple[np.ndarray, np.ndarray]]:
    """(bytes, kernels, dtype-cast bytes among them, kernels without a backward, their
    bytes, (bytes, kernels) of backward's fp32 branch sums) of the layer's memory-bound
    forward kernels: the two pre-norms, the rotary embedding of q and k, the two
    bias-dropout-adds of the residual, the attention core's (``_Core.bytes``) and the MLP's
    activation and routing; run as the trainer's eager kernels or compiled where it runs
    them so."""
    model, job, fw, e, ac, tokens, rep, t = r.model, r.job, r.fw, r.e, r.ac, r.tokens, r.rep, r.t
    h, q, kv = r.h, r.q, r.kv
    drop = 1.0 if model.dropout else 0.0
    rope = model.position_embedding == "rope"
    # Compiled (TorchInductor), autocast's casts of a norm's output are its kernel's
    # epilogue (the same cast of one tensor computed once), and in backward the gradients'
    # casts and their sum fuse into the norm's backward: no kernel of their own, as a traced
    # graph's fused regions count them (``costmodel.blockcosts._regions``).
    fused_casts = job.compile and fw.eager_kernels
    # Attention block: pre-norm, rotary embedding of q and k, bias-dropout-add of the
    # residual. Under autocast the norm reads and writes fp32 (compiled, writes its cast)
    # and the residual adds a low-precision branch to the fp32 stream (read 4 + e, write 4).
    norm_bytes = np.where(ac, 4.0 + e if fused_casts else 8.0, 2 * e) * tokens * h * rep
    rope_bytes = 2 * e * tokens * (q + kv) / t if rope else 0.0 * tokens
    residual = (np.where(ac, 8.0 + e, 3 * e) + drop) * tokens * h * rep
    ew_bytes = norm_bytes + rope_bytes + residual + core.bytes
    ew_kernels: Num = 2.0 + (1.0 if rope else 0.0) + core.kernels
    # MLP block: pre-norm, residual, activation, then the projections.
    ew_bytes = ew_bytes + norm_bytes + residual
    ew_kernels += 2.0
    # Autocast: each linear fed by a norm casts the fp32 norm output itself (q, k and v
    # separately, the MLP's up and gate projections separately), and backward casts each
    # input gradient back and sums the branches in fp32 (read 4 + 4, write 4).
    n_casts = 0.0 if fused_casts else 3.0 + (2.0 if model.gated_mlp else 1.0)
    ac_casts = np.where(ac, CAST_BYTES * n_casts, 0.0) * tokens * h * rep
    ew_bytes = ew_bytes + ac_casts
    ew_kernels = ew_kernels + np.where(ac, n_casts, 0.0)
    sums = max(n_casts - 2.0, 0.0)
    branch_sums = (np.where(ac, 12.0 * sums, 0.0) * tokens * h * rep,
                   np.where(ac, sums, 0.0))  # bytes, kernels
    ew_kernels += mlp.kernels
    ew_bytes = ew_bytes + mlp.act_bytes
    ew_kernels += 1.0
    # Dtype casts among them: their backward casts the gradient back, moving what they did.
    casts = ac_casts
    nograd, nograd_bytes = 0.0, 0.0 * tokens  # kernels among them without a backward
    if fw.eager_kernels and not job.compile:
        x_bytes, x_kernels = eager_bytes(model, tokens, rep, t, e, ac)
        casts = casts + eager_cast_bytes(model, tokens, rep, t, e, ac)
        if moe and mlp.routed is not None:
            m_bytes, m_kernels, m_casts, nograd_bytes = eager_moe_bytes(model, mlp.routed, t, e)
            x_bytes, x_kernels, casts = x_bytes + m_bytes, x_kernels + m_kernels, casts + m_casts
            nograd = EAGER_MOE_NOGRAD_KERNELS
        ew_bytes = ew_bytes + x_bytes
        ew_kernels = ew_kernels + x_kernels
    elif fw.eager_kernels:
        # Compiled (TorchInductor, one graph per block): the MLP's norm is fused with the
        # attention's residual add before it, reading the stream that add makes in
        # registers (one kernel and one read of the stream fewer), and the rotary embedding
        # of q and of k are two kernels (their loops differ in size under GQA, so the
        # scheduler does not fuse them). The traced graph's fused regions count the same
        # (``costmodel.blockcosts._regions``).
        ew_bytes = ew_bytes - np.where(ac, 4.0, e) * tokens * h * rep
        ew_kernels = ew_kernels - 1.0 + (1.0 if rope else 0.0)
        if moe and mlp.routed is not None and fw.grouped_experts:
            # A MoE layer's routing compiled (COMPILED_MOE_KERNELS): what TorchInductor
            # cannot fuse, and the zeroed un-permutation buffer (e a routed element).
            nograd_bytes = e * mlp.routed * h
            ew_bytes = ew_bytes + nograd_bytes
            ew_kernels = ew_kernels + COMPILED_MOE_KERNELS
            nograd = COMPILED_MOE_NOGRAD_KERNELS
    return ew_bytes, ew_kernels, casts, nograd, nograd_bytes, branch_sums


def _weight_casts(r: _Rows, moe: bool, ep: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, kernels): autocast casts the layer's fp32 weights to the compute dtype on
    every forward pass and the weight gradients back to fp32 in backward, CAST_BYTES per
    weight each way, one kernel per weight tensor, and a linear's bias apart from its weight
    (``F.linear`` casts each of its floating inputs: torch's autocast ``cached_cast``). A
    MoE layer's router is a linear, and torchtitan's ``GroupedExperts`` casts its local
    experts' three weight tensors to bf16 itself (``w1.bfloat16()``, torchtitan/models/moe/
    moe.py @08dc75ae), as its shared experts' linears are cast."""
    model, h, t = r.model, r.h, r.t
    q, kv = r.q, r.kv
    n_up = 2.0 if model.gated_mlp else 1.0
    weights = h * (q + 2 * kv) / t + q * h / t
    n_mats: Num = 4.0
    if moe:
        f_moe = float(model.moe_ffn_hidden_size or 0)
        local = model.num_experts / (1.0 if ep is None else ep.astype(float))
        shared = float(model.num_shared_experts)
        weights = weights + h * model.num_experts \
            + (local + shared) * h * f_moe * (n_up + 1) / t
        n_mats = n_mats + 1 + (n_up + 1) * (1 + (shared > 0))
    else:
        weights = weights + h * float(model.ffn_hidden_size or 0) / t * (n_up + 1)
        n_mats = n_mats + n_up + 1
    if model.bias or model.qkv_bias:  # q, k and v
        weights, n_mats = weights + (q + 2 * kv) / t, n_mats + 3
    if model.bias and not moe:  # the output projection and the MLP's
        weights = weights + h + n_up * float(model.ffn_hidden_size or 0) / t + h
        n_mats = n_mats + 1 + n_up + 1
    elif model.bias:
        weights, n_mats = weights + h, n_mats + 1
    return np.where(r.ac, CAST_BYTES * weights, 0.0), np.where(r.ac, n_mats, 0.0)


def _op_selective(r: _Rows, moe: bool, core: _Core, ew_fwd: np.ndarray, qkv_gemm: np.ndarray,
                  k_gemm: np.ndarray, proj_gemm: np.ndarray, mlp: _Mlp
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) torchtitan's per-op selective AC re-runs in backward: every second
    matmul of the block in call order (wq, wk, wv, wo, then w1, w3, w2 gated or fc1, fc2:
    wk, wo and w3 or fc2), every memory-bound kernel (``ew_fwd``) and a non-fused attention
    core."""
    model, h, t, tokens = r.model, r.h, r.t, r.tokens
    q, kv = r.q, r.kv
    re_mlp = (0.5 * mlp.up if model.gated_mlp else mlp.down)
    ffn = float(model.ffn_hidden_size or 0)
    re_mlp_flops = (2 * tokens * h * ffn / t if not moe else 0.0 * tokens)
    re_attn, re_attn_flops = k_gemm + proj_gemm, 2 * tokens * h * (kv + q) / t
    if model.bias:
        # A linear with a bias runs as ``addmm``, which the policy's save list (``mm``)
        # leaves out: every projection is re-run.
        re_attn, re_attn_flops = qkv_gemm + proj_gemm, 2 * tokens * h * (2 * q + 2 * kv) / t
        re_mlp = mlp.up + mlp.down
        re_mlp_flops = (2 * tokens * h * ffn * (3 if model.gated_mlp else 2) / t
                        if not moe else 0.0 * tokens)
    unfused = not r.job.flash_attention
    return (re_attn + re_mlp + ew_fwd + (core.forward if unfused else 0.0),
            re_attn_flops + re_mlp_flops + (core.flops if unfused else 0.0))


def loss_kind(fw: Framework, job: Job) -> str:
    """The job's cross entropy: ``"vocab-parallel"`` (Megatron-LM's in place on one fp32
    copy of the logits, op by op: its default, unless ``Job.fused_cross_entropy``, its
    ``--cross-entropy-loss-fusion``), ``"fused"`` (``Job.fused_cross_entropy``, else the
    trainer's own: one kernel on one fp32 copy of the logits), ``"compiled"`` (torch's
    ``F.cross_entropy`` on an fp32 cast under ``torch.compile``, ``Job.compile_loss``, else
    ``compile`` where the trainer compiles its loss) or ``"eager"`` (the same, eager)."""
    if fw.cross_entropy_fusion_opt_in and not job.fused_cross_entropy:
        return "vocab-parallel"
    if fw.fused_cross_entropy if job.fused_cross_entropy is None else job.fused_cross_entropy:
        return "fused"
    compiled = (job.compile and fw.compiles_loss) if job.compile_loss is None \
        else job.compile_loss
    return "compiled" if compiled else "eager"


#: Bytes per element of torch's eager RMSNorm (the composite ``rms_norm`` of
#: aten/src/ATen/native/layer_norm.cpp and torchtitan's own ``RMSNorm``: upcast to fp32
#: (read e, write 4), square (read 4, write 4), mean (read 4), normalize (read 4, write 4),
#: cast back (read 4, write e), scale by the weight (read e, write e)): ``28 + 4e`` in all,
#: ``28 + 2e`` (this constant plus 2e) over the ``2e`` of a fused norm, in 7 kernels more.
EAGER_RMSNORM_BYTES = 28.0
EAGER_RMSNORM_KERNELS = 7.0
#: torchtitan's ``apply_rotary_emb`` (torchtitan/models/llama3/model/model.py): q and k each
#: cast to fp32 (read e, write 4), multiplied as complex numbers (read 4, write 4) and cast
#: back (read 4, write e): 16 bytes per element over a fused kernel's 2e, 5 kernels more.
EAGER_ROPE_BYTES = 16.0
EAGER_ROPE_KERNELS = 5.0


def eager_bytes(model: ModelSpec, tokens: np.ndarray, rep: np.ndarray, t: np.ndarray,
                e: float, ac: Num = False) -> tuple[np.ndarray, Num]:
    """(bytes, kernels) that one layer's memory-bound forward moves beyond the fused count
    when run as PyTorch eager kernels: RMSNorm decomposed (``EAGER_RMSNORM_BYTES`` + 2e, two
    norms), the complex rotary embedding (``EAGER_ROPE_BYTES``) and SwiGLU as ``silu`` then a
    product (read e, write e; read 2e, write e: 2e per ffn element over the fused 3e), and
    each residual's dropout before the add (``native_dropout``: read e, write e and a one-byte
    mask; then the add: read 2e, write e: 2e per element over a fused bias-dropout-add's 3e
    and mask, one kernel more). A LayerNorm and GELU are single aten kernels eager too, and a
    linear's bias is added by its ``addmm``. ``ac``: rows under ``torch.autocast``, whose
    norms read the fp32 residual stream: the composite's upcast and cast back are no-ops
    (``Tensor.to`` of the dtype a tensor has), 2 (4 + e) bytes and two kernels fewer, and
    the fused count it extends reads and writes fp32 (8 bytes, not 2e: ``_memory_bound``),
    20 bytes beyond it in 5 kernels (what a trace under autocast runs, ``costmodel.graph``)."""
    h = float(model.hidden_size)
    out = 0.0 * tokens
    kernels: Num = 0.0
    if model.dropout:
        out = out + 2 * (2 * e) * tokens * h * rep
        kernels += 2.0
    if model.norm == "rmsnorm":
        per = EAGER_RMSNORM_BYTES + 2 * e - np.where(ac, 8.0 + 2 * e, 0.0)
        out = out + 2 * per * tokens * h * rep
        kernels = kernels + 2 * (EAGER_RMSNORM_KERNELS - np.where(ac, 2.0, 0.0))
    if model.position_embedding == "rope":
        out = out + EAGER_ROPE_BYTES * tokens * (model.q_dim + model.kv_dim) / t
        kernels += EAGER_ROPE_KERNELS
    if model.gated_mlp and not model.is_moe:
        out = out + 2 * e * tokens * float(model.ffn_hidden_size or 0) / t
        kernels += 1.0
    return out, kernels


#: torchtitan's MoE layer run as eager kernels (torchtitan/models/moe/moe.py @08dc75ae,
#: MoEArgs defaults: sigmoid scores, an expert bias, scores applied before the experts,
#: grouped matmuls; their padding, a concatenation, an index_select, an index_copy_ (6e per
#: element) and 3 kernels of permutation indices, dropped in fe80b63c, April 2026), beyond
#: the permutation and un-permutation (a copy each) and the router's softmax the fused count
#: holds: the router's fp32 cast, bias add, top-k, gather and scaling of the scores, two
#: histograms, the expert-load update, an argsort and the scores' reorder, the token
#: index's division (11 kernels on [tokens, experts] or smaller tensors); the routed tokens
#: scaled by their scores in fp32 (cast up, multiply, cast down: 16 + 2e bytes per
#: element); the groups' offsets (a cumsum); the un-permutation buffer zeroed (e) and the k
#: copies summed (read e): 17 kernels; SwiGLU as silu then a product (2e per ffn element
#: over the fused 3e, as a dense layer's: one kernel more). Of those kernels, the ones
#: without a backward: bias add and top-k (only the indices are used), the histograms, the
#: load update, the argsort, the index division, the offsets and the zeroed buffer. The
#: reference transformer's ``MoEFeedForward`` runs the same kernels.
#: The same layer under ``torch.compile``: TorchInductor fuses the pointwise ops between
#: the kernels it does not generate (top-k, the two histograms and the argsort run as aten's,
#: the cumsum as a scan of its own), so beyond the fused count's three: top-k, the scores'
#: gather and scaling (one region), two histograms, the load update, the argsort, the
#: cumsum and the zeroed buffer (a fill): 8 kernels, 7 of them without a backward; the
#: routed tokens' gather, scaling and casts are one region, the fused count's permutation,
#: and the k copies' sum is the residual add's reduction (what a traced graph's fused
#: regions count: ``costmodel.blockcosts._regions``).
COMPILED_MOE_KERNELS = 8.0
COMPILED_MOE_NOGRAD_KERNELS = 7.0
EAGER_MOE_BYTES = 16.0
EAGER_MOE_BYTES_PER_E = 4.0
EAGER_MOE_KERNELS = 17.0
EAGER_MOE_NOGRAD_KERNELS = 9.0


def eager_moe_bytes(model: ModelSpec, routed: np.ndarray, t: np.ndarray, e: float
                    ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """(bytes, kernels, cast bytes among them, bytes of kernels without a backward among
    them) that a MoE layer's routing and experts move beyond the fused count when run as
    torchtitan's eager kernels (``EAGER_MOE_BYTES``), ``routed`` the tokens times their
    experts on the rank: the casts of the scaling by the scores (their backward casts the
    gradient back, moving as much) and the zeroed buffer (no backward)."""
    h = float(model.hidden_size)
    out = (EAGER_MOE_BYTES + EAGER_MOE_BYTES_PER_E * e) * routed * h
    kernels = EAGER_MOE_KERNELS
    if model.gated_mlp:
        out = out + 2 * e * routed * float(model.moe_ffn_hidden_size or 0) / t
        kernels += 1.0
    return out, kernels, 2 * (4.0 + e) * routed * h, e * routed * h


def eager_cast_bytes(model: ModelSpec, tokens: np.ndarray, rep: np.ndarray, t: np.ndarray,
                     e: float, ac: Num = False) -> np.ndarray:
    """The bytes of ``eager_bytes``'s kernels (and of the fused count they extend) that are
    dtype casts: each eager RMSNorm's and each rotary embedding's cast to fp32 and back
    (read e, write 4; read 4, write e; none for a norm under autocast, ``ac``, whose input
    is fp32). A cast's backward casts the gradient back, moving what its forward moved,
    where other memory-bound kernels move ``BACKWARD_BYTES`` times as much (the traced
    graph counts them so too: ``costmodel.blockcosts``)."""
    h = float(model.hidden_size)
    out = 0.0 * tokens
    per = 2 * (4.0 + e)  # up to fp32 and back, bytes per element
    if model.norm == "rmsnorm":
        out = out + 2 * np.where(ac, 0.0, per) * tokens * h * rep
    if model.position_embedding == "rope":
        out = out + per * tokens * (model.q_dim + model.kv_dim) / t
    return out


def float8_cast_time(model: ModelSpec, gpu: GPU, job: Job, tokens: np.ndarray,
                     t: np.ndarray, moe: bool, gathered: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of torchao's dynamic float8 casts in one layer
    (``float8_casts``): one Float8Linear per projection, each casting its own input (q, k
    and v, and the MLP's gate and up projections, cast their shared input each); a MoE
    layer's routed experts and its router are not Float8Linears."""
    h = float(model.hidden_size)
    ffn = 0.0 if moe else float(model.ffn_hidden_size or 0)
    n_up = 2.0 if model.gated_mlp else 1.0
    ins = tokens * (3 * h + model.q_dim / t + n_up * h * (ffn > 0) + ffn / t)
    outs = tokens * ((model.q_dim + 2 * model.kv_dim) / t + h + n_up * ffn / t + h * (ffn > 0))
    weights = h * (2 * model.q_dim + 2 * model.kv_dim) / t + (n_up + 1.0) * h * ffn / t
    linears = 4.0 + (n_up + 1.0) * (ffn > 0)
    return float8_casts(gpu, job, ins, outs, linears, weights, gathered)


def float8_casts(gpu: GPU, job: Job, ins: Num, outs: Num, linears: Num, weights: Num = 0.0,
                 gathered: Num | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of torchao's dynamic float8 casts of ``linears``
    Float8Linears whose activation inputs hold ``ins`` elements, whose outputs ``outs`` and
    whose weights ``weights`` (on the rank).

    Each takes the amax of its input and casts it to fp8 (read e twice, write 1; compiled,
    the amax fuses into the cast: read e, write 1) in forward, in one kernel per pass; in
    backward the same for its output gradient, and a transposed fp8 copy of the input and
    of the output gradient for the weight-gradient matmul (read e, write 1 each)
    (torchao/float8/float8_linear.py, tensorwise and rowwise recipes). The row-wise recipe
    (``Job.float8_recipe``) scales each operand along the other axis for the weight-gradient
    matmul, which one pass cannot: its first kernel also writes a transposed bf16 copy
    (write e more per element of the input and of the output gradient), which a second
    kernel casts; torchao's roofline model of the recipes counts 8 bytes per element
    row-wise against 6 tensor-wise (pytorch/ao@0598012,
    torchao/testing/training/roofline_utils.py, get_tensor_memory_traffic_ovhd_s).

    Row-wise, the two backward matmuls (slow accumulation) do not run the row-scaled CUTLASS
    kernel, which is slow without fast accumulation: torchao runs the tensor-wise cuBLAS one
    unscaled and multiplies its output by the outer product of the two scale vectors
    afterwards (torchao/float8/float8_ops.py ``addmm_float8_unwrapped``, pytorch/ao#1325,
    November 2024; still so in pytorch/ao@6243040, June 2025, pytorch/ao#2184). Each input
    gradient (``ins`` elements) and weight gradient (``weights``) is read and written once
    more (bf16), in a kernel of its own per matmul ("at least one extra triton kernel per
    GEMM" compiled, pytorch/ao#2184); eager, the fp32 outer product is written and read too
    (``a_inverse_scale * b_inverse_scale``, then ``output *= ...``: 8 bytes more, 2 kernels).
    Row-wise, each linear also casts its bf16 weight (``weights`` elements) along one axis in
    forward and along the other in backward, on every micro-batch (``Float8Linear.forward``
    takes the axis-wise path, ``matmul_with_hp_or_float8_args``, which saves the bf16 weight
    and casts it again for the input-gradient matmul; pytorch/ao@890e0ac8,
    torchao/float8/float8_linear.py). Tensor-wise, the weight's float8 copy is made once per
    forward and kept for backward: an amax pass and the cast (read 2e, write 1, 2 kernels
    a linear; ``_cast_weight_to_float8_t``), unless ``Job.fp8_param_gather`` (FSDP's float8
    all-gather, torchtitan's setting for this recipe) has it made on the shard before the
    gather, a 1/shard share not counted. ``gathered``: per row, whether the weights arrive
    that way (``float8_gathered_rows``: a row without FSDP casts per forward under the flag
    too); None: wherever ``float8_param_gather`` says so.
    """
    e = 2.0
    ins, outs = np.asarray(ins, dtype=float), np.asarray(outs, dtype=float)
    cast = (e + 1.0) if job.compile else (2 * e + 1.0)
    kernels = np.asarray(linears, dtype=float) * (1.0 if job.compile else 2.0)
    w = np.asarray(weights, dtype=float)
    rowwise = job.float8_recipe == "rowwise"
    extra = e if rowwise else 0.0
    fwd = memory_time(gpu, (cast + extra) * ins, kernels)
    bwd = memory_time(gpu, (cast + extra) * outs + (e + 1.0) * (ins + outs), 2 * kernels)
    if rowwise:
        rescale = 2 * e if job.compile else 2 * e + 8.0
        fwd = fwd + memory_time(gpu, cast * w, kernels)
        bwd = bwd + memory_time(gpu, rescale * (ins + w) + cast * w, 3 * kernels)
    else:
        if gathered is None:
            gathered = float8_param_gather(job.framework, job)
        fwd = fwd + np.where(gathered, 0.0, memory_time(gpu, (2 * e + 1.0) * w,
                                                        2 * np.asarray(linears, dtype=float)))
    return fwd, bwd


def float8_param_gather(framework_name: str, job: Job) -> bool:
    """Whether FSDP all-gathers a layer's linear weights in float8 (1 byte each): torchtitan
    with torchao's tensor-wise recipe and ``Job.fp8_param_gather`` (its
    ``float8.enable_fsdp_float8_all_gather``, with ``precompute_float8_dynamic_scale_for_fsdp``
    as its float8 docs launch it, docs/float8.md). Each Float8Linear's weight shard is cast to
    float8 before the all-gather (one amax all-reduce for all weights), so the gather and the
    unsharded weight it makes are 1 byte per element, and forward casts no weight
    (torchao/float8/fsdp_utils.py, ``WeightWithDynamicFloat8CastTensor``). Row-wise, torchao
    gathers in bf16 (torchtitan's docs/float8.md: "all distributed communication is done in
    high precision"). The norms' weights, a few parts in a million of a layer, are counted
    with them."""
    return (framework_name == "torchtitan" and job.precision == "fp8"
            and job.fp8_param_gather and job.float8_recipe == "tensorwise")


def float8_gathered_rows(framework_name: str, job: Job, zero: Num) -> np.ndarray:
    """Per row, whether FSDP brings a layer's linear weights in float8
    (``float8_param_gather``): only where FSDP2 holds them (torchtitan's ZeRO-2/3, whose
    all-gather copy-in casts the shard on a stream of its own, on one rank too:
    ``stepterms._fsdp2_copies``); under DDP (ZeRO-0) each Float8Linear casts its weight on
    every forward."""
    return float8_param_gather(framework_name, job) & (np.asarray(zero) >= 2)


def float8_gather(framework_name: str, job: Job, e: float) -> tuple[float, bool]:
    """(bytes per element of the SP all-gathers that feed a layer's matmuls, whether async TP
    fuses them with their matmuls).

    torchtitan with torchao's tensorwise float8 puts ``Float8ColwiseParallel``,
    ``Float8RowwiseParallel`` and ``PrepareFloat8ModuleInput`` on its TP linears: a linear's
    input is cast to float8 before its forward all-gather, and a row-parallel output's
    gradient before the all-gather that is its reduce-scatter's backward, so every SP
    all-gather moves one byte per element; the reduce-scatters stay bf16 (torchao/float8/
    float8_tensor_parallel.py; torchtitan's parallelize ``apply_tp`` takes those styles for
    the tensorwise recipe only: rowwise, its all-gathers move bf16). With the rowwise
    recipe, async TP's pattern match of all-gather then matmul misses the row-scaled matmul,
    so those all-gathers run unfused (pytorch/pytorch#149990, March 2025; torchtitan
    benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: async TP adds 4-6 % rowwise
    against 9-16 % tensorwise and bf16). ``e``: the activations' bytes per element."""
    if framework_name != "torchtitan" or job.precision != "fp8":
        return e, True
    if job.float8_recipe == "rowwise":
        return e, False
    return 1.0, True


def lm_head_compute(model: ModelSpec, gpu: GPU, job: Job, tp: np.ndarray, cp: np.ndarray,
                    mbs: np.ndarray, sp: np.ndarray, autocast: np.ndarray | None = None
                    ) -> tuple[LayerCompute, LayerCompute]:
    """(embedding, head) compute for one micro-batch, per row.

    Embedding: a gather of T rows of h (read + write). Head: final norm, the vocab-parallel
    ``[T, h] x [h, V/tp]`` matmul (V padded as the trainer pads it, ``padded_vocab``), and the
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
    4 + 4, write 4) and casts it back (read 4, write e). ``autocast``: as in
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
                       proj_gemm=zero, down_gemm=zero)
    v = padded_vocab(fw, model.vocab_size, t) / t if not model.patch_size \
        else float(model.vocab_size) / t
    # An fp8 job keeps its output layer in bf16: Megatron-Core runs fp8 only inside its
    # transformer layers (Transformer Engine's fp8 autocast wraps each layer; the output
    # layer is a plain ColumnParallelLinear), and torchtitan's float8 converter leaves
    # ``output`` out of torchao's conversion (a fixed module filter in its 2024-25
    # releases, ``filter_fqns`` since: ``planner.emit.torchtitan`` writes it).
    head_gemm = gemm_time(gpu, "bf16" if dtype == "fp8" else dtype, tokens, v, h,
                          bytes_per_element=e)
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
    else:
        ce_fwd, ce_bwd = (e + 4.0 + 16.0) * logits, (4.0 + 12.0 + 4.0 + e) * logits
        kernels_f = kernels_b = 4.0
    head_f = head_gemm + memory_time(gpu, norm + ce_fwd + cast, 1.0 + kernels_f)
    head_b = 2 * head_gemm + memory_time(gpu, BACKWARD_BYTES * norm + ce_bwd + cast,
                                         1.0 + kernels_b)
    head_flops = 3 * 2 * tokens * h * v
    head = LayerCompute(forward=head_f, backward=head_b, selective=zero, flops=head_flops,
                        selective_flops=zero, forward_flops=head_flops / 3,
                        core_forward=zero, core_backward=zero, qkv_gemm=zero, up_gemm=zero,
                        proj_gemm=zero, down_gemm=zero)
    return emb, head

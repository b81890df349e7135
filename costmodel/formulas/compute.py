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

- attention projections ``2 T h (q + 2 kv) + 2 T q h`` (GQA: ``kv = kv_heads * head_dim``;
  in general ``2 T`` times each linear's weights, ``ModelSpec.attention_matmuls``: multi-head
  latent attention's down projections run whole on every TP rank, on its sequence shard
  under SP),
- attention core ``4 T s q`` (scores and weighted sum over the s keys; Narayanan et al. 2021,
  Eq. 3's ``s / 6h`` term; ``2 T s (q + o)`` where the values are narrower than the keys).
  A fused causal kernel skips the masked half (Dao 2023, Sec. 3);
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

from costmodel.config import QUANTIZED_PRECISIONS, Job
from costmodel.formulas.arrays import ordered_sum
from costmodel.formulas.eager import (
    COMPILED_MOE_KERNELS,
    COMPILED_MOE_NOGRAD_KERNELS,
    EAGER_MOE_NOGRAD_KERNELS,
    eager_bytes,
    eager_cast_bytes,
    eager_moe_bytes,
    float8_cast_time,
    te_quantize_time,
)
from costmodel.formulas.roofline import (
    BACKWARD_BYTES,
    FLASH_BACKWARD_FLOPS,
    LayerCompute,
    _dtypes,
    attention_kernel,
    flash_attention_time,
    gemm_time,
    memory_time,
    weight_grad_bytes,
)
from costmodel.frameworks import Framework, framework
from costmodel.hardware import GPU
from costmodel.model import ModelSpec
from costmodel.units import Num

__all__ = ["CAST_BYTES", "autocast_rows", "layer_compute"]


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
    windowed: bool = False

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
        """Key width (KV heads x head dim)."""
        return float(self.model.kv_dim)

    @property
    def v(self) -> float:
        """Value width (KV heads x value head dim)."""
        return float(self.model.v_dim)

    @property
    def o(self) -> float:
        """Attention output width (heads x value head dim)."""
        return float(self.model.o_dim)

    def local(self, split: bool) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, divisor of the output features) of a linear on this rank: split over TP
        (column parallel), or whole on every rank, on its sequence shard under SP."""
        return (self.tokens, self.t) if split else (self.tokens * self.rep, 1.0 + 0.0 * self.t)

    def gemm(self, m: Num, n: Num, k: Num, count: Num = 1.0, bytes_per_element: float = 2.0,
             grouped: bool = False) -> np.ndarray:
        """``gemm_time`` of ``count`` ``[m, k] x [k, n]`` matmuls in the job's dtype."""
        return gemm_time(self.gpu, self.dtype, m, n, k, count=count,
                         bytes_per_element=bytes_per_element, grouped=grouped)

    def wgrad(self, m: Num, n: Num, k: Num, count: Num = 1.0, bytes_per_element: float = 2.0,
              grouped: bool = False) -> np.ndarray:
        """Seconds of the weight-gradient matmuls of ``count`` ``[m, k] x [k, n]`` linears:
        the same FLOPs, reading the input and the output gradient and moving the ``[k, n]``
        gradient as the trainer does (``weight_grad_bytes``)."""
        return gemm_time(self.gpu, self.dtype, m, n, k, count=count,
                         bytes_per_element=bytes_per_element,
                         weight_bytes_per_element=weight_grad_bytes(self.job), grouped=grouped)


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
    adds, the routed tokens (MoE; else None), the routed experts' own forward seconds and
    FLOPs (MoE; else zero), and the weight-gradient matmuls' seconds of all its linears."""

    forward: np.ndarray
    flops: np.ndarray
    act_bytes: np.ndarray
    up: np.ndarray
    down: np.ndarray
    kernels: float
    routed: np.ndarray | None
    routed_forward: np.ndarray | float = 0.0
    routed_flops: np.ndarray | float = 0.0
    wgrad: np.ndarray | float = 0.0


def layer_compute(model: ModelSpec, gpu: GPU, job: Job, tp: np.ndarray, cp: np.ndarray,
                  mbs: np.ndarray, sp: np.ndarray, moe: bool,
                  capacity_factor: float = 1.0, ep: np.ndarray | None = None,
                  autocast: np.ndarray | None = None,
                  float8_gathered: np.ndarray | None = None, local: bool = False,
                  etp: np.ndarray | None = None) -> LayerCompute:
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
    None: ``float8_param_gather``). ``local``: the layer attends to a window or chunk of keys
    (``ModelSpec.attended_keys``), which its fused attention's FLOPs and time follow.
    ``etp``: the experts' tensor-parallel degree (``ParallelConfig.etp``; default ``tp``).
    """
    dtype, e, e_in = _dtypes(job)
    t = tp.astype(float)
    et = t if etp is None else etp.astype(float)  # the experts' TP split
    r = _Rows(model, gpu, job, framework(job.framework), dtype, e, e_in,
              np.zeros(np.shape(tp), dtype=bool) if autocast is None else np.asarray(autocast),
              t, job.seq_len / cp.astype(float) * mbs,
              np.where(sp == 1, 1.0 / t, 1.0),  # norm/dropout regions: split by SP
              mbs, cp, local)
    qkv_gemm, k_gemm, proj_gemm, attn_wgrad = _projections(r)
    attn_flops = 0.0 * r.tokens  # projections
    for n_in, n_out, split in model.attention_matmuls():
        m, div = r.local(split)
        attn_flops = attn_flops + 2 * m * n_in * n_out / div
    core = _attention_core(r)
    mlp = _mlp_block(r, moe, capacity_factor, ep, et)
    fwd = qkv_gemm + proj_gemm + core.forward + mlp.forward
    # Each linear's backward: the input-gradient matmul (the forward's shape and traffic)
    # and the weight-gradient one (``_Rows.wgrad``).
    bwd = qkv_gemm + proj_gemm + attn_wgrad + core.backward + mlp.forward + mlp.wgrad
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
        cast_f, cast_b = float8_cast_time(model, gpu, job, r.tokens, t, moe, float8_gathered)
        fwd, bwd, ew_fwd = fwd + cast_f, bwd + cast_b, ew_fwd + cast_f
    elif r.fw.name == "megatron" and job.precision in QUANTIZED_PRECISIONS:
        cast_f, cast_b = te_quantize_time(model, gpu, job, r.tokens, t, mlp.routed, et)
        fwd, bwd, ew_fwd = fwd + cast_f, bwd + cast_b, ew_fwd + cast_f
    selective, selective_flops = core.selective, core.selective_flops
    if r.fw.name == "megatron":
        selective, selective_flops = _recomputed_kernels(r, core, mlp, moe, et, k_gemm)
    if r.fw.selective_recompute == "op":
        selective, selective_flops = _op_selective(r, moe, core, ew_fwd, qkv_gemm, k_gemm,
                                                   proj_gemm, mlp)
    return LayerCompute(forward=fwd, backward=bwd, selective=selective, flops=f_flops + b_flops,
                        selective_flops=selective_flops, forward_flops=f_flops,
                        core_forward=core.forward, core_backward=core.backward,
                        qkv_gemm=qkv_gemm, up_gemm=mlp.up, proj_gemm=proj_gemm,
                        down_gemm=mlp.down, routed_forward=mlp.routed_forward + 0.0 * fwd)


def _projections(r: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q, k and v projection, the K projection's share of it, output projection, the
    weight-gradient matmuls of them all) seconds: one fused QKV matmul, or three
    (``Framework.separate_projections``). The K share is what torchtitan's per-op selective
    AC re-runs."""
    h, q, kv, v, t, tokens = r.h, r.q, r.kv, r.v, r.t, r.tokens
    # (m, n, k) of each matmul, the output projection first.
    shapes: list[tuple[Num, Num, Num]] = [(tokens, h, r.o / t)]
    if r.model.is_mla:
        # Every linear of multi-head latent attention is one matmul; per-op selective AC
        # re-runs every second one in call order (the query and key-value up projections).
        shapes += [(m, n_out / div, n_in) for n_in, n_out, split in
                   r.model.attention_matmuls()[:-1] for m, div in (r.local(split),)]
    elif r.fw.separate_projections:
        shapes += [(tokens, q / t, h), (tokens, kv / t, h), (tokens, v / t, h)]
    else:
        shapes += [(tokens, (q + kv + v) / t, h)]
    times = [r.gemm(m, n, k, bytes_per_element=r.e_in) for m, n, k in shapes]
    wgrad = ordered_sum(r.wgrad(m, n, k, bytes_per_element=r.e_in) for m, n, k in shapes)
    out, ins = times[0], times[1:]
    if r.model.is_mla:
        return ordered_sum(ins), ordered_sum(ins[1::2], 0.0 * out), out, wgrad
    if r.fw.separate_projections:
        return ordered_sum(ins), ins[1], out, wgrad
    return ins[0], kv / (q + kv + v) * ins[0], out, wgrad


def _attention_core(r: _Rows) -> _Core:
    """The attention core: fused (FlashAttention, Dao 2023: its backward does
    ``FLASH_BACKWARD_FLOPS`` times the forward's FLOPs, selective recompute has nothing to
    re-run), or two batched matmuls over ``mbs * heads / tp`` heads with a fused
    scale-mask-softmax and dropout on the scores between them."""
    model, job, t, tokens = r.model, r.job, r.t, r.tokens
    q, o, s_kv = r.q, r.o, float(job.seq_len)
    zero = 0.0 * tokens
    if job.flash_attention:
        # Each query attends to ModelSpec.attended_keys (half the sequence under the causal
        # mask, which the fused kernel skips; a local layer's window).
        keys = model.attended_keys(job.seq_len, r.windowed)
        flops = 2 * tokens * keys * (q + o) / t
        # Context parallel runs the kernel over one chunk of the keys at a time (ring
        # attention, Liu et al. 2023); a local layer's keys span at most its window.
        span = min(s_kv, float(model.sliding_window)) if r.windowed else s_kv
        f, b = flash_attention_time(r.gpu, r.dtype, flops, span / r.cp.astype(float),
                                    attention_kernel(job, r.gpu), float(model.head_dim or 128))
        return _Core(f, b, flops, FLASH_BACKWARD_FLOPS * flops, zero, 0.0, zero, zero)
    # Two batched matmuls: [s, d] x [d, s] and [s, s] x [s, d] (a window masks the scores,
    # which are all computed).
    heads = model.num_heads / t
    hd = float(model.head_dim or model.hidden_size // model.num_heads)
    s_q = job.seq_len / r.cp.astype(float)
    f = r.gemm(s_q, s_kv, hd, count=r.mbs * heads, bytes_per_element=r.e) \
        + r.gemm(s_q, float(model.v_head_dim or hd), s_kv, count=r.mbs * heads,
                 bytes_per_element=r.e)
    flops = 2 * tokens * s_kv * (q + o) / t
    scores = heads * tokens * s_kv
    drop = 1.0 if model.dropout else 0.0
    # Fused scale-mask-softmax reads and writes the scores; dropout reads them, writes
    # them and a one-byte mask (Korthikanti et al. 2022, Sec. 4.1 counts the same tensors).
    nbytes = 2 * r.e * scores + drop * (2 * r.e + 1) * scores
    kernels = 1.0 + drop
    return _Core(f, 2 * f, flops, 2 * flops, nbytes, kernels,
                 f + memory_time(r.gpu, nbytes, kernels), flops)


def _mlp(r: _Rows, ffn: float, m_tokens: np.ndarray, per_expert: np.ndarray | None = None,
         split: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(forward time, forward FLOPs, activation bytes, input projection time, output
    projection time, weight-gradient matmul time) of an MLP on ``m_tokens`` tokens.

    ``per_expert``: tokens per local expert (the matmuls' M) for a grouped expert GEMM.
    ``split``: the tensor-parallel degree its width splits by (the experts' ``etp``; default
    the layer's tp).
    """
    model, h = r.model, r.h
    t = r.t if split is None else split
    n_up = ffn * (2 if model.gated_mlp else 1) / t
    m_shape = m_tokens if per_expert is None else per_expert
    count = 1.0 if per_expert is None else m_tokens / per_expert
    # Local experts' matmuls as one grouped kernel per projection, or one each.
    grouped = per_expert is not None and r.fw.grouped_experts
    # (matmuls, n, k) of the input projection (gate and up as two matmuls, or one) and the
    # output projection.
    two = r.fw.separate_projections and model.gated_mlp
    up_shape = (2.0, ffn / t, h) if two else (1.0, n_up, h)
    shapes = (up_shape, (1.0, h, ffn / t))
    up, down = (n_mm * r.gemm(m_shape, n, k, count=count, bytes_per_element=r.e_in,
                              grouped=grouped) for n_mm, n, k in shapes)
    wgrad = ordered_sum(n_mm * r.wgrad(m_shape, n, k, count=count, bytes_per_element=r.e_in,
                                       grouped=grouped) for n_mm, n, k in shapes)
    fl = 2 * m_tokens * h * n_up + 2 * m_tokens * ffn / t * h
    width = 3 if model.gated_mlp else 2  # ffn-wide tensors the activation reads + writes
    return up + down, fl, width * r.e * m_tokens * ffn / t, up, down, wgrad


def _mlp_block(r: _Rows, moe: bool, capacity_factor: float, ep: np.ndarray | None,
               et: np.ndarray) -> _Mlp:
    """The layer's MLP: dense, or a MoE layer's router, its routed experts (``top_k`` copies
    of each token times ``capacity_factor``, ``ep`` experts' shares per rank as a grouped
    matmul) and its shared experts. The experts split their width over ``et`` (their etp:
    the layer's tp unless folded): with etp = tp each rank runs its TP group's routed tokens
    (gathered over the sequence-parallel ranks) through 1/tp of each local expert; folded
    (Megatron-Core's MoE parallel folding, etp < tp), its own share of them through 1/etp:
    the same FLOPs, wider and shorter matmuls."""
    model, h, tokens = r.model, r.h, r.tokens
    if not moe:
        f, flops, act, up, down, wgrad = _mlp(r, float(model.ffn_hidden_size or 0), tokens)
        return _Mlp(f, flops, act, up, down, 0.0, None, wgrad=wgrad)
    ffn = float(model.moe_ffn_hidden_size or 0)
    n_exp = float(model.num_experts)
    ep_f = (ep if ep is not None else np.ones_like(r.t)).astype(float)
    # The routed copies this rank computes.
    routed = tokens * model.top_k * capacity_factor * et / r.t
    router = r.gemm(tokens * r.rep, n_exp, h, bytes_per_element=r.e)
    f, flops, act, _, _, wgrad = _mlp(r, ffn, routed, routed * ep_f / n_exp, split=et)
    experts_f, experts_flops = f, flops
    f = f + router
    wgrad = wgrad + r.wgrad(tokens * r.rep, n_exp, h, bytes_per_element=r.e)
    flops = flops + 2 * tokens * r.rep * h * n_exp
    # Token permutation before the experts and un-permutation after: read + write each.
    act = act + 2 * 2 * r.e * routed * h + 4.0 * tokens * r.rep * n_exp
    kernels = 3.0
    if model.num_shared_experts:
        sh_f, sh_flops, sh_bytes, _, _, sh_w = _mlp(r, ffn * model.num_shared_experts, tokens)
        f, flops, act, wgrad = f + sh_f, flops + sh_flops, act + sh_bytes, wgrad + sh_w
        kernels += 1.0
    zero = 0.0 * tokens
    return _Mlp(f, flops, act, zero, zero, kernels, routed, experts_f, experts_flops, wgrad)


def _recomputed_kernels(r: _Rows, core: _Core, mlp: _Mlp, moe: bool, et: np.ndarray,
                        up_proj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) Megatron-LM's selective recompute re-runs in backward (``Job.
    recompute_modules``, ``activations._recomputed_modules`` the memory it frees;
    megatron/core/transformer/transformer_config.py names them): the attention core
    (``core_attn``, nothing with a fused attention), the routed experts' activation function
    (``moe_act``: reads the fc1 output's gate and up halves, writes the activation, over the
    rank's routed tokens), the two norms (``layernorm``: each reads and writes one [tokens, h]
    tensor), a dense layer's whole MLP (``mlp``: transformer_layer.py checkpoints it, so its
    forward, matmuls and activation, runs again), a MoE layer's shared experts
    (``shared_experts``: moe_layer.py checkpoints them likewise) and multi-head latent
    attention's up projections with the rotary embedding (``mla_up_proj``:
    multi_latent_attention.py re-runs them from the latents; ``up_proj``, their seconds) and
    a MoE layer whole (``moe``: moe_layer.py checkpoints its forward, so the router, the
    permutations, the routed and shared experts run again, covering ``moe_act`` and
    ``shared_experts``; the dispatch and combine it re-runs are communication,
    ``stepterms.expert_parallel``)."""
    mods = r.job.recompute_modules
    model, zero = r.model, 0.0 * r.tokens
    out, flops = (core.selective if "core_attn" in mods else zero), zero
    whole_moe = "moe" in mods and moe
    if "core_attn" in mods:
        flops = core.selective_flops
    if whole_moe:
        out = out + mlp.forward + memory_time(r.gpu, mlp.act_bytes, mlp.kernels)
        flops = flops + mlp.flops
    if "moe_act" in mods and moe and mlp.routed is not None and not whole_moe:
        width = float(model.moe_ffn_hidden_size or 0) / et
        out = out + memory_time(r.gpu, 3 * r.e * mlp.routed * width, 1.0)
    if "layernorm" in mods:
        out = out + memory_time(r.gpu, 2 * 2 * r.e * r.tokens * r.h * r.rep, 2.0)
    if "mlp" in mods and not moe:
        out = out + mlp.forward + memory_time(r.gpu, mlp.act_bytes, 1.0)
        flops = flops + mlp.flops
    if "shared_experts" in mods and moe and model.num_shared_experts and not whole_moe:
        sh_f, sh_flops, sh_bytes, _, _, _ = _mlp(
            r, float(model.moe_ffn_hidden_size or 0) * model.num_shared_experts, r.tokens)
        out = out + sh_f + memory_time(r.gpu, sh_bytes, 1.0)
        flops = flops + sh_flops
    if "mla_up_proj" in mods and model.is_mla:
        rope = 2 * r.e * r.tokens * float(model.rotary_elements) / r.t \
            if model.has_rotary(r.windowed) else zero
        out = out + up_proj + memory_time(r.gpu, rope, 1.0)
        ups = model.attention_matmuls()[:-1][1::2]
        flops = flops + sum((2 * m * n_in * n_out / div for n_in, n_out, split in ups
                             for m, div in (r.local(split),)), zero)
    return out, flops


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
    rope = model.has_rotary(r.windowed)
    # MLA: RMSNorms of the query and key-value latents (whole on each rank, on its sequence
    # shard under SP: Megatron-Core's q_layernorm / kv_layernorm), read and written once.
    latent = float(model.latent_norm_params())
    latent_norms = 2 * e * tokens * latent * rep
    latent_kernels = (1.0 if model.q_lora_rank else 0.0) + 1.0 if model.is_mla else 0.0
    # Compiled (TorchInductor), autocast's casts of a norm's output are its kernel's
    # epilogue (the same cast of one tensor computed once), and in backward the gradients'
    # casts and their sum fuse into the norm's backward: no kernel of their own, as a traced
    # graph's fused regions count them (``costmodel.trace.fusion._regions``).
    fused_casts = job.compile and fw.eager_kernels
    # Attention block: pre-norm, rotary embedding of q and k, bias-dropout-add of the
    # residual. Under autocast the norm reads and writes fp32 (compiled, writes its cast)
    # and the residual adds a low-precision branch to the fp32 stream (read 4 + e, write 4).
    norm_bytes = np.where(ac, 4.0 + e if fused_casts else 8.0, 2 * e) * tokens * h * rep
    rope_bytes = 2 * e * tokens * float(model.rotary_elements) / t if rope else 0.0 * tokens
    # qk-norm (ModelSpec.qk_norm): one fused RMSNorm each over the rank's q and k heads,
    # reading and writing them (Megatron-Core's q_layernorm / k_layernorm).
    qk_norm = 2 * e * tokens * (q + kv) / t if model.qk_norm else 0.0 * tokens
    residual = (np.where(ac, 8.0 + e, 3 * e) + drop) * tokens * h * rep
    # Post-norms (ModelSpec.post_norms): one more norm of each block's output.
    post = norm_bytes if model.post_norms else 0.0 * tokens
    ew_bytes = norm_bytes + rope_bytes + qk_norm + residual + core.bytes + latent_norms + post
    ew_kernels: Num = 2.0 + (1.0 if rope else 0.0) + (2.0 if model.qk_norm else 0.0) \
        + core.kernels + latent_kernels + (1.0 if rope and model.is_mla else 0.0) \
        + (1.0 if model.post_norms else 0.0)
    # MLP block: pre-norm, residual, activation, then the projections (and a post-norm).
    ew_bytes = ew_bytes + (2 if model.post_norms else 1) * norm_bytes + residual
    ew_kernels += 3.0 if model.post_norms else 2.0
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
        x_bytes, x_kernels = eager_bytes(model, tokens, rep, t, e, ac, rotary=rope)
        casts = casts + eager_cast_bytes(model, tokens, rep, t, e, ac, rotary=rope)
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
        # (``costmodel.trace.fusion._regions``).
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
    weights = 0.0 * t
    for n_in, n_out, split in model.attention_matmuls():
        weights = weights + n_in * n_out / (t if split else 1.0)
    n_mats: Num = float(len(model.attention_matmuls())) if model.is_mla else 4.0
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
        weights, n_mats = weights + (q + kv + r.v) / t, n_mats + 3
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
    wk, wo and w3 or fc2), every memory-bound kernel (``ew_fwd``), a non-fused attention
    core, and a MoE layer's routed experts' matmuls: ``torch._grouped_mm`` is not on the
    policy's save list (torchtitan/models/deepseek_v3/infra/parallelize.py
    ``_op_sac_save_list`` at v0.2.2, which holds ``aten.mm``, the fused attention kernels and
    the all-to-all, so nothing is sent again)."""
    model, h, t, tokens = r.model, r.h, r.t, r.tokens
    q, kv = r.q, r.kv
    re_mlp = (0.5 * mlp.up if model.gated_mlp else mlp.down)
    ffn = float(model.ffn_hidden_size or 0)
    re_mlp_flops = (2 * tokens * h * ffn / t if not moe else 0.0 * tokens)
    re_attn, re_attn_flops = k_gemm + proj_gemm, 2 * tokens * h * (kv + r.o) / t
    if model.is_mla:  # every second linear in call order: the up projections
        re_attn_flops = 2 * tokens * sum(n_in * n_out for n_in, n_out, _ in
                                         model.attention_matmuls()[1::2]) / t
    if model.bias:
        # A linear with a bias runs as ``addmm``, which the policy's save list (``mm``)
        # leaves out: every projection is re-run.
        re_attn, re_attn_flops = qkv_gemm + proj_gemm, 2 * tokens * h * (q + kv + r.v + r.o) / t
        re_mlp = mlp.up + mlp.down
        re_mlp_flops = (2 * tokens * h * ffn * (3 if model.gated_mlp else 2) / t
                        if not moe else 0.0 * tokens)
    # A MoE layer's routed experts, whose grouped matmuls the policy does not save.
    re_mlp, re_mlp_flops = re_mlp + mlp.routed_forward, re_mlp_flops + mlp.routed_flops
    unfused = not r.job.flash_attention
    return (re_attn + re_mlp + ew_fwd + (core.forward if unfused else 0.0),
            re_attn_flops + re_mlp_flops + (core.flops if unfused else 0.0))

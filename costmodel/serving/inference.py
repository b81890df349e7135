"""Serving a decoder-only model: memory per GPU, time to first token, time per output token.

A replica of the model spans ``tp * pp`` GPUs (Megatron-style tensor parallel inside a stage,
pipeline stages across, FasterTransformer / vLLM / TensorRT-LLM); ``replicas`` copies serve
independent requests. Each replica serves ``batch_size`` sequences at once, each with a
``prompt_len``-token prompt and ``output_len`` generated tokens.

Memory per GPU (one stage of one replica):

- weights: the stage's layers with their matmul weights split over tp (column / row parallel;
  Shoeybi et al. 2019) at the weight precision, plus norms, biases, the router, the
  embedding (first stage) and the LM head (last stage) at 16 bits, which weight-only
  quantizers leave unquantized (AutoAWQ and GPTQ quantize ``nn.Linear`` layers of the blocks;
  vLLM's ``lm_head`` stays 16-bit). Group-wise quantization stores per group of
  ``quant_group_size`` input elements of an output channel an fp16 scale, plus a packed
  4-bit zero point for asymmetric int4 (AutoAWQ ``WQLinear_GEMM``: ``scales`` fp16 and
  ``qzeros`` int32-packed, both ``[k / group, n]``): int8 ``1 + 2/g`` and int4
  ``0.5 + 2.5/g`` bytes per weight; fp8 uses one scale per tensor (``1`` byte).
- KV cache: per token and layer ``2 * kv_heads * head_dim`` elements (Kwon et al. 2023,
  vLLM, Sec. 3: 800 KB per token for OPT-13B at fp16); a GPU holds ``kv_heads / tp`` heads,
  or one replicated head when ``tp > kv_heads`` (vLLM ``QKVParallelLinear`` replicates KV
  heads), for ``batch_size * (prompt_len + output_len)`` tokens. Multi-head latent
  attention caches ``kv_lora_rank + qk_rope_head_dim`` elements per token and layer, whole on
  every GPU of a stage (DeepSeek-V2, Sec. 2.1.2), and decodes in the absorbed form.
- activations: the working set of the largest forward pass, a prefill of
  ``min(batch * prompt_len, prefill_chunk_tokens)`` tokens: the residual stream and the
  normalized copy (``2 h``), and the widest intermediate (QKV, or the MLP's up-projection
  plus its activation output), plus fp32 logits of the batch on the last stage.
- overhead: CUDA context, cuBLAS workspace and NCCL buffers (``software.toml`` ``[runtime]``).

Time, per GPU from the profile's roofline (``costmodel.formulas.compute.gemm_time``: the larger of
FLOPs over the matmul peak and bytes over the HBM bandwidth, plus a fixed cost per kernel):

- prefill: every matmul with ``M = tokens``, compute-bound; the causal fused attention
  ``2 T P q / tp`` FLOPs (half of ``4 T P q``; Dao 2023) at the profile's attention
  efficiency; the logits of the last position of each sequence only.
- decode step: every matmul with ``M = batch``, so the weights are read once per step and the
  step is memory-bound (Pope et al. 2022, "Efficiently Scaling Transformer Inference",
  Sec. 2); attention reads the cached keys and values of every sequence.
- tensor parallel: two all-reduces of the layer's output per layer (Shoeybi et al. 2019),
  not overlapped (vLLM, TensorRT-LLM default); the vocab-parallel logits are gathered.
- pipeline parallel: one point-to-point hand-off per stage boundary (and the sampled token
  back to the first stage in decode). Prefill of a batch runs through the stages in turn;
  decode keeps ``min(batch, pp)`` micro-batches in flight (vLLM's virtual engines,
  FasterTransformer's micro-batching), so a round takes the longer of one micro-batch's trip
  through all stages and ``micro-batches x`` the slowest stage (the pipeline bound).
- MoE: a decode step of ``B`` tokens, each routed to ``top_k`` of ``E`` experts uniformly,
  reads ``E (1 - (1 - top_k / E)^B)`` experts in expectation (the chance an expert is picked
  by none of the ``B`` tokens is ``(1 - top_k / E)^B``).

TTFT is the prefill of the batch; TPOT the decode step at the mean context
``prompt_len + output_len / 2`` (the step time is linear in the context, so this is the mean
over the output); the latency of a request ``TTFT + (output_len - 1) TPOT``; throughput the
output tokens of every replica over that time. MBU (Databricks 2023, "LLM Inference
Performance Engineering": bytes read per step over TPOT, over the peak bandwidth) and
prefill MFU are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.errors import SpecError
from costmodel.formulas.arrays import even_split
from costmodel.formulas.comm import Topology
from costmodel.formulas.roofline import gemm_time, memory_time
from costmodel.hardware import GPU, Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference_job import (
    ELEMENT_BYTES,
    KV_PRECISIONS,
    MAX_BATCH,
    OBJECTIVES,
    WEIGHT_PRECISIONS,
    InferenceConfig,
    InferenceJob,
    compute_dtype,
    validate_inference,
    weight_bytes_per_element,
)
from costmodel.units import GIB, MIB, Num

# What is served and how (InferenceJob, InferenceConfig, precisions) lives in
# costmodel.serving.inference_job and is re-exported here beside the estimate.
__all__ = [
    "KV_PRECISIONS",
    "OBJECTIVES",
    "WEIGHT_PRECISIONS",
    "InferenceConfig",
    "InferenceEstimate",
    "InferenceJob",
    "InferenceMemory",
    "InferenceTable",
    "compute_dtype",
    "estimate_inference",
    "inference_table",
    "kv_cache_bytes_per_token",
    "validate_inference",
    "weight_bytes",
    "weight_bytes_per_element",
]

def _kv_heads_per_gpu(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """KV heads one GPU holds: ``kv_heads / tp``, or one replicated head when tp exceeds them
    (vLLM ``QKVParallelLinear``: ``num_kv_head_replicas = tp // num_kv_heads``)."""
    kv = float(model.num_kv_heads or model.num_heads)
    return np.maximum(kv / tp, 1.0)


def _kv_elements_per_gpu(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """KV-cache elements one GPU holds per token and layer: the keys and values of its KV
    heads (``2 * kv_heads / tp * head_dim``, values of ``v_head_dim``); multi-head latent
    attention caches the key-value latent and the shared rotary key of each token,
    ``kv_lora_rank + qk_rope_head_dim``, whole on every TP rank (DeepSeek-AI 2024,
    "DeepSeek-V2", Sec. 2.1.2 and Table 1; vLLM's MLA backends keep one latent cache per
    rank)."""
    if model.is_mla:
        return np.full(np.shape(tp), float(model.kv_lora_rank + model.qk_rope_head_dim))
    return _kv_heads_per_gpu(model, tp) * float(int(model.head_dim or 0)
                                                 + int(model.v_head_dim or 0))


def kv_cache_bytes_per_token(model: ModelSpec, precision: str = "bf16") -> float:
    """KV-cache bytes one token takes in the whole model: ``layers * 2 * kv_heads * head_dim``
    elements (Kwon et al. 2023, Sec. 3); MLA's ``layers * (kv_lora_rank + qk_rope_head_dim)``
    (``_kv_elements_per_gpu``)."""
    if precision not in KV_PRECISIONS:
        raise SpecError(f"kv cache precision {precision!r} is not one of "
                        f"{', '.join(KV_PRECISIONS)}")
    per_layer = model.kv_lora_rank + model.qk_rope_head_dim if model.is_mla \
        else model.kv_dim + model.v_dim
    return float(model.num_layers * per_layer) * ELEMENT_BYTES[precision]


def _layer_linear_params(model: ModelSpec, moe: bool) -> tuple[float, float, float]:
    """(matmul weights split over TP, matmul weights every TP rank holds whole, everything
    else) of one whole layer, in parameters; the router and norms and biases are
    'everything else', the quantizers' unquantized part; MLA's down projections the whole
    ones (vLLM ``ReplicatedLinear``)."""
    h = model.hidden_size
    attn = sum(i * o for i, o, split in model.attention_matmuls() if split)
    whole = sum(i * o for i, o, split in model.attention_matmuls() if not split)
    gated = 3 if model.gated_mlp else 2
    if moe:
        ffn = int(model.moe_ffn_hidden_size or 0)
        mlp = gated * h * ffn * (model.num_experts + model.num_shared_experts)
    else:
        mlp = gated * h * int(model.ffn_hidden_size or 0)
    total = model.moe_layer_non_expert_params() + model.routed_expert_params() if moe \
        else model.dense_layer_params()
    return float(attn + mlp), float(whole), float(total - attn - whole - mlp)


def weight_bytes(model: ModelSpec, precision: str = "bf16", group_size: int = 128,
                 dtype: str = "bf16") -> float:
    """Bytes of the whole model's weights served at ``precision``: the blocks' matmul weights
    at that format, everything else (embedding, LM head, norms, biases, router) at
    ``dtype``. The single-GPU (tp = pp = 1) weights term."""
    wb = weight_bytes_per_element(precision, group_size)
    e = ELEMENT_BYTES[dtype]
    total = (model.embedding_params() + model.head_params()) * e
    for moe, count in ((False, model.num_layers - model.num_moe_layers),
                       (True, model.num_moe_layers)):
        lin, whole, other = _layer_linear_params(model, moe)
        total += count * ((lin + whole) * wb + other * e)
    return total


@dataclass(frozen=True)
class _Layer:
    """Per-row seconds of one layer's pass and its bytes moved (for MBU)."""

    time: np.ndarray
    tp_comm: np.ndarray
    bytes_read: np.ndarray
    flops: np.ndarray


def _layer(model: ModelSpec, gpu: GPU, topo: Topology, dtype: str, e: float,
           wb: np.ndarray, tp: np.ndarray, m: np.ndarray, attn_flops: np.ndarray,
           attn_bytes: np.ndarray, moe: bool) -> _Layer:
    """One transformer layer's forward pass over ``m`` new tokens per row on one GPU.

    ``attn_flops`` / ``attn_bytes``: the fused attention kernel's FLOPs and HBM traffic.
    """
    h = float(model.hidden_size)
    t = tp.astype(float)

    def mm(n: Num, k: Num, count: Num = 1.0, rows: np.ndarray | None = None,
           w: Num | None = None) -> tuple[np.ndarray, Num, np.ndarray]:
        """(seconds, weight bytes read, FLOPs) of ``count`` matmuls ``[rows, k] x [k, n]``."""
        rows = m if rows is None else rows
        w = wb if w is None else w
        sec = gemm_time(gpu, dtype, rows, n, k, count=count, bytes_per_element=e,
                        weight_bytes_per_element=w)
        return sec, count * w * n * k, count * 2.0 * rows * n * k

    # The attention's linears (ModelSpec.attention_matmuls): split over TP, or whole. MLA's
    # absorbed decode multiplies the queries and outputs by the key-value up projection's
    # two halves instead of the cached latents: the same weights and FLOPs per new token.
    parts = [mm(n_out / t if split else 1.0 * n_out, 1.0 * n_in)
             for n_in, n_out, split in model.attention_matmuls()]
    gated = 2.0 if model.gated_mlp else 1.0
    if moe:
        ffn = float(model.moe_ffn_hidden_size or 0) / t
        n_exp = float(model.num_experts)
        k_top = float(model.top_k)
        active = n_exp * (1.0 - (1.0 - k_top / n_exp) ** m)
        per = m * k_top / active
        parts += [mm(n_exp, h, w=e), mm(gated * ffn, h, active, per), mm(h, ffn, active, per)]
        if model.num_shared_experts:
            sh = ffn * model.num_shared_experts
            parts += [mm(gated * sh, h), mm(h, sh)]
        width = ffn * model.top_k * (gated + 1.0)
    else:
        ffn = float(model.ffn_hidden_size or 0) / t
        parts += [mm(gated * ffn, h), mm(h, ffn)]
        width = ffn * (gated + 1.0)
    sec = sum(p[0] for p in parts)
    read = sum(p[1] for p in parts)
    flops = sum(p[2] for p in parts)
    eff = gpu.efficiency
    peak = gpu.peak_flops(dtype if dtype != "fp8" else "bf16")
    attn = np.maximum(attn_flops / (peak * eff.attention),
                      attn_bytes / (gpu.memory_bandwidth_bytes_per_s * eff.memory))
    sec = sec + attn + eff.kernel_overhead_s
    # Memory-bound kernels: two (fused add +) norms reading and writing h, rotary embedding of
    # q and k, the MLP activation reading its input(s) and writing its output.
    rope = 2 * float(model.rotary_elements) / t
    ew = e * m * (2 * 2 * h + 2 * 3 * h + rope + width)
    sec = sec + memory_time(gpu, ew, 4.0)
    comm = 2 * topo.all_reduce(m * h * e, t, 1.0)
    return _Layer(time=sec + comm, tp_comm=comm, bytes_read=read + attn_bytes,
                  flops=flops + attn_flops)


def _decode_keys(model: ModelSpec, local: bool, mean_ctx: float, ctx: float) -> float:
    """Keys a decoded token attends to, over the output on average: the mean context; a
    sliding window's at most its width; a chunked layer's the tokens before it in its chunk,
    half a chunk on average once the context passes one."""
    if not local:
        return mean_ctx
    w = float(model.sliding_window)
    if model.chunked_attention:
        return mean_ctx if ctx <= w else w / 2
    return min(mean_ctx, w)


def _stage_kinds(model: ModelSpec, pp: np.ndarray, stages: int) -> np.ndarray:
    """Layers of each kind (``ModelSpec.kind_attributes``) on each pipeline stage of each
    row, ``[kinds, rows, stages]``, the layers split evenly (``even_split``)."""
    kinds = np.asarray(model.layer_kinds)
    out = np.zeros((len(model.kind_attributes), len(pp), stages))
    for p_val in np.unique(pp):
        rows = pp == p_val
        start = 0
        for s, count in enumerate(even_split(model.num_layers, int(p_val))):
            out[:, rows, s] = np.bincount(kinds[start:start + count],
                                          minlength=len(out))[:, None]
            start += count
    return out


@dataclass(frozen=True)
class InferenceTable:
    """Per-row results (arrays over the rows), SI units; see ``InferenceEstimate``.

    ``memory``: term -> ``[rows, stages]`` bytes per GPU of each pipeline stage (``valid``
    masks the stages a row has); ``max_batch``: the largest batch whose KV cache for the full
    context fits every stage; ``prefill_terms`` / ``decode_terms``: seconds by term of the
    prefill of the batch and of one decode step at the mean context (summed over stages).
    """

    memory: dict[str, np.ndarray]
    valid: np.ndarray
    peak: np.ndarray
    peak_stage: np.ndarray
    capacity: float
    ttft: np.ndarray
    tpot: np.ndarray
    latency: np.ndarray
    tokens_per_s: np.ndarray
    max_batch: np.ndarray
    mbu: np.ndarray
    prefill_mfu: np.ndarray
    prefill_terms: dict[str, np.ndarray]
    decode_terms: dict[str, np.ndarray]

    @property
    def fits(self) -> np.ndarray:
        """Rows whose every stage fits in GPU memory."""
        return self.peak <= self.capacity


MEMORY_TERMS = ("weights", "kv_cache", "activations", "overhead")


def inference_table(model: ModelSpec, cluster: Cluster, job: InferenceJob, tp: np.ndarray,
                    pp: np.ndarray, replicas: np.ndarray, batch: np.ndarray,
                    precision: np.ndarray) -> InferenceTable:
    """The inference cost model over rows of ``(tp, pp, replicas, batch, precision)``;
    ``precision`` holds indices into ``WEIGHT_PRECISIONS``. Rows must be valid
    (``validate_inference``)."""
    gpu = cluster.gpu
    topo = Topology.of(cluster)
    tp = np.asarray(tp, dtype=float)
    pp_i = np.asarray(pp, dtype=int)
    pp = pp_i.astype(float)
    reps = np.asarray(replicas, dtype=float)
    b = np.asarray(batch, dtype=float)
    prec = np.asarray(precision, dtype=int)
    n = tp.shape[0]
    e = ELEMENT_BYTES[job.dtype]
    kv_e = ELEMENT_BYTES[job.kv_cache_precision]
    h = float(model.hidden_size)
    v = float(model.vocab_size)
    P, out = float(job.prompt_len), float(job.output_len)
    ctx = P + out
    wb = np.array([weight_bytes_per_element(p, job.quant_group_size)
                   for p in WEIGHT_PRECISIONS])[prec]
    kv_local = _kv_elements_per_gpu(model, tp)  # cached per token and layer
    q_local, o_local = model.q_dim / tp, model.o_dim / tp
    # The attention kernel's keys and values per token: the heads' (MLA's prefill expands
    # the latents to them, vLLM's MLA prefill path), and what a decode step's kernel reads
    # per cached token and works on per head (MLA absorbed: the latent with the rotary key as
    # one key of kv_lora_rank + qk_rope_head_dim, the latent as its value; DeepSeek-AI 2024,
    # "DeepSeek-V2", Sec. 2.1.2, "absorb").
    kv_heads_local = (model.kv_dim + model.v_dim) / tp if model.is_mla else kv_local
    decode_dims = (float(2 * model.kv_lora_rank + model.qk_rope_head_dim) * model.num_heads / tp
                   if model.is_mla else q_local + o_local)

    # Prefill passes: whole batch, or chunks of prefill_chunk_tokens.
    prompt_tokens = b * P
    chunk = prompt_tokens if job.prefill_chunk_tokens is None else \
        np.minimum(prompt_tokens, float(job.prefill_chunk_tokens))
    passes = np.ceil(prompt_tokens / chunk)
    # Decode: min(batch, pp) micro-batches in flight, each of mb_size sequences.
    mb = np.minimum(b, pp)
    mb_size = np.ceil(b / mb)
    mean_ctx = P + out / 2.0

    layers: dict[tuple[str, int], _Layer] = {}
    for kind, (moe, local) in enumerate(model.kind_attributes):
        for phase in ("prefill", "decode"):
            acc = {k: np.zeros(n) for k in ("time", "tp_comm", "bytes_read", "flops")}
            for pi, pname in enumerate(WEIGHT_PRECISIONS):
                rows = prec == pi
                if not rows.any():
                    continue
                dtype = compute_dtype(gpu, job, pname)
                if phase == "prefill":
                    m = chunk[rows]
                    # Causal: a prompt token attends to (P + 1) / 2 keys on average (a local
                    # layer's, ModelSpec.attended_keys); the kernel reads q, k, v and writes
                    # o once (compute-bound).
                    keys = model.attended_keys(P, True) if local else (P + 1) / 2
                    af = 2.0 * m * keys * (q_local[rows] + o_local[rows])
                    ab = e * m * (q_local[rows] + o_local[rows] + kv_heads_local[rows])
                else:
                    m = mb_size[rows]
                    keys = _decode_keys(model, local, mean_ctx, ctx)
                    af = 2.0 * m * keys * decode_dims[rows]
                    ab = kv_e * m * keys * kv_local[rows]
                lay = _layer(model, gpu, topo, dtype, e, wb[rows], tp[rows], m, af, ab, moe)
                for k in acc:
                    acc[k][rows] = getattr(lay, k)
            layers[(phase, kind)] = _Layer(**acc)

    def ends(m: np.ndarray, rows_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(embedding, head, logit gather) seconds for ``m`` tokens in, ``rows_out`` logits."""
        emb = memory_time(gpu, 2 * e * m * h, 1.0)
        head = gemm_time(gpu, job.dtype, rows_out, v / tp, h, bytes_per_element=e)
        gather = topo.all_gather(rows_out * v * e, tp, 1.0)
        # Final norm, then the sampler over fp32 logits (cast, softmax, pick).
        head = head + memory_time(gpu, 2 * e * rows_out * h + 3 * 4.0 * rows_out * v, 4.0)
        return emb, head + gather, gather

    emb_p, head_p, gather_p = ends(chunk, b)
    emb_d, head_d, gather_d = ends(mb_size, mb_size)
    hop_p = np.where(pp > 1, topo.p2p(chunk * h * e, tp), 0.0)
    hop_d = np.where(pp > 1, topo.p2p(mb_size * h * e, tp), 0.0)

    max_pp = int(pp_i.max()) if n else 1
    valid = np.arange(max_pp)[None, :] < pp_i[:, None]
    kind_n = _stage_kinds(model, pp_i, max_pp)  # [kinds, rows, stages]
    first = np.zeros((n, max_pp))
    first[:, 0] = 1.0
    last = (np.arange(max_pp)[None, :] == (pp_i - 1)[:, None]).astype(float)

    def per_stage(phase: str, attr: str, emb: np.ndarray | float, head: np.ndarray | float
                  ) -> np.ndarray:
        """``[rows, stages]``: a layer quantity summed over each stage's layers, plus the
        embedding on the first stage and the head on the last."""
        d = sum(getattr(layers[(phase, k)], attr)[:, None] * kind_n[k]
                for k in range(len(kind_n)))
        d = d + np.asarray(emb)[..., None] * first + np.asarray(head)[..., None] * last
        return np.where(valid, d, 0.0)

    # Prefill: a pass runs through the stages in turn; further chunks follow it through the
    # pipeline one slowest-stage apart.
    st_p = per_stage("prefill", "time", emb_p, head_p)
    ttft = st_p.sum(axis=1) + (pp - 1) * hop_p + (passes - 1) * st_p.max(axis=1)
    # Decode round: one micro-batch's trip through the stages (and the sampled token back),
    # or the slowest stage busy with every micro-batch in turn, whichever is longer.
    st_d = per_stage("decode", "time", emb_d, head_d)
    hops = np.where(pp > 1, pp * hop_d, 0.0)
    tpot = np.maximum(st_d.sum(axis=1) + hops, mb * st_d.max(axis=1) + np.minimum(hops, hop_d))
    latency = ttft + (out - 1) * tpot
    tokens_per_s = reps * b * out / latency

    rows_i = np.arange(n)
    tp_st = per_stage("prefill", "tp_comm", 0.0, gather_p)
    slow_p = np.argmax(st_p, axis=1)
    tp_p = tp_st.sum(axis=1) + (passes - 1) * tp_st[rows_i, slow_p]
    pp_p = (pp - 1) * hop_p
    prefill_terms = {"compute": ttft - tp_p - pp_p, "tp_comm": tp_p, "pp_comm": pp_p}
    tp_st = per_stage("decode", "tp_comm", 0.0, gather_d)
    stage_bound = mb * st_d.max(axis=1) + np.minimum(hops, hop_d) > st_d.sum(axis=1) + hops
    tp_d = np.where(stage_bound, mb * tp_st[rows_i, np.argmax(st_d, axis=1)], tp_st.sum(axis=1))
    pp_d = np.where(stage_bound, np.minimum(hops, hop_d), hops)
    decode_terms = {"compute": tpot - tp_d - pp_d, "tp_comm": tp_d, "pp_comm": pp_d}

    # Memory per stage.
    t = tp
    per_gpu = {moe: (lin / t + whole) * wb + oth * e
               for moe in {a[0] for a in model.kind_attributes}
               for lin, whole, oth in (_layer_linear_params(model, moe),)}
    emb_bytes = model.embedding_params() * e / t
    head_bytes = model.head_params() * e / t
    if model.tied_embeddings:
        # One matrix serves both ends on a single stage; the last stage of a pipeline holds
        # its own copy for the head.
        head_bytes = np.where(pp > 1, model.embedding_params() * e / t, 0.0)
    weights = (sum(per_gpu[moe][:, None] * kind_n[k]
                   for k, (moe, _) in enumerate(model.kind_attributes))
               + emb_bytes[:, None] * first + head_bytes[:, None] * last)
    # A local layer caches its window alone (vLLM's sliding-window KV cache frees the blocks
    # behind it; a chunked layer keeps its chunk).
    cached = [min(ctx, float(model.sliding_window)) if local else ctx
              for _, local in model.kind_attributes]
    kv_per_seq = kv_local[:, None] * kv_e * sum(c * kind_n[k] for k, c in enumerate(cached))
    kv = b[:, None] * kv_per_seq
    ffn_max = float(max(model.ffn_hidden_size or 0,
                        (model.moe_ffn_hidden_size or 0) * max(model.top_k, 1)))
    gated = 2.0 if model.gated_mlp else 1.0
    width = np.maximum(q_local + kv_heads_local, (gated + 1.0) * ffn_max / t)
    per_token = e * (2 * h + width)
    logits_per_seq = 4.0 * v
    act = per_token[:, None] * chunk[:, None] + b[:, None] * logits_per_seq * last
    rt = hardware_profiles.load_software()["runtime"]
    peers = (tp > 1).astype(float) + 2.0 * (pp > 1)
    nccl = peers * float(rt["nccl_max_channels"]) * float(rt["nccl_buffsize_mib"]) * MIB
    overhead = (float(rt["cuda_context_mib"]) + float(rt["cublas_workspace_mib"])) * MIB + nccl
    over = np.broadcast_to(overhead[:, None], (n, max_pp))
    memory = {"weights": np.where(valid, weights, 0.0), "kv_cache": np.where(valid, kv, 0.0),
              "activations": np.where(valid, act, 0.0),
              "overhead": np.where(valid, over, 0.0)}
    total = sum(memory.values())
    assert isinstance(total, np.ndarray), "a sum of four arrays"
    peak_stage = np.argmax(total, axis=1)
    peak = total[np.arange(n), peak_stage]
    cap = float(gpu.memory_bytes)

    # Largest batch: memory grows linearly in the batch, in two regimes when prefill is
    # chunked (below and above the chunk).
    fixed = weights + over
    free = cap - fixed
    kv_seq = kv_per_seq + logits_per_seq * last
    if job.prefill_chunk_tokens is None:
        per = kv_seq + per_token[:, None] * P
        b_max = np.floor(free / per)
    else:
        c = float(job.prefill_chunk_tokens)
        below = np.minimum(np.floor(free / (kv_seq + per_token[:, None] * P)), math.floor(c / P))
        above = np.floor((free - per_token[:, None] * c) / kv_seq)
        above = np.where(above * P >= c, above, 0.0)
        b_max = np.maximum(below, above)
    b_max = np.where(valid, np.maximum(b_max, 0.0), np.inf).min(axis=1)

    # MBU: bytes a GPU reads per decode round (its stage, once per micro-batch) over the
    # round, over the peak bandwidth; averaged over the stages.
    head_read = v * h / tp * e
    read = mb * per_stage("decode", "bytes_read", 0.0, head_read).sum(axis=1) / pp
    mbu = read / tpot / gpu.memory_bandwidth_bytes_per_s
    flops = per_stage("prefill", "flops", 0.0, 2 * b * h * v / tp / passes).sum(axis=1) * passes
    prefill_mfu = flops / pp / ttft / gpu.peak_flops(job.dtype)
    return InferenceTable(memory=memory, valid=valid, peak=peak, peak_stage=peak_stage,
                          capacity=cap, ttft=ttft, tpot=tpot, latency=latency,
                          tokens_per_s=tokens_per_s, max_batch=b_max, mbu=mbu,
                          prefill_mfu=prefill_mfu, prefill_terms=prefill_terms,
                          decode_terms=decode_terms)


@dataclass(frozen=True, kw_only=True)
class InferenceMemory:
    """Bytes per GPU by term: ``weights``, ``kv_cache`` (the batch at its full context),
    ``activations`` (the largest forward pass's working set and the logits) and
    ``overhead`` (CUDA context, cuBLAS workspace, NCCL buffers)."""

    weights_bytes: float
    kv_cache_bytes: float
    activations_bytes: float
    overhead_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of the terms."""
        return (self.weights_bytes + self.kv_cache_bytes + self.activations_bytes
                + self.overhead_bytes)

    def as_dict(self) -> dict[str, float]:
        """Terms by name plus ``total_bytes``."""
        out = {f"{t}_bytes": getattr(self, f"{t}_bytes") for t in MEMORY_TERMS}
        out["total_bytes"] = self.total_bytes
        return out


@dataclass(frozen=True, kw_only=True)
class InferenceEstimate:
    """What serving with one configuration costs. Seconds, bytes, tokens/s.

    ``memory``: the peak stage's bytes per GPU by term (``peak_stage`` counts from 0);
    ``stage_memory``: each pipeline stage's. ``ttft_s``: time to first token (the prefill of
    the batch); ``tpot_s``: time per output token, the mean over the output; ``latency_s``:
    a request from arrival to its last token, ``ttft + (output_len - 1) * tpot``;
    ``tokens_per_s``: output tokens per second of all replicas together;
    ``max_batch_size``: the most sequences a replica holds at the full context;
    ``prefill_terms`` / ``decode_terms``: seconds by term (``compute``, ``tp_comm``,
    ``pp_comm``) of the prefill and of one decode step; ``mbu``: model bandwidth utilization
    of decode; ``prefill_mfu``: model FLOPs utilization of the prefill, against the 16-bit
    peak as trainers quote it (fp8 matmuls can take it past 1).
    """

    config: InferenceConfig
    memory: InferenceMemory
    stage_memory: tuple[InferenceMemory, ...]
    peak_stage: int
    memory_capacity_bytes: float
    ttft_s: float
    tpot_s: float
    latency_s: float
    tokens_per_s: float
    max_batch_size: int
    prefill_terms: dict[str, float]
    decode_terms: dict[str, float]
    mbu: float
    prefill_mfu: float
    kv_cache_bytes_per_token: float
    #: The 16-bit type the engine computes in (``InferenceJob.dtype``: bf16 or fp16).
    dtype: str = "bf16"

    @property
    def peak_memory_bytes(self) -> float:
        """Bytes per GPU on the fullest stage."""
        return self.memory.total_bytes

    @property
    def fits(self) -> bool:
        """Whether every stage fits in GPU memory."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def tokens_per_s_per_user(self) -> float:
        """Output tokens per second one sequence sees: ``1 / tpot``."""
        return 1.0 / self.tpot_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form with stable keys."""
        return {
            "kind": "inference",
            "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "latency_s": self.latency_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes, "fits": self.fits,
            "max_batch_size": self.max_batch_size, "peak_stage": self.peak_stage,
            "memory": self.memory.as_dict(),
            "stage_memory": [m.as_dict() for m in self.stage_memory],
            "prefill_terms": dict(self.prefill_terms), "decode_terms": dict(self.decode_terms),
            "mbu": self.mbu, "prefill_mfu": self.prefill_mfu,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
        }

    def summary(self) -> str:
        """A human-readable report."""
        c = self.config
        m = self.memory
        lines = [
            f"serve    {c.describe(self.dtype)}",
            "latency  first token "
            + (f"{self.ttft_s:.2f} s" if self.ttft_s >= 1 else f"{1e3 * self.ttft_s:.1f} ms")
            + f", then {1e3 * self.tpot_s:.2f} ms "
            f"per token ({self.tokens_per_s_per_user:,.0f} tokens/s per sequence); a request "
            f"{self.latency_s:.2f} s",
            f"output   {self.tokens_per_s:,.0f} tokens/s over {c.replicas} replica(s); decode "
            f"MBU {100 * self.mbu:.0f}%, prefill MFU {100 * self.prefill_mfu:.0f}%",
            f"memory   {self.peak_memory_bytes / GIB:.2f} of "
            f"{self.memory_capacity_bytes / GIB:.1f} GiB per GPU (stage {self.peak_stage}): "
            f"weights {m.weights_bytes / GIB:.2f}, KV cache {m.kv_cache_bytes / GIB:.2f}, "
            f"activations {m.activations_bytes / GIB:.2f}, overhead "
            f"{m.overhead_bytes / GIB:.2f}" + ("" if self.fits else "  DOES NOT FIT"),
            f"         at most {self.max_batch_size:,} sequences per replica fit the context",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from costmodel.formulas.estimate import _html_table

        rows = [(line[:9].strip(), line[9:]) for line in self.summary().splitlines()]
        return _html_table(("", ""), rows)


def estimate_inference(model: ModelSpec, cluster: Cluster, job: InferenceJob,
                       config: InferenceConfig) -> InferenceEstimate:
    """Memory per GPU, latency and throughput of serving ``model`` on ``cluster`` as
    ``config`` says; the search's numbers exactly (a table of one row).

    Raises SpecError naming the problem when the configuration cannot run.
    """
    for name, value, kind in (("model", model, ModelSpec), ("cluster", cluster, Cluster),
                              ("job", job, InferenceJob), ("config", config, InferenceConfig)):
        if not isinstance(value, kind):
            raise SpecError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    validate_inference(model, cluster, job, config)
    one = np.ones(1)
    t = inference_table(model, cluster, job, config.tp * one, config.pp * one,
                        config.replicas * one, config.batch_size * one,
                        np.array([WEIGHT_PRECISIONS.index(config.weight_precision)]))
    stages = tuple(InferenceMemory(**{f"{k}_bytes": float(t.memory[k][0, s])
                                      for k in MEMORY_TERMS}) for s in range(config.pp))
    peak = int(t.peak_stage[0])
    return InferenceEstimate(
        config=config, memory=stages[peak], stage_memory=stages, peak_stage=peak,
        memory_capacity_bytes=t.capacity, ttft_s=float(t.ttft[0]), tpot_s=float(t.tpot[0]),
        latency_s=float(t.latency[0]), tokens_per_s=float(t.tokens_per_s[0]),
        max_batch_size=int(min(t.max_batch[0], MAX_BATCH)),
        prefill_terms={k: float(v[0]) for k, v in t.prefill_terms.items()},
        decode_terms={k: float(v[0]) for k, v in t.decode_terms.items()},
        mbu=float(t.mbu[0]), prefill_mfu=float(t.prefill_mfu[0]),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(model, job.kv_cache_precision),
        dtype=job.dtype)

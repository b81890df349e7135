"""Time of one training step for a table of configurations: compute, communication, pipeline,
optimizer and offload, with what overlaps and what is exposed.

One vectorized numpy pass, like ``costmodel.formulas.memory``; ``estimate()`` evaluates a table of
one.

Per micro-batch, each pipeline stage spends (per GPU, seconds):

    t_i = forward + backward (with the gradient accumulation of micro-batches after the
          first) + recompute + exposed TP, CP, EP, ZeRO-3/FSDP and PP comm

and the step is the pipeline's makespan plus what follows the last backward:

    step = makespan(t_0 .. t_{p-1}) + max_i (exposed gradient reduction + parameter gather
           + optimizer + offload)

The makespan is the trainer's schedule played out op by op (``costmodel.formulas.pipeline``: GPipe,
1F1B, interleaved 1F1B in torch's rounds, zero bubble ZB-H1), each stage's time split into
forward and backward by its compute; ``bubble`` is what it adds to ``m * max_i t_i``. For equal
stages and ``m >= p`` that is ``(p - 1) t`` (1F1B, GPipe; Narayanan et al. 2021, Sec. 2.2),
``(p - 1) t / v`` interleaved (ibid., Sec. 2.2.2) and ``(p - 1) T_F`` for ZB-H1 with the
backward split evenly into input and weight gradients (Qi et al. 2024, Sec. 3.1); the
simulation also covers uneven stages, ``m < p`` and rounds that are not multiples of ``p``,
where those formulas do not hold.

Overlap rules (what each trainer hides behind compute; the rest is exposed):

- TP collectives of the forward pass are on the critical path in every trainer (Megatron-LM
  overlaps them only with Transformer Engine's opt-in ``--tp-comm-overlap``, torchtitan only
  with opt-in async TP), and so are torchtitan's and DeepSpeed's in backward. In backward,
  Megatron-LM's column-parallel linears (QKV, MLP input) run their input-gradient all-reduce
  (SP: reduce-scatter) beside their weight-gradient matmul, and with SP re-gather their input
  beside the input-gradient matmul; each is exposed only beyond that matmul (Korthikanti
  et al. 2022, Sec. 4.2.2 and Sec. 6.2, Table 4). The SP gradient gathers of the row-parallel
  outputs are exposed. Without SP this needs ``Job.overlap_tp_grad_comm``.
- CP ring attention overlaps each KV block's transfer with attention on the previous block
  (Liu et al. 2023): exposed is the transfer time beyond the attention compute per step. A
  step waits for the ring's slowest hop, which crosses nodes once tp x cp exceeds a node.
- EP all-to-all (dispatch and combine) is exposed (Megatron-LM and torchtitan defaults).
- PP send/receive of activations and gradients is exposed, two per micro-batch per model chunk.
  Megatron-LM sends 1/tp of the tensor from each TP rank and all-gathers it inside the node
  (scatter-gather, Narayanan et al. 2021, Sec. 4.1).
- ZeRO-3 / FSDP: each layer's parameter all-gather is prefetched during the previous layer's
  compute, and in backward the all-gather and the gradient reduce-scatter share the
  communication stream with the layer's backward (FSDP: Zhao et al. 2023, Sec. 3.3; DeepSpeed
  ZeRO-3 prefetch; Megatron FSDP). Exposed per layer: ``max(0, comm - compute)``, plus the
  first gather and the last reduce-scatter of each micro-batch. torchtitan's ZeRO-2 (FSDP
  without resharding) gathers once per micro-batch in forward only; DeepSpeed ZeRO-2
  reduce-scatters every micro-batch.
- Data-parallel gradient reduction (ZeRO 0 and 1) runs once per step, in buckets launched
  during the last micro-batch's backward when ``Job.overlap_grad_reduce``: exposed is
  ``max(comm - that backward, last bucket)``; otherwise all of it. Megatron-LM's pipeline
  ranks after the first use one bucket. The ZeRO-1/2 parameter all-gather after the optimizer
  overlaps with the next forward in Megatron-LM (``--overlap-param-gather``) and is exposed in
  DeepSpeed.
- torchtitan with a pipeline and FSDP: torch.distributed.pipelining keeps gradient sync
  off until each stage's last backward, so the gradients are reduce-scattered once per
  step, after it, like the data-parallel reduction. torchtitan's async TP
  (``Job.tp_comm_overlap``) chunks each TP collective with its matmul in forward, and in
  backward the output-gradient all-gathers; an input-gradient reduce-scatter reading a sum
  of matmuls (q, k and v; w1 and w3) is not fused by inductor's micro-pipeline pass:
  exposed.
- Hidden FSDP and data-parallel communication still slows the compute beside it by
  ``GPU.efficiency.comm_slowdown`` seconds per second (fitted).
- Host: a trainer that waits on the host for each MoE layer's routing counts
  (``Framework.moe_host_sync``: Megatron-LM) cannot launch more than a layer ahead, so a
  stage's time per micro-batch is at least its MoE layers times the host's time to launch
  one (``host_floor``); ``host`` is what that adds beyond the GPU's work.
- Optimizer step: memory-bound over the GPU's shard of the states. With CPU offload: gradients
  to the host (overlapped like a bucketed reduction), the CPU Adam step (the node's CPU shared
  by its GPUs), updated parameters back to the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.config import Job
from costmodel.formulas.arrays import (
    RECOMPUTE_CODES,
    SCHEDULE_CODES,
    ConfigArrays,
    first_argmax,
)
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import MemoryTable
from costmodel.formulas.pipelinetable import pairs, pipeline_bound, table_makespan
from costmodel.formulas.states import Widths, master_bytes, optimizer_state_bytes
from costmodel.formulas.stepterms import (
    Rows,
    Sharded,
    accumulation_time,
    context_parallel,
    expert_parallel,
    overlap,
    p2p_time,
    recompute_time,
    sharded,
    table_rows,
)
from costmodel.formulas.tpcomm import tensor_parallel
from costmodel.frameworks import framework
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import MIB

__all__ = ["COMM_KINDS", "TIME_TERMS", "TimeTable", "host_floor", "host_words",
           "model_flops_per_token", "optimizer_bytes", "time_table"]

COMM_KINDS = ("tp", "cp", "ep", "pp", "fsdp", "dp")
TIME_TERMS = ("compute", "recompute", "host", *(f"{k}_comm" for k in COMM_KINDS), "bubble",
              "optimizer", "offload")


@dataclass(frozen=True)
class TimeTable:
    """Step time per row and its terms, seconds.

    ``terms[name]`` for ``name`` in ``TIME_TERMS`` is the time each adds to the step (comm
    terms: the exposed part), summing to ``step_time``. ``comm_total[kind]`` is all the time
    that kind of communication takes on the critical GPU, overlapped or not. ``stage_time``
    ``[P, rows]`` (stage-major, like ``MemoryTable``) is each stage's time per micro-batch;
    ``model_flops`` and ``hardware_flops`` count the whole step over all GPUs (hardware adds
    recompute). ``floor``: the pipeline's time without ZeRO-3/FSDP communication and without
    what follows the last backward; a lower bound on ``step_time`` of every configuration that
    differs from the row only in ZeRO stage, sharding group and offload, or also in recompute
    when the row recomputes nothing (stage times only grow with those, and the makespan and
    bubble grow with the stage times).
    ``forward_share`` ``[P, rows]``: the forward pass's part of each stage's compute
    (recompute counts with the backward), to split ``stage_time`` into forward and backward.
    A table made with ``detail=False`` has no ``comm_total`` (empty), ``hardware_flops`` or
    ``forward_share`` (None). ``hidden`` ``[P, rows]``: what one overlapped forward-backward
    pair saves per micro-batch on each stage (``pair_saving``; None where no row pairs).
    ``exact`` ``[rows]``: whether the row's pipeline time is its
    schedule played out (``costmodel.formulas.pipeline``); rows of a table made with ``exact_below``
    whose lower bound on the step time exceeds it keep the bound (``step_time`` is then a
    lower bound).
    """

    step_time: np.ndarray
    terms: dict[str, np.ndarray]
    comm_total: dict[str, np.ndarray]
    stage_time: np.ndarray
    bottleneck_stage: np.ndarray
    model_flops: float
    hardware_flops: np.ndarray | None
    floor: np.ndarray
    forward_share: np.ndarray | None = None
    exact: np.ndarray | None = None
    hidden: np.ndarray | None = None


def model_flops_per_token(model: ModelSpec | LayerCosts, seq_len: int) -> float:
    """Model FLOPs per trained token, forward and backward
    (``LayerCosts.model_flops_per_token``: PaLM's ``6 N + 12 L q s``)."""
    return LayerCosts.of(model).model_flops_per_token(seq_len)


def optimizer_bytes(job: Job, model: Widths) -> tuple[float, float]:
    """HBM bytes the optimizer step moves per parameter: (per parameter of the GPU's optimizer
    shard, per parameter of its whole gradient buffer).

    With P the fp32 parameter (master) bytes, G the gradient bytes the optimizer reads, S its
    state bytes and W the low-precision weight bytes:

    - the update (fused Adam, SGD, Adafactor) reads P, G and S and writes P and S:
      ``2 P + 2 S + G``; the global gradient norm for clipping reads G once more;
    - Megatron-LM (``megatron/core/optimizer/optimizer.py``, ``MixedPrecisionOptimizer.step``):
      fp16 unscales the gradients and checks them for inf/nan (read + write G), mixed precision
      copies the master weights to the model's (read P, write W), and the contiguous gradient
      buffer is zeroed before the next step (write G over the whole buffer);
    - DeepSpeed (ZeRO 1/2 mixed-precision optimizer): fp16 unscales the gradients in one pass
      with the clipping (read + write G) and copies the master weights to fp16 (P + W);
    - torchtitan: ``torch.nn.utils.clip_grad_norm_`` always multiplies the gradients by the
      clamped coefficient (read + write G); FSDP casts parameters to bf16 in its all-gather.
    """
    fw = job.framework
    s = optimizer_state_bytes(job, model)
    # Every trainer keeps fp32 parameters (or masters) and fp32 optimizer gradients, except
    # Megatron-LM's fp16 masters (Job.master_weights_dtype).
    p = master_bytes(job) if fw == "megatron" else 4.0
    g = 4.0
    w = 2.0  # the 16-bit model weights a mixed-precision master copy writes
    per = 2 * p + 2 * s + g + g
    zeroed = 0.0
    if fw == "torchtitan":
        per += 2 * g
    else:
        if job.precision != "fp32":
            per += p + w
        if job.precision == "fp16":
            per += 2 * g
        if fw == "megatron":
            zeroed = g
    return per, zeroed


def _moe_layer_host_s(soft: Mapping[str, Any]) -> float:
    """Seconds the host takes to launch one Megatron-LM MoE layer, forward and backward, for
    one micro-batch (``software.toml [host] megatron_moe_layer_ms``)."""
    return float(soft["host"]["megatron_moe_layer_ms"]) * 1e-3


def host_floor(r: Rows) -> np.ndarray | float:
    """Seconds per micro-batch on each stage that the host needs to launch the stage's MoE
    layers, forward and backward (zero where the trainer does not wait on the host inside
    them: ``Framework.moe_host_sync``). Megatron-LM's token dispatchers copy each layer's
    routing counts to the host and synchronize before the expert all-to-all and the grouped
    matmuls (megatron/core/transformer/moe/token_dispatcher.py, ``cuda_sync_point``), so the
    CPU runs at most a layer ahead and the layer takes no less than its launch time on the
    host: ``hardware_profiles/software.toml [host] megatron_moe_layer_ms``, measured from a
    host-bound run at micro-batch 1 (Megatron-Bridge 26.02, Qwen3-30B-A3B on DGX-B200)."""
    if not r.costs.is_moe or not framework(r.job.framework).moe_host_sync:
        return 0.0
    return r.routed_layers(r.counts) * _moe_layer_host_s(r.soft)


def host_words(breakdown: Mapping[str, float]) -> str | None:
    """What an estimate's summary says where its step waits on the host (``host`` in its
    time ``breakdown``, seconds), or None where it does not."""
    host = breakdown.get("host", 0.0)
    if host <= 0:
        return None
    ms = 1e3 * _moe_layer_host_s(hardware_profiles.load_software())
    return (f"host-bound: {host:.3f} s of the step waits for the host to launch MoE layers "
            f"({ms:g} ms a layer and micro-batch, measured; docs/step-time.md); larger "
            "micro-batches put more GPU work under each launch")


def pair_phases(forward: np.ndarray, backward: np.ndarray, routed: np.ndarray,
                pair: np.ndarray, k: float) -> np.ndarray:
    """Seconds one MoE layer's overlapped forward-backward pair takes: one micro-batch's
    forward (``forward`` s, of which its routed experts' matmuls ``routed``) beside another's
    ``backward`` (the experts' input- and weight-gradient matmuls twice ``routed``), each
    pass's dispatch and combine taking ``pair`` s (half each).

    The pair runs in three phases, each as long as the longer of its two streams (Megatron-LM,
    megatron/core/models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.
    run``; torchtitan 0.2.2's DualPipeV barriers at the same four points; the DeepSeek-V3
    report's Figure 4): the forward's attention (with everything before the dispatch) beside
    the backward's combine; the backward's experts then the forward's experts beside the
    forward's dispatch then the backward's (each expert part waiting for its own dispatch);
    the backward's attention beside the forward's combine. Communication beside compute
    slows it by ``k`` s per s (``comm_slowdown``). A layer whose compute outweighs its
    communication in every phase takes its compute plus ``k`` times the communication, as an
    even overlap would; where one phase's communication outweighs its compute the rest of
    the pair cannot hide that excess."""
    m = np.minimum(routed, forward)
    m_b = np.minimum(2 * m, backward)
    half = 0.5 * pair
    experts = np.maximum(m_b + m + k * pair, np.maximum(pair, half + np.maximum(m, m_b / 2)))
    attn_f, attn_b = forward - m, backward - m_b
    return (np.maximum(attn_f + k * half, half) + experts
            + np.maximum(attn_b + k * half, half))


def pair_saving(r: Rows, ep_comm: np.ndarray, stage_time: np.ndarray,
                host: np.ndarray | float = 0.0
                ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(what one overlapped forward-backward pair saves per micro-batch on each stage, its
    most over every recompute and sharding of the row) under Megatron-LM's combined 1F1B and
    the DualPipeV of a trainer that overlaps its pairs' expert communication
    (``Framework.dualpipev_ep_overlap``: torchtitan 0.2.2 with pp > 1, ep > 1 and no
    activation checkpointing) or that DeepSeek's DualPipe costs as (``ConfigArrays.dualpipe``,
    with any recompute: its own chunks overlap); (None, None) where no row runs either.

    A pair runs one micro-batch's forward beside another's backward on two streams, each
    one's expert dispatch and combine under the other's compute (megatron/core/
    pipeline_parallel/combined_1f1b.py; torchtitan/distributed/dual_pipe_v.py; DeepSeek-V3
    report, Sec. 3.2.1), phase by phase (``pair_phases``: each MoE layer saves its compute
    and communication less the pair's time). Dispatches a recompute runs again are hidden
    as an even overlap hides them: all but ``k`` of each (``GPU.efficiency.comm_slowdown``,
    the slowdown fitted for every overlapped collective: the kernels take SMs and HBM
    bandwidth). A stage never goes below its ``host`` launch time (``host_floor``)."""
    a = r.a
    comb = a.schedule == SCHEDULE_CODES["combined-1f1b"]
    if framework(r.job.framework).dualpipev_ep_overlap:
        comb = comb | ((a.schedule == SCHEDULE_CODES["dualpipev"]) & (a.pp > 1) & (a.ep > 1)
                       & (a.recompute == RECOMPUTE_CODES["none"]))
    if a.dualpipe is not None:  # DualPipe's own pairs, costed as DualPipeV
        comb = comb | (a.dualpipe & (a.pp > 1) & (a.ep > 1))
    if not comb.any():
        return None, None
    k = min(r.cluster.gpu.efficiency.comm_slowdown, 1.0)
    pair = r.ep_pair
    saved = [np.maximum(lc.forward + lc.backward + 2 * pair
                        - pair_phases(lc.forward, lc.backward, lc.routed_forward, pair, k), 0.0)
             if r.costs.routed(i) else np.zeros_like(pair) for i, lc in enumerate(r.layers)]
    paired = r.routed_layers(r.counts) * (2 * pair)
    cap = r.per_stage(saved) + (1 - k) * np.maximum(ep_comm - paired, 0.0)
    cap = np.where(comb, cap, 0.0)
    return np.minimum(cap, np.maximum(stage_time - np.maximum(ep_comm, host), 0.0)), cap


def _floor(r: Rows, bare: np.ndarray, hidden: np.ndarray | None = None) -> np.ndarray:
    """``TimeTable.floor`` from the stage times without ZeRO-3/FSDP communication and
    gradient accumulation (``bare``): the pipeline bound of those (it grows with each stage
    time; zero bubble's forward share is not known for the whole family, so it counts none).
    Autocast (ZeRO 0 only) adds casts that FSDP's mixed precision does without, so the floor
    of a core leaves them out too: it then bounds the core's sharded configurations."""
    if r.autocast.any():
        costs, gpu, job, a = r.costs, r.cluster.gpu, r.job, r.a
        bare_layers = [costs.layer_compute(gpu, job, a, k, capacity_factor=r.cf)
                       for k in range(costs.kinds)]
        e0, h0 = costs.head_compute(gpu, job, a)
        emb, head = r.emb, r.head
        extra = r.per_stage([lc.forward + lc.backward - l0.forward - l0.backward
                             for lc, l0 in zip(r.layers, bare_layers, strict=True)],
                            emb.forward + emb.backward - e0.forward - e0.backward,
                            head.forward + head.backward - h0.forward - h0.backward) \
            + r.recomputed_sum([lc.forward - l0.forward
                                for lc, l0 in zip(r.layers, bare_layers, strict=True)]) \
            * (a.recompute == 2)
        bare = bare - extra
    bare = np.where(r.valid, bare, 0.0)
    sched = r.a.schedule
    return pipeline_bound(bare, None, r.count, r.m, r.v, np.where(sched == 2, 0, sched), hidden)


# ---- after the last backward: gradient sync, parameter gather, optimizer, offload ---------

@dataclass(frozen=True)
class _AfterBackward:
    """Per stage, seconds after the last backward: the gradient reduction (all of it,
    ``grad_sync``, and its exposed part) and the ZeRO-1/2 parameter gather after the optimizer
    (all of it, ``gather_after``, and its exposed part)."""

    grad_sync: np.ndarray
    grad_exposed: np.ndarray
    gather_after: np.ndarray
    gather_exposed: np.ndarray


def _last_bucket(r: Rows) -> np.ndarray:
    """The share of a stage's gradients in the last bucket of its reduction (at most 1)."""
    params = r.dense_params + r.exp_params
    if r.fw == "megatron":
        mg = r.soft["megatron"]
        bucket_params = np.maximum(float(mg["ddp_bucket_min_params"]),
                                   float(mg["ddp_bucket_params_per_dp_rank"]) * r.dp * r.cp)
        bucket = np.where(r.stage == 0, bucket_params / np.maximum(params, 1.0), 1.0)
    elif r.fw == "deepspeed":
        bucket = float(r.soft["deepspeed"]["reduce_bucket_size"]) / np.maximum(params, 1.0)
    else:
        cap = float(r.soft["torchtitan"]["ddp_bucket_cap_mib"]) * MIB
        bucket = cap / np.maximum(r.g_b * params, 1.0)
    return np.minimum(bucket, 1.0)


def _grad_sync(r: Rows, sh: Sharded) -> np.ndarray:
    """Seconds per stage of the once-per-step gradient reduction: an all-reduce without ZeRO,
    a reduce-scatter then an all-reduce across replicas with ZeRO-1 (Megatron-LM's ZeRO-2
    too) and under torch pipelining's no-sync; none when every micro-batch reduce-scatters."""
    # The experts' data-parallel group: dp * cp over the ways they split beyond tp.
    topo, g_b, tp, ep = r.topo, r.g_b, r.tp, r.ep_share
    dense, exp, z, z_exp = r.dense_params, r.exp_params, sh.z, sh.z_exp
    dpcp = r.dp * r.cp
    zero = r.a.zero
    once = (zero == 1) | ((zero == 2) & (r.fw == "megatron")) | sh.nosync
    rs_then_ar = (topo.reduce_scatter(g_b * dense, z, tp)
                  + topo.all_reduce(g_b * dense / z, dpcp / z, tp * z))
    if r.costs.is_moe:
        rs_then_ar = (rs_then_ar + topo.reduce_scatter(g_b * exp, z_exp, tp * ep)
                      + topo.all_reduce(g_b * exp / z_exp, dpcp / ep / z_exp,
                                        tp * ep * z_exp))
    if not np.any((zero == 0) & (z != 1)):
        # Without ZeRO the shard degree is 1 (ParallelConfig.shard_degree): the reduce-
        # scatter over one rank is free and the all-reduce is over all the replicas, the
        # plain all-reduce to the last bit.
        return np.where((zero == 0) | once, rs_then_ar, 0.0)
    all_reduce = topo.all_reduce(g_b * dense, dpcp, tp)
    if r.costs.is_moe:
        all_reduce = all_reduce + topo.all_reduce(g_b * exp, dpcp / ep, tp * ep)
    return np.where(zero == 0, all_reduce, np.where(once, rs_then_ar, 0.0))


def _after_backward(r: Rows, sh: Sharded, last_backward: np.ndarray, fwd: np.ndarray
                    ) -> _AfterBackward:
    """The gradient reduction and the parameter gather after the last backward.

    The reduction runs in buckets launched during the last micro-batch's backward when
    ``Job.overlap_grad_reduce``: exposed is ``max(comm - that backward, last bucket)``, and the
    hidden part slows the compute beside it (``comm_slowdown``); otherwise all of it. The
    ZeRO-1/2 parameter all-gather after the optimizer overlaps with the next forward in
    Megatron-LM (``--overlap-param-gather``) and is exposed in DeepSpeed."""
    job, fw, zero = r.job, r.fw, r.a.zero
    grad_sync = _grad_sync(r, sh)
    if job.overlap_grad_reduce:
        grad_exposed = np.maximum(grad_sync - last_backward, grad_sync * _last_bucket(r))
        slow = r.cluster.gpu.efficiency.comm_slowdown
        grad_exposed = grad_exposed + slow * (grad_sync - grad_exposed)
    else:
        grad_exposed = grad_sync
    # Megatron-LM's --fp8-param-gather all-gathers the updated parameters in fp8.
    gather_b = 1.0 if fw == "megatron" and job.precision == "fp8" and job.fp8_param_gather \
        else r.w_b
    gather_after = r.topo.all_gather(gather_b * r.dense_params, sh.z, r.tp)
    if r.costs.is_moe:
        gather_after = gather_after + r.topo.all_gather(gather_b * r.exp_params, sh.z_exp,
                                                        r.tp * r.ep_share)
    gather_after = np.where((zero == 1) | ((zero == 2) & (fw == "deepspeed")),
                            gather_after, 0.0)
    if fw == "megatron" and job.overlap_grad_reduce:
        gather_exposed = overlap(gather_after, fwd)
    else:
        gather_exposed = gather_after
    return _AfterBackward(grad_sync=grad_sync, grad_exposed=grad_exposed,
                          gather_after=gather_after, gather_exposed=gather_exposed)


def _optimizer_offload(r: Rows, sh: Sharded, last_backward: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per stage of the optimizer step on the GPU and of the offloaded one.

    On the GPU: memory-bound passes over its shard of the states (``optimizer_bytes``);
    Megatron-LM also zeroes its whole gradient buffer once per step. Offloaded: gradients to
    the host (overlapped like a bucketed reduction), the CPU Adam step (the node's CPU shared
    by its GPUs), updated parameters back to the GPU."""
    job, fw, gpu = r.job, r.fw, r.cluster.gpu
    local = r.dense_params / sh.z + r.exp_params / sh.z_exp  # shard degree 1 without ZeRO
    per_param, zeroed = optimizer_bytes(job, r.costs)
    opt_bytes = local * per_param + zeroed * (r.dense_params + r.exp_params)
    if fw == "torchtitan":
        # DDP (torchtitan without FSDP, TP, PP or CP) copies each fp32 gradient into its
        # bucket (gradient_as_bucket_view=False; software.toml [torch_ddp]): read + write 4
        # bytes per parameter (measured on an H100: 389 device copies, 3.8 ms for 1.3B).
        a = r.a
        pure_ddp = (a.zero == 0) & (a.tp == 1) & (a.pp == 1) & (a.cp == 1)
        ddp = r.soft["torch_ddp"]
        copy = 0.0 if ddp["gradient_as_bucket_view"] else 2 * r.g_b
        opt_bytes = opt_bytes + np.where(pure_ddp, copy * local, 0.0)
    gpu_opt = opt_bytes / (gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory)
    rate = float(r.soft["host"]["deepspeed_cpu_adam_params_per_s" if fw == "deepspeed"
                                else "torch_cpu_adam_params_per_s"]) / r.cluster.gpus_per_node
    host_bw = r.host_bw
    off = r.a.offload
    if not off.any():  # nothing offloaded (a search without offload in its space)
        return gpu_opt, np.zeros_like(gpu_opt)
    cpu_opt = local / rate
    d2h = r.g_b * local / host_bw
    h2d = r.w_b * local / host_bw
    d2h_exposed = overlap(d2h, last_backward) if job.overlap_grad_reduce else d2h
    optimizer = np.where(off >= 1, 0.0, gpu_opt)
    offload = np.where(off >= 1, cpu_opt + h2d + np.where(off == 1, d2h_exposed, 0.0), 0.0)
    return optimizer, offload


def _makespan(r: Rows, stage_time: np.ndarray, f_stage: np.ndarray, bound: np.ndarray,
              after: np.ndarray, exact_below: float, hidden: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(the pipeline's time per row, whether it is the schedule played out): rows whose bound
    is already their pipeline time (one stage, GPipe) and rows whose bound plus ``after``
    exceeds ``exact_below`` keep the bound."""
    a = r.a
    played = (a.pp > 1) & (a.schedule != 2)
    exact = ~played | (bound + after <= exact_below)
    todo = np.flatnonzero(played & exact)
    pipeline = bound.copy()
    pipeline[todo] = table_makespan(f_stage, stage_time - f_stage, r.stage, r.count, a.pp,
                                    r.mem.num_micro_batches, a.v, a.schedule, todo, hidden)
    return pipeline, exact


def time_table(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, a: ConfigArrays,
               mem: MemoryTable, detail: bool = True, exact_below: float = np.inf
               ) -> TimeTable:
    """Step time and its terms for every configuration of ``a`` (assumed valid).

    ``detail``: also the total communication by kind, the hardware FLOPs and the forward
    shares (what ``estimate`` reports; a search reads only the step time, terms and floor).
    ``exact_below`` (s): play the pipeline schedule out only for rows whose lower bound on the
    step time is at most this (a search's current k-th best); the others keep the bound.
    """
    r = table_rows(model, cluster, job, a, mem)
    ls, em, hd = r.layers, r.emb, r.head
    tp = tensor_parallel(r)
    cp_comm, cp_layer = context_parallel(r)
    ep_comm = expert_parallel(r, cp_comm)
    sh = sharded(r)
    accumulate = accumulation_time(r, sh)

    # ---- per stage, per micro-batch -------------------------------------------------------
    fwd = r.per_stage([lc.forward for lc in ls], em.forward, hd.forward)
    bwd = r.per_stage([lc.backward for lc in ls], em.backward, hd.backward) + accumulate
    recompute = recompute_time(r)
    pp_comm, pp_total = p2p_time(r, fwd)
    busy = fwd + bwd + recompute + tp.exposed + cp_comm + ep_comm + sh.exposed + pp_comm
    host = host_floor(r)
    stage_time = np.where(r.valid, np.maximum(busy, host), 0.0)
    host_wait = np.where(r.valid, np.maximum(host - busy, 0.0), 0.0)

    # ---- pipeline makespan ----------------------------------------------------------------
    # The schedule played out (costmodel.formulas.pipeline): each stage's time per micro-batch split
    # into its forward and backward by the forward pass's share of its compute (recompute
    # runs with the backward), communication pro rata.
    m = r.m
    t_max = stage_time.max(axis=0)
    b = first_argmax(stage_time)
    rows = np.arange(a.rows)

    def picker(idx: np.ndarray) -> Callable[[np.ndarray | float], np.ndarray]:
        """A function giving an array's value at each row's stage ``idx``: np.take at the
        flat positions, several times faster than numpy's indexing by (stage, row) pairs."""
        pos = idx * a.rows + rows

        def at(x: np.ndarray | float) -> np.ndarray:
            x = np.asarray(x)
            if x.shape == stage_time.shape:
                return np.take(x.ravel(), pos)
            if x.ndim < 2 or x.shape[0] == 1:  # the same at every stage
                return np.array(np.broadcast_to(x, stage_time.shape)[0])
            return np.broadcast_to(x, stage_time.shape)[idx, rows]
        return at

    at_b = picker(b)
    share = fwd / np.maximum(fwd + bwd + recompute, 1e-30)
    f_stage = stage_time * share
    hidden, cap = pair_saving(r, ep_comm, stage_time, host)
    bound = pipeline_bound(stage_time, f_stage, r.count, m, r.v, a.schedule, hidden)
    # Gradient accumulation shrinks with the shard degree, so the floor leaves it out too.
    floor = _floor(r, stage_time - sh.exposed - accumulate, cap)

    last_backward = bwd + recompute
    ab = _after_backward(r, sh, last_backward, fwd)
    optimizer, offload = _optimizer_offload(r, sh, last_backward)
    post = np.where(r.valid, ab.grad_exposed + ab.gather_exposed + optimizer + offload, 0.0)
    q = first_argmax(post)
    at_q = picker(q)
    after = at_q(post)
    pipeline, exact = _makespan(r, stage_time, f_stage, bound, after, exact_below, hidden)
    # What the bottleneck stage's overlapped pairs hide of its expert all-to-alls.
    saved = 0.0 if hidden is None else at_b(pairs(r.count, m, r.v, a.schedule) * hidden / r.v)
    # Never below zero but by rounding (the busiest rank works at least m t less its pairs'
    # savings); a near-bubble-free schedule (ZB-V) would print -0.0.
    bubble = np.maximum(pipeline - (m * t_max - saved), 0.0)
    step = pipeline + after

    terms = {
        "compute": m * (at_b(fwd) + at_b(bwd)),
        "recompute": m * at_b(recompute),
        "host": m * at_b(host_wait),
        "tp_comm": m * at_b(tp.exposed),
        "cp_comm": m * at_b(cp_comm),
        "ep_comm": m * at_b(ep_comm) - saved,
        "pp_comm": m * at_b(pp_comm),
        "fsdp_comm": m * at_b(sh.exposed),
        "dp_comm": at_q(ab.grad_exposed) + at_q(ab.gather_exposed),
        "bubble": bubble,
        "optimizer": at_q(optimizer),
        "offload": at_q(offload),
    }
    mf = float(model_flops_per_token(model, job.seq_len) * job.tokens_per_step)
    if not detail:
        return TimeTable(step_time=step, terms=terms, comm_total={}, stage_time=stage_time,
                         bottleneck_stage=b, model_flops=mf, hardware_flops=None,
                         floor=floor, exact=exact)
    tp_total = r.per_stage(tp.layer_total, tp.emb, tp.head) \
        + tp.rec_total
    comm_total = {
        "tp": m * at_b(tp_total),
        "cp": m * at_b(r.per_stage(cp_layer)),
        "ep": m * at_b(ep_comm),  # all of it is exposed
        "pp": m * at_b(pp_total),
        "fsdp": m * at_b(sh.wire + sh.copy),
        "dp": at_q(ab.grad_sync + ab.gather_after),
    }
    return TimeTable(step_time=step, terms=terms, comm_total=comm_total, stage_time=stage_time,
                     bottleneck_stage=b, model_flops=mf, hardware_flops=mf + _recompute_flops(r),
                     floor=floor, forward_share=share, exact=exact, hidden=hidden)


def _recompute_flops(r: Rows) -> np.ndarray:
    """FLOPs recompute adds to the step over all GPUs: the forward of what it re-runs."""
    mode = r.a.recompute
    rec = np.where(mode == 2, r.recomputed_sum([lc.forward_flops for lc in r.layers]),
                   np.where(mode == 1, r.per_stage([lc.selective_flops for lc in r.layers]),
                            0.0))
    return r.m * (rec * r.count).sum(axis=0) * r.tp * r.dp * r.cp

"""Time of one training step for a table of configurations: compute, communication, pipeline,
optimizer and offload, with what overlaps and what is exposed.

One vectorized numpy pass, like ``costmodel.memory``; ``estimate()`` evaluates a table of one.

Per micro-batch, each pipeline stage spends (per GPU, seconds):

    t_i = forward + backward (with the gradient accumulation of micro-batches after the
          first) + recompute + exposed TP, CP, EP, ZeRO-3/FSDP and PP comm

and the step is the pipeline's makespan plus what follows the last backward:

    step = makespan(t_0 .. t_{p-1}) + max_i (exposed gradient reduction + parameter gather
           + optimizer + offload)

The makespan is the trainer's schedule played out op by op (``costmodel.pipeline``: GPipe,
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
  (``Job.tp_comm_overlap``) chunks each TP collective with its matmul in forward and
  backward.
- Hidden FSDP and data-parallel communication still slows the compute beside it by
  ``GPU.efficiency.comm_slowdown`` seconds per second (fitted).
- Optimizer step: memory-bound over the GPU's shard of the states. With CPU offload: gradients
  to the host (overlapped like a bucketed reduction), the CPU Adam step (the node's CPU shared
  by its GPUs), updated parameters back to the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hardware_profiles
from costmodel.comm import Topology
from costmodel.compute import (
    LayerCompute,
    autocast_rows,
    layer_compute,
    lm_head_compute,
    memory_time,
)
from costmodel.config import Job
from costmodel.frameworks import framework
from costmodel.hardware import Cluster
from costmodel.memory import (
    ConfigArrays,
    MemoryTable,
    first_argmax,
    layer_params_per_gpu,
    optimizer_state_bytes,
    state_bytes,
)
from costmodel.model import ModelSpec
from costmodel.pipeline import pipeline_bound, table_makespan

__all__ = ["COMM_KINDS", "TIME_TERMS", "TimeTable", "model_flops_per_token", "optimizer_bytes",
           "time_table"]

COMM_KINDS = ("tp", "cp", "ep", "pp", "fsdp", "dp")
TIME_TERMS = ("compute", "recompute", *(f"{k}_comm" for k in COMM_KINDS), "bubble",
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
    ``forward_share`` (None). ``exact`` ``[rows]``: whether the row's pipeline time is its
    schedule played out (``costmodel.pipeline``); rows of a table made with ``exact_below``
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


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per trained token, forward and backward: ``6 N + 12 L q s`` (PaLM,
    Chowdhery et al. 2022, App. B), with N the parameters that take part in a matmul per token
    (active experts only; not the input embedding table, which is a lookup, unless tied to the
    output layer) and ``q = heads * head_dim``, counting the full s x s attention.
    """
    n = model.num_active_params() - model.embedding_params()
    if model.tied_embeddings and not model.patch_size:
        n += model.vocab_size * model.hidden_size
    return 6.0 * n + 12.0 * model.num_layers * model.q_dim * seq_len


def optimizer_bytes(job: Job, model: ModelSpec) -> tuple[float, float]:
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
    p = g = 4.0  # every trainer keeps fp32 parameters (or masters) and fp32 optimizer gradients
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


def _overlap(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Exposed part of ``comm`` run beside ``window`` seconds of compute."""
    return np.maximum(comm - window, 0.0)


def time_table(model: ModelSpec, cluster: Cluster, job: Job, a: ConfigArrays,
               mem: MemoryTable, detail: bool = True, exact_below: float = np.inf
               ) -> TimeTable:
    """Step time and its terms for every configuration of ``a`` (assumed valid).

    ``detail``: also the total communication by kind, the hardware FLOPs and the forward
    shares (what ``estimate`` reports; a search reads only the step time, terms and floor).
    ``exact_below`` (s): play the pipeline schedule out only for rows whose lower bound on the
    step time is at most this (a search's current k-th best); the others keep the bound.
    """
    fw = job.framework
    gpu = cluster.gpu
    topo = Topology.of(cluster)
    soft = hardware_profiles.load_software()
    e = 4.0 if job.precision == "fp32" else 2.0
    w_b, g_b, _ = state_bytes(job, model)
    if fw == "torchtitan":
        g_b = float(soft["torchtitan"]["reduce_dtype_bytes"])
    cf = float(job.moe_capacity_factor or 1.0)

    st = a.stage_major  # [P, rows], like mem's arrays
    stage = st.index
    count = st.count
    valid = mem.valid
    first = (stage == 0)
    last = (stage == a.pp - 1)
    m = mem.num_micro_batches.astype(float)
    tp, cp, dp, pp, ep = (x.astype(float) for x in (a.tp, a.cp, a.dp, a.pp, a.ep))
    v = a.v.astype(float)
    zero = a.zero
    mode = a.recompute
    tokens = job.seq_len / cp * a.mbs
    h = float(model.hidden_size)
    sp = a.sp == 1

    # ---- compute per layer per micro-batch ------------------------------------------------
    ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    dense = layer_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=False, autocast=ac)
    moe = (layer_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=True,
                         capacity_factor=cf, ep=a.ep, autocast=ac) if model.is_moe else dense)
    emb, head = lm_head_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, autocast=ac)

    # ---- tensor parallel: per layer, forward and backward ---------------------------------
    act = e * tokens * h  # one activation tensor, all of it
    ar = topo.all_reduce(act, tp, 1.0)
    ag = topo.all_gather(act, tp, 1.0)
    # Without SP: two all-reduces per pass; with SP: two all-gathers and two reduce-scatters
    # (reduce-scatter costs what all-gather does).
    tp_pass = np.where(sp, 2 * (ag + ag), 2 * ar)

    # Megatron-LM with Transformer Engine's userbuffers (Job.tp_comm_overlap, SP rows only)
    # pipelines each linear's matmul with its all-gather or reduce-scatter, split into tp
    # chunks, so that all but one chunk of the matmul hides a chunk of the collective: in
    # forward all four, in backward also the row-parallel output-gradient gathers beside their
    # input-gradient matmuls; the column-parallel ones stay bulk-overlapped as without it
    # (megatron/core/model_parallel_config.py: tp_comm_overlap, tp_comm_overlap_ag/_rs,
    # tp_comm_bulk_wgrad/_dgrad).
    pipelined = fw in ("megatron", "torchtitan") and job.tp_comm_overlap
    chunked = (tp - 1) / tp

    def tp_backward(lc: LayerCompute) -> np.ndarray:
        """Exposed TP communication of one layer's backward pass.

        Megatron-LM's column-parallel linears (QKV, MLP input) launch their input-gradient
        collective asynchronously and compute the weight gradient meanwhile; with SP they also
        re-gather their input during the input-gradient matmul
        (``LinearWithGradAccumulationAndAsyncCommunication``; Korthikanti et al. 2022,
        Sec. 4.2.2 and 6.2). The gradient gathers of the row-parallel outputs (SP) stay exposed.
        Without SP the overlap needs ``Job.overlap_tp_grad_comm`` (Megatron-LM's
        ``--async-tensor-model-parallel-allreduce``, from August 2021). With userbuffers the
        output-gradient gathers are pipelined with their input-gradient matmuls too.
        """
        if fw == "torchtitan":
            # Async TP micro-pipelines the backward's matmul + collective pairs as it does
            # the forward's (Job.tp_comm_overlap).
            return tp_forward(lc)
        if fw != "megatron":
            return tp_pass
        windows = (lc.qkv_gemm, lc.up_gemm)
        gathers = sum(_overlap(ag, chunked * w) for w in (lc.proj_gemm, lc.down_gemm)) \
            if pipelined else 2 * ag
        exposed_sp = gathers + sum(2 * _overlap(ag, w) for w in windows)
        exposed_ar = sum(_overlap(ar, w) for w in windows) if job.overlap_tp_grad_comm \
            else 2 * ar
        return np.where(sp, exposed_sp, exposed_ar)

    def tp_forward(lc: LayerCompute) -> np.ndarray:
        """Exposed TP communication of one layer's forward pass."""
        if not pipelined:
            return tp_pass
        gemms = (lc.qkv_gemm, lc.proj_gemm, lc.up_gemm, lc.down_gemm)
        return np.where(sp, sum(_overlap(ag, chunked * w) for w in gemms), tp_pass)

    tp_dense_f = tp_forward(dense)
    tp_moe_f = tp_forward(moe)
    tp_dense_b = tp_backward(dense)
    tp_moe_b = tp_backward(moe)
    tp_dense_total = 2 * tp_pass + np.where(sp & (fw == "megatron"), 2 * ag, 0.0)
    # Vocabulary-parallel embedding: all-reduce (SP: reduce-scatter) of its output; LM head:
    # all-gather of its input with SP, all-reduce of the input gradient without; the
    # vocabulary-parallel cross entropy all-reduces 3 fp32 values per token (max, sum, target).
    tp_emb = np.where(sp, ag, ar)
    tp_head = np.where(sp, 2 * ag, ar) + 3 * topo.all_reduce(4.0 * tokens, tp, 1.0)

    # ---- context parallel: ring exchange of K and V -------------------------------------
    kv_block = 2 * e * tokens * model.kv_dim / tp
    ring_step = np.where(cp > 1, topo.ring_step(kv_block, cp, tp), 0.0)
    cp_f_dense = (cp - 1) * _overlap(ring_step, dense.core_forward / cp)
    cp_b_dense = (cp - 1) * _overlap(2 * ring_step, dense.core_backward / cp)
    cp_f_moe = (cp - 1) * _overlap(ring_step, moe.core_forward / cp)
    cp_b_moe = (cp - 1) * _overlap(2 * ring_step, moe.core_backward / cp)
    cp_total_layer = (cp - 1) * 3 * ring_step

    # ---- expert parallel: dispatch and combine all-to-alls per MoE layer pass -------------
    if model.is_moe:
        a2a = 2 * topo.all_to_all(e * tokens * model.top_k * cf * h, ep, tp)
    else:
        a2a = np.zeros_like(tokens)

    # ---- ZeRO-3 / FSDP per-layer gathers and reduce-scatters -----------------------------
    comp_b = 4.0 if job.precision == "fp32" else 2.0  # parameters are gathered in this dtype
    z = a.shard.astype(float)
    z_exp = np.maximum(z / ep, 1.0)
    ag_fwd = (zero == 3) | ((zero == 2) & (fw == "torchtitan"))
    ag_bwd = zero == 3
    rs_each = (zero == 3) | ((zero == 2) & (fw in ("torchtitan", "deepspeed")))
    # torch.distributed.pipelining runs every backward but a stage's last with FSDP's gradient
    # sync off (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync:
    # set_requires_gradient_sync(last_backward)): the stage's gradients accumulate unsharded
    # and are reduce-scattered once per step, like a data-parallel all-reduce.
    nosync = framework(fw).torch_pipelining & (a.pp > 1) & (zero >= 2)
    rs_each = rs_each & ~nosync
    dense_local, moe_local, exp_local = layer_params_per_gpu(model, tp, ep)
    host = gpu.host()
    host_bw = host.achieved_bytes_per_s
    params_offloaded = a.offload == 2

    def gather(params: np.ndarray, group: np.ndarray, stride: np.ndarray) -> np.ndarray:
        t = topo.all_gather(comp_b * params, group, stride)
        # Offloaded parameters first cross PCIe, the GPU's shard of them.
        return t + np.where(params_offloaded, w_b * params / group / host_bw, 0.0)

    def scatter(params: np.ndarray, group: np.ndarray, stride: np.ndarray) -> np.ndarray:
        t = topo.reduce_scatter(g_b * params, group, stride)
        # HSDP: the shards are then all-reduced across the replicas.
        replicas = dp * cp / z
        t = t + topo.all_reduce(g_b * params / group, replicas, tp * z)
        return t + np.where(params_offloaded, g_b * params / group / host_bw, 0.0)

    ag_dense = np.where(ag_fwd, gather(dense_local, z, tp), 0.0)
    rs_dense = np.where(rs_each, scatter(dense_local, z, tp), 0.0)
    if model.is_moe:
        ag_moe = np.where(ag_fwd, gather(moe_local, z, tp) + gather(exp_local, z_exp, tp * ep),
                          0.0)
        rs_moe = np.where(rs_each,
                          scatter(moe_local, z, tp) + scatter(exp_local, z_exp, tp * ep), 0.0)
    else:
        ag_moe, rs_moe = ag_dense, rs_dense
    # Per-micro-batch reduce-scatters hide behind backward unless overlap is off (DeepSpeed
    # ZeRO-2 with overlap_comm false); ZeRO-3 prefetching always overlaps.
    hide = np.where(zero == 3, 1.0, 1.0 if job.overlap_grad_reduce else 0.0)
    fs_f_dense = _overlap(ag_dense, dense.forward)
    fs_b_dense = _overlap(np.where(ag_bwd, ag_dense, 0.0) + rs_dense, hide * dense.backward)
    fs_f_moe = _overlap(ag_moe, moe.forward)
    fs_b_moe = _overlap(np.where(ag_bwd, ag_moe, 0.0) + rs_moe, hide * moe.backward)
    fs_edges = ag_dense + rs_dense  # first gather and last reduce-scatter of a micro-batch

    # ---- gradient accumulation, per micro-batch after the first --------------------------
    # Each later micro-batch adds its weight gradients into the accumulated ones: read both,
    # write the sum, 3 gradient-sized passes per parameter (PyTorch's AccumulateGrad adds in
    # place; Megatron-LM's DDP hook adds param.grad into main_grad). Gradients reduce-scattered
    # every micro-batch (ZeRO-2/3, FSDP) accumulate in the GPU's shard. Megatron-LM's
    # --gradient-accumulation-fusion has the weight-gradient matmul add into main_grad itself
    # (fused_weight_gradient_mlp_cuda, commit 83b1e42f of February 2022; Transformer Engine),
    # leaving the norm and bias gradients, a negligible share, out here too.
    dense_params = mem.layer_params - mem.expert_params + mem.embedding_params
    exp_params = mem.expert_params
    if fw == "megatron" and job.fuse_grad_accumulation:
        accumulate = np.zeros_like(dense_params)
    else:
        acc_params = np.where(rs_each, dense_params / z + exp_params / z_exp,
                              dense_params + exp_params)
        later = (m - 1) / m  # the share of micro-batches that add into others
        accumulate = memory_time(gpu, 3 * g_b * acc_params, 0.0) * later

    # ---- per stage, per micro-batch -------------------------------------------------------
    nl = mem.num_layers.astype(float)
    nm = mem.moe_layers.astype(float)
    nd = nl - nm
    rd = mem.recomputed_dense.astype(float)
    rm = mem.recomputed_moe.astype(float)

    def per_stage(d: np.ndarray, mo: np.ndarray, e_: np.ndarray | float = 0.0,
                  hd: np.ndarray | float = 0.0) -> np.ndarray:
        """Sum over a stage's layers of a per-layer quantity (dense, MoE, embedding, head)."""
        out = nd * d + nm * mo if model.is_moe else nl * d
        if not np.isscalar(e_) or e_ != 0.0:
            out = out + np.where(first, np.broadcast_to(e_, d.shape), 0.0)
        if not np.isscalar(hd) or hd != 0.0:
            out = out + np.where(last, np.broadcast_to(hd, d.shape), 0.0)
        return out

    fwd = per_stage(dense.forward, moe.forward, emb.forward, head.forward)
    bwd = per_stage(dense.backward, moe.backward, emb.backward, head.backward) + accumulate
    rec_full = rd * dense.forward + rm * moe.forward
    rec_sel = per_stage(dense.selective, moe.selective)
    recompute = np.where(mode == 2, rec_full, np.where(mode == 1, rec_sel, 0.0))
    rec_layers = np.where(mode == 2, rd + rm, 0.0)

    # Full recompute runs each recomputed layer's forward collectives again.
    rec_tp = rd * tp_dense_f + rm * tp_moe_f if pipelined else rec_layers * tp_pass
    tp_comm = per_stage(tp_dense_f + tp_dense_b, tp_moe_f + tp_moe_b, tp_emb, tp_head) + rec_tp
    cp_comm = per_stage(cp_f_dense + cp_b_dense, cp_f_moe + cp_b_moe)
    ep_comm = (nm * (2 * a2a) + rm * a2a * (mode == 2) if model.is_moe
               else np.zeros_like(cp_comm))
    fsdp_comm = per_stage(fs_f_dense + fs_b_dense, fs_f_moe + fs_b_moe) + fs_edges * valid
    # FSDP2's own copies on the compute stream (torchtitan; torch/distributed/fsdp/_fully_shard/
    # _fsdp_collectives.py): each all-gather's copy-out splits the gathered flat buffer into the
    # unsharded parameters (split_with_sizes_copy: read and write comp_b bytes per parameter),
    # and each reduce-scatter's copy-in casts the unsharded gradients into the flat buffer of
    # the reduce dtype (foreach_reduce_scatter_copy_in: read comp_b, write g_b), one kernel each
    # per FSDP unit (each layer, the embedding, the head). The all-gather's copy-in, the cast of
    # the shard, runs on a stream of its own beside the compute. They happen on one GPU too.
    if fw == "torchtitan":
        units = (nl + first + last) * valid
        copy_bytes = np.where(ag_fwd, 2 * comp_b * (1 + ag_bwd) + comp_b + g_b, 0.0)
        copy_kernels = np.where(ag_fwd, 2.0 + ag_bwd, 0.0)
        fsdp_copy = memory_time(gpu, copy_bytes * (dense_params + exp_params),
                                copy_kernels * units)
        fsdp_comm = fsdp_comm + fsdp_copy
    else:
        fsdp_copy = 0.0

    # Pipeline send/receive, twice per micro-batch per model chunk.
    scatter_gather = fw == "megatron"
    p2p_bytes = np.where(sp | scatter_gather, act / tp, act)
    p2p = topo.p2p(p2p_bytes, tp * cp * dp)
    if scatter_gather:
        p2p = p2p + np.where(sp, 0.0, topo.all_gather(act, tp, 1.0))
    pp_total = np.where(pp > 1, 2 * v * p2p, 0.0) * valid
    pp_comm = pp_total
    if fw == "megatron" and job.overlap_p2p_comm:
        # Megatron-LM's interleaved 1F1B posts each chunk's send and the next chunk's receive
        # asynchronously and waits for them one chunk later (--overlap-p2p-communication,
        # May 2023, the default since October 2023, commit 4eeff55d; off without
        # interleaving): each transfer hides behind one chunk's forward pass.
        exposed = _overlap(p2p, fwd / v)
        pp_comm = np.where(a.schedule == 1, 2 * v * exposed * valid, pp_total)

    # Communication hidden behind compute still slows it: NCCL's kernels take SMs and HBM
    # bandwidth from the compute kernels beside them (GPU.efficiency.comm_slowdown, fitted by
    # planner calibrate). Counted for the collectives that run beside compute for most of a
    # step, FSDP's gathers and reduce-scatters (their term carries it) and the data-parallel
    # gradient reduction (below); applied to TP and CP too, the fit lost the Korthikanti et
    # al. 2022 runs (4 % instead of 2.5 %), whose overlap windows are single matmuls.
    fsdp_wire = per_stage(ag_dense * (1 + ag_bwd) + rs_dense, ag_moe * (1 + ag_bwd) + rs_moe)
    slow = gpu.efficiency.comm_slowdown
    if slow > 0:
        fsdp_comm = fsdp_comm + slow * np.maximum(fsdp_wire - (fsdp_comm - fsdp_copy), 0.0)
    stage_time = fwd + bwd + recompute + tp_comm + cp_comm + ep_comm + fsdp_comm + pp_comm
    stage_time = np.where(valid, stage_time, 0.0)

    # ---- pipeline makespan ----------------------------------------------------------------
    # The schedule played out (costmodel.pipeline): each stage's time per micro-batch split
    # into its forward and backward by the forward pass's share of its compute (recompute
    # runs with the backward), communication pro rata.
    t_max = stage_time.max(axis=0)
    b = first_argmax(stage_time)
    rows = np.arange(a.rows)
    sched = a.schedule
    share = fwd / np.maximum(fwd + bwd + recompute, 1e-30)
    f_stage = stage_time * share
    bound = pipeline_bound(stage_time, f_stage, count, m, v, sched)
    # The floor: the bound without ZeRO-3/FSDP communication (it grows with each stage time;
    # zero bubble's forward share is not known for the whole family, so it counts none).
    # Autocast (ZeRO 0 only) adds casts that FSDP's mixed precision does without, so the floor
    # of a core leaves them out too: it then bounds the core's sharded configurations.
    # Gradient accumulation shrinks with the shard degree, so the floor leaves it out too.
    bare = stage_time - fsdp_comm - accumulate
    if ac.any():
        d0 = layer_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=False)
        m0 = (layer_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=True,
                            capacity_factor=cf, ep=a.ep) if model.is_moe else d0)
        e0, h0 = lm_head_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp)
        extra = per_stage(dense.forward + dense.backward - d0.forward - d0.backward,
                          moe.forward + moe.backward - m0.forward - m0.backward,
                          emb.forward + emb.backward - e0.forward - e0.backward,
                          head.forward + head.backward - h0.forward - h0.backward) \
            + (rd * (dense.forward - d0.forward) + rm * (moe.forward - m0.forward)) \
            * (mode == 2)
        bare = bare - extra
    bare = np.where(valid, bare, 0.0)
    floor = pipeline_bound(bare, None, count, m, v, np.where(sched == 2, 0, sched))

    # ---- after the last backward: gradient sync, parameter gather, optimizer, offload -----
    dpcp = dp * cp
    all_reduce = topo.all_reduce(g_b * dense_params, dpcp, tp)
    rs_then_ar = (topo.reduce_scatter(g_b * dense_params, z, tp)
                  + topo.all_reduce(g_b * dense_params / z, dpcp / z, tp * z))
    if model.is_moe:
        all_reduce = all_reduce + topo.all_reduce(g_b * exp_params, dpcp / ep, tp * ep)
        rs_then_ar = (rs_then_ar + topo.reduce_scatter(g_b * exp_params, z_exp, tp * ep)
                      + topo.all_reduce(g_b * exp_params / z_exp, dpcp / ep / z_exp,
                                        tp * ep * z_exp))
    grad_sync = np.where(zero == 0, all_reduce,
                         np.where((zero == 1) | ((zero == 2) & (fw == "megatron")) | nosync,
                                  rs_then_ar, 0.0))
    if fw == "megatron":
        mg = soft["megatron"]
        bucket_params = np.maximum(float(mg["ddp_bucket_min_params"]),
                                   float(mg["ddp_bucket_params_per_dp_rank"]) * dpcp)
        bucket = np.where(stage == 0, bucket_params / np.maximum(dense_params + exp_params, 1.0),
                          1.0)
    elif fw == "deepspeed":
        bucket = float(soft["deepspeed"]["reduce_bucket_size"]) \
            / np.maximum(dense_params + exp_params, 1.0)
    else:
        cap = float(soft["torchtitan"]["ddp_bucket_cap_mib"]) * 1024**2
        bucket = cap / np.maximum(g_b * (dense_params + exp_params), 1.0)
    bucket = np.minimum(bucket, 1.0)
    last_backward = bwd + recompute
    if job.overlap_grad_reduce:
        grad_exposed = np.maximum(grad_sync - last_backward, grad_sync * bucket)
        grad_exposed = grad_exposed + slow * (grad_sync - grad_exposed)
    else:
        grad_exposed = grad_sync
    # Megatron-LM's --fp8-param-gather all-gathers the updated parameters in fp8.
    gather_b = 1.0 if fw == "megatron" and job.precision == "fp8" and job.fp8_param_gather \
        else w_b
    gather_after = topo.all_gather(gather_b * dense_params, z, tp)
    if model.is_moe:
        gather_after = gather_after + topo.all_gather(gather_b * exp_params, z_exp, tp * ep)
    gather_after = np.where((zero == 1) | ((zero == 2) & (fw == "deepspeed")),
                            gather_after, 0.0)
    if fw == "megatron" and job.overlap_grad_reduce:
        gather_exposed = _overlap(gather_after, fwd)
    else:
        gather_exposed = gather_after

    # Optimizer: memory-bound passes over the GPU's shard of the states (optimizer_bytes);
    # Megatron-LM also zeroes its whole gradient buffer once per step.
    local = dense_params / z + exp_params / z_exp  # the shard degree is 1 without ZeRO
    per_param, zeroed = optimizer_bytes(job, model)
    opt_bytes = local * per_param + zeroed * (dense_params + exp_params)
    if fw == "torchtitan":
        # DDP (torchtitan without FSDP, TP, PP or CP) copies each fp32 gradient into its
        # bucket (gradient_as_bucket_view=False; software.toml [torch_ddp]): read + write 4
        # bytes per parameter (measured on an H100: 389 device copies, 3.8 ms for 1.3B).
        pure_ddp = (zero == 0) & (a.tp == 1) & (a.pp == 1) & (a.cp == 1)
        ddp = soft["torch_ddp"]
        copy = 0.0 if ddp["gradient_as_bucket_view"] else 2 * g_b
        opt_bytes = opt_bytes + np.where(pure_ddp, copy * local, 0.0)
    gpu_opt = opt_bytes / (gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory)
    host_soft = soft["host"]
    rate = float(host_soft["deepspeed_cpu_adam_params_per_s" if fw == "deepspeed"
                           else "torch_cpu_adam_params_per_s"]) / cluster.gpus_per_node
    off = a.offload
    cpu_opt = local / rate
    d2h = g_b * local / host_bw
    h2d = w_b * local / host_bw
    d2h_exposed = _overlap(d2h, last_backward) if job.overlap_grad_reduce else d2h
    optimizer = np.where(off >= 1, 0.0, gpu_opt)
    offload = np.where(off >= 1, cpu_opt + h2d + np.where(off == 1, d2h_exposed, 0.0), 0.0)
    post = np.where(valid, grad_exposed + gather_exposed + optimizer + offload, 0.0)
    q = first_argmax(post)
    after = post[q, rows]
    # Rows whose bound is already their pipeline time need no playing out (one stage, GPipe).
    played = (a.pp > 1) & (sched != 2)
    exact = ~played | (bound + after <= exact_below)
    todo = np.flatnonzero(played & exact)
    pipeline = bound.copy()
    pipeline[todo] = table_makespan(f_stage, stage_time - f_stage, stage, count, a.pp,
                                    mem.num_micro_batches, a.v, sched, todo)
    bubble = pipeline - m * t_max
    step = pipeline + after

    def at(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``x`` at each row's stage ``idx``."""
        return np.broadcast_to(x, stage_time.shape)[idx, rows]

    terms = {
        "compute": m * (at(fwd, b) + at(bwd, b)),
        "recompute": m * at(recompute, b),
        "tp_comm": m * at(tp_comm, b),
        "cp_comm": m * at(cp_comm, b),
        "ep_comm": m * at(ep_comm, b),
        "pp_comm": m * at(pp_comm, b),
        "fsdp_comm": m * at(fsdp_comm, b),
        "dp_comm": at(grad_exposed, q) + at(gather_exposed, q),
        "bubble": bubble,
        "optimizer": at(optimizer, q),
        "offload": at(offload, q),
    }
    mf = model_flops_per_token(model, job.seq_len) * job.tokens_per_step
    if not detail:
        return TimeTable(step_time=step, terms=terms, comm_total={}, stage_time=stage_time,
                         bottleneck_stage=b, model_flops=float(mf), hardware_flops=None,
                         floor=floor, exact=exact)
    tp_total = per_stage(tp_dense_total, tp_dense_total, tp_emb, tp_head) \
        + rec_layers * tp_pass
    cp_total = per_stage(cp_total_layer, cp_total_layer)
    fsdp_total = fsdp_wire + fsdp_copy
    comm_total = {
        "tp": m * at(tp_total, b),
        "cp": m * at(cp_total, b),
        "ep": m * at(ep_comm, b),  # all of it is exposed
        "pp": m * at(pp_total, b),
        "fsdp": m * at(fsdp_total, b),
        "dp": at(grad_sync + gather_after, q),
    }

    # FLOPs of the step over all GPUs; recompute adds the forward of what it re-runs.
    rec_flops = np.where(mode == 2,
                         rd * dense.forward_flops + rm * moe.forward_flops,
                         np.where(mode == 1, per_stage(dense.selective_flops,
                                                       moe.selective_flops), 0.0))
    rec_total = m * (rec_flops * count).sum(axis=0) * tp * dp * cp
    return TimeTable(
        step_time=step,
        terms=terms,
        comm_total=comm_total,
        stage_time=stage_time,
        bottleneck_stage=b,
        model_flops=float(mf),
        hardware_flops=mf + rec_total,
        floor=floor,
        forward_share=share,
        exact=exact,
    )

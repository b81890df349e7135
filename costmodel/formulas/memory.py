"""Training memory per GPU, by term and by pipeline stage, for a whole table of configurations.

What a layer, the embedding and the head hold and keep is read from the model's
``LayerCosts`` (``costmodel.formulas.layercosts``; a preset's formulas, or a traced graph's blocks);
everything else here (ZeRO, offload, schedules, buffers) is the same for every model.

One vectorized numpy pass serves the search (thousands of rows) and ``estimate()`` (a table of
one row), so the two can never disagree. Per-stage results are arrays of shape ``[P, rows]``
(stage-major) where ``P`` is the number of stage columns of the table; columns beyond a row's
stages are masked out. Stage-major, a per-row quantity broadcasts against them along numpy's
contiguous axis: with a handful of stages and rows-major arrays every such operation would
loop over the rows in Python-sized steps of P elements, several times slower.

Terms (bytes per GPU):

- weights, gradients, optimizer states: bytes per parameter by trainer and precision
  (``state_bytes``), sharded by ZeRO stage over ``sharding_group * cp`` ranks (experts over
  that divided by ``ep``), moved to CPU by offload.
- activations: bytes saved for backward per layer per micro-batch
  (``LayerCosts.layer_activations``: Korthikanti et al. 2022, Sec. 4 and Table 2, for a
  preset), times the micro-batches a stage holds in flight under its pipeline schedule
  (``costmodel.formulas.stagelayout``), plus the embedding and output layers on the first
  and last stage (Korthikanti et al. 2022, Sec. 4.3).
- buffers: transient working sets: ZeRO-3/FSDP gathered parameters, gradient buckets, the
  recompute working set of one layer, logits, all-to-all and pipeline send/receive buffers.
- overhead: CUDA context, cuBLAS workspace and NCCL buffers (``hardware_profiles/software.toml``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.config import QUANTIZED_PRECISIONS, Job
from costmodel.formulas.activations import layer_params_per_gpu
from costmodel.formulas.arrays import (
    OFFLOAD_CODES,
    RECOMPUTE_CODES,
    SCHEDULE_CODES,
    ConfigArrays,
    Stages,
    even_split,
    first_argmax,
    ordered_sum,
)
from costmodel.formulas.compute import autocast_rows
from costmodel.formulas.eager import float8_param_gather, loss_kind
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.moe import deepep_buffer_bytes, routed_load
from costmodel.formulas.roofline import quantized_bytes
from costmodel.formulas.stagelayout import stage_in_flight, stage_layout
from costmodel.formulas.states import optimizer_state_bytes, state_bytes
from costmodel.frameworks import Framework, framework
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import MIB, compute_bytes

# ConfigArrays and its codes live in costmodel.formulas.arrays, the state sizes in
# costmodel.formulas.states;
# they are re-exported here, where most callers meet them beside memory_table.
__all__ = ["OFFLOAD_CODES", "RECOMPUTE_CODES", "SCHEDULE_CODES", "TERMS", "ConfigArrays",
           "MemoryTable", "Stages", "even_split", "first_argmax", "layer_params_per_gpu",
           "memory_table", "optimizer_state_bytes", "state_bytes"]

TERMS = ("weights", "gradients", "optimizer", "activations", "buffers", "overhead")


@dataclass(frozen=True)
class MemoryTable:
    """Per-stage memory, arrays ``[P, rows]`` (stage-major) in bytes, and what the peak is made
    of.

    ``terms`` maps each name of ``TERMS`` to its array; ``cpu`` is what offload keeps in host
    memory per GPU; ``valid`` masks the stages that exist. ``layer_params`` and
    ``embedding_params`` count the parameters a GPU of each stage holds (after tensor and
    expert sharding, before ZeRO), ``in_flight`` the micro-batches its activations cover,
    ``layer_activations`` the part of the activations that the transformer layers save (the
    rest belongs to the embedding and output layers). ``expert_params``: the routed-expert
    part of ``layer_params``; ``kind_layers`` ``[kinds, P, rows]``: the layers of each kind
    (``LayerCosts.layer_kinds``) among ``num_layers``; ``recomputed`` ``[kinds, P, rows]``:
    those full recompute re-runs.
    ``resident_weights``: the stored (sharded) parameters alone, the part of the weights term
    a GPU holds between steps, without the low-precision and unsharded copies of forward and
    backward. ``resident_gradients``: all the gradients after the backward pass (what the
    optimizer step reads); the gradients term counts less where they never coexist with the
    activations.
    """

    terms: dict[str, np.ndarray]
    cpu: np.ndarray
    valid: np.ndarray
    num_layers: np.ndarray
    layer_params: np.ndarray
    embedding_params: np.ndarray
    in_flight: np.ndarray
    layer_activations: np.ndarray
    num_micro_batches: np.ndarray
    expert_params: np.ndarray
    kind_layers: np.ndarray
    recomputed: np.ndarray
    resident_weights: np.ndarray
    resident_gradients: np.ndarray

    @cached_property
    def total(self) -> np.ndarray:
        """Sum of all terms per stage, ``[P, rows]``; zero where the stage does not exist (as
        every term is there)."""
        out = self.terms[TERMS[0]]
        for t in TERMS[1:]:
            out = out + self.terms[t]
        return out

    @property
    def peak_stage(self) -> np.ndarray:
        """Index of the stage with the largest total, per row."""
        return first_argmax(np.where(self.valid, self.total, -1.0))

    @property
    def peak(self) -> np.ndarray:
        """Largest per-GPU total over the stages of each row, bytes."""
        return self.total.max(axis=0)


def _largest(on: Sequence[np.ndarray] | np.ndarray, value: Callable[[int], np.ndarray]
             ) -> np.ndarray:
    """Per stage and row, the largest ``value(k)`` over the kinds ``k`` with ``on[k] > 0``
    (zero without any)."""
    out = np.zeros(np.shape(on[0]))
    for k, n in enumerate(on):
        out = np.maximum(out, np.where(n > 0, value(k), 0.0))
    return out


@dataclass(frozen=True)
class _Stage:
    """What every term of ``memory_table`` reads: the model's costs and trainer, the table's
    stage columns ``[P, rows]`` (``first``/``last`` stage, ``valid`` ones), the layers of each
    kind a stage holds (``counts``, ``[kinds, P, rows]``) and the parameters one GPU of each
    stage holds before ZeRO: of one layer of each kind (``per_layer``: all but routed
    experts, and those), of its layers (``layer_params``, ``expert_params``) and of the
    embedding and head (``emb_params``)."""

    costs: LayerCosts
    job: Job
    a: ConfigArrays
    fw: Framework
    soft: Mapping[str, Any]
    st: Stages
    valid: np.ndarray
    first: np.ndarray
    last: np.ndarray
    tp: np.ndarray
    ep_share: np.ndarray  # ConfigArrays.expert_share: the experts' parameter and DP split
    m: np.ndarray
    counts: np.ndarray
    per_layer: tuple[tuple[np.ndarray, np.ndarray | None], ...]
    layer_params: np.ndarray
    expert_params: np.ndarray
    emb_params: np.ndarray

    @property
    def kinds(self) -> range:
        """The kinds of layer (``LayerCosts.layer_kinds``)."""
        return range(self.costs.kinds)

    @property
    def dense_params(self) -> np.ndarray:
        """Everything but routed experts."""
        return self.layer_params + self.emb_params

    @property
    def all_params(self) -> np.ndarray:
        """Every parameter one GPU of the stage holds before ZeRO."""
        return self.dense_params + self.expert_params

    @property
    def z_dense(self) -> np.ndarray:
        """ZeRO shard degree of the dense parameters."""
        return self.a.shard.astype(float)

    @property
    def z_exp(self) -> np.ndarray:
        """ZeRO shard degree of the routed experts (their data-parallel group is
        ``ConfigArrays.expert_share`` times smaller)."""
        return np.maximum(self.z_dense / self.ep_share, 1.0)


def _stage(costs: LayerCosts, job: Job, a: ConfigArrays) -> _Stage:
    """The stage columns and parameters per GPU (tensor-parallel shards; norms stay
    replicated) every term reads."""
    st = a.stage_major
    tp = a.tp.astype(float)
    ep_share = a.expert_share.astype(float)
    first = st.index == 0
    last = st.index == a.head_rank
    counts = stage_layout(costs, a, st)  # [kinds, P, rows]
    kinds = range(costs.kinds)
    per_layer = costs.layer_params_per_gpu(tp, ep_share)  # per kind: (local, routed experts)
    layer_params = ordered_sum(counts[k] * per_layer[k][0] for k in kinds)
    expert_params = ordered_sum((counts[k] * x for k in kinds
                          if (x := per_layer[k][1]) is not None), np.zeros_like(layer_params))
    emb_local, head_local, tied = costs.edge_params_per_gpu(tp)
    # The last stage keeps its own copy of a tied (or multi-token prediction's shared)
    # embedding when it sits on another rank. DeepSeek's DualPipe puts the embedding's stage
    # and the head's on one rank, which holds the tensor once: "the physical sharing of
    # parameters and gradients, of the shared embedding and output head, between the MTP
    # module and the main model" (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1): its
    # rows (ConfigArrays.dualpipe) are costed as a DualPipeV, whose rank 0 holds both.
    copy = a.pp > 1 if a.dualpipe is None else (a.pp > 1) & ~a.dualpipe
    head_local = head_local + np.where(copy, tied, 0.0)
    emb_params = np.where(first, emb_local, 0.0) + np.where(last, head_local, 0.0)
    return _Stage(costs=costs, job=job, a=a, fw=framework(job.framework),
                  soft=hardware_profiles.load_software(), st=st, valid=st.count > 0,
                  first=first, last=last, tp=tp, ep_share=ep_share,
                  m=job.global_batch_size // (a.dp * a.mbs), counts=counts,
                  per_layer=per_layer, layer_params=layer_params,
                  expert_params=expert_params, emb_params=emb_params)


@dataclass(frozen=True)
class _States:
    """Model states per GPU (bytes): ``weights`` (with the low-precision and unsharded
    copies), ``resident`` (the stored parameters alone), ``grads``, ``unsharded_grads``
    (torch pipelining's no-sync accumulation), ``optim``, and what offload moved to the
    host (``cpu``); ``w_sharded`` where ZeRO shards the parameters; ``w_b`` / ``g_b``: bytes
    per weight and per gradient (``state_bytes``)."""

    weights: np.ndarray
    resident: np.ndarray
    grads: np.ndarray
    unsharded_grads: np.ndarray
    optim: np.ndarray
    cpu: np.ndarray
    w_sharded: np.ndarray
    w_b: float
    g_b: float


def _model_states(s: _Stage) -> _States:
    """Weights, gradients and optimizer states per GPU, sharded by ZeRO, moved by offload."""
    job, a, fw = s.job, s.a, s.fw
    dense_params, expert_params = s.dense_params, s.expert_params
    z_dense, z_exp = s.z_dense, s.z_exp
    w_b, g_b, o_b = state_bytes(job, s.costs)
    zero = a.zero
    w_sharded = zero >= fw.param_shard_stage
    g_sharded = zero >= 2
    o_sharded = zero >= 1

    def sharded(bytes_per_param: float, on: np.ndarray) -> np.ndarray:
        return bytes_per_param * (dense_params / np.where(on, z_dense, 1.0)
                                  + expert_params / np.where(on, z_exp, 1.0))

    all_params = s.all_params
    compute_b = compute_bytes(job.precision)
    weights = sharded(w_b, w_sharded)
    resident = weights  # the stored parameters alone, what a GPU holds between steps
    # torchtitan keeps low-precision copies beside its fp32 parameters: autocast's cast weights
    # (saved for backward) under DDP, and the unsharded parameters that FSDP with
    # reshard_after_forward=False (ZeRO-2) holds from forward to backward. Only sharded
    # parameters get an unsharded copy; in mixed precision every parameter has a bf16 copy
    # either way (FSDP's param_dtype cast or autocast's).
    # Without ZeRO, torchtitan runs DDP, which only serves 1-D data parallel; with TP, PP or CP
    # the planner's runtime replicates with FSDP2 instead, whose unsharded parameters are a
    # separate copy in the compute dtype (planner.runtime.apply; measured by
    # benchmarks/runtime_memory.py).
    if fw.name == "torchtitan":
        sharded_params = (dense_params * (z_dense > 1) + expert_params * (z_exp > 1))
        low = 2.0 if job.precision != "fp32" else 0.0
        multi = (a.tp > 1) | (a.pp > 1) | (a.cp > 1)
        extra = np.where(zero == 0, np.where(multi, compute_b, low) * all_params, 0.0)
        unsharded = compute_b * sharded_params
        if float8_param_gather(fw.name, job):  # a layer's linear weights unsharded in float8
            unsharded = unsharded - (compute_b - 1.0) * s.layer_params * (z_dense > 1)
        extra = np.where(zero == 2, np.maximum(low * all_params, unsharded), extra)
        weights = weights + extra
    # Transformer Engine caches fp8 copies of each weight and its transpose across
    # micro-batches (Megatron-LM with --fp8-format): 2 bytes per layer parameter, with the
    # block scales of MXFP8, block-wise fp8 and NVFP4 (--fp4-format: half a byte each way;
    # roofline.QUANTIZED_BYTES). With --fp8-param-gather the parameters are those fp8
    # tensors (1 byte and the transpose, what w_b counts), with no bf16 copy beside them.
    # ROCm Megatron-LM's --no-fp8-weight-transpose-cache keeps the copy, not the transpose
    # (Job.fp8_weight_transpose_cache). Unsharded even under FSDP: Llama-2-70B fp8 on 16
    # MI325X with FSDP2 and no transpose cache had 227 GiB of the device in use, where this
    # counts 210 GiB with one copy and 273 GiB with both (hisohara/ai-scripts@4fb66ab5
    # training/03_primus/run-llama2-70B-2N.log).
    if fw.name == "megatron" and job.precision in QUANTIZED_PRECISIONS \
            and not job.fp8_param_gather:
        copies = 2.0 if job.fp8_weight_transpose_cache else 1.0
        weights = weights + copies * quantized_bytes(job, weight=True) \
            * (s.layer_params + expert_params)
    grads = sharded(g_b, g_sharded)
    # With a pipeline, torch.distributed.pipelining turns FSDP's gradient sync off for every
    # backward but the last (stage.py, backward_maybe_with_nosync), and FSDP2 then accumulates
    # each parameter's unsharded gradient in the reduce dtype (_fsdp_param.py,
    # unsharded_accumulated_grad): the stage's whole gradient, reduce-scattered into its
    # shards after the last backward group by group, each freed as its shard is made (not
    # resident between steps, and never whole beside the shards: _gradients).
    nosync = fw.torch_pipelining & (a.pp > 1) & (zero >= 2)
    unsharded_grads = np.where(nosync, g_b * all_params, 0.0)
    optim = sharded(o_b, o_sharded)

    cpu = np.zeros_like(weights)
    off = a.offload
    cpu = cpu + np.where(off >= 1, optim, 0.0)
    optim = np.where(off >= 1, 0.0, optim)
    cpu = cpu + np.where(off == 2, weights + grads, 0.0)
    weights = np.where(off == 2, 0.0, weights)
    resident = np.where(off == 2, 0.0, resident)
    grads = np.where(off == 2, 0.0, grads)
    return _States(weights=weights, resident=resident, grads=grads,
                   unsharded_grads=unsharded_grads, optim=optim, cpu=cpu,
                   w_sharded=w_sharded, w_b=w_b, g_b=g_b)


@dataclass(frozen=True)
class _Activations:
    """Activations per GPU (bytes): ``total``; ``layers``, the layers' share; ``in_flight``,
    the micro-batches a stage's layers hold; ``per_kind``, one layer's saved bytes per
    micro-batch per recompute mode of each kind; ``recomputed``, the layers of each kind that
    full recompute re-runs."""

    total: np.ndarray
    layers: np.ndarray
    in_flight: np.ndarray
    per_kind: list[dict[str, np.ndarray]]
    recomputed: list[np.ndarray]


def _activations(s: _Stage) -> _Activations:
    """What the stage saves for backward, over the micro-batches its schedule holds."""
    job, a, st, counts, kinds = s.job, s.a, s.st, s.counts, s.kinds
    layers = st.layers
    ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    acts = [s.costs.layer_activations(job, a, k, ac) for k in kinds]
    mode = a.recompute

    def by_mode(acts: dict[str, np.ndarray]) -> np.ndarray:
        return np.where(mode == 0, acts["none"],
                        np.where(mode == 1, acts["selective"], acts["full"]))

    # Full recompute of only the first N layers of each chunk (Megatron --recompute-method
    # block): the others keep everything; a stage's layers of the first kinds come first
    # (a MoE model's dense layers).
    n_rec = np.where((mode == 2) & (a.recompute_layers > 0),
                     np.minimum(a.recompute_layers * a.v, layers), layers)
    n_rec = np.where(mode == 2, n_rec, layers)
    if st.recompute is not None:  # per-stage counts (a non-uniform plan)
        n_rec = np.where((mode == 2) & (st.recompute >= 0),
                         np.minimum(st.recompute, layers), n_rec)
    rec = []
    for k in kinds:
        rec.append(np.minimum(n_rec, counts[k]))
        n_rec = n_rec - rec[-1]
    stage_act = (ordered_sum(rec[k] * by_mode(acts[k]) for k in kinds)
                 + ordered_sum((counts[k] - rec[k]) * acts[k]["none"] for k in kinds))

    emb_act, head_act = s.costs.edge_activations(job, a, ac)
    layers_f, emb_f, head_f = stage_in_flight(a, st.index, s.m)
    layer_activations = stage_act * layers_f
    activations = (layer_activations + np.where(s.first, emb_act * emb_f, 0.0)
                   + np.where(s.last, head_act * head_f, 0.0))
    return _Activations(total=activations, layers=layer_activations, in_flight=layers_f,
                        per_kind=acts, recomputed=rec)


def _buffers(s: _Stage, states: _States, act: _Activations) -> np.ndarray:
    """Transient working sets at the peak: the layer recompute re-materializes, the loss's,
    pipeline and all-to-all buffers, ZeRO-3/FSDP gathers, gradient buckets."""
    job, a, fw, costs, counts, kinds = s.job, s.a, s.fw, s.costs, s.counts, s.kinds
    mode, acts = a.recompute, act.per_kind
    zero, z_dense, z_exp, w_sharded = a.zero, s.z_dense, s.z_exp, states.w_sharded
    compute_b = compute_bytes(job.precision)
    # One layer's parameters that ZeRO-3/FSDP gathers: only the parts that are sharded (the
    # experts are not when their data-parallel degree dp*cp/ep is 1).
    dense_gathered = np.where(z_dense > 1, 1.0, 0.0)

    def gathered_layer(k: int, dense_b: float = 1.0, expert_b: float = 1.0) -> np.ndarray:
        """Layer kind ``k``'s gathered parameters, weighted ``dense_b`` per non-expert one
        and ``expert_b`` per expert one (1: counted; bytes per parameter: their bytes)."""
        local, experts = s.per_layer[k]
        out = dense_b * local * dense_gathered
        return out if experts is None else out + expert_b * np.where(z_exp > 1, experts, 0.0)

    layer_max = _largest(counts, gathered_layer)
    buffers = np.zeros_like(states.weights)
    # Recompute re-materializes, for one layer and one micro-batch during backward, what it
    # did not keep: everything under full recompute, the attention scores under selective
    # (nothing extra with a fused attention kernel, which never stores them).
    def rematerialized(kept: str, on: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        return _largest(on, lambda k: acts[k]["none"] - acts[k][kept])

    buffers = buffers + np.where(
        mode == 2, rematerialized("full", act.recomputed),
        np.where(mode == 1, rematerialized("selective", counts), 0.0))
    # The cross entropy's working set beside the logits it keeps (last stage, one
    # micro-batch): Megatron-LM's in-place one (fused or not), the low-precision logits it
    # cast from; torch's F.cross_entropy, at the start of backward, a dense fp32 NLL
    # gradient and the fp32 log-softmax gradient (measured with torch.cuda.memory snapshots
    # on an H100: the peak of a step is there, 12 bytes per logit with the kept 4; on the
    # compute-dtype logits, Job.loss_upcast off, the same two gradients in that dtype);
    # compiled, what software.toml [torch_compile] says beside the kept low-precision logits.
    e = compute_b
    tokens = job.seq_len / a.cp * a.mbs
    rep = np.where(a.sp == 1, 1.0 / s.tp, 1.0)
    h = float(costs.hidden_size)
    ce = {"fused": e, "vocab-parallel": e, "eager": 8.0 if job.loss_upcast else 2 * e,
          "compiled": float(hardware_profiles.load_software()["torch_compile"]
                            ["ce_working_bytes_per_logit"])}[loss_kind(fw, job)]
    buffers = buffers + np.where(s.last, ce * tokens * costs.logits_per_token(s.tp), 0.0)
    # Pipeline send and receive buffers of one activation tensor each.
    buffers = buffers + np.where(a.pp > 1, 2 * e * tokens * h * rep, 0.0)
    # Expert-parallel all-to-all send and receive buffers of the routed tokens (the busiest
    # rank's, moe.routed_load), and DeepEP's own communication buffer, one per GPU.
    if costs.is_moe:
        a2a = 2 * e * tokens * costs.moe_routing()[0] * h * routed_load(job)
        if job.moe_dispatcher == "deepep":
            a2a = a2a + deepep_buffer_bytes(int(h), a.expert_tp * a.ep)
        routed = ordered_sum(counts[k] for k in kinds if costs.routed(k))
        buffers = buffers + np.where((a.ep > 1) & (routed > 0), a2a, 0.0)
    all_params, w_b, g_b = s.all_params, states.w_b, states.g_b
    if fw.name in ("torchtitan", "megatron"):
        # FSDP (torchtitan and Megatron's FSDP mode): about two blocks' parameters unsharded
        # (the current and the prefetched one) plus one block's unsharded gradients in the
        # fp32 reduce dtype before its reduce-scatter (FSDP notes; software.toml).
        tt = s.soft["torchtitan"]
        blocks = float(tt["unsharded_blocks_live"])
        # With torchtitan's float8 all-gather a layer's linear weights are unsharded in 1 byte
        # (compute.float8_param_gather); its experts' stay in the compute dtype.
        gathered_bytes = _largest(counts, lambda k: gathered_layer(k, 1.0, compute_b)) \
            if float8_param_gather(fw.name, job) else compute_b * layer_max
        gathered = np.where(w_sharded & (zero >= 3), blocks * gathered_bytes, 0.0)
        grad_full = np.where(w_sharded, float(tt["reduce_dtype_bytes"]) * layer_max, 0.0)
        buffers = buffers + gathered + grad_full
    if fw.name == "torchtitan":
        # DDP buckets hold a second copy of the gradients (gradient_as_bucket_view=False).
        ddp = s.soft["torch_ddp"]
        copy = 0.0 if ddp["gradient_as_bucket_view"] else g_b
        buffers = buffers + np.where((zero == 0) & (a.dp > 1), copy * all_params, 0.0)
    if fw.name == "deepspeed":
        ds = s.soft["deepspeed"]
        # Stages 0-2: the flat gradient bucket of reduce_bucket_size elements; stage 3 adds the
        # gathered parameters of the current module plus the prefetch bucket, capped by
        # stage3_max_live_parameters (deepspeed/runtime/zero/config.py defaults).
        bucket = np.minimum(float(ds["reduce_bucket_size"]), all_params) * g_b
        live = np.minimum(layer_max + float(ds["stage3_prefetch_bucket_size"]),
                          float(ds["stage3_max_live_parameters"]))
        live = np.minimum(live, all_params)
        buffers = buffers + np.where(a.dp > 1, bucket, 0.0)
        buffers = buffers + np.where(zero == 3, w_b * live, 0.0)
    return buffers


def _gradients(s: _Stage, states: _States, activations: np.ndarray) -> np.ndarray:
    """The gradients term: what the step's peak holds of them.

    torchtitan frees the gradients every step (optimizer.zero_grad(set_to_none=True)), and
    FSDP creates each layer's sharded gradient during backward as that layer's activations
    are freed. With one micro-batch per step no gradient exists in the forward pass, so the
    step's peak holds the larger of the two, not their sum: the gradients term counts what
    they exceed the activations by (measured on an H100 with torch.cuda.memory: Llama 3.2 1B
    under FSDP peaked at 19.7 GiB with recompute or without, the optimizer step's states).
    DDP's buckets, Megatron-LM's and DeepSpeed's gradient buffers stay allocated.

    Under torch.distributed.pipelining the stage's unsharded gradients accumulate until the
    last backward, and only then does each FSDP group reduce-scatter its own into a shard
    and free it (stage.py ``backward_maybe_with_nosync`` runs every group's post_backward
    after the last backward): the shards replace the unsharded gradients they are made
    from, so the peak holds the larger of the two, not their sum."""
    grads = np.maximum(states.grads, states.unsharded_grads)
    if s.fw.name == "torchtitan":
        apart = (s.a.zero >= 2) & (s.m == 1)
        grads = np.where(apart, np.maximum(grads - activations, 0.0), grads)
    return grads


def _overhead(s: _Stage, like: np.ndarray) -> np.ndarray:
    """CUDA context, cuBLAS workspace, NCCL buffers per communicator, shaped ``like``."""
    a = s.a
    rt = s.soft["runtime"]
    groups = ((a.tp > 1).astype(float) + (a.pp > 1) + (a.dp * a.cp > 1) + (a.cp > 1)
              + (a.ep > 1))
    nccl = groups * 2 * float(rt["nccl_max_channels"]) * float(rt["nccl_buffsize_mib"]) * MIB
    overhead = (float(rt["cuda_context_mib"]) + float(rt["cublas_workspace_mib"])) * MIB + nccl
    return np.broadcast_to(overhead, like.shape).astype(float)


def memory_table(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, a: ConfigArrays
                 ) -> MemoryTable:
    """Per-GPU memory by term for every configuration of ``a`` and every pipeline stage.

    ``model``: a preset, or the ``LayerCosts`` the per-layer figures are read from. The
    configurations are assumed valid (``costmodel.formulas.checks.validate``). One function per
    term: ``_model_states``, ``_activations``, ``_buffers``, ``_gradients``, ``_overhead``.
    """
    s = _stage(LayerCosts.of(model), job, a)
    states = _model_states(s)
    act = _activations(s)
    buffers = _buffers(s, states, act)
    grads = _gradients(s, states, act.total)
    terms = {
        "weights": states.weights,
        "gradients": grads,
        "optimizer": states.optim,
        "activations": act.total,
        "buffers": buffers,
        "overhead": _overhead(s, states.weights),
    }
    valid = s.valid
    # Zero where a stage column does not exist; in a table cut to its rows' stage count (what
    # costmodel.formulas.tables.evaluate passes) every column exists, and the arrays are kept as
    # they are.
    every = bool(valid.all())

    def on_stages(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        return x if every and np.shape(x) == valid.shape else np.where(valid, x, fill)

    full_rec = a.recompute == 2
    return MemoryTable(
        terms={k: on_stages(x) for k, x in terms.items()},
        cpu=on_stages(states.cpu),
        valid=valid,
        num_layers=on_stages(s.st.layers, 0),
        layer_params=on_stages(s.layer_params + s.expert_params),
        embedding_params=on_stages(s.emb_params),
        in_flight=on_stages(act.in_flight),
        layer_activations=on_stages(act.layers),
        num_micro_batches=s.m,
        expert_params=on_stages(s.expert_params),
        kind_layers=np.stack([on_stages(c, 0) for c in s.counts]),
        recomputed=np.stack([on_stages(np.where(full_rec, r, 0), 0) for r in act.recomputed]),
        resident_weights=on_stages(states.resident),
        resident_gradients=on_stages(states.grads),
    )

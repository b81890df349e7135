"""The per-micro-batch terms of the step time, per pipeline stage, for a table of
configurations: context- and expert-parallel communication, ZeRO-3/FSDP gathers and
reduce-scatters, gradient accumulation, recompute and pipeline send/receive, each with what
overlaps it (the rules are stated in ``costmodel.formulas.steptime``'s docstring, which
assembles them into the step; tensor parallel's are ``costmodel.formulas.tpcomm``).

Every function reads one ``Rows``: the job's constants, the configurations as float columns
and the compute of one layer of each kind per micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.config import Job
from costmodel.formulas.arrays import ConfigArrays, Distinct, ordered_sum
from costmodel.formulas.comm import Topology
from costmodel.formulas.compute import autocast_rows
from costmodel.formulas.eager import float8_param_gather
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.layerqueries import SpreadCompute
from costmodel.formulas.memory import MemoryTable
from costmodel.formulas.moe import dispatch_combine, routed_load
from costmodel.formulas.roofline import LayerCompute, memory_time
from costmodel.formulas.states import state_bytes
from costmodel.frameworks import framework
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import compute_bytes

__all__ = ["Rows", "Sharded", "accumulation_time", "context_parallel", "expert_parallel",
           "layer_groups", "overlap", "p2p_time", "pick", "recompute_time", "sharded",
           "table_rows"]


def overlap(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Exposed part of ``comm`` run beside ``window`` seconds of compute."""
    return np.maximum(comm - window, 0.0)


@dataclass(frozen=True)
class Rows:
    """What every term of one time table reads: the job's constants, the configurations as
    float columns (stage-major ``[P, rows]`` where per stage, like ``MemoryTable``) and the
    compute per micro-batch of one layer of each kind, of the embedding and of the head."""

    costs: LayerCosts
    cluster: Cluster
    job: Job
    a: ConfigArrays
    mem: MemoryTable
    topo: Topology
    soft: Mapping[str, Any]
    e: float  # bytes per activation element and per parameter as gathered (compute_bytes)
    w_b: float  # bytes per weight as gathered after the optimizer (ZeRO 1/2)
    g_b: float  # bytes per gradient element as reduced
    cf: float  # the busiest expert-parallel rank's routed load (moe.routed_load)
    host_bw: float  # achieved GPU-host bytes/s (offload)
    stage: np.ndarray
    count: np.ndarray
    first: np.ndarray
    last: np.ndarray
    m: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray  # the experts' TP degree (ConfigArrays.expert_tp)
    ep_share: np.ndarray  # ConfigArrays.expert_share: the experts' parameter and DP split
    v: np.ndarray
    tokens: np.ndarray  # per micro-batch per GPU
    z: np.ndarray  # ZeRO/FSDP shard degree of the dense parameters (1 without ZeRO)
    sp: np.ndarray
    autocast: np.ndarray
    layers: tuple[LayerCompute, ...]  # one layer of each kind (LayerCosts.layer_kinds)
    emb: LayerCompute
    head: LayerCompute
    dense_params: np.ndarray  # per GPU: the stage's non-expert parameters (embeddings too)
    exp_params: np.ndarray  # per GPU: the stage's expert parameters

    @property
    def fw(self) -> str:
        """The trainer."""
        return self.job.framework

    @property
    def valid(self) -> np.ndarray:
        """Stage columns that are real stages (not padding)."""
        return self.mem.valid

    @cached_property
    def nl(self) -> np.ndarray:
        """Layers of each stage."""
        return self.mem.num_layers.astype(float)

    @cached_property
    def counts(self) -> np.ndarray:
        """Layers of each kind in each stage, ``[kinds, P, rows]``."""
        return self.mem.kind_layers.astype(float)

    @cached_property
    def recomputed(self) -> np.ndarray:
        """Layers of each kind fully recomputed in each stage, ``[kinds, P, rows]``."""
        return self.mem.recomputed.astype(float)

    @cached_property
    def ep_pair(self) -> np.ndarray:
        """One MoE layer's dispatch and combine in one pass per micro-batch, per row
        (``dispatch_pair``), computed once for the all-to-all term and the overlapped pairs."""
        return dispatch_pair(self)

    @cached_property
    def rec_layers(self) -> np.ndarray:
        """Layers whose forward runs again in backward (full recompute)."""
        return np.where(self.a.recompute == 2, self.recomputed.sum(axis=0), 0.0)

    def per_stage(self, per_kind: Sequence[np.ndarray], e_: np.ndarray | float = 0.0,
                  hd: np.ndarray | float = 0.0) -> np.ndarray:
        """Sum over a stage's layers of a per-layer quantity (one per kind of layer), plus
        the embedding's on the first stage and the head's on the last."""
        return self._over(self.counts, per_kind, e_, hd)

    def recomputed_sum(self, per_kind: Sequence[np.ndarray]) -> np.ndarray:
        """Sum over a stage's fully recomputed layers of a per-layer quantity."""
        return self._over(self.recomputed, per_kind)

    def routed_layers(self, counts: np.ndarray) -> np.ndarray:
        """Of ``counts`` (per kind), the layers that route tokens to experts."""
        out = np.zeros(counts.shape[1:])
        for k in range(counts.shape[0]):
            if self.costs.routed(k):
                out = out + counts[k]
        return out

    def _over(self, counts: np.ndarray, per_kind: Sequence[np.ndarray],
              e_: np.ndarray | float = 0.0, hd: np.ndarray | float = 0.0) -> np.ndarray:
        out = ordered_sum(c * x for c, x in zip(counts, per_kind, strict=True))
        if not np.isscalar(e_) or e_ != 0.0:
            out = out + np.where(self.first, np.broadcast_to(e_, out.shape), 0.0)
        if not np.isscalar(hd) or hd != 0.0:
            out = out + np.where(self.last, np.broadcast_to(hd, out.shape), 0.0)
        return out


def table_rows(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, a: ConfigArrays,
               mem: MemoryTable) -> Rows:
    """The columns and layer computes of a table (``Rows``)."""
    costs = LayerCosts.of(model)
    soft = hardware_profiles.load_software()
    w_b, g_b, _ = state_bytes(job, costs)
    if job.framework == "torchtitan":
        g_b = float(soft["torchtitan"]["reduce_dtype_bytes"])
    cf = routed_load(job) if costs.is_moe else 1.0
    gpu = cluster.gpu
    st = a.stage_major  # [P, rows], like mem's arrays
    cp = a.cp.astype(float)
    ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    layers = tuple(costs.layer_compute(gpu, job, a, k, capacity_factor=cf, autocast=ac)
                   for k in range(costs.kinds))
    emb, head = costs.head_compute(gpu, job, a, autocast=ac)
    return Rows(
        costs=costs, cluster=cluster, job=job, a=a, mem=mem,
        topo=Topology.of(cluster, a.mesh_groups),
        soft=soft, e=compute_bytes(job.precision), w_b=w_b, g_b=g_b, cf=cf,
        host_bw=gpu.host().achieved_bytes_per_s, z=a.shard.astype(float),
        stage=st.index, count=st.count, first=(st.index == 0), last=(st.index == a.head_rank),
        m=mem.num_micro_batches.astype(float), tp=a.tp.astype(float), cp=cp,
        dp=a.dp.astype(float), pp=a.pp.astype(float), ep=a.ep.astype(float),
        etp=a.expert_tp.astype(float), ep_share=a.expert_share.astype(float),
        v=a.v.astype(float), tokens=job.seq_len / cp * a.mbs, sp=a.sp == 1, autocast=ac,
        layers=layers, emb=emb, head=head,
        dense_params=mem.layer_params - mem.expert_params + mem.embedding_params,
        exp_params=mem.expert_params)


def context_parallel(r: Rows) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """CP ring exchange of K and V per micro-batch: (exposed per stage, all of it for one
    layer of each kind).

    Each KV block's transfer overlaps the attention on the previous block (Liu et al. 2023),
    forward one exchange per step, backward two (the KV blocks and their gradients)."""
    groups, computes = layer_groups(r)  # once per kernel group, as TP's
    exposed, total = _cp_layers(r, computes, groups)
    if groups is not None:
        exposed, total = [groups.spread(x) for x in exposed], [groups.spread(x) for x in total]
    return r.per_stage(exposed), tuple(total)


def _cp_layers(r: Rows, layers: Sequence[LayerCompute], groups: Distinct | None
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One layer's ring exchange per micro-batch of each kind per kernel group (per row for
    ``None``), whose layer computes are ``layers``: (exposed, all of it)."""
    a = r.a if groups is None else r.a.kernel_rows  # the groups' first rows
    cp, tp = pick(r.cp, groups), pick(r.tp, groups)
    exposed, total = [], []
    for k, lc in enumerate(layers):
        kv_block = r.costs.cp_kv_bytes(k, r.job, a)
        ring_step = np.where(cp > 1, r.topo.ring_step(kv_block, cp, tp), 0.0)
        steps = r.costs.cp_ring_steps(k, r.job, a)  # cp - 1, fewer for a local layer
        exposed.append(steps * overlap(ring_step, lc.core_forward / (steps + 1))
                       + steps * overlap(2 * ring_step, lc.core_backward / (steps + 1)))
        total.append(steps * 3 * ring_step)
    return exposed, total


def layer_groups(r: Rows) -> tuple[Distinct | None, Sequence[LayerCompute]]:
    """(the kernel groups, each kind's layer compute per group) where the table's layer
    computes were made once per ``ConfigArrays.kernel_groups`` group (``SpreadCompute``);
    ``(None, r.layers)`` where they were made per row."""
    groups = r.a.kernel_groups
    layers = [lc.per_group for lc in r.layers
              if isinstance(lc, SpreadCompute) and lc.groups is groups]
    return (groups, layers) if len(layers) == len(r.layers) else (None, r.layers)


def pick(x: np.ndarray, groups: Distinct | None) -> np.ndarray:
    """A per-row column at each group's first row (all of it for ``None``)."""
    return x if groups is None else np.take(x, groups.first)


def dispatch_pair(r: Rows) -> np.ndarray:
    """Seconds of one MoE layer's dispatch and combine in one pass (forward or backward) per
    micro-batch, per row (``moe.dispatch_combine`` with the job's dispatcher and the busiest
    rank's load ``Rows.cf``); zero for a dense model."""
    if not r.costs.is_moe:
        return np.zeros(r.a.rows)
    h = float(r.costs.hidden_size)
    top_k, num_experts = r.costs.moe_routing()
    spec = r.costs.spec
    # Each rank dispatches the routed copies it computes (``compute._mlp_block``): its TP
    # group's under etp = tp, its own sequence share folded; the EP group's ranks sit etp
    # apart (the experts' mesh is etp x ep x expert-DP, etp innermost).
    return dispatch_combine(r.topo, r.job.moe_dispatcher, r.e * r.tokens * h * r.etp / r.tp,
                            top_k, r.cf, r.ep, r.etp, spec.expert_groups if spec else 0,
                            spec.expert_group_limit if spec else 0, num_experts)


def expert_parallel(r: Rows, like: np.ndarray) -> np.ndarray:
    """EP dispatch and combine per micro-batch per stage (``dispatch_pair``), all exposed
    (Megatron-LM and torchtitan defaults): forward and backward each run a pair; full
    recompute, and Megatron-LM's selective recompute of the ``moe`` module (moe_layer.py
    checkpoints the layer's forward, dispatch and combine included), run the forward pair
    again. Zeros shaped ``like`` for a dense model."""
    if not r.costs.is_moe:
        return np.zeros_like(like)
    pair = r.ep_pair
    again = r.routed_layers(r.recomputed) * (r.a.recompute == 2)
    if r.job.framework == "megatron" and "moe" in r.job.recompute_modules:
        again = again + r.routed_layers(r.counts) * (r.a.recompute == 1)
    return r.routed_layers(r.counts) * (2 * pair) + again * pair


# ---- ZeRO-3 / FSDP per-layer gathers and reduce-scatters ---------------------------------

@dataclass(frozen=True)
class Sharded:
    """ZeRO-3/FSDP communication per micro-batch per stage: ``exposed`` (with FSDP2's copies
    and the compute the hidden part slows), ``wire`` (all collectives, hidden or not),
    ``copy`` (FSDP2's copies); and what the rest of the step reads: the shard degrees of
    dense and expert parameters (``z``, ``z_exp``), whether gradients are reduce-scattered
    every micro-batch (``rs_each``) or once per step under torch pipelining (``nosync``)."""

    exposed: np.ndarray
    wire: np.ndarray
    copy: np.ndarray | float
    z: np.ndarray
    z_exp: np.ndarray
    rs_each: np.ndarray
    nosync: np.ndarray


def _gather(r: Rows, params: np.ndarray, group: np.ndarray, stride: np.ndarray,
            bytes_per_param: float | None = None) -> np.ndarray:
    """Seconds to all-gather ``params`` parameters (per GPU of the TP/EP group) over ``group``
    ranks ``stride`` apart, in the compute dtype (or ``bytes_per_param``: a layer's float8
    weights, ``compute.float8_param_gather``); offloaded parameters first cross PCIe, the
    GPU's shard of them."""
    t = r.topo.all_gather((r.e if bytes_per_param is None else bytes_per_param) * params,
                          group, stride)
    return t + np.where(r.a.offload == 2, r.w_b * params / group / r.host_bw, 0.0)


def _scatter(r: Rows, params: np.ndarray, group: np.ndarray, stride: np.ndarray
             ) -> np.ndarray:
    """Seconds to reduce-scatter the gradients of ``params`` parameters over ``group`` ranks
    ``stride`` apart; with HSDP the shards are then all-reduced across the replicas."""
    t = r.topo.reduce_scatter(r.g_b * params, group, stride)
    replicas = r.dp * r.cp / r.z
    t = t + r.topo.all_reduce(r.g_b * params / group, replicas, r.tp * r.z)
    return t + np.where(r.a.offload == 2, r.g_b * params / group / r.host_bw, 0.0)


def _per_tensor(r: Rows, params: np.ndarray, tensors: tuple[int, int], group: np.ndarray,
                stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gather, reduce-scatter) seconds of one layer's ``params`` parameters (per GPU of the
    TP group) as DeepSpeed's ZeRO-3 of 2021 moved them (``Job.zero3_synchronous_gather``):
    one collective per parameter tensor (``tensors``: weight matrices, vectors of
    ``hidden_size``), each paying its ring latency, and each copying its ``group`` per-rank
    pieces out of (into) torch's flat buffer one copy kernel at a time
    (ProcessGroupNCCL's list all_gather / reduce_scatter), at the fitted cost of one kernel."""
    n_w, n_v = tensors
    h = float(r.costs.hidden_size)
    weight = np.maximum(params - n_v * h, 0.0) / n_w
    copies = (n_w + n_v) * np.where(group > 1, group, 0.0) \
        * r.cluster.gpu.efficiency.kernel_overhead_s
    vector = np.full_like(weight, h)
    gather = n_w * _gather(r, weight, group, stride) + n_v * _gather(r, vector, group, stride)
    scatter = n_w * _scatter(r, weight, group, stride) \
        + n_v * _scatter(r, vector, group, stride)
    return gather + copies, scatter + copies


def _fsdp2_copies(r: Rows, ag_fwd: np.ndarray, ag_bwd: np.ndarray) -> np.ndarray | float:
    """Seconds per micro-batch per stage of FSDP2's own copies on the compute stream
    (torchtitan; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each all-gather's
    copy-out splits the gathered flat buffer into the unsharded parameters
    (split_with_sizes_copy: read and write comp_b bytes per parameter), and each
    reduce-scatter's copy-in casts the unsharded gradients into the flat buffer of the reduce
    dtype (foreach_reduce_scatter_copy_in: read comp_b, write g_b), one kernel each per FSDP
    unit (each layer, the embedding, the head). The all-gather's copy-in, the cast of the
    shard, runs on a stream of its own beside the compute. They happen on one GPU too. With
    the float8 all-gather (``compute.float8_param_gather``) a layer's linear weights are
    copied out at 1 byte each."""
    if r.fw != "torchtitan":
        return 0.0
    comp_b = r.e
    units = (r.nl + r.first + r.last) * r.valid
    params = r.dense_params + r.exp_params
    copy_bytes = np.where(ag_fwd, 2 * comp_b * (1 + ag_bwd) + comp_b + r.g_b, 0.0) * params
    if float8_param_gather(r.fw, r.job):
        layer_dense = r.mem.layer_params - r.mem.expert_params
        copy_bytes = copy_bytes - np.where(ag_fwd, 2 * (comp_b - 1.0) * (1 + ag_bwd),
                                           0.0) * layer_dense
    copy_kernels = np.where(ag_fwd, 2.0 + ag_bwd, 0.0)
    return memory_time(r.cluster.gpu, copy_bytes, copy_kernels * units)


def sharded(r: Rows) -> Sharded:
    """ZeRO-3/FSDP communication per micro-batch per stage (``Sharded``).

    Each layer's gather is prefetched beside the previous layer's forward; in backward the
    gather and the gradient reduce-scatter share the stream beside the layer's backward;
    the first gather and the last reduce-scatter of a micro-batch are exposed."""
    zero, fw = r.a.zero, r.fw
    z = r.z
    z_exp = np.maximum(z / r.ep_share, 1.0)
    ag_fwd = (zero == 3) | ((zero == 2) & (fw == "torchtitan"))
    ag_bwd = zero == 3
    rs_each = (zero == 3) | ((zero == 2) & (fw in ("torchtitan", "deepspeed")))
    # torch.distributed.pipelining runs every backward but a stage's last with FSDP's gradient
    # sync off (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync:
    # set_requires_gradient_sync(last_backward)): the stage's gradients accumulate unsharded
    # and are reduce-scattered once per step, like a data-parallel all-reduce.
    nosync = framework(fw).torch_pipelining & (r.a.pp > 1) & (zero >= 2)
    rs_each = rs_each & ~nosync
    tp, tp_ep = r.tp, r.tp * r.ep_share
    ag, rs = [], []  # one layer of each kind: its gather, its gradients' reduce-scatter
    # DeepSpeed's ZeRO-3 of 2021 (Job.zero3_synchronous_gather) on its ZeRO-3 rows.
    synchronous = (zero == 3) & (fw == "deepspeed" and r.job.zero3_synchronous_gather)
    tensors = r.costs.layer_param_tensors(framework(fw).separate_projections) \
        if synchronous.any() else None
    # torchtitan's float8 all-gather: a layer's linear weights gathered in 1 byte (the
    # experts' grouped weights are not Float8Linears and stay bf16).
    w8 = 1.0 if float8_param_gather(fw, r.job) else None
    for i, (local, experts) in enumerate(r.costs.layer_params_per_gpu(r.tp, r.ep_share)):
        g, sc = _gather(r, local, z, tp, w8), _scatter(r, local, z, tp)
        if tensors is not None:
            g_each, sc_each = _per_tensor(r, local, tensors[i], z, tp)
            g, sc = np.where(synchronous, g_each, g), np.where(synchronous, sc_each, sc)
        if experts is not None:
            g = g + _gather(r, experts, z_exp, tp_ep)
            sc = sc + _scatter(r, experts, z_exp, tp_ep)
        ag.append(np.where(ag_fwd, g, 0.0))
        rs.append(np.where(rs_each, sc, 0.0))
    wire = r.per_stage([g * (1 + ag_bwd) + sc for g, sc in zip(ag, rs, strict=True)])
    # Per-micro-batch reduce-scatters hide behind backward unless overlap is off (DeepSpeed
    # ZeRO-2 with overlap_comm false); ZeRO-3 prefetching always overlaps.
    hide = np.where(zero == 3, 1.0, 1.0 if r.job.overlap_grad_reduce else 0.0)
    per_layer = [overlap(g, lc.forward)
                 + overlap(np.where(ag_bwd, g, 0.0) + sc, hide * lc.backward)
                 for g, sc, lc in zip(ag, rs, r.layers, strict=True)]
    # The first gather and the last reduce-scatter of a micro-batch: the stage's first
    # layer's (the backward ends on it).
    edges = _first_layer(r, [g + sc for g, sc in zip(ag, rs, strict=True)])
    exposed = r.per_stage(per_layer) + edges * r.valid
    copy = _fsdp2_copies(r, ag_fwd, ag_bwd)
    exposed = exposed + copy
    # Communication hidden behind compute still slows it: NCCL's kernels take SMs and HBM
    # bandwidth from the compute kernels beside them (GPU.efficiency.comm_slowdown, fitted by
    # planner calibrate). Counted for the collectives that run beside compute for most of a
    # step, FSDP's gathers and reduce-scatters (here) and the data-parallel gradient
    # reduction (_gradient_sync); applied to TP and CP too, the fit lost the Korthikanti et
    # al. 2022 runs (4 % instead of 2.5 %), whose overlap windows are single matmuls.
    slow = r.cluster.gpu.efficiency.comm_slowdown
    if slow > 0:
        exposed = exposed + slow * np.maximum(wire - (exposed - copy), 0.0)
    # Synchronous gathers overlap nothing: each waits for all the work before it, and the
    # reduce-scatters for the next gather's synchronize.
    exposed = np.where(synchronous, wire, exposed)
    return Sharded(exposed=exposed, wire=wire, copy=copy, z=z, z_exp=z_exp, rs_each=rs_each,
                    nosync=nosync)


def _first_layer(r: Rows, per_kind: Sequence[np.ndarray]) -> np.ndarray:
    """A per-layer quantity (one per kind of layer) of each stage's first layer."""
    if len(per_kind) == 1:
        return per_kind[0]
    kinds = np.asarray(r.costs.layer_kinds)
    first = np.take(kinds, np.minimum(r.a.stage_major.start, len(kinds) - 1))
    return ordered_sum(np.where(first == k, x, 0.0) for k, x in enumerate(per_kind))


def accumulation_time(r: Rows, sh: Sharded) -> np.ndarray:
    """Seconds per micro-batch (averaged over the step's) of gradient accumulation.

    Each later micro-batch adds its weight gradients into the accumulated ones: read both,
    write the sum, 3 gradient-sized passes per parameter (PyTorch's AccumulateGrad adds in
    place; Megatron-LM's DDP hook adds param.grad into main_grad). Gradients reduce-scattered
    every micro-batch (ZeRO-2/3, FSDP) accumulate in the GPU's shard. Megatron-LM's
    --gradient-accumulation-fusion has the weight-gradient matmul add into main_grad itself
    (fused_weight_gradient_mlp_cuda, commit 83b1e42f of February 2022; Transformer Engine),
    leaving the norm and bias gradients, a negligible share, out here too."""
    if r.fw == "megatron" and r.job.fuse_grad_accumulation:
        return np.zeros_like(r.dense_params)
    acc_params = np.where(sh.rs_each, r.dense_params / sh.z + r.exp_params / sh.z_exp,
                          r.dense_params + r.exp_params)
    later = (r.m - 1) / r.m  # the share of micro-batches that add into others
    return memory_time(r.cluster.gpu, 3 * r.g_b * acc_params, 0.0) * later


def recompute_time(r: Rows) -> np.ndarray:
    """Seconds per micro-batch per stage that recompute adds to the backward."""
    mode = r.a.recompute
    rec_full = r.recomputed_sum([lc.forward for lc in r.layers])
    rec_sel = r.per_stage([lc.selective for lc in r.layers])
    return np.where(mode == 2, rec_full, np.where(mode == 1, rec_sel, 0.0))


def p2p_time(r: Rows, fwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline send/receive per micro-batch per stage, twice per model chunk: (exposed,
    all of it).

    Megatron-LM sends 1/tp of the tensor from each TP rank and all-gathers it inside the node
    (scatter-gather, Narayanan et al. 2021, Sec. 4.1). Its interleaved 1F1B posts each
    chunk's send and the next chunk's receive asynchronously and waits for them one chunk
    later (--overlap-p2p-communication, May 2023, the default since October 2023, commit
    4eeff55d; off without interleaving): each transfer hides behind one chunk's forward."""
    megatron = r.fw == "megatron"
    act = r.e * r.tokens * float(r.costs.hidden_size)
    p2p = r.topo.p2p(np.where(r.sp | megatron, act / r.tp, act), r.tp * r.cp * r.dp)
    if megatron:
        p2p = p2p + np.where(r.sp, 0.0, r.topo.all_gather(act, r.tp, 1.0))
    total = np.where(r.pp > 1, 2 * r.v * p2p, 0.0) * r.valid
    if megatron and r.job.overlap_p2p_comm:
        exposed = overlap(p2p, fwd / r.v)
        return np.where(r.a.schedule == 1, 2 * r.v * exposed * r.valid, total), total
    return total, total

"""Tensor-parallel communication per micro-batch per pipeline stage, for a table of
configurations: each layer's all-reduces (or, with sequence parallelism, all-gathers and
reduce-scatters) forward and backward, what of them the trainer hides behind its matmuls,
and what full and per-op selective recompute add (the rules are stated in
``costmodel.formulas.steptime``'s docstring, which assembles the step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.formulas.arrays import SCHEDULE_CODES, Distinct
from costmodel.formulas.eager import float8_gather
from costmodel.formulas.roofline import LayerCompute
from costmodel.formulas.stepterms import Rows, layer_groups, overlap, pick
from costmodel.frameworks import framework

__all__ = ["TensorParallel", "tensor_parallel"]


# ---- tensor parallel: per layer, forward and backward -------------------------------------

@dataclass(frozen=True)
class _TPCollectives:
    """One layer's TP collectives per micro-batch, seconds: an all-reduce and an all-gather
    (reduce-scatter alike) of one activation, one forward pass's (``per_pass``: without SP two
    all-reduces, with SP two all-gathers and two reduce-scatters), whether Megatron-LM's
    userbuffers or torchtitan's async TP pipeline them with their matmuls (``pipelined``) and
    the share of a matmul that hides a chunk (``chunked``, ``(tp - 1) / tp``).
    ``gather``: one SP all-gather feeding a matmul (``compute.float8_gather``; ``ag`` but where it
    moves float8); ``fused_gather``: whether async TP fuses those all-gathers with their
    matmuls (``compute.float8_gather``). ``ar_in``, ``ag_in``, ``gather_in``: the same
    collectives of the attention's column-parallel input where it is not one activation
    (``ModelSpec.attention_input_dim``: MLA's latents; ``None``: as the others)."""

    ar: np.ndarray
    ag: np.ndarray
    per_pass: np.ndarray
    pipelined: bool
    chunked: np.ndarray
    gather: np.ndarray
    fused_gather: bool = True
    ar_in: np.ndarray | None = None
    ag_in: np.ndarray | None = None
    gather_in: np.ndarray | None = None

    @property
    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(all-reduce, all-gather, SP gather) of the attention's input."""
        return (self.ar if self.ar_in is None else self.ar_in,
                self.ag if self.ag_in is None else self.ag_in,
                self.gather if self.gather_in is None else self.gather_in)


@dataclass(frozen=True)
class TensorParallel:
    """TP communication per micro-batch: ``exposed`` per stage (with the forward collectives
    full recompute runs again), and what ``detail`` adds up into its total: one layer's
    forward and backward collectives, the embedding's and the head's, and all that full
    recompute adds per stage (``layer_total`` per kind of layer)."""

    exposed: np.ndarray
    layer_total: tuple[np.ndarray, ...]
    emb: np.ndarray
    head: np.ndarray
    rec_total: np.ndarray


def _tp_forward(c: _TPCollectives, sp: np.ndarray, lc: LayerCompute) -> np.ndarray:
    """Exposed TP communication of one layer's forward pass.

    Megatron-LM with Transformer Engine's userbuffers (``Job.tp_comm_overlap``, SP rows only)
    pipelines each linear's matmul with its all-gather or reduce-scatter, split into tp chunks,
    so that all but one chunk of the matmul hides a chunk of the collective
    (megatron/core/model_parallel_config.py: tp_comm_overlap, tp_comm_overlap_ag/_rs)."""
    if not c.pipelined:
        return c.per_pass
    # All-gathers into the column-parallel matmuls (QKV, MLP input; in backward, the output
    # gradients' into the row-parallel ones), reduce-scatters out of the others.
    gathers = _gathers(c, lc.qkv_gemm, lc.up_gemm, c.inputs[2])
    scatters = sum(overlap(c.ag, c.chunked * w) for w in (lc.proj_gemm, lc.down_gemm))
    return np.where(sp, gathers + scatters, c.per_pass)


def _gathers(c: _TPCollectives, first: np.ndarray, second: np.ndarray,
             first_gather: np.ndarray | None = None) -> np.ndarray:
    """Exposed seconds of the two SP all-gathers feeding the matmuls of seconds ``first``
    and ``second`` under a pipelined TP: each hidden but for one chunk of its matmul where
    async TP fuses them (``_TPCollectives.fused_gather``), else both exposed.
    ``first_gather``: the first one's seconds where it differs (the attention's input)."""
    g1 = c.gather if first_gather is None else first_gather
    if c.fused_gather:
        return overlap(g1, c.chunked * first) + overlap(c.gather, c.chunked * second)
    return g1 + c.gather


def _tp_backward(c: _TPCollectives, r: Rows, sp: np.ndarray, lc: LayerCompute, kind: int,
                 ordered: bool = True) -> np.ndarray:
    """Exposed TP communication of one layer's backward pass.

    Megatron-LM's column-parallel linears (QKV, MLP input) launch their input-gradient
    collective asynchronously and compute the weight gradient meanwhile; with SP they also
    re-gather their input during the input-gradient matmul
    (``LinearWithGradAccumulationAndAsyncCommunication``; Korthikanti et al. 2022,
    Sec. 4.2.2 and 6.2). The gradient gathers of the row-parallel outputs (SP) stay exposed.
    Without SP the overlap needs ``Job.overlap_tp_grad_comm`` (Megatron-LM's
    ``--async-tensor-model-parallel-allreduce``, from August 2021). With userbuffers the
    output-gradient gathers are pipelined with their input-gradient matmuls too
    (tp_comm_bulk_wgrad/_dgrad keep the column-parallel ones bulk-overlapped).
    ``ordered`` False: the GPU does not run kernels in the order they are launched
    (``CUDA_DEVICE_MAX_CONNECTIONS`` > 1, which Megatron-LM's expert all-to-all overlap needs:
    megatron/core/transformer/moe/README.md, "Requirements for EP A2A Overlap"); the
    asynchronous collectives hide behind the matmuls launched after them only with one
    hardware queue (megatron/core/tensor_parallel/layers.py: "we rely on
    CUDA_DEVICE_MAX_CONNECTIONS=1 to ensure that the ... is scheduled before the ...
    computation", "necessary for a speedup but not for correctness"), so none is hidden;
    userbuffers' pipelined collectives keep their overlap.
    """
    if r.fw == "torchtitan":
        return _async_tp_backward(c, r, sp, lc, kind) if c.pipelined else c.per_pass
    if r.fw != "megatron":
        return c.per_pass
    ar_in, ag_in, _ = c.inputs
    gathers = sum(overlap(c.ag, c.chunked * w) for w in (lc.proj_gemm, lc.down_gemm)) \
        if c.pipelined else 2 * c.ag
    keep = ordered or c.pipelined  # the windows the input-gradient collectives hide in
    qkv, up = (lc.qkv_gemm, lc.up_gemm) if keep else (0.0 * lc.qkv_gemm, 0.0 * lc.up_gemm)
    exposed_sp = gathers + 2 * overlap(ag_in, qkv) + 2 * overlap(c.ag, up)
    exposed_ar = overlap(ar_in, qkv) + overlap(c.ar, up) \
        if r.job.overlap_tp_grad_comm else ar_in + c.ar
    return np.where(sp, exposed_sp, exposed_ar)


def _async_tp_backward(c: _TPCollectives, r: Rows, sp: np.ndarray, lc: LayerCompute,
                       kind: int) -> np.ndarray:
    """Exposed TP communication of one layer (of ``kind``)'s backward pass under torchtitan's
    async TP.

    Inductor's micro-pipeline pass fuses an all-gather with the matmul that reads it and a
    matmul with the reduce-scatter of its output, in the backward graph as in the forward
    one (torch/_inductor/fx_passes/micro_pipeline_tp.py, ``micro_pipeline_tp_pass``). In
    backward the row-parallel outputs' gradients are all-gathered into their input-gradient
    matmuls (``wo``, ``w2``): fused, each chunk hidden as in forward. A column-parallel
    input's gradient is reduce-scattered: fused where one matmul made it, unfused (exposed,
    as without async TP) where it is the sum of several (``_find_producer_matmul`` takes a
    matmul, not an add): the attention's q, k and v; a gated MLP's w1 and w3; a MoE layer's
    router and experts. A plain MLP's fc1 alone makes its input's gradient."""
    gathers = _gathers(c, lc.proj_gemm, lc.down_gemm)
    model = r.costs.spec
    assert model is not None
    summed = model.gated_mlp or r.costs.routed(kind)
    scatters = c.inputs[1] + (c.ag if summed else overlap(c.ag, c.chunked * lc.up_gemm))
    return np.where(sp, gathers + scatters, c.per_pass)


def tensor_parallel(r: Rows) -> TensorParallel:
    """TP communication per micro-batch per stage (``TensorParallel``)."""
    if r.costs.spec is None:
        # A traced graph: the collectives its layouts insert (LayerCosts.tp_seconds), all
        # exposed; full recompute runs a layer's forward half of them again.
        layers, emb, head = r.costs.tp_seconds(r.topo, r.a, r.job)
        rec = r.recomputed_sum([x / 2 for x in layers])
        # Per-op selective AC gathers again in backward what its layers all-gathered.
        if framework(r.job.framework).selective_recompute == "op":
            op_sac = r.a.recompute == 1
            layers = tuple(x + np.where(op_sac, g, 0.0) for x, g in zip(
                layers, r.costs.op_regather_seconds(r.topo, r.a, r.job), strict=True))
        return TensorParallel(exposed=r.per_stage(layers, emb, head) + rec,
                              layer_total=layers, emb=emb, head=head, rec_total=rec)
    # One layer's collectives depend on its kernel group alone (tp, sp, tokens and the
    # layer's matmuls): computed once per group where the layers are, and spread.
    groups, computes = layer_groups(r)
    per = _tp_layers(r, computes, groups)
    if groups is not None:
        per = per.spread(groups)
    # Full recompute runs each recomputed layer's forward collectives again, after gathering
    # the saved layer input when its TP ranks kept a slice each (distributed saved
    # activations, Job docstring; none with SP, whose input is already split).
    rec = r.recomputed_sum(per.fwd) if _tp_pipelined(r) else r.rec_layers * per.per_pass
    gather: np.ndarray | float = 0.0
    if r.job.distribute_saved_activations:
        gather = r.rec_layers * np.where(r.sp, 0.0, per.ag)
        rec = rec + gather
    # Per-op selective AC gathers again in backward (_op_sac_regathers).
    op_sac = r.a.recompute == 1
    regather = [np.where(op_sac, x, 0.0) for x in per.regather]
    unordered = _unordered_rows(r)
    bwd = [np.where(unordered, u, b) for u, b in zip(per.bwd_unordered, per.bwd, strict=True)]
    return TensorParallel(
        exposed=r.per_stage([f + b + g for f, b, g in zip(per.fwd, bwd, regather,
                                                           strict=True)], per.emb,
                            per.head) + rec,
        layer_total=tuple(per.total + np.where(op_sac, x, 0.0) for x in per.regather_total),
        emb=per.emb, head=per.head, rec_total=r.rec_layers * per.per_pass + gather)


@dataclass(frozen=True)
class _TPLayers:
    """One layer's TP collectives per micro-batch, seconds: exposed in forward and in
    backward (per kind of layer), the backward's without the kernel order Megatron-LM's
    asynchronous collectives rely on (``_tp_backward``'s ``ordered``), the embedding's and the
    head's, one forward pass's, one all-gather, and a layer's in all; what per-op selective
    AC gathers again in backward (per kind: exposed, all of it; ``_op_sac_regathers``)."""

    fwd: list[np.ndarray]
    bwd: list[np.ndarray]
    bwd_unordered: list[np.ndarray]
    emb: np.ndarray
    head: np.ndarray
    per_pass: np.ndarray
    ag: np.ndarray
    total: np.ndarray
    regather: list[np.ndarray]
    regather_total: list[np.ndarray]

    def spread(self, groups: Distinct) -> _TPLayers:
        """These, per group of ``groups``, per row."""
        def each(xs: list[np.ndarray]) -> list[np.ndarray]:
            return [groups.spread(x) for x in xs]

        return _TPLayers(fwd=each(self.fwd), bwd=each(self.bwd),
                         bwd_unordered=each(self.bwd_unordered), emb=groups.spread(self.emb),
                         head=groups.spread(self.head), per_pass=groups.spread(self.per_pass),
                         ag=groups.spread(self.ag), total=groups.spread(self.total),
                         regather=each(self.regather),
                         regather_total=each(self.regather_total))


def _unordered_rows(r: Rows) -> np.ndarray:
    """Rows whose backward TP collectives run without the kernel order Megatron-LM's
    asynchronous overlap relies on (``_tp_backward``'s ``ordered``): combined 1F1B's."""
    return r.a.schedule == SCHEDULE_CODES["combined-1f1b"]


def _tp_pipelined(r: Rows) -> bool:
    """Whether Megatron-LM's userbuffers or torchtitan's async TP pipeline the TP collectives
    with their matmuls (``Job.tp_comm_overlap``)."""
    return r.fw in ("megatron", "torchtitan") and r.job.tp_comm_overlap


def _tp_layers(r: Rows, layers: Sequence[LayerCompute], groups: Distinct | None
               ) -> _TPLayers:
    """One layer's TP collectives per micro-batch (``_TPLayers``) per kernel group (per row
    for ``None``; ``layer_groups``), whose layer computes are ``layers``."""
    tokens, tp, sp = (pick(x, groups) for x in (r.tokens, r.tp, r.sp))
    act = r.e * tokens * float(r.costs.hidden_size)  # one activation tensor, all of it
    ar = r.topo.all_reduce(act, tp, 1.0)
    ag = r.topo.all_gather(act, tp, 1.0)
    width, fused = float8_gather(r.fw, r.job, r.e)
    gather = ag if width == r.e else r.topo.all_gather(act * width / r.e, tp, 1.0)
    model = r.costs.spec
    assert model is not None
    ar_in, ag_in, gather_in = ar, ag, gather
    if model.attention_input_dim != model.hidden_size:
        # MLA: the up projections read the latents, gathered (SP) or whose gradient is
        # all-reduced (Megatron-Core MLASelfAttention), not the hidden state.
        act_in = act * model.attention_input_dim / float(model.hidden_size)
        ar_in, ag_in = r.topo.all_reduce(act_in, tp, 1.0), r.topo.all_gather(act_in, tp, 1.0)
        gather_in = r.topo.all_gather(act_in * width / r.e, tp, 1.0)
    c = _TPCollectives(ar=ar, ag=ag, per_pass=np.where(sp, gather_in + gather + 2 * ag, 2 * ar),
                       pipelined=_tp_pipelined(r), chunked=(tp - 1) / tp, gather=gather,
                       fused_gather=fused, ar_in=ar_in, ag_in=ag_in, gather_in=gather_in)
    fwd = [_tp_forward(c, sp, lc) for lc in layers]
    bwd = [_tp_backward(c, r, sp, lc, k) for k, lc in enumerate(layers)]
    # Megatron-LM's combined 1F1B runs with several hardware queues (``ordered`` False).
    unordered = [_tp_backward(c, r, sp, lc, k, ordered=False) for k, lc in enumerate(layers)] \
        if _unordered_rows(r).any() else list(bwd)
    # Folded experts (ParallelConfig.etp < tp, Megatron-Core's MoE parallel folding): a MoE
    # layer's tokens stay split over the TP ranks into the dispatcher, whose all-to-all
    # spans the experts' own etp x ep mesh, so its MLP half's TP exchanges (the SP gather
    # before it and the reduce-scatter after, or the all-reduce) leave; its attention's
    # stay, their share of the layer's.
    fold = pick(r.etp, groups) < tp
    if np.any(fold):
        num = np.where(sp, gather_in + ag, ar_in)
        den = np.where(sp, gather_in + gather + 2 * ag, ar_in + ar)
        attn = np.divide(num, den, out=np.ones_like(den), where=den > 0)
        keep = np.where(fold, attn, 1.0)
        for k in range(len(layers)):
            if r.costs.routed(k):
                fwd[k], bwd[k] = fwd[k] * keep, bwd[k] * keep
                unordered[k] = unordered[k] * keep
    regather = [_op_sac_regathers(r, c, sp, lc, k) for k, lc in enumerate(layers)]
    # Vocabulary-parallel embedding: all-reduce (SP: reduce-scatter) of its output; LM head:
    # all-gather of its input with SP, all-reduce of the input gradient without; the
    # vocabulary-parallel cross entropy all-reduces 3 fp32 values per token (max, sum, target).
    emb = np.where(sp, ag, ar)
    head = (np.where(sp, 2 * ag, ar) + 3 * r.topo.all_reduce(4.0 * tokens, tp, 1.0)) \
        * (1 + model.mtp_layers)  # multi-token prediction runs the output layer again
    total = 2 * c.per_pass + np.where(sp & (r.fw == "megatron"), 2 * ag, 0.0)
    return _TPLayers(fwd=fwd, bwd=bwd, bwd_unordered=unordered, emb=emb, head=head,
                     per_pass=c.per_pass, ag=ag,
                     total=total, regather=[x for x, _ in regather],
                     regather_total=[x for _, x in regather])


def _op_sac_regathers(r: Rows, c: _TPCollectives, sp: np.ndarray, lc: LayerCompute,
                      kind: int) -> tuple[np.ndarray, np.ndarray]:
    """What torchtitan's per-op selective AC (``Framework.selective_recompute`` "op") adds
    to one layer's backward under TP with SP, seconds per micro-batch: (exposed, all of it).

    Its policy saves the outputs of matmuls (but every second), of the attention kernel and
    of reduce-scatters and all-to-alls, not of all-gathers (torchtitan's
    ``_apply_ac_to_transformer_block`` ``_save_list``; its later ``_COMM_OPS``, the
    collectives saved "to avoid re-communication"). The all-gathered inputs of the attention
    and MLP projections are read again by their weight-gradient matmuls, so backward
    recomputes the norm and gathers them again: two all-gathers more per layer (one for a
    MoE layer, whose expert block it keeps as without recompute). Under async TP a gather
    hides behind the recomputed matmul it feeds (the K projection; the gated MLP's w3; a
    plain MLP's fc1 is saved, so nothing)."""
    zero = 0.0 * sp
    if framework(r.job.framework).selective_recompute != "op":
        return zero, zero
    model = r.costs.spec
    assert model is not None
    mlp = 0.0 if r.costs.routed(kind) else 1.0
    g_in = c.inputs[2]
    if c.pipelined and c.fused_gather:
        k_share = model.kv_dim / float(model.q_dim + model.kv_dim + model.v_dim)
        exposed = overlap(g_in, c.chunked * k_share * lc.qkv_gemm) + mlp * (
            overlap(c.gather, c.chunked * 0.5 * lc.up_gemm) if model.gated_mlp else c.gather)
    else:
        exposed = g_in + mlp * c.gather
    return np.where(sp, exposed, zero), np.where(sp, g_in + mlp * c.gather, zero)

"""Per-row queries of ``LayerCosts``: what each kind of layer, the embedding and the head
hold, keep, compute and communicate at the degrees and micro-batch of each row of a table of
configurations (``ConfigArrays``), read from a preset's formulas or a traced graph's blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from costmodel.config import QUANTIZED_PRECISIONS, Job
from costmodel.errors import SpecError
from costmodel.formulas.activations import layer_activations, layer_params_per_gpu
from costmodel.formulas.arrays import ConfigArrays, Distinct
from costmodel.formulas.compute import autocast_rows, layer_compute
from costmodel.formulas.eager import float8_gather, float8_gathered_rows, loss_kind
from costmodel.formulas.headcompute import lm_head_compute
from costmodel.formulas.kernels import (
    Kernels,
    float8_cast_compute,
    kernel_compute,
    te_quantize_compute,
)
from costmodel.formulas.layerstructure import LayerStructure
from costmodel.formulas.roofline import (
    LayerCompute,
    attention_kernel,
    high_precision,
    matmul_dtype,
    quantized_bytes,
    weight_grad_bytes,
)
from costmodel.formulas.shardcosts import (
    NONE_COMPILED,
    OP_SELECTIVE,
    OP_SELECTIVE_COMPILED,
    RECOMPUTE_MODES,
    BlockCosts,
    ShardCosts,
    _saved,
)
from costmodel.frameworks import framework
from costmodel.units import compute_bytes

if TYPE_CHECKING:
    from costmodel.formulas.comm import Topology
    from costmodel.hardware import GPU


_Out = TypeVar("_Out")


def _autocast_rows(block: BlockCosts, by_degree: list[tuple[int, ShardCosts, np.ndarray]],
                   ac: np.ndarray | None) -> list[tuple[ShardCosts, np.ndarray]]:
    """(costs, mask of rows) of ``_degree_rows``' groups, the rows ``ac`` marks (trained
    under torch.autocast, whole on one GPU) taken out for the block's ``autocast`` costs
    where it has them."""
    if block.autocast is None or ac is None or not np.any(ac):
        return [(c, rows) for _, c, rows in by_degree]
    out = [(c, rows & ~ac) for _, c, rows in by_degree]
    return [x for x in out if x[1].any()] + [(block.autocast, np.asarray(ac, dtype=bool))]


def _per_group(a: ConfigArrays, ac: np.ndarray | None,
               fn: Callable[[ConfigArrays, np.ndarray | None], _Out]) -> _Out:
    """``fn(a, ac)`` (a layer's per-row compute or saved bytes, which depend on
    ``ConfigArrays.kernel_groups``' columns alone) computed once per group, on one row of
    each, and spread over the rows: the same values, for a few dozen rows' arithmetic."""
    groups = a.kernel_groups
    if len(groups.first) == a.rows:
        return fn(a, ac)
    out = fn(a.kernel_rows, None if ac is None else np.take(ac, groups.first))
    return _spread(out, groups)


def _spread(x: Any, groups: Distinct) -> Any:
    """``x``'s per-group arrays (in a ``LayerCompute``, dict or tuple) spread over the rows
    (a ``LayerCompute``'s each when first read)."""
    if isinstance(x, LayerCompute):
        return SpreadCompute(x, groups)
    if isinstance(x, dict):
        return {k: _spread(v, groups) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_spread(v, groups) for v in x)
    return groups.spread(x) if np.ndim(x) else x


class SpreadCompute(LayerCompute):
    """A ``LayerCompute`` per row made from ``per_group``, one per group of ``groups``: each
    field is spread over the rows when first read (a search reads half of them, depending on
    the job's overlap switches). What depends on a layer's compute and the kernel groups'
    columns alone can be computed from ``per_group`` too (``costmodel.formulas.stepterms``' TP)."""

    per_group: LayerCompute
    groups: Distinct

    def __init__(self, per_group: LayerCompute, groups: Distinct) -> None:
        object.__setattr__(self, "per_group", per_group)
        object.__setattr__(self, "groups", groups)

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not yet in the instance: the dataclass fields, once each.
        if name.startswith("_") or name in ("per_group", "groups"):
            raise AttributeError(name)
        value = _spread(getattr(self.per_group, name), self.groups)
        object.__setattr__(self, name, value)
        return value


def _fp8_operands(k: Kernels, narrow: float = 0.5) -> Kernels:
    """``k`` with its quantized matmuls (a layer's linears, ``Gemm.cast_in``, and routed
    experts) moving ``narrow`` times the bytes the trace moved in bf16: one byte per element
    for fp8 (half), the format's bytes with scales for the others
    (``roofline.QUANTIZED_BYTES``), as the formulas time a layer's quantized matmuls."""
    return dataclasses.replace(k, gemms=tuple(
        dataclasses.replace(g, activation_bytes=g.activation_bytes * narrow,
                            weight_bytes=g.weight_bytes * narrow)
        if g.cast_in or g.expert else g for g in k.gemms))


def _routed(k: Kernels, load: float) -> Kernels:
    """``k`` with its routed experts' matmuls (``Gemm.expert``) on ``load`` times the traced
    tokens: their FLOPs and activations grow, their weights do not."""
    return dataclasses.replace(k, gemms=tuple(
        dataclasses.replace(g, flops=g.flops * load, activation_bytes=g.activation_bytes * load)
        if g.expert else g for g in k.gemms))


def _float8_gather_share(job: Job) -> float:
    """The share of a traced layer's all-gather bytes (traced in bf16) that ``job`` moves:
    torchtitan's tensorwise float8 TP styles gather the float8 cast of a linear's input
    (``compute.float8_gather``; a layer's SP all-gathers are its linears' inputs and, in
    backward, their output gradients)."""
    return float8_gather(job.framework, job, 2.0)[0] / 2.0


def _collective_seconds(topo: Topology, kind: str, nbytes: np.ndarray, calls: float, t: int
                        ) -> np.ndarray:
    """Seconds of ``calls`` collectives of ``kind`` moving ``nbytes`` in all over ``t``
    ranks inside a node (``costmodel.trace.sharding.reshard_time``'s costs: an all-to-all sends
    each rank's share), each paying its latency."""
    n = max(calls, 1.0)
    size = nbytes / n
    cost = topo.all_to_all(size / t, t, 1) if kind == "all-to-all" else {
        "all-reduce": topo.all_reduce, "all-gather": topo.all_gather,
        "reduce-scatter": topo.reduce_scatter}[kind](size, t, 1)
    return n * cost


class LayerQueries(LayerStructure):
    """The queries ``LayerCosts`` answers for a table of configurations: per row, what a
    layer of each kind, the embedding and the head hold, keep, compute and communicate, read
    from the fields ``LayerStructure`` declares."""

    def _by_tp(self, block: BlockCosts | None, tp: np.ndarray,
               figure: Callable[[ShardCosts], float], sp: np.ndarray | None = None
               ) -> np.ndarray:
        """``figure`` of a block's costs at each row's TP degree (0 without the block), and
        with the row's sequence parallelism ``sp`` where ``sp_costs`` has the block sharded
        so."""
        tp = np.asarray(tp)
        if block is None:
            return np.zeros(np.shape(tp), dtype=float)
        twin = self._twins.get(id(block)) if sp is not None else None
        # A lookup table by (degree, sequence parallel): no sort of the rows' degrees.
        width = max(block.by_tp) + 1
        if twin is not None:
            width = max(width, max(twin.by_tp) + 1)
        lut = np.full(2 * width, np.nan)
        for t, c in block.by_tp.items():
            lut[2 * t + int(self.sequence_parallel and twin is not None)] = figure(c)
        if twin is not None:
            for t, c in twin.by_tp.items():
                lut[2 * t + int(not self.sequence_parallel)] = figure(c)
        idx = 2 * tp.astype(np.int64)
        if twin is not None:
            idx = idx + np.asarray(sp).astype(np.int64)
        out = lut[np.minimum(idx, len(lut) - 1)]
        bad = np.isnan(out) | (idx >= len(lut))
        if bad.any():
            self._missing(block, idx[bad].flat[0])
        return out

    def _autocast_by_tp(self, block: BlockCosts | None, a: ConfigArrays,
                        ac: np.ndarray | None, figure: Callable[[ShardCosts], float]
                        ) -> np.ndarray:
        """``_by_tp`` of each row, with the block's ``autocast`` costs on the rows ``ac``
        marks (trained under torch.autocast) where it has them."""
        out = self._by_tp(block, a.tp, figure, a.sp)
        if block is None or block.autocast is None or ac is None:
            return out
        return np.where(ac, figure(block.autocast), out)

    def _missing(self, block: BlockCosts, key: int) -> None:
        """``SpecError``: ``block`` has no costs at TP degree ``key // 2`` with sequence
        parallelism ``key % 2``."""
        t, sp = int(key) // 2, bool(key % 2)
        raise SpecError(f"block {block.name!r} has no costs at tp={t}"
                        f"{' with sequence parallelism' if sp else ''}; degrees: "
                        f"{', '.join(map(str, sorted(self.variant(sp).tp_degrees)))}")

    def _degree_rows(self, block: BlockCosts, a: ConfigArrays
                     ) -> list[tuple[int, ShardCosts, np.ndarray]]:
        """(TP degree, the block's costs there, mask of the rows at it) per degree of the rows
        of ``a`` (and per sequence parallelism where ``sp_costs`` holds the block sharded
        the other way); ``SpecError`` for a degree the block has no costs at."""
        twin = self._twins.get(id(block))
        if twin is None:
            out = [(t, c, a.tp == t) for t, c in block.by_tp.items()]
        else:
            other = a.sp.astype(bool) != self.sequence_parallel
            out = [(t, c, (a.tp == t) & ~other) for t, c in block.by_tp.items()] \
                + [(t, c, (a.tp == t) & other) for t, c in twin.by_tp.items()]
        out = [x for x in out if x[2].any()]
        if sum(int(x[2].sum()) for x in out) != a.rows:
            covered = np.logical_or.reduce([x[2] for x in out]) if out \
                else np.zeros(a.rows, bool)
            r = int(np.flatnonzero(~covered)[0])
            self._missing(block, 2 * int(a.tp[r]) + int(a.sp[r]))
        return out

    def _token_share(self, job: Job, a: ConfigArrays) -> np.ndarray:
        """Each row's tokens per micro-batch per GPU over the traced micro-batch's (a
        context-parallel rank holds 1/cp of each sequence: its queries attend to all the
        keys, so its attention FLOPs are 1/cp too)."""
        if np.any(a.cp != 1) and not self.context_parallel_ok:
            raise SpecError(f"{self.name}: context parallelism splits the sequence, but "
                            f"{self.token_mixer} reduces over the tokens outside a fused "
                            "attention; use cp=1")
        return job.seq_len / a.cp * a.mbs / float(self.micro_batch_size * self.seq_len)

    def cp_kv_bytes(self, kind: int, job: Job, a: ConfigArrays) -> np.ndarray:
        """Bytes of the keys and values of one layer of ``kind`` that a context-parallel
        rank holds and passes on per ring step, per micro-batch, per row: a preset's
        ``e (s / cp) b (kv_dim + v_dim) / tp`` (MLA's keys and values per head, as
        Megatron-Core's ring attention passes them); a traced block's attention inputs."""
        if self.spec is not None:
            tokens = job.seq_len / a.cp * a.mbs
            kv = float(self.spec.kv_dim + self.spec.v_dim)
            return compute_bytes(job.precision) * tokens * kv / a.tp
        share = self._token_share(job, a)
        return self._by_tp(self.layer_blocks()[kind], a.tp, lambda c: c.kv_bytes,
                           a.sp) * share

    def cp_ring_steps(self, kind: int, job: Job, a: ConfigArrays) -> np.ndarray:
        """Ring steps a context-parallel rank takes per layer of ``kind`` per row: the other
        ``cp - 1`` ranks' keys and values; for a preset's local layer only the blocks its
        window reaches back into (``ceil(window / (s / cp))``, at most ``cp - 1``)."""
        steps = a.cp.astype(float) - 1
        if not self.local(kind):
            return steps
        assert self.spec is not None
        chunk = job.seq_len / a.cp.astype(float)
        return np.minimum(steps, np.ceil(self.spec.sliding_window / chunk))

    def layer_params_per_gpu(self, tp: np.ndarray, ep: np.ndarray
                             ) -> tuple[tuple[np.ndarray, np.ndarray | None], ...]:
        """Per kind of layer, the parameters one GPU holds of one layer per row: (all but
        routed experts, the routed experts or ``None`` for a kind without them)
        (``costmodel.formulas.activations.layer_params_per_gpu``)."""
        if self.spec is not None:
            dense, moe, experts = layer_params_per_gpu(self.spec, tp, ep)
            return tuple((moe, experts) if routed else (dense, None)
                         for routed, _ in self.spec.kind_attributes)
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        for k, b in enumerate(self.layer_blocks()):
            held = self._by_tp(b, tp, lambda c: c.params)
            if not self.routed(k):
                out.append((held, None))
                continue
            experts = self._by_tp(b, tp, lambda c: c.expert_params)
            out.append((held - experts, experts / ep))
        return tuple(out)

    def layer_param_tensors(self, separate_projections: bool) -> tuple[tuple[int, int], ...]:
        """Per kind of layer (as ``layer_params_per_gpu``), its parameter tensors: (weight
        matrices, vectors: norm scales and shifts and biases), what a trainer that gathers
        each parameter by its own collective issues (``Job.zero3_synchronous_gather``).
        ``separate_projections``: q, k, v (and a gated MLP's gate and up) are separate
        matrices (``Framework.separate_projections``) rather than fused ones. SpecError for
        a traced module, whose layers do not list their tensors here, and for mixture of
        experts, which that trainer's releases predate."""
        model = self.spec
        if model is None or model.is_moe:
            what = "a traced module" if model is None else "a mixture-of-experts model"
            raise SpecError(f"Job.zero3_synchronous_gather (DeepSpeed's per-parameter ZeRO-3 "
                            f"gathers of 2021) is modelled for a dense preset model, not "
                            f"{what}; turn it off")
        qkv = 3 if separate_projections else 1
        if model.is_mla:  # its linears and latent norms
            qkv = len(model.attention_matmuls()) - 1 + (1 if model.q_lora_rank else 0) + 1
        up = 2 if model.gated_mlp and separate_projections else 1
        weights = qkv + 1 + up + 1
        vectors = 2 * (2 if model.norm == "layernorm" else 1)
        if model.bias:
            vectors += weights
        elif model.qkv_bias:
            vectors += qkv
        return ((weights, vectors),)

    def edge_params_per_gpu(self, tp: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input side, output side, tied) parameters one GPU of the first and of the last
        stage holds per row: the vocabulary-parallel embedding and LM head split over tp
        (Megatron-LM, torchtitan), learned positions, token types, norms and a ViT's patch
        projection replicated; the tied word embedding's share, which the last stage keeps
        a copy of when pp > 1 (Megatron-LM keeps both copies in sync by an all-reduce)."""
        if self.spec is None:
            emb, head = self.edges()
            return (self._by_tp(emb, tp, lambda c: c.params),
                    self._by_tp(head, tp, lambda c: c.params),
                    self._by_tp(head, tp, lambda c: c.shared_params))
        model = self.spec
        norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
        word = 0 if model.patch_size else model.vocab_size * model.hidden_size
        final_norm = norm if model.final_norm else 0
        emb_local = word / tp + (model.embedding_params() - word)
        head_local = (model.head_params() - final_norm) / tp + final_norm
        # Multi-token prediction (beyond its layers, ``stagelayout.stage_layout``): the 2h -> h
        # projection split over tp, three norms whole; it reads the embedding on the last
        # stage, which keeps a copy of it as a tied output layer does.
        mtp = model.mtp_layers
        head_local = head_local + mtp * ((model.mtp_extra_params() - 3 * norm) / tp + 3 * norm)
        shared = model.tied_embeddings or mtp > 0
        return emb_local, head_local, (word if shared else 0) / tp

    def layer_activations(self, job: Job, a: ConfigArrays, kind: int, ac: np.ndarray
                          ) -> dict[str, np.ndarray]:
        """Bytes one layer of ``kind`` saves for backward per micro-batch per recompute
        mode, per row (``costmodel.formulas.activations.layer_activations``)."""
        return _per_group(a, ac, lambda g, g_ac: self._layer_activations(job, g, kind, g_ac))

    def _layer_activations(self, job: Job, a: ConfigArrays, kind: int, ac: np.ndarray | None
                           ) -> dict[str, np.ndarray]:
        if self.spec is not None:
            return layer_activations(self.spec, job, framework(job.framework), a,
                                     self.routed(kind), ac)
        layer, share = self.layer_blocks()[kind], self._token_share(job, a)
        op = framework(job.framework).selective_recompute == "op"
        keys = {"selective": OP_SELECTIVE_COMPILED if job.compile else OP_SELECTIVE} \
            if op else {}
        if job.compile:
            keys["none"] = NONE_COMPILED
        return {m: self._autocast_by_tp(layer, a, ac, partial(_saved, m, key=keys.get(m)))
                * share for m in RECOMPUTE_MODES}

    def edge_activations(self, job: Job, a: ConfigArrays, ac: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(input side, output side) bytes saved for backward per micro-batch per row.

        Korthikanti et al. 2022, Sec. 4.3: the embedding's dropout mask sbh/t; on the last
        stage the final norm's input 2sbh/t, the output layer's input 2sbh/t and the fp32
        logits 4sbv/t the cross entropy keeps, in all 4sbh/t (1 + v/h). Under autocast the
        final norm's input is fp32 (4 + e instead of 2e). A compiled loss
        (``costmodel.formulas.compute.loss_kind``) keeps the e-byte logits it was given instead of
        an fp32 log-softmax (measured, benchmarks/op_sac_memory.py); an eager one without the
        upcast (``Job.loss_upcast``) an e-byte log-softmax."""
        return _per_group(a, ac, lambda g, g_ac: self._edge_activations(job, g, g_ac))

    def _edge_activations(self, job: Job, a: ConfigArrays, ac: np.ndarray | None
                          ) -> tuple[np.ndarray, np.ndarray]:
        if self.spec is None:
            emb, head = self.edges()
            share = self._token_share(job, a)
            # The embedding and head are not recomputed.
            kept = partial(_saved, "none", key=NONE_COMPILED if job.compile else None)
            return (self._autocast_by_tp(emb, a, ac, kept) * share,
                    self._autocast_by_tp(head, a, ac, kept) * share)
        model = self.spec
        e = compute_bytes(job.precision)
        tp = a.tp.astype(float)
        tokens = job.seq_len / a.cp * a.mbs
        rep = np.where(a.sp == 1, 1.0 / tp, 1.0)
        h = float(model.hidden_size)
        emb_act = (1.0 if model.dropout else 0.0) * tokens * h * rep
        kind = loss_kind(framework(job.framework), job)
        # The log-softmax an eager F.cross_entropy keeps is in the dtype of its input: fp32
        # unless the trainer skips the upcast (Job.loss_upcast).
        logit_b = e if kind == "compiled" or (kind == "eager" and not job.loss_upcast) \
            else 4.0
        if ac is None:
            ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
        head_act = (np.where(ac, 4.0 + e, 2 * e) * tokens * h * rep
                    + logit_b * tokens * model.vocab_size / tp)
        if model.mtp_layers:
            # Each multi-token prediction module keeps its output layer's input and logits as
            # the model's does, its two norms' inputs and its projection's input (2h).
            head_act = head_act * (1 + model.mtp_layers) \
                + model.mtp_layers * e * tokens * h * (2 * rep + 2 * rep)
        return emb_act, head_act

    def logits_per_token(self, tp: np.ndarray) -> np.ndarray:
        """Logits one GPU of the last stage holds per token (the vocabulary over tp; for a
        traced graph, the widest tensor of its output side)."""
        if self.spec is None:
            return self._by_tp(self.edges()[1], tp, lambda c: c.widest_elements) \
                / float(self.micro_batch_size * self.seq_len)
        return self.spec.vocab_size / tp

    def layer_compute(self, gpu: GPU, job: Job, a: ConfigArrays, kind: int,
                      capacity_factor: float = 1.0, autocast: np.ndarray | None = None
                      ) -> LayerCompute:
        """One layer of ``kind``'s compute per micro-batch per row (``costmodel.formulas.compute``;
        a traced graph's: its kernels, ``costmodel.formulas.kernels``)."""
        return _per_group(a, autocast, lambda g, g_ac: self._layer_compute(
            gpu, job, g, kind, capacity_factor, g_ac))

    def _layer_compute(self, gpu: GPU, job: Job, a: ConfigArrays, kind: int,
                       capacity_factor: float, autocast: np.ndarray | None) -> LayerCompute:
        if self.spec is None:
            return self._kernel_compute(self.layer_blocks()[kind], gpu, job, a, autocast,
                                        load=capacity_factor)
        moe = self.routed(kind)
        return layer_compute(self.spec, gpu, job, a.tp, a.cp, a.mbs, a.sp, moe=moe,
                             capacity_factor=capacity_factor, ep=a.ep if moe else None,
                             autocast=autocast,
                             float8_gathered=float8_gathered_rows(job.framework, job, a.zero),
                             local=self.local(kind),
                             etp=a.etp if moe and a.etp is not None else None)

    def head_compute(self, gpu: GPU, job: Job, a: ConfigArrays,
                     autocast: np.ndarray | None = None) -> tuple[LayerCompute, LayerCompute]:
        """(embedding, head) compute per micro-batch per row (``costmodel.formulas.compute``; a
        traced graph's: the kernels of its input and output sides)."""
        return _per_group(a, autocast, lambda g, g_ac: self._head_compute(gpu, job, g, g_ac))

    def _head_compute(self, gpu: GPU, job: Job, a: ConfigArrays, autocast: np.ndarray | None
                      ) -> tuple[LayerCompute, LayerCompute]:
        if self.spec is None:
            emb, head = self.edges()
            return (self._kernel_compute(emb, gpu, job, a, autocast),
                    self._kernel_compute(head, gpu, job, a, autocast))
        return lm_head_compute(self.spec, gpu, job, a.tp, a.cp, a.mbs, a.sp,
                               autocast=autocast)

    def _kernel_compute(self, block: BlockCosts | None, gpu: GPU, job: Job, a: ConfigArrays,
                        autocast: np.ndarray | None = None, load: float = 1.0) -> LayerCompute:
        """A traced block's ``LayerCompute`` per row: its kernels at the row's TP degree
        (its ``autocast`` kernels on the rows ``autocast`` marks, where it has them), scaled
        to the row's micro-batch (zero without the block); a MoE layer's expert matmuls at
        the busiest rank's ``load`` (``moe.routed_load``), as the formulas run them."""
        share = self._token_share(job, a)
        fields = [f.name for f in dataclasses.fields(LayerCompute)]
        out = {name: np.zeros(np.shape(a.tp)) for name in fields}
        if block is None:
            return LayerCompute(**out)
        # The job's matmul dtype (tf32 for fp32, fp8), as the formulas run theirs; the bytes
        # moved are as traced. fp8 runs in the layers only: the input and output sides stay
        # in bf16 (``headcompute.lm_head_compute``).
        dtype = matmul_dtype(job)
        if block.kind != "layer":
            dtype = high_precision(dtype)
        fw = framework(job.framework)
        op = fw.selective_recompute == "op"
        # torchao's float8 training casts each Float8Linear's input and output gradient in
        # a layer (the formulas' ``eager.float8_cast_time``; the head stays in bf16).
        casts = fw.torchao_float8 and job.precision == "fp8" and block.kind == "layer"
        te_casts = fw.name == "megatron" and job.precision in QUANTIZED_PRECISIONS \
            and block.kind == "layer"
        gathered = float8_gathered_rows(job.framework, job, a.zero)
        kernel = attention_kernel(job, gpu)
        for c, rows in _autocast_rows(block, self._degree_rows(block, a), autocast):
            run = (c.compiled if job.compile and c.compiled is not None else c.kernels) \
                or Kernels()
            again = c.recomputed
            if op and c.op_recomputed is not None:
                # torchtitan's per-op selective AC re-runs its matmuls and every
                # memory-bound kernel of the block (``costmodel.trace.blockcosts``).
                again = dataclasses.replace(run, gemms=c.op_recomputed.gemms,
                                            attention_flops=0.0, attention_kernels=0,
                                            attention_backward=False,
                                            attention_flops_per_key=0.0)
            if load != 1.0:
                run, again = _routed(run, load), again and _routed(again, load)
            if dtype in QUANTIZED_PRECISIONS and block.kind == "layer":
                narrow = quantized_bytes(job) / 2
                run, again = _fp8_operands(run, narrow), again and _fp8_operands(again, narrow)
            lc = kernel_compute(gpu, dtype, run, share[rows], again, ep=a.ep[rows],
                                attention_kernel=kernel, grad_bytes=weight_grad_bytes(job))
            if casts:
                cast_f, cast_b = float8_cast_compute(gpu, job, run, share[rows],
                                                     gathered[rows])
                # Per-op AC re-runs every memory-bound kernel, the casts among them.
                lc = dataclasses.replace(lc, forward=lc.forward + cast_f,
                                         backward=lc.backward + cast_b,
                                         selective=lc.selective + cast_f if op
                                         else lc.selective)
            if te_casts:
                cast_f, cast_b = te_quantize_compute(gpu, job, run, share[rows])
                lc = dataclasses.replace(lc, forward=lc.forward + cast_f,
                                         backward=lc.backward + cast_b)
            for name in fields:
                out[name][rows] = getattr(lc, name)
        return LayerCompute(**out)

    def tp_seconds(self, topo: Topology, a: ConfigArrays, job: Job
                   ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
        """A traced graph's tensor-parallel collectives per micro-batch per row, seconds:
        (one layer of each kind, the input side, the output side), forward and backward,
        all exposed (inside a node; ``costmodel.trace.sharding.reshard_time``'s costs)."""
        emb, head = self.edges()
        share = self._token_share(job, a)
        gather = _float8_gather_share(job)

        def seconds(block: BlockCosts | None) -> np.ndarray:
            out = np.zeros(np.shape(a.tp))
            if block is None:
                return out
            for t, c, rows in self._degree_rows(block, a):
                for kind, nbytes in c.collectives.items():
                    if kind == "all-gather" and block.kind == "layer":
                        nbytes = nbytes * gather
                    out[rows] = out[rows] + _collective_seconds(
                        topo, kind, nbytes * share[rows], c.collective_calls.get(kind, 1.0), t)
            return out

        return tuple(seconds(b) for b in self.layer_blocks()), seconds(emb), seconds(head)

    def op_regather_seconds(self, topo: Topology, a: ConfigArrays, job: Job
                            ) -> tuple[np.ndarray, ...]:
        """A traced graph's all-gathers that torchtitan's per-op selective AC runs again in
        backward, seconds per micro-batch per row, one layer of each kind
        (``ShardCosts.op_regather``; a preset's are ``costmodel.formulas.stepterms``'s)."""
        share = self._token_share(job, a) * _float8_gather_share(job)
        out = []
        for block in self.layer_blocks():
            secs = np.zeros(np.shape(a.tp))
            for t, c, rows in self._degree_rows(block, a):
                if c.op_regather:
                    secs[rows] = _collective_seconds(topo, "all-gather",
                                                     c.op_regather * share[rows],
                                                     c.op_regather_calls, t)
            out.append(secs)
        return tuple(out)

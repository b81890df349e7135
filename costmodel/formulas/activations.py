"""What the formulas of a transformer preset (``ModelSpec``) say one layer keeps for backward
and holds in parameters per GPU: the analytic producer behind ``LayerCosts.from_spec`` and the
memory table of a preset.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from costmodel.config import QUANTIZED_PRECISIONS, Job
from costmodel.formulas.arrays import ConfigArrays
from costmodel.formulas.compute import autocast_rows
from costmodel.formulas.moe import routed_load
from costmodel.formulas.roofline import quantized_bytes
from costmodel.frameworks import Framework
from costmodel.model import ModelSpec
from costmodel.units import compute_bytes

__all__ = ["layer_activations", "layer_params_per_gpu"]


def layer_activations(model: ModelSpec, job: Job, fw: Framework, a: ConfigArrays,
                       moe: bool, ac: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Bytes saved for backward by one layer for one micro-batch, per recompute mode ``[rows]``.

    Korthikanti et al. 2022, Sec. 4.1: attention 11sbh + 5as^2b, MLP 19sbh, norms 4sbh, i.e.
    sbh(34 + 5as/h); under tensor parallel the norm inputs, the inputs of the first linear of
    each block and the dropout masks (10sbh) are replicated and the rest is divided by t
    (Table 2: sbh(10 + 24/t + 5as/(ht))); sequence parallel divides everything by t;
    selective recompute drops the 5as^2b score terms; full recompute keeps the layer input.
    Generalized here to GQA (K and V of kv_heads * head_dim), gated MLPs, models without
    dropout, fused attention (saves Q, K, V, O and a fp32 log-sum-exp per query and head, Dao
    et al. 2022, instead of the score matrix), Transformer Engine's fp8 and nvfp4 linear
    inputs (1 byte, or half a byte, block scales added), context parallel (s/cp tokens per
    rank) and MoE layers (routed tokens: top_k copies, Fedus et al. 2022, times the busiest
    expert-parallel rank's load, ``moe.routed_load``).
    """
    e = compute_bytes(job.precision)
    # Transformer Engine keeps a linear's fp8 input for backward; torchao's Float8Linear keeps
    # the high-precision one (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args:
    # save_for_backward(input_hp, weight_hp_t)), so float8 saves what bf16 saves (torchtitan
    # published 61.8 GiB float8 vs 62.0 bf16, torchao 47.77 vs 47.65).
    # Block-scaled formats keep their scales beside the values (roofline.QUANTIZED_BYTES):
    # MXFP8 1/32 byte, block-wise fp8 4/128, NVFP4 half a byte and 1/16.
    e_lin = quantized_bytes(job) if job.precision in QUANTIZED_PRECISIONS \
        and not fw.torchao_float8 else e
    h = float(model.hidden_size)
    tp = a.tp.astype(float)
    s_local = job.seq_len / a.cp.astype(float)
    tokens = s_local * a.mbs
    rep = np.where(a.sp == 1, 1.0 / tp, 1.0)  # tensors replicated over TP unless SP
    drop = 1.0 if model.dropout else 0.0
    # Under torch.autocast (compute.autocast_rows) the norm inputs (the residual stream) are
    # fp32, and each linear fed by a norm saves its own cast of the norm output: q, k and v
    # three copies, the gated MLP's up and gate two (measured with torch.cuda.memory
    # snapshots on an H100, benchmarks/single_gpu_accuracy.py). ``ac``: those rows, when the
    # caller has them already.
    # Compiled, AOTAutograd's common-subexpression pass makes the casts of one tensor one
    # (one copy saved), and its partitioner keeps the attention's bf16 output rather than
    # the fp32 stream it adds up to, which backward recomputes from the layer's input (as a
    # traced graph's compiled count keeps: ``costmodel.trace.fusion._compiled_saved``).
    if ac is None:
        ac = autocast_rows(job, a.zero, a.tp, a.pp, a.cp)
    compiled = job.compile and fw.eager_kernels  # an eager trainer under torch.compile
    copies = ac & (not compiled)
    e_res = np.where(ac, 4.0, e)
    n_qkv = np.where(copies, 3.0, 1.0)
    n_in = 2.0 if model.gated_mlp else 1.0  # an MLP's input projections
    # Under autocast a MoE layer's norm output is cast by its router and by its shared
    # experts' input projections (one MLP as wide as all of them), each keeping its own
    # copy; the routed tokens are gathered from the fp32 stream.
    n_up = np.where(copies, 1.0 + n_in * (model.num_shared_experts > 0) if moe else n_in, 1.0)
    e_mlp_res = np.where(copies, 4.0, e)

    # Attention block (norm input, QKV input, core, output-projection input, dropout mask).
    attn_rep = (e_res + n_qkv * e_lin + drop) * tokens * h * rep
    qkv = float(model.q_dim + model.kv_dim + model.v_dim)
    if job.flash_attention:
        core_keep = (e * tokens * qkv + e * tokens * model.o_dim
                     + 4.0 * tokens * model.num_heads) / tp
        core_scores = np.zeros_like(core_keep)
    else:
        core_keep = (e * tokens * qkv + e_lin * tokens * model.o_dim) / tp
        scores = model.num_heads * a.mbs * s_local * job.seq_len / tp
        core_scores = scores * (e + drop * (1.0 + e))  # softmax out, mask, dropout out
    # MLP block: norm input, first-linear input, dropout mask replicated; inner tensors / tp.
    # Compiled, an eager trainer's SwiGLU keeps the gate and up outputs and their product
    # (silu is recomputed from the gate's output): 3 ffn-wide tensors, as fused kernels keep
    # (measured on an H200, Llama 3 8B's layer without recompute: 1185 MiB compiled, 1665
    # eager; benchmarks/op_sac_memory.py).
    gated = 3 if compiled else fw.gated_mlp_saved_widths

    # With Megatron-Core's activation_func_fp8_input_store a SwiGLU keeps its input (the
    # first linear's output, the gated widths but the last) in fp8 (Job docstring).
    e_in = 1.0 if job.activation_func_fp8_input_store and model.gated_mlp else e

    def mlp_inner(ffn: float, tok: np.ndarray) -> np.ndarray:
        widths = gated if model.gated_mlp else 2
        return ((widths - 1) * e_in + e_lin) * tok * ffn / tp

    mlp_rep = (e_mlp_res + n_up * e_lin + drop) * tokens * h * rep
    if moe:
        f_moe = float(model.moe_ffn_hidden_size or 0)
        # The busiest expert-parallel rank's routed copies: the load that paces its matmuls
        # (moe.routed_load: the capacity factor, or dropless routing's measured imbalance)
        # sets what it saves too, and the peak is that rank's.
        routed = tokens * model.top_k * routed_load(job)
        # The routed copies a rank holds in the hidden size: its TP group's (gathered)
        # with the experts split as tp, its own share folded (ParallelConfig.etp); their
        # MLP's inner tensors hold routed * f_moe / tp either way.
        held = routed * a.expert_tp / tp
        # The experts' outputs are weighted by the router's probabilities as they are
        # combined, and that product keeps them for the probabilities' gradient: Megatron-
        # Core's unpermute multiplied the permuted tokens by the probs before 0.13
        # (megatron/core/transformer/moe/moe_utils.py), torchtitan's MoE its routed output
        # by top_scores, GShard's combine einsum its expert outputs. Before the TP reduction
        # (a partial sum on each rank).
        # torchtitan scales the routed tokens by their scores first, keeping their fp32 copy
        # for the scores' gradient, and sums the experts' outputs (Framework.
        # moe_scores_before_experts); compiled, the partitioner recomputes that pointwise
        # product from the layer's input and keeps nothing more.
        kept = (0.0 if compiled else 4.0) if fw.moe_scores_before_experts else e
        if fw.moe_probs_in_activation:
            # Megatron-Core 0.13+ weights inside the experts' activation (Framework.
            # moe_probs_in_activation): only each routed copy's fp32 probability stays.
            kept = 4.0 / h
        # Under autocast the scaled tokens stay fp32, and each of the experts' input
        # projections casts them itself (torchtitan's ``x.bfloat16()`` per grouped matmul).
        mlp = (mlp_rep + 4.0 * tokens * model.num_experts * rep  # fp32 router probabilities
               # permuted expert inputs (tokens gathered over TP)
               + np.where(copies, n_in, 1.0) * e_lin * held * h
               + kept * held * h  # the experts' outputs (or inputs) the scores' product keeps
               + mlp_inner(f_moe, routed)
               + mlp_inner(f_moe * model.num_shared_experts, tokens))
    else:
        mlp = mlp_rep + mlp_inner(float(model.ffn_hidden_size or 0), tokens)

    # qk-norm (ModelSpec.qk_norm): each norm keeps its input, the projected q and k of the
    # rank's heads, for its backward (and RoPE then keeps the normed ones, counted above).
    qk_in = e * tokens * (model.q_dim + model.kv_dim) / tp if model.qk_norm else 0.0 * tokens
    # MLA: each latent's norm keeps its input and its up projection the normed latent, on
    # every TP rank (its sequence shard under SP; Megatron-Core MLASelfAttention); the
    # rotations keep nothing (orthogonal: their backward rotates the gradient back).
    latent = (e + e_lin) * tokens * float(model.latent_norm_params()) * rep
    # Post-norms (Gemma's, ModelSpec.post_norms): each keeps its input, the attention's and
    # the MLP's output (the row-parallel linears' outputs, after their reduction).
    post = (2.0 * e * tokens * h * rep) if model.post_norms else 0.0 * tokens
    none = attn_rep + core_keep + qk_in + core_scores + mlp + latent + post
    full = e_res * tokens * h * rep
    if job.distribute_saved_activations:
        # Each TP rank keeps its 1/tp slice of the saved layer input (Job docstring).
        full = full * np.where(a.sp == 1, 1.0, 1.0 / tp)
    selective = none - core_scores
    if fw.name == "megatron":
        selective = selective - _recomputed_modules(
            model, job, moe, e_lin, tokens * h * rep, tokens * model.top_k / tp, core_scores,
            mlp_inner, tokens, e * tokens * qkv / tp, mlp - mlp_rep)
    if fw.selective_recompute == "op":
        # torchtitan's per-op selective AC (frameworks.Framework.selective_recompute) keeps
        # the block input and the outputs of the matmuls it does not re-run (wq, wv, w1 or
        # fc1, w2 or fc2) and of the fused attention kernel (O and its fp32 log-sum-exp); a
        # MoE layer's expert block keeps what it keeps without recompute.
        attn_op = (e * tokens * (model.q_dim + model.v_dim + model.o_dim)
                   + 4.0 * tokens * model.num_heads) / tp
        if moe:
            mlp_op = mlp - mlp_rep
        elif model.bias:
            # Linears with a bias run as ``addmm``, which the policy does not save (its
            # ``_save_list`` holds ``aten.mm``): only the attention kernel's outputs stay.
            attn_op = (e * tokens * model.o_dim + 4.0 * tokens * model.num_heads) / tp
            mlp_op = 0.0 * tokens
        else:
            # Compiled, the partitioner keeps only what backward reads, and the second MLP
            # matmul's output feeds nothing but the residual add: its h per token goes
            # (measured on an H200, Llama 3 8B's layer: 497 MiB per layer eager, 433 MiB
            # compiled, the difference one [s, h] bf16 tensor; benchmarks/op_sac_memory.py).
            # The second matmul's output is whole on each TP rank (a row-parallel linear's
            # partial sum, before its all-reduce or reduce-scatter).
            ffn = float(model.ffn_hidden_size or 0)
            mlp_op = e * tokens * (ffn / tp + (0.0 if job.compile else h))
        selective = np.minimum(full + attn_op + mlp_op, selective)
    return {"none": none, "selective": selective, "full": full}


def _recomputed_modules(model: ModelSpec, job: Job, moe: bool, e_lin: float,
                        hidden: np.ndarray, routed_per_tp: np.ndarray, scores: np.ndarray,
                        mlp_inner: Callable[[float, np.ndarray], np.ndarray],
                        tokens: np.ndarray, qkv_kept: np.ndarray,
                        moe_inner: np.ndarray) -> np.ndarray:
    """Bytes Megatron-LM's selective recompute drops beyond the attention core's scores
    (``Job.recompute_modules``; megatron/core/transformer/transformer_config.py: ``moe_act``,
    ``layernorm`` and ``mla_up_proj`` checkpoint without keeping their output, ``mlp`` and
    ``shared_experts`` with a plain checkpoint that keeps its input): ``moe_act``, the routed
    experts' activation output, their fc2 input (the fc1 output it is recomputed from stays);
    ``layernorm``, the two norms' outputs, the QKV and MLP input projections' inputs
    (``hidden``: one [tokens, h] tensor as the rank holds it); ``mlp``, a dense layer's MLP
    inner tensors (``mlp_inner`` of its width; its input, the norm's output, stays);
    ``shared_experts``, the shared experts' inner tensors likewise; ``mla_up_proj``, the
    query, key and value latent attention's up projections and rotary embedding make
    (``qkv_kept``: what the attention core keeps of them; the latents stay); ``moe``, all a
    MoE layer keeps beyond its norm's input and output (``moe_inner``: the router's
    probabilities, the permuted tokens, the routed and shared experts' inner tensors;
    moe_layer.py checkpoints its whole forward from the norm's output), which covers
    ``moe_act`` and ``shared_experts``. Without ``core_attn`` the attention scores stay (a
    negative drop; nothing with a fused attention)."""
    mods = job.recompute_modules
    out = 0.0 * hidden
    whole_moe = "moe" in mods and moe
    if "core_attn" not in mods:
        out = out - scores
    if whole_moe:
        out = out + moe_inner
    if "moe_act" in mods and moe and not whole_moe:
        out = out + e_lin * routed_per_tp * float(model.moe_ffn_hidden_size or 0)
    if "layernorm" in mods:
        out = out + 2 * e_lin * hidden
    if "mlp" in mods and not moe:
        out = out + mlp_inner(float(model.ffn_hidden_size or 0), tokens)
    if "shared_experts" in mods and moe and model.num_shared_experts and not whole_moe:
        out = out + mlp_inner(float(model.moe_ffn_hidden_size or 0)
                              * model.num_shared_experts, tokens)
    if "mla_up_proj" in mods and model.is_mla:
        out = out + qkv_kept
    return out


def layer_params_per_gpu(model: ModelSpec, tp: np.ndarray, ep: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parameters one GPU holds of (a dense layer, a MoE layer's non-expert part, its routed
    experts): matrices split over tp (Megatron-LM column/row parallel), experts further split
    over ep. Replicated over tp: the layer's norms (``ModelSpec.layer_norm_params``), and the
    biases of the row-parallel output projections (attention output, MLP down), added after
    the all-reduce (Shoeybi et al. 2019, Sec. 3; Megatron-LM RowParallelLinear, torch
    RowwiseParallel), MLA's down
    projections and latent norms (``ModelSpec.attention_replicated_params``), and a MoE layer's
    router, whose ``experts x hidden`` weight every rank holds whole (Megatron-Core
    ``megatron/core/transformer/moe/router.py``: a plain parameter, its gradient all-reduced
    over tp under sequence parallelism); and the query and key norms' weights (``qk_norm``),
    shared by the heads."""
    row_bias = model.hidden_size if model.bias else 0
    rep_attn = model.layer_norm_params() + model.attention_replicated_params()
    rep_dense = 2 * row_bias + rep_attn
    # (The routed experts' own biases are split with them.)
    rep_moe = row_bias + model.router_params() + rep_attn
    dense = (model.dense_layer_params() - rep_dense) / tp + rep_dense
    moe = (model.moe_layer_non_expert_params() - rep_moe) / tp + rep_moe
    return dense, moe, model.routed_expert_params() / (tp * ep)

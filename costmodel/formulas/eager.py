"""Memory-bound work that a fused count leaves out: the eager kernels of a trainer that runs
PyTorch ops one by one (RMSNorm, rotary embedding, SwiGLU, dropout, MoE routing), the
cross entropy each trainer runs, and float8 training's casts and scales (torchao).
"""

from __future__ import annotations

import numpy as np

from costmodel.config import Job
from costmodel.formulas.roofline import memory_time, quantized_bytes
from costmodel.frameworks import Framework
from costmodel.hardware import GPU
from costmodel.model import ModelSpec
from costmodel.units import Num


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
                e: float, ac: Num = False, rotary: bool = True) -> tuple[np.ndarray, Num]:
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
    20 bytes beyond it in 5 kernels (what a trace under autocast runs,
    ``costmodel.trace.graph``)."""
    h = float(model.hidden_size)
    out = 0.0 * tokens
    kernels: Num = 0.0
    if model.dropout:
        out = out + 2 * (2 * e) * tokens * h * rep
        kernels += 2.0
    if model.norm == "rmsnorm":
        per = EAGER_RMSNORM_BYTES + 2 * e - np.where(ac, 8.0 + 2 * e, 0.0)
        norms = 4 if model.post_norms else 2
        out = out + norms * per * tokens * h * rep
        kernels = kernels + norms * (EAGER_RMSNORM_KERNELS - np.where(ac, 2.0, 0.0))
    if model.qk_norm:  # the query and key norms decomposed too, over the rank's heads
        out = out + (EAGER_RMSNORM_BYTES + 2 * e) * tokens * (model.q_dim + model.kv_dim) / t
        kernels = kernels + 2 * EAGER_RMSNORM_KERNELS
    if model.is_mla:
        # MLA eager: the latents' RMSNorms decomposed as the pre-norms are (on every rank);
        # the rotation of the queries' and the shared key's rotary parts alone, 3 kernels
        # each, then the queries and keys concatenated and the values copied out (what the
        # fused count's two assembling kernels move, in three): 7 kernels more.
        latent = float(model.latent_norm_params())
        out = out + (EAGER_RMSNORM_BYTES + 2 * e) * tokens * latent * rep
        kernels = kernels + (1.0 + (model.q_lora_rank > 0)) * EAGER_RMSNORM_KERNELS
        if model.position_embedding == "rope" and rotary:
            rotated = float(model.num_heads * model.qk_rope_head_dim) / t \
                + model.qk_rope_head_dim
            out = out + EAGER_ROPE_BYTES * tokens * rotated
            kernels += 7.0
    elif model.position_embedding == "rope" and rotary:
        out = out + EAGER_ROPE_BYTES * tokens * float(model.rotary_elements) / t
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
#: regions count: ``costmodel.trace.fusion._regions``).
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
                     e: float, ac: Num = False, rotary: bool = True) -> np.ndarray:
    """The bytes of ``eager_bytes``'s kernels (and of the fused count they extend) that are
    dtype casts: each eager RMSNorm's and each rotary embedding's cast to fp32 and back
    (read e, write 4; read 4, write e; none for a norm under autocast, ``ac``, whose input
    is fp32). A cast's backward casts the gradient back, moving what its forward moved,
    where other memory-bound kernels move ``BACKWARD_BYTES`` times as much (the traced
    graph counts them so too: ``costmodel.trace.blockcosts``)."""
    h = float(model.hidden_size)
    out = 0.0 * tokens
    per = 2 * (4.0 + e)  # up to fp32 and back, bytes per element
    if model.norm == "rmsnorm":
        norms = 4 if model.post_norms else 2
        out = out + norms * np.where(ac, 0.0, per) * tokens * h * rep
    if model.norm == "rmsnorm" and model.is_mla:  # the latents' norms (MLA)
        out = out + per * tokens * float(model.latent_norm_params()) * rep
    if model.position_embedding == "rope" and rotary:
        out = out + per * tokens * (float(model.num_heads * model.qk_rope_head_dim) / t
                                    + model.qk_rope_head_dim if model.is_mla
                                    else float(model.rotary_elements) / t)
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
    ins = tokens * (3 * h + model.o_dim / t + n_up * h * (ffn > 0) + ffn / t)
    outs = tokens * ((model.q_dim + model.kv_dim + model.v_dim) / t + h + n_up * ffn / t
                     + h * (ffn > 0))
    weights = sum(i * o / (t if split else 1.0) for i, o, split in model.attention_matmuls()) \
        + (n_up + 1.0) * h * ffn / t
    linears = 4.0 + (n_up + 1.0) * (ffn > 0)
    return float8_casts(gpu, job, ins, outs, linears, weights, gathered)


def te_quantize_time(model: ModelSpec, gpu: GPU, job: Job, tokens: np.ndarray,
                     t: np.ndarray, routed: np.ndarray | None = None,
                     etp: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of Transformer Engine's quantize kernels in one layer of
    an fp8 or nvfp4 Megatron-LM job (``te_quantize``): the attention's fused QKV and output
    linears, the MLP's two, and a MoE layer's routed (``routed`` tokens the rank computes,
    top-k copies, through experts split ``etp`` ways, default ``t``) and shared experts'
    instead of the dense MLP's (the router stays bf16)."""
    h = float(model.hidden_size)
    n_up = 2.0 if model.gated_mlp else 1.0
    ffn = 0.0 if routed is not None else float(model.ffn_hidden_size or 0)
    ins = tokens * (h + model.o_dim / t + (h + ffn / t) * (ffn > 0))
    outs = tokens * ((model.q_dim + model.kv_dim + model.v_dim) / t + h
                     + (n_up * ffn / t + h) * (ffn > 0))
    linears = 2.0 + 2.0 * (ffn > 0)
    if routed is not None:
        fe = float(model.moe_ffn_hidden_size or 0)
        et = t if etp is None else etp
        shared = fe * model.num_shared_experts
        ins = ins + routed * (h + fe / et) + tokens * (h + shared / t) * (shared > 0)
        outs = outs + routed * (n_up * fe / et + h) + tokens * (n_up * shared / t + h) \
            * (shared > 0)
        linears = linears + 2.0 + 2.0 * (shared > 0)
    return te_quantize(gpu, job, ins, outs, linears)


def te_quantize(gpu: GPU, job: Job, ins: Num, outs: Num, linears: Num
                ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of Transformer Engine's quantize kernels for linears
    reading ``ins`` input elements and writing ``outs`` output elements in all (Megatron-LM
    with ``--fp8-format`` or ``--fp4-format``). Forward quantizes each linear's input into a
    row-wise copy for its own matmul and a column-wise one that backward's weight-gradient
    matmul reads (TE's cast-transpose; for MXFP8 and NVFP4 the two carry scales along
    different axes): read 2 bytes, write twice the format's bytes with scales
    (``roofline.QUANTIZED_BYTES``), one kernel per linear. Backward quantizes each output
    gradient the same way for the data- and weight-gradient matmuls; NVFP4 applies its
    16-point random Hadamard transform to the column-wise operands in that pass (NVIDIA,
    "Pretraining Large Language Models with NVFP4", arXiv 2509.25149, Sec. 4.2), which
    stays memory-bound. Where TE fuses a quantize into the norm or activation before it
    (LayerNormLinear, LayerNormMLP), the bf16 read and a launch are saved; they are counted
    here all the same (a few per cent of the quantize traffic's upper bound)."""
    width = 2.0 + 2.0 * quantized_bytes(job)
    return (memory_time(gpu, width * np.asarray(ins, dtype=float), linears),
            memory_time(gpu, width * np.asarray(outs, dtype=float), linears))


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
    if job.float8_recipe == "mxfp8":
        # torchao's MX casts take each 32-element block's amax inside the cast kernel (no
        # amax pass: read e, write 1 and a 1/32 scale byte) along dim 0 in forward and dim 1
        # for the transposed operands of backward, and cast the weight on every micro-batch
        # (no float8 FSDP gather; torchao/prototype/mx_formats/mx_linear.py).
        cast = e + 1.0 + 1.0 / 32
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
    if job.float8_recipe in ("rowwise", "mxfp8"):
        # torchtitan's float8 TP styles are the tensorwise recipe's alone; MX matmuls are not
        # the pattern async TP fuses either (like row-wise's).
        return e, False
    return 1.0, True

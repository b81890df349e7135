"""Job (what is trained) and ParallelConfig (how it is split), with their validation.

``ParallelConfig`` checks what it can alone; ``costmodel.formulas.checks.validate`` checks it
against a model, a cluster and a job. Both raise ``SpecError`` naming the offending values and a
fix, never ``assert``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from costmodel.errors import SpecError
from costmodel.frameworks import FRAMEWORKS
from hardware_profiles.numbers import real

__all__ = ["ATTENTION_KERNELS", "TRI_STATE_JOB_FLAGS", "Job", "ParallelConfig", "accounted_split"]

PRECISIONS = ("bf16", "fp16", "fp8", "nvfp4", "mxfp4", "fp32")
#: The precisions whose matmuls run quantized (block scales: roofline.QUANTIZED_BYTES); their
#: attention, output layer and optimizer stay in bf16 or above.
QUANTIZED_PRECISIONS = ("fp8", "nvfp4", "mxfp4")
#: The FP4 precisions: each a block-scaled recipe of its own (NVFP4 Blackwell's, MXFP4 CDNA
#: 4's), where fp8 takes ``Job.float8_recipe``.
FP4_PRECISIONS = ("nvfp4", "mxfp4")
OPTIMIZERS = ("adamw", "adam", "adam8bit", "sgd", "adafactor")
#: torchao's float8 training recipes (torchtitan ``--quantize.linear.float8.recipe_name``).
FLOAT8_RECIPES = ("tensorwise", "rowwise", "mxfp8", "blockwise")
#: Megatron-LM's ``--recompute-modules`` the cost model counts (megatron/core/transformer/
#: transformer_config.py: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe,
#: shared_experts and hybrid models' own; Megatron's default is core_attn). ``moe`` re-runs
#: the whole MoE layer, its dispatch and combine included.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: MoE token dispatchers (``costmodel.formulas.moe.dispatch_combine``).
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")
#: Storage dtypes of Adam's two moments (Megatron-LM's precision-aware optimizer,
#: ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` choices at the recorded commit) and their bytes.
STATE_DTYPES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
#: Storage dtypes of the master weights (``--main-params-dtype``) and their bytes.
MASTER_DTYPES = {"fp32": 4.0, "fp16": 2.0}
#: Fused attention kernels: FlashAttention-2 (the flash-attn package, SDPA's flash backend on
#: NVIDIA, Composable Kernel's on AMD), cuDNN's fused flash attention (Transformer Engine's
#: FusedAttention, SDPA's cuDNN backend; AMD's v3 assembly kernels on Instinct GPUs) and
#: AOTriton, AMD's Triton FlashAttention, which PyTorch's SDPA runs on ROCm (Instinct only).
ATTENTION_KERNELS = ("flash", "cudnn", "aotriton")
#: Pipeline schedules (``costmodel.formulas.pipeline``); ``zbv`` and ``dualpipev`` are V-shaped,
#: two chunks per rank (``costmodel.formulas.vschedules``); ``combined-1f1b`` is Megatron-LM's
#: 1F1B with each steady-state forward and backward merged so that one hides the other's
#: expert-parallel all-to-alls (``--overlap-moe-expert-parallel-comm``), interleaved when
#: pp > 1; ``dualpipe`` is DeepSeek's bidirectional DualPipe over pp ranks, rank r holding
#: stages r and pp - 1 - r (``costmodel.formulas.vschedules.dualpipe_costing``).
SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "zero-bubble", "zbv", "dualpipev",
             "combined-1f1b", "dualpipe")
#: The schedules that place two model chunks per rank as a V.
V_SCHEDULES = ("zbv", "dualpipev")
RECOMPUTE = ("none", "selective", "full")
OFFLOADS = ("none", "optimizer", "optimizer+params")
FRAMEWORK_NAMES = tuple(f.name for f in FRAMEWORKS)


def _choice(owner: str, key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{owner}.{key}={value!r} is not one of: {', '.join(allowed)}")


def _positive_int(owner: str, key: str, value: Any, most: int | None = None,
                  allow_zero: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        need = "a non-negative" if allow_zero else "a positive"
        raise SpecError(f"{owner}.{key} must be {need} integer, got {value!r}")
    if most is not None and value > most:
        raise SpecError(f"{owner}.{key} = {value:,} is beyond what any training job uses (at "
                        f"most {most:,}); check the units")


# Sanity bounds, far beyond published training runs (Llama 3 405B: 8,192-token sequences,
# 16M-token batches, Dubey et al. 2024; million-token contexts exist), so that a typo is an
# error instead of numbers that overflow.
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**24
MAX_TOKENS_PER_STEP = 2**36


#: Job flags that are true, false or None (None: the trainer's own).
TRI_STATE_JOB_FLAGS = ("fused_cross_entropy", "compile_loss", "grad_reduce_in_fp32")


def _modules(mods: object) -> tuple[str, ...]:
    """``Job.recompute_modules`` checked (``RECOMPUTE_MODULES``), as a tuple without repeats."""
    if isinstance(mods, str) or not isinstance(mods, tuple | list) or not mods:
        raise SpecError(f"Job.recompute_modules must be a non-empty list of "
                        f"{', '.join(RECOMPUTE_MODULES)}, got {mods!r}")
    for m in mods:
        if m not in RECOMPUTE_MODULES:
            raise SpecError(f"Job.recompute_modules: {m!r} is not one the planner costs "
                            f"(Megatron-LM's hybrid models' own are not); choose from "
                            f"{', '.join(RECOMPUTE_MODULES)}")
    return tuple(dict.fromkeys(str(m) for m in mods))


@dataclass(frozen=True, kw_only=True)
class Job:
    """What is trained: batch (sequences per step), sequence length (tokens), number formats.

    ``precision``: ``bf16`` / ``fp16`` (mixed precision with fp32 master state), ``fp8``
    (fp8 matmuls, bf16 weights and activations, fp32 master state), ``nvfp4`` (Transformer
    Engine's NVFP4 recipe under Megatron-LM, ``--fp4-format e2m1 --fp4-recipe nvfp4``: every
    transformer layer's linears, forward and both backward matmuls, take E2M1 operands with
    one E4M3 scale per 16 elements at the GPU's nvfp4 rate; attention and the output layer
    stay bf16, as for fp8; Blackwell only), ``mxfp4`` (the OCP MX FP4 recipe of AMD's
    Megatron-LM (Primus, ROCm Transformer Engine), ``--fp4-format e2m1 --fp4-recipe mxfp4``:
    the same linears take E2M1 operands with one E8M0 scale per 32 elements at the GPU's
    mxfp4 rate, attention and the output layer in bf16; CDNA 4 only) or ``fp32``.
    ``framework``: the trainer whose memory conventions the estimate follows.
    ``flash_attention``: whether attention runs as a fused kernel that saves no
    sequence-by-sequence score matrix (Dao et al. 2022); off for runs that predate it.
    ``overlap_grad_reduce``: whether data-parallel gradient reduction (and the ZeRO parameter
    all-gather after the step) overlaps with compute as each trainer does it when asked
    (Megatron-LM ``--overlap-grad-reduce --overlap-param-gather``, DeepSpeed ``overlap_comm``,
    torch DDP buckets, FSDP); ``False`` models trainers that reduce after the backward pass
    (Megatron-LM's own DDP before 2023). ZeRO-3/FSDP prefetching always overlaps.
    ``overlap_tp_grad_comm``: whether Megatron-LM runs each column-parallel linear's
    input-gradient all-reduce beside its weight-gradient matmul without sequence parallel
    (``--async-tensor-model-parallel-allreduce``, added in August 2021 and on by default
    since; with sequence parallel Megatron-LM always overlaps); ``False`` models the releases
    before it. Other trainers keep TP collectives on the critical path either way.
    ``fuse_grad_accumulation``: whether Megatron-LM's weight-gradient matmuls add into the
    gradient buffer themselves (``--gradient-accumulation-fusion``, on by default since
    February 2022, first with fp32 main gradients and from September 2022 with fp16 ones too);
    ``False`` models the releases before it, which add each micro-batch's gradients into the
    buffer with a separate kernel, as every other trainer does through PyTorch's autograd.
    ``tp_comm_overlap``: whether Megatron-LM pipelines each tensor-parallel all-gather and
    reduce-scatter with its linear layer's matmul, in forward and backward (Transformer
    Engine's userbuffers, ``--tp-comm-overlap``; it needs sequence parallel, and NVIDIA's
    performance recipes turn it on); ``False``: the collectives of the forward pass and the
    output-gradient gathers of backward stay on the critical path. In torchtitan it is async
    TP (``parallelism.enable_async_tensor_parallel``, which needs ``compile``): each
    all-gather + matmul and matmul + reduce-scatter is split into tp chunks in forward and
    backward alike (torch's micro-pipelined ``fused_all_gather_matmul`` /
    ``fused_matmul_reduce_scatter``). DeepSpeed ignores it.
    ``overlap_p2p_comm``: whether Megatron-LM's interleaved 1F1B schedule overlaps its
    pipeline sends and receives with the next model chunk's compute
    (``--overlap-p2p-communication``, added in May 2023 and on by default since October 2023;
    Megatron-LM turns it off without interleaving); ``False`` models the releases before it.
    Other trainers ignore it.
    ``compile``: whether the model runs under ``torch.compile`` (torchtitan
    ``compile.enable``; off by default there). Compiled, the memory-bound kernels are fused
    (one read and one write per tensor, as the cost model counts them for every trainer);
    eager, torchtitan's Llama runs RMSNorm, the complex rotary embedding, SwiGLU and
    torchao's float8 casts as separate kernels (``costmodel.formulas.compute.eager_bytes``).
    Megatron-LM and DeepSpeed run their own fused kernels and ignore it.
    ``fp8_param_gather``: Megatron-LM's ``--fp8-param-gather`` with fp8 training (set by
    NeMo's and Megatron-Bridge's fp8 recipes, nemo/collections/llm/recipes/precision/
    mixed_precision.py): the model's parameters are Transformer Engine fp8 tensors (1 byte,
    and its transposed copy) instead of bf16 beside TE's cached fp8 copies, and the
    distributed optimizer all-gathers them in fp8. torchtitan with torchao's tensor-wise
    recipe: ``float8.enable_fsdp_float8_all_gather`` (and
    ``precompute_float8_dynamic_scale_for_fsdp``, as torchtitan's float8 docs launch it):
    FSDP all-gathers each layer's linear weights in float8, cast on the shard before the
    gather (``costmodel.formulas.eager.float8_param_gather``); row-wise, it gathers in bf16. Other
    trainers ignore it.
    ``fp8_weight_transpose_cache``: with fp8 under Megatron-LM, whether Transformer Engine
    keeps each weight's fp8 transpose beside its fp8 copy between micro-batches (its default)
    or remakes it at each use: ``False`` is ROCm Megatron-LM's
    ``--no-fp8-weight-transpose-cache`` (Primus ``no_fp8_weight_transpose_cache``, which
    AMD's FSDP recipes set; Transformer Engine on ROCm), halving the cached copies. Only for
    fp8 Megatron-LM jobs on AMD GPUs (``costmodel.formulas.checks``).
    ``fused_cross_entropy``: whether the loss is a fused cross entropy that works on one
    fp32 copy of the logits (llm-foundry's default ``loss_fn: fused_crossentropy``,
    flash-attn's Triton kernel, llmfoundry/models/mpt/modeling_mpt.py) rather than torch's
    ``F.cross_entropy``; None: the trainer's own (``Framework.fused_cross_entropy``).
    Megatron-LM's vocabulary-parallel one is in place on an fp32 copy either way: this is
    its ``--cross-entropy-loss-fusion`` (off by default; NeMo 2 and Megatron-Bridge turn it
    on), without which it runs op by op (``costmodel.formulas.compute.loss_kind``).
    ``grad_reduce_in_fp32``: whether Megatron-LM keeps and reduces its gradients in fp32
    (``main_grad``; Megatron-LM forces it with bf16: megatron/training/arguments.py sets
    ``accumulate_allreduce_grads_in_fp32`` for ``--bf16``; Megatron-Core's
    ``DistributedDataParallelConfig.grad_reduce_in_fp32``) or in the 16-bit compute dtype
    (NeMo's ``distributed_fused_adam`` with ``grad_sync_dtype: bf16``); None: the trainer's
    own. Other trainers ignore it.
    ``compile_loss``: whether the loss runs under ``torch.compile`` with the model (the
    cast, log-softmax and NLL fused into one reduction over the low-precision logits, and
    one pointwise kernel in backward); None: under ``compile`` where the trainer compiles
    its loss (``Framework.compiles_loss``: torchtitan from April 2025). A fused cross
    entropy (``fused_cross_entropy``) is its own kernel either way.
    ``loss_upcast``: whether torch's ``F.cross_entropy`` runs on an fp32 copy of the logits
    (torchtitan's loss casts them, ``pred.float()``) or, False, on the compute-dtype logits
    themselves (NeMo AutoModel's ``MaskedCrossEntropy`` with ``fp32_upcast: false``,
    nemo_automodel/components/loss/masked_ce.py): its log-softmax, kept for backward, and
    its gradients are then 16-bit. Only torch's eager cross entropy reads it (``costmodel.
    formulas.eager.loss_kind`` ``"eager"``); the trainers the planner emits upcast.
    ``distribute_saved_activations``: under full recompute without sequence parallel, each
    tensor-parallel rank keeps only its 1/tp slice of the layer input it saved and all-gathers
    it before recomputing the layer (Megatron-LM ``--distribute-saved-activations``,
    megatron/core/tensor_parallel/random.py ``CheckpointFunction``; metaseq's
    ``--distribute-checkpointed-activations``; DeepSpeed's ``partition_activations``).
    Rows with another recompute mode, with SP or with tp = 1 ignore it.
    ``activation_func_fp8_input_store``: a SwiGLU MLP (dense, routed and shared experts)
    keeps its activation function's input, the first linear's output, in fp8 for backward
    and casts it back there (Megatron-Core's ``TransformerConfig.activation_func_fp8_input_store``,
    a config field with no pretrain_gpt.py flag: Megatron-Bridge's
    ``model.activation_func_fp8_input_store``; the DeepSeek-V3 report's Sec. 3.3.3 caches the
    SwiGLU input in FP8 likewise). Megatron-LM only, gated MLPs only.
    ``float8_recipe``: with fp8, the scaling recipe. Under torchtitan, torchao's: ``tensorwise``
    (one scale per tensor), ``rowwise`` (one per row; its casts write a transposed bf16 copy
    and cast it again along the other axis, ``costmodel.formulas.eager.float8_cast_time``) or
    ``mxfp8`` (torchao's MX training, ``quantize.linear.mx``: one E8M0 scale per 32 elements,
    cast along both axes in one pass each, on GPUs whose profile has an ``mxfp8`` peak:
    Blackwell, CDNA 4). Under Megatron-LM, Transformer Engine's ``--fp8-recipe``: ``mxfp8``,
    or ``blockwise`` (DeepSeek-V3's 1x128 activation and 128x128 weight scales); the others
    are its default scaling, which the cost model does not tell apart. torchtitan 0.2 has no
    block-wise recipe.
    ``optimizer_state_dtype``: the dtype Adam's two moments (SGD's momentum) are kept in:
    ``fp32`` (every trainer's default), or ``bf16`` / ``fp16`` / ``fp8`` with Megatron-LM's
    precision-aware optimizer (``--use-precision-aware-optimizer --exp-avg-dtype
    --exp-avg-sq-dtype``, Transformer Engine's FusedAdam; NeMo's ``optim.dtype``). Memory and
    the optimizer step's traffic follow (``costmodel.formulas.states``). Other trainers refuse
    anything but fp32 (``costmodel.formulas.checks``).
    ``master_weights_dtype``: the dtype of the master copy of the weights the optimizer
    updates: ``fp32``, or ``fp16`` with Megatron-LM's ``--main-params-dtype fp16`` (the
    precision-aware optimizer keeps fp16 masters with their remainders in the states). Other
    trainers refuse fp16.
    ``attention_kernel``: which fused attention kernel runs, ``"flash"`` (FlashAttention-2;
    Composable Kernel's on AMD), ``"cudnn"`` (the GPU vendor's own, which Transformer Engine
    calls: cuDNN's on NVIDIA, AMD's aiter v3 kernels on Instinct GPUs) or ``"aotriton"``
    (PyTorch SDPA's flash backend on ROCm; ``ATTENTION_KERNELS``); ``None``: the trainer's
    own choice on the GPU (``costmodel.formulas.roofline.attention_kernel``,
    ``Framework.cudnn_attention_archs``, ``Framework.rocm_attention``).
    Needs ``flash_attention``.
    ``zero3_synchronous_gather``: DeepSpeed's ZeRO-3 as released from v0.3.12 (March 2021)
    to v0.5.4: each parameter tensor is all-gathered by its own collective after a
    ``torch.cuda.synchronize()``, so no gather runs beside compute, and through
    ``torch.distributed.all_gather`` / ``reduce_scatter`` with a list of one tensor per rank,
    which PyTorch copies out of (into) a flat buffer one tensor at a time
    (deepspeed/runtime/zero/partition_parameters.py ``_allgather_param`` and
    ``_reduce_scatter_gradient`` at commit c83e49f9e; DeepSpeed PR #1188, v0.5.5: 'the async
    version is not async at all, because each all_gather calls torch.cuda.synchronize()' and
    'torch.distributed.all_gather will do implicit memcpy'). ``False``: later DeepSpeed,
    whose coalesced gathers overlap compute like FSDP's. Other trainers ignore it.
    ``moe_capacity_factor``: expert capacity as a multiple of the even share of routed tokens
    (Fedus et al. 2022), the busiest expert-parallel rank taken at capacity; ``None`` is
    dropless routing. ``moe_load_imbalance``: with dropless routing, the routed tokens on the
    busiest expert-parallel rank over the even share (1.0: the forced even routing of
    benchmark tables, Megatron-LM's ``--moe-router-force-load-balancing``); ``None`` takes the
    imbalance published for trained routers (``costmodel.formulas.moe.routed_load``). Both
    scale the busiest rank's expert matmuls and its dispatch and combine (its activation
    memory counts the even share). ``moe_dispatcher``: how tokens reach their experts:
    ``alltoall`` (an NCCL all-to-all), ``allgather`` (Megatron-LM's all-gather dispatcher)
    or ``deepep`` (DeepEP's kernels, one network copy per destination node;
    ``costmodel.formulas.moe``).
    ``recompute_modules``: what a row's ``selective`` recompute re-runs under Megatron-LM
    (``--recompute-granularity selective --recompute-modules``): ``core_attn`` (the
    attention core, Korthikanti et al. 2022; Megatron's default), ``moe_act`` (the routed
    experts' activation function: their fc2 input is not kept), ``layernorm`` (the two
    norms: their outputs, the QKV and MLP inputs, are not kept), ``mlp`` (a dense layer's
    MLP), ``moe`` (a MoE layer whole: router, dispatch, experts, combine and shared experts
    re-run from its input), ``shared_experts`` (a MoE layer's shared experts) and
    ``mla_up_proj`` (latent
    attention's up projections and rotary embedding: the query, key and value are not
    kept); each one re-runs its kernels in backward (``costmodel.formulas.compute``,
    ``activations``). Other trainers take the default.
    ``memory_reserve``: the share of each GPU's memory a plan keeps free for what the estimate
    does not count: the caching allocator's fragmentation (GMLake, Guo et al. ASPLOS 2024,
    measured 15 % of reserved memory on average, up to 33 %, over eight LLM training jobs on
    80 GB A100s with PyTorch's default allocator; torchtitan and Megatron-LM runs set
    ``expandable_segments``, which leaves less), a framework's own buffers and a run's
    transient peaks. The search only picks configurations whose estimated peak leaves it
    free; an estimate still says "fits" up to the whole capacity, and flags a peak above 95 %
    of it (``costmodel.formulas.estimate.NEAR_CAPACITY``).
    """

    global_batch_size: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adamw"
    framework: str = "torchtitan"
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    overlap_tp_grad_comm: bool = True
    fuse_grad_accumulation: bool = True
    tp_comm_overlap: bool = False
    overlap_p2p_comm: bool = True
    moe_capacity_factor: float | None = None
    moe_load_imbalance: float | None = None
    moe_dispatcher: str = "alltoall"
    recompute_modules: tuple[str, ...] = ("core_attn",)
    memory_reserve: float = 0.05
    compile: bool = False
    fp8_param_gather: bool = False
    fp8_weight_transpose_cache: bool = True
    fused_cross_entropy: bool | None = None
    compile_loss: bool | None = None
    loss_upcast: bool = True
    grad_reduce_in_fp32: bool | None = None
    distribute_saved_activations: bool = False
    activation_func_fp8_input_store: bool = False
    zero3_synchronous_gather: bool = False
    float8_recipe: str = "tensorwise"
    attention_kernel: str | None = None
    optimizer_state_dtype: str = "fp32"
    master_weights_dtype: str = "fp32"

    def __post_init__(self) -> None:
        _positive_int("Job", "global_batch_size", self.global_batch_size, MAX_GLOBAL_BATCH)
        _positive_int("Job", "seq_len", self.seq_len, MAX_SEQ_LEN)
        if self.global_batch_size * self.seq_len > MAX_TOKENS_PER_STEP:
            raise SpecError(f"Job: {self.global_batch_size:,} x {self.seq_len:,} tokens per step "
                            f"is beyond any training job (at most {MAX_TOKENS_PER_STEP:,}); "
                            "check the batch and sequence length")
        _choice("Job", "precision", self.precision, PRECISIONS)
        _choice("Job", "optimizer", self.optimizer, OPTIMIZERS)
        _choice("Job", "framework", self.framework, FRAMEWORK_NAMES)
        _choice("Job", "float8_recipe", self.float8_recipe, FLOAT8_RECIPES)
        _choice("Job", "optimizer_state_dtype", self.optimizer_state_dtype, tuple(STATE_DTYPES))
        _choice("Job", "master_weights_dtype", self.master_weights_dtype, tuple(MASTER_DTYPES))
        for key, value in self.low_precision_states.items():
            if self.optimizer not in ("adam", "adamw"):
                raise SpecError(f"Job.{key}={value!r} is Megatron-LM's "
                                "precision-aware Adam (Transformer Engine's FusedAdam); "
                                f"{self.optimizer} keeps its own states: leave it fp32")
        if self.attention_kernel is not None:
            _choice("Job", "attention_kernel", self.attention_kernel, ATTENTION_KERNELS)
            if not self.flash_attention:
                raise SpecError(f"Job.attention_kernel={self.attention_kernel!r} names a fused "
                                "attention kernel, but flash_attention is off (attention "
                                "saves its score matrix); drop one of the two")
        for key in ("flash_attention", "overlap_grad_reduce", "overlap_tp_grad_comm",
                    "fuse_grad_accumulation", "tp_comm_overlap", "overlap_p2p_comm",
                    "compile", "fp8_param_gather", "fp8_weight_transpose_cache",
                    "distribute_saved_activations",
                    "zero3_synchronous_gather", "loss_upcast",
                    "activation_func_fp8_input_store"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"Job.{key} must be true or false, got {getattr(self, key)!r}")
        for key in TRI_STATE_JOB_FLAGS:
            if getattr(self, key) is not None and not isinstance(getattr(self, key), bool):
                raise SpecError(f"Job.{key} must be true, false or None (the trainer's own), "
                                f"got {getattr(self, key)!r}")
        if self.moe_capacity_factor is not None:
            # Tokens an expert takes, as a multiple of an even share: at most every token
            # (num_experts / top_k); 1,000 is beyond any model's ratio.
            object.__setattr__(self, "moe_capacity_factor", real(
                self.moe_capacity_factor, "Job.moe_capacity_factor (or None: dropless)",
                lo=0.0, lo_open=True, hi=1000.0))
        _choice("Job", "moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS)
        object.__setattr__(self, "recompute_modules", _modules(self.recompute_modules))
        if self.moe_load_imbalance is not None:
            if self.moe_capacity_factor is not None:
                raise SpecError("Job: give moe_capacity_factor (tokens over capacity dropped) "
                                "or moe_load_imbalance (dropless routing's busiest rank), not "
                                "both")
            object.__setattr__(self, "moe_load_imbalance", real(
                self.moe_load_imbalance, "Job.moe_load_imbalance (busiest expert-parallel "
                "rank's tokens over the even share, at least 1; or None)", lo=1.0, hi=1000.0))
        object.__setattr__(self, "memory_reserve", real(
            self.memory_reserve, "Job.memory_reserve (the share of GPU memory a plan keeps "
            "free, e.g. 0.05 for 5 %)", lo=0.0, hi=0.9, hi_open=True))

    @property
    def low_precision_states(self) -> dict[str, str]:
        """``optimizer_state_dtype`` and ``master_weights_dtype`` where not fp32 (Megatron-LM's
        precision-aware optimizer), by field name."""
        return {k: v for k, v in (("optimizer_state_dtype", self.optimizer_state_dtype),
                                  ("master_weights_dtype", self.master_weights_dtype))
                if v != "fp32"}

    @property
    def unit(self) -> str:
        """What the throughput counts: ``tokens``, or ``samples`` for a job of one-token
        sequences (an image model traced from a module: ``seq_len`` 1)."""
        return "samples" if self.seq_len == 1 else "tokens"

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed per optimizer step: ``global_batch_size * seq_len``."""
        return self.global_batch_size * self.seq_len


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """One way to split training. Degrees: ``dp, tp, pp, cp`` multiply to the world size;
    ``ep`` (expert parallel) is carved out of ``dp * cp`` for the expert layers, as Megatron-LM
    and torchtitan lay out their meshes. ``etp``: the experts' own tensor-parallel degree
    (Megatron-Core's MoE parallel folding, ``--expert-tensor-parallel-size``): the experts
    then form their own mesh of etp x ep x expert-data-parallel over the same ``tp * cp * dp``
    ranks of a pipeline stage, etp innermost, so ``etp * ep`` must divide them; ``None`` is
    ``tp`` (the experts split as the attention).

    ``zero_stage``: 0 (replicated), 1 (optimizer sharded), 2 (+ gradients), 3 (+ parameters;
    FSDP). ``sharding_group``: the data-parallel ranks one shard spans (HSDP / hybrid sharding);
    ``None`` means all of ``dp``. ``pipeline_schedule``: ``None`` picks ``1f1b``, or
    ``interleaved-1f1b`` when ``virtual_pipeline_stages > 1``. ``recompute``: ``none``,
    ``selective`` (attention core, Korthikanti et al. 2022) or ``full``; with ``full``,
    ``recompute_num_layers`` limits it to the first N layers of each pipeline chunk.
    ``offload``: ``none``, ``optimizer``, ``optimizer+params`` (to CPU memory).
    ``stage_layers``: explicit transformer layers per pipeline stage (sums to the model's);
    interleaved, per chunk in virtual order (``chunk_layers``; ``accounted_split`` gives
    Megatron-LM's split with the embedding and the loss counted as layers).
    ``stage_recompute_layers``: with ``recompute='full'`` and ``stage_layers``, how many of
    each stage's layers (its first ones) are fully recomputed, so stages may differ.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    zero_stage: int = 0
    sharding_group: int | None = None
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    pipeline_schedule: str | None = None
    virtual_pipeline_stages: int = 1
    recompute: str = "none"
    recompute_num_layers: int | None = None
    offload: str = "none"
    stage_layers: tuple[int, ...] | None = None
    stage_recompute_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        owner = "ParallelConfig"
        for key in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages"):
            _positive_int(owner, key, getattr(self, key))
        if self.etp is not None:
            _positive_int(owner, "etp", self.etp)
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise SpecError(f"{owner}.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        self._check_schedule()
        self._check_recompute()
        _choice(owner, "offload", self.offload, OFFLOADS)
        if self.sequence_parallel and self.tp < 2:
            raise SpecError(f"{owner}: sequence_parallel needs tp >= 2, got tp={self.tp}")
        self._check_sharding_group()
        self._check_stage_layers()

    def _check_schedule(self) -> None:
        """Resolve the default schedule; the schedule must agree with the virtual stages."""
        owner = "ParallelConfig"
        if self.pipeline_schedule is None:
            auto = "interleaved-1f1b" if self.virtual_pipeline_stages > 1 else "1f1b"
            object.__setattr__(self, "pipeline_schedule", auto)
        _choice(owner, "pipeline_schedule", self.pipeline_schedule, SCHEDULES)
        if self.pipeline_schedule == "dualpipe":
            # deepseek-ai/DualPipe dualpipe.py DualPipe.step: "assert num_ranks % 2 == 0";
            # rank r runs stage r of one direction and stage pp - 1 - r of the other. Costed
            # as DualPipeV over pp / 2 ranks (vschedules.dualpipe_costing), a V of two or more.
            if self.pp < 4 or self.pp % 2 or self.virtual_pipeline_stages != 1:
                raise SpecError(
                    f"{owner}: pipeline_schedule='dualpipe' runs micro-batches from both ends "
                    f"of an even number of ranks, each holding stages r and pp - 1 - r: it "
                    f"needs an even pp >= 4 and virtual_pipeline_stages=1, got pp={self.pp}, "
                    f"virtual_pipeline_stages={self.virtual_pipeline_stages}")
            return
        if self.pipeline_schedule in V_SCHEDULES:
            if self.virtual_pipeline_stages != 2 or self.pp < 2:
                raise SpecError(
                    f"{owner}: pipeline_schedule={self.pipeline_schedule!r} places two chunks "
                    f"per rank as a V: it needs virtual_pipeline_stages=2 and pp >= 2, got "
                    f"virtual_pipeline_stages={self.virtual_pipeline_stages}, pp={self.pp}")
            return
        if self.pipeline_schedule == "combined-1f1b":
            # megatron/core/transformer/transformer_config.py: with pipeline parallel the
            # overlap needs the interleaved (virtual) pipeline.
            if self.pp > 1 and self.virtual_pipeline_stages < 2:
                raise SpecError(
                    f"{owner}: pipeline_schedule='combined-1f1b' (Megatron-LM's "
                    f"--overlap-moe-expert-parallel-comm) with pp={self.pp} needs the "
                    f"interleaved pipeline: virtual_pipeline_stages >= 2")
            if self.pp == 1 and self.virtual_pipeline_stages > 1:
                raise SpecError(f"{owner}: virtual_pipeline_stages="
                                f"{self.virtual_pipeline_stages} needs pp >= 2")
            return
        interleaved = self.pipeline_schedule == "interleaved-1f1b"
        if interleaved and self.virtual_pipeline_stages < 2:
            raise SpecError(
                f"{owner}: pipeline_schedule='interleaved-1f1b' needs virtual_pipeline_stages "
                f">= 2, got {self.virtual_pipeline_stages}"
            )
        if not interleaved and self.virtual_pipeline_stages > 1:
            raise SpecError(
                f"{owner}: virtual_pipeline_stages={self.virtual_pipeline_stages} needs "
                f"pipeline_schedule='interleaved-1f1b' (got {self.pipeline_schedule!r})"
            )
        if interleaved and self.pp < 2:
            raise SpecError(f"{owner}: virtual_pipeline_stages={self.virtual_pipeline_stages} (an "
                            f"interleaved schedule) needs pp >= 2, got pp={self.pp}")

    def _check_recompute(self) -> None:
        """The recompute mode, and a layer count only with full recompute."""
        owner = "ParallelConfig"
        _choice(owner, "recompute", self.recompute, RECOMPUTE)
        if self.recompute_num_layers is not None:
            _positive_int(owner, "recompute_num_layers", self.recompute_num_layers)
            if self.recompute != "full":
                raise SpecError(
                    f"{owner}: recompute_num_layers={self.recompute_num_layers} needs "
                    f"recompute='full' (got {self.recompute!r})"
                )

    def _check_sharding_group(self) -> None:
        """A sharding group (HSDP) needs ZeRO and must divide dp."""
        owner = "ParallelConfig"
        if self.sharding_group is None:
            return
        _positive_int(owner, "sharding_group", self.sharding_group)
        if self.zero_stage == 0:
            raise SpecError(
                f"{owner}: sharding_group={self.sharding_group} needs zero_stage >= 1"
            )
        if self.dp % self.sharding_group:
            raise SpecError(
                f"{owner}: sharding_group={self.sharding_group} must divide dp={self.dp}"
            )

    def _check_stage_layers(self) -> None:
        """Per-stage layer and recompute counts: one per stage, as tuples."""
        owner = "ParallelConfig"
        for key in ("stage_layers", "stage_recompute_layers"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, str | bytes)
                                      or not isinstance(value, list | tuple)):
                raise SpecError(f"{owner}: {key} must be a list of layer counts, one per "
                                f"pipeline stage, or None; got {value!r:.40}")
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
            chunks = self.pp * self.virtual_pipeline_stages
            if len(self.stage_layers) != chunks:
                raise SpecError(
                    f"{owner}: stage_layers has {len(self.stage_layers)} entries but "
                    f"pp={self.pp}" + (f" x virtual_pipeline_stages="
                                       f"{self.virtual_pipeline_stages} = {chunks} chunks"
                                       if chunks != self.pp else "")
                )
            for n in self.stage_layers:
                # A chunk of an interleaved pipeline may hold the embedding or the loss alone
                # (Megatron-LM's --pipeline-model-parallel-layout); a stage holds a layer.
                _positive_int(owner, "stage_layers[i]", n, allow_zero=chunks != self.pp)
            if chunks != self.pp and 0 in (self.rank_layers or ()):
                raise SpecError(f"{owner}: stage_layers {list(self.stage_layers)} leave a "
                                "pipeline rank without layers")
        if self.stage_recompute_layers is None:
            return
        rec = tuple(self.stage_recompute_layers)
        object.__setattr__(self, "stage_recompute_layers", rec)
        if self.pipeline_schedule == "dualpipe":
            raise SpecError(f"{owner}: stage_recompute_layers is not taken with "
                            "pipeline_schedule='dualpipe'; use recompute_num_layers")
        if self.stage_layers is None or self.recompute != "full" or \
                self.recompute_num_layers is not None:
            raise SpecError(f"{owner}: stage_recompute_layers needs stage_layers and "
                            "recompute='full' without recompute_num_layers")
        if len(rec) != self.pp or any(isinstance(r, bool) or not isinstance(r, int)
                                      or not 0 <= r <= n
                                      for r, n in zip(rec, self.stage_layers, strict=True)):
            raise SpecError(f"{owner}: stage_recompute_layers {list(rec)} must give each "
                            f"of the {self.pp} stages 0..its layers "
                            f"{list(self.stage_layers)}")

    @property
    def chunk_layers(self) -> tuple[int, ...] | None:
        """An interleaved pipeline's explicit layers per chunk, in virtual order (chunk ``j``
        is virtual stage ``j // pp`` of rank ``j % pp``, Megatron-LM's
        ``--pipeline-model-parallel-layout`` order; V-shaped, rank ``j`` for ``j < pp`` and
        ``2 pp - 1 - j`` after); None for an even split or without interleaving."""
        if self.stage_layers is None or self.virtual_pipeline_stages == 1:
            return None
        return self.stage_layers

    @property
    def rank_layers(self) -> tuple[int, ...] | None:
        """Explicit layers per pipeline rank (each rank's chunks summed); None for an even
        split."""
        if self.stage_layers is None:
            return None
        p = self.pp
        if self.pipeline_schedule in V_SCHEDULES:  # rank r: chunks r and 2p - 1 - r
            return tuple(self.stage_layers[r] + self.stage_layers[2 * p - 1 - r]
                         for r in range(p))
        if self.pipeline_schedule == "dualpipe":  # rank r: stages r and p - 1 - r
            return tuple(self.stage_layers[r] + self.stage_layers[p - 1 - r] for r in range(p))
        return tuple(sum(self.stage_layers[r::p]) for r in range(p))

    @property
    def world_size(self) -> int:
        """GPUs this configuration occupies: ``dp * tp * pp * cp``."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: ``etp``, or ``tp`` where it is not set."""
        return self.tp if self.etp is None else self.etp

    @property
    def shard_degree(self) -> int:
        """Ranks a ZeRO/FSDP shard of the dense parameters spans: sharding group times cp."""
        if self.zero_stage == 0:
            return 1
        return (self.sharding_group or self.dp) * self.cp

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain JSON-serializable dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("stage_layers", "stage_recompute_layers"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out


def accounted_split(num_layers: int, pp: int, virtual: int = 1, *, embedding: bool = True,
                    loss: bool = True, mtp: int = 0) -> tuple[int, ...] | None:
    """Layers per chunk (virtual order; per stage without interleaving) of Megatron-LM's
    split with the embedding and the loss each counted as one layer
    (``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``,
    megatron/core/transformer/transformer_block.py ``get_num_layers_to_build``): the layers
    and those extra units split evenly over the ``pp * virtual`` chunks, the first chunk
    one layer fewer for the embedding, the last one fewer for the loss (and for each of
    ``mtp`` multi-token prediction modules, which sit with it). None where the units do not
    divide evenly, which Megatron-LM refuses. Llama 3.1 405B's 126 layers on pp 8 x virtual
    8 with both: 2 per chunk, 1 in the first and the last; DeepSeek-V3's 61 and its MTP
    module on pp 8 x virtual 4: 1, then 2 in each of 30, then 0 (Megatron-Bridge's layout
    ``Et|(tt|)*30mL``)."""
    chunks = pp * virtual
    units = num_layers + int(embedding) + int(loss) + mtp
    if chunks < 1 or units % chunks:
        return None
    per = units // chunks
    out = [per] * chunks
    out[0] -= int(embedding)
    out[-1] -= int(loss) + mtp
    if min(out) < 0 or (virtual == 1 and min(out) < 1):
        return None
    return tuple(out)


"""What each trainer can run, and the memory conventions it follows, as data.

Facts each entry rests on:

- Megatron-LM keeps bf16 parameters, fp32 main gradients (a contiguous ``main_grad`` buffer;
  bf16 training accumulates and reduces gradients in fp32) and fp32 master weights with the
  Adam states: 18 bytes per parameter, or 6 + 12/d with its distributed optimizer, sharded over
  the data-parallel ranks including context-parallel ones (docs/api-guide/dist_optimizer.md;
  megatron/core/distributed/distributed_data_parallel.py). fp16: 20 bytes, 4 + 16/d (the fp32
  copy of the gradients is part of the sharded optimizer state). ZeRO-3 is its FSDP mode.
  Schedules: 1F1B and interleaved 1F1B. CPU offload of the optimizer needs the distributed
  optimizer (--optimizer-cpu-offload).
- DeepSpeed ZeRO keeps fp16/bf16 parameters and gradients (2 + 2 bytes) and K = 12 bytes of
  fp32 master weights and Adam states (Rajbhandari et al. 2020, Sec. 3.1 and Fig. 1). Its
  pipeline engine runs a 1F1B schedule and supports ZeRO stage 0 or 1 only. ZeRO-Offload moves
  optimizer states to the CPU (stage >= 1); parameter offload needs stage 3.
- torchtitan trains with FSDP2 (``fully_shard``) whose sharded parameters stay fp32 and are
  all-gathered in bf16 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), so the
  sharded state is 4 + 4 + 8 = 16 bytes per parameter with no separate master copy. Without
  FSDP it uses DDP (``replicate``) with autocast. ZeRO-2 is FSDP with
  ``reshard_after_forward=False``; there is no ZeRO-1. CPU offload (CPUOffloadPolicy) moves
  parameters, gradients and optimizer states together and needs FSDP. Schedules come from
  torch.distributed.pipelining: GPipe, 1F1B, interleaved 1F1B, zero bubble.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FRAMEWORKS", "Framework", "experts_fit", "framework", "padded_vocab",
           "pipelining_problem", "schedule_problem"]


@dataclass(frozen=True, kw_only=True)
class Framework:
    """Capabilities of one trainer: which ZeRO stages, schedules and offloads it runs."""

    name: str
    zero_stages: tuple[int, ...]
    schedules: tuple[str, ...]
    offloads: tuple[tuple[str, int], ...]  # (offload mode, least zero stage it needs)
    zero_with_pp: tuple[int, ...]  # ZeRO stages that combine with pipeline parallel
    param_shard_stage: int  # least ZeRO stage at which the stored parameters are sharded
    hybrid_shard_stages: tuple[int, ...]  # ZeRO stages that may shard over part of dp (HSDP)
    gated_mlp_saved_widths: int  # ffn-wide tensors saved per gated MLP (fused 3, eager 4)
    note_zero: str
    # Pipelines with torch.distributed.pipelining, whose schedules constrain the micro-batch
    # count (``pipelining_problem``).
    torch_pipelining: bool = False
    # Megatron-LM's vocabulary-parallel cross entropy works in place on one fp32 copy of the
    # logits (megatron/core/tensor_parallel/cross_entropy.py); the others call torch's
    # F.cross_entropy on an fp32 copy (torchtitan's cross_entropy_loss, Hugging Face models
    # under DeepSpeed), whose backward holds the saved log-softmax output, a dense fp32 NLL
    # gradient and the fp32 log-softmax gradient at once.
    fused_cross_entropy: bool = False
    # Megatron-LM runs that in-place cross entropy op by op (cast, max, subtract, exp, sum,
    # divide: megatron/core/tensor_parallel/cross_entropy.py) unless
    # --cross-entropy-loss-fusion (Job.fused_cross_entropy) fuses it
    # (megatron/core/fusions/fused_cross_entropy.py). Off by default in Megatron-LM's
    # arguments; NeMo 2's GPTConfig and Megatron-Bridge's GPTProvider turn it on.
    cross_entropy_fusion_opt_in: bool = False
    # Whether the trainer compiles its loss function with the model under Job.compile:
    # torchtitan's build_cross_entropy_loss does (torchtitan/components/loss.py, from
    # pytorch/torchtitan@bbb1b616e, 2025-04-02); before, its train.py compiled it only from
    # e10cb9494 (2024-10-22) to e8977b007 (2024-12-18, "turning off compile on loss
    # function").
    compiles_loss: bool = False
    # The vocabulary padded to a multiple of this times tp (Megatron-LM
    # --make-vocab-size-divisible-by, default 128); 1: not padded.
    vocab_multiple: int = 1
    # Megatron-LM's interleaved schedule refuses a micro-batch count that is not a multiple of
    # pp (megatron/core/pipeline_parallel/schedules.py,
    # forward_backward_pipelining_with_interleaving; Narayanan et al. 2021, Sec. 2.2.2).
    interleaved_needs_multiple: bool = False
    # Schedules the trainer's own launcher does not run as estimated, so a search does not
    # offer them (an explicit configuration is still estimated, and 'planner run' runs it).
    unsearched_schedules: tuple[str, ...] = ()
    # Schedules of another trainer that wraps a model built as this one's: estimated (and
    # drawn by planner.timeline) with this trainer's kernels, never searched, and emitted as
    # the nearest schedule the trainer runs. DeepSeek's DualPipe (deepseek-ai/DualPipe, the
    # schedule of its in-house HAI-LLM for DeepSeek-V3, a Megatron-style model; DeepSeek-V3
    # report Sec. 3.2.1) runs in neither Megatron-LM nor torchtitan.
    costed_schedules: tuple[str, ...] = ()
    # Mixed precision by torch.autocast when neither FSDP nor TP/PP/CP is on (torchtitan's
    # maybe_enable_amp: DDP or a single device): fp32 parameters cast to bf16 on each forward,
    # fp32 norms and residual stream, each linear casting its input.
    autocast_ddp: bool = False
    # Whether the trainer's DualPipeV overlaps one micro-batch's expert dispatch and combine
    # with another's compute in each forward-backward pair, as DeepSeek's DualPipe does:
    # torchtitan 0.2.2 (torchtitan/distributed/dual_pipe_v.py, DualPipeExpertParallel's sync
    # hooks; [parallelism] pipeline_parallel_expert_parallel_overlap, on by default) with
    # pp > 1, ep > 1 and no activation checkpointing, which it refuses beside the overlap.
    # (torchtitan's main branch removed the overlap after 0.2.2: pytorch/torchtitan#2774.)
    dualpipev_ep_overlap: bool = False
    # The MoE token dispatchers the trainer runs (Job.moe_dispatcher): Megatron-LM's
    # --moe-token-dispatcher-type alltoall, allgather and flex with DeepEP; torchtitan 0.2.2's
    # [parallelism] expert_parallel_comm_backend "standard" (all-to-all) and "deepep"
    # (torchtitan/config/job_config.py); the others an all-to-all.
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    # Whether the trainer waits on the host for each MoE layer's routing counts and launches
    # the layer's kernels eagerly, so that a layer takes at least the host's time to launch
    # it (hardware_profiles/software.toml [host] megatron_moe_layer_ms; Megatron-LM's token
    # dispatchers). The others' host time is not measured and not modelled.
    moe_host_sync: bool = False
    # The experts' own tensor-parallel degrees (ParallelConfig.etp) the trainer runs beside
    # tp: "tp" (the experts split as the attention), "divisors" (Megatron-Core's MoE parallel
    # folding, any etp dividing tp, --expert-tensor-parallel-size) or "tp_or_1" (torchtitan
    # 0.2.2's expert_tensor_parallel_degree: "Currently we only support ETP=TP or ETP=1",
    # torchtitan/distributed/parallel_dims.py), and the largest ZeRO stage a folded mesh
    # (etp < tp) runs with: Megatron-LM's distributed optimizer (1), torchtitan's FSDP over
    # its expert shard group (3).
    expert_tp: str = "tp"
    folded_zero_max: int = 1
    # Whether expert parallel borrows only the FSDP shard group's ranks (times cp, and tp
    # over etp), not the replicated ones: torchtitan 0.2.2 builds its experts' mesh as
    # (dp_replicate, efsdp, ep, etp) with efsdp = dp_shard * cp * tp / (etp * ep), which
    # must be whole (parallel_dims.py), so DDP (dp_shard 1) leaves ep only cp * tp / etp.
    ep_in_shard_group: bool = False
    # What "selective" activation recompute means in this trainer. "attention-core":
    # Korthikanti et al. 2022's selective recompute (drop and re-run the attention scores;
    # Megatron-LM --recompute-granularity selective, DeepSpeed's checkpointing of the core).
    # "op": torchtitan's per-op selective AC (torchtitan/models/llama3/infra/parallelize.py,
    # _apply_ac_to_transformer_block, selective_ac_option "op"; torchtitan's default for
    # Llama 3 8B): inside each block only the outputs of matmuls, the attention kernel and a
    # few collectives are saved, "except every second mm", and everything else (norms,
    # rotary embedding, activation functions) is recomputed in backward from the block input.
    selective_recompute: str = "attention-core"
    # Whether the model runs its memory-bound operations as PyTorch eager kernels unless
    # Job.compile (torchtitan: plain torch modules), rather than the fused kernels of
    # Transformer Engine / Apex that Megatron-LM and Megatron-DeepSpeed call.
    eager_kernels: bool = False
    # Whether the model's q, k and v projections, and a gated MLP's gate and up projections,
    # are separate matmuls (torchtitan: Attention.wq, wk, wv and FeedForward.w1, w3 are
    # separate nn.Linear modules, torchtitan/models/llama3/model/model.py, and its MoE's
    # GroupedExperts separate w1 and w3 alike) rather than Megatron-LM's fused linear_qkv and
    # linear_fc1. Compiled or not: torch.compile does not merge matmuls.
    separate_projections: bool = False
    # Whether a MoE layer runs each projection of its local experts as one grouped matmul
    # (one kernel for all of them) rather than one matmul per expert: torchtitan's
    # GroupedExperts calls torch._grouped_mm once per projection (MoEArgs.use_grouped_mm,
    # default True; torchtitan/models/moe/moe.py @08dc75ae). Megatron-LM's default
    # SequentialMLP loops over its local experts (--moe-grouped-gemm switches it).
    grouped_experts: bool = False
    # Whether a MoE layer scales each routed token by its router score before the experts,
    # in fp32 (torchtitan's MoEArgs.score_before_experts, default True, torchtitan/models/
    # moe/moe.py @08dc75ae): the product keeps the token's fp32 copy for the score's
    # gradient, and the combine after the experts is a plain sum, which keeps nothing.
    # Megatron-LM weights the experts' outputs as it un-permutes them, keeping those, unless
    # it weights inside the experts (below).
    moe_scores_before_experts: bool = False
    # Whether a MoE layer multiplies each routed token's activation by its router
    # probability inside the experts (Megatron-Core 0.13 and later: "Memory efficient token
    # permutation", NVIDIA/Megatron-LM 2659630, 2025-04-09: GroupedMLP's
    # activation_func_with_probs and the fused weighted SwiGLU, which keep the fc1 output
    # and the fp32 probabilities, and the un-permute weights nothing): no [tokens, h] copy
    # of the experts' outputs is kept for the probabilities' gradient.
    moe_probs_in_activation: bool = False
    # float8 training by torchao's Float8Linear (dynamic scaling: an amax reduction and a cast
    # of each linear's input, and in backward of its output gradient, plus transposed fp8
    # copies for the weight-gradient matmul; torchao/float8/float8_linear.py), rather than
    # Transformer Engine, which fuses the casts into the preceding norm or activation kernel.
    torchao_float8: bool = False
    # Megatron-style sequence parallelism of the norm and dropout regions under TP. DeepSpeed's
    # AutoTP has none (it splits the sequence only with Ulysses, which the planner times as
    # context parallel), so a search for it does not offer sequence parallel.
    sequence_parallel: bool = True
    # GPU architectures on which the trainer's fused attention is cuDNN's rather than
    # FlashAttention-2 (Job.attention_kernel overrides;
    # costmodel.formulas.roofline.attention_kernel).
    cudnn_attention_archs: tuple[str, ...] = ()
    # The fused attention kernel the trainer runs on AMD Instinct GPUs: Composable Kernel's
    # FlashAttention-2 ("flash", Transformer Engine's default on ROCm and the flash-attn
    # package's), or AOTriton ("aotriton") where attention goes through PyTorch's SDPA.
    rocm_attention: str = "flash"
    # Whether the trainer's launch file can pick the fused attention kernel (Transformer
    # Engine: NVTE_FLASH_ATTN=0 / NVTE_FUSED_ATTN=0 turn a backend off); the others leave it
    # to the model code and PyTorch's SDPA.
    selects_attention_kernel: bool = False

    def runs_expert_tp(self, tp: int, etp: int) -> bool:
        """Whether the trainer splits its experts over ``etp`` ranks under ``tp``
        (``expert_tp``; Megatron-Core folds any etp, and the search offers it tp's
        divisors)."""
        if self.expert_tp == "divisors":
            return True
        return etp == tp or (self.expert_tp == "tp_or_1" and etp == 1)


def experts_fit(shard: int, cp: int, tp: int, ep: int, etp: int) -> bool:
    """Whether the experts' ep x etp mesh tiles ``shard`` data-parallel ranks x cp x tp, so
    that their expert-data-parallel group is whole (Megatron-Core: the expert DP size is the
    stage's tp * cp * dp over etp * ep; torchtitan: efsdp = dp_shard * cp * tp / (etp * ep),
    torchtitan/distributed/parallel_dims.py)."""
    return (shard * cp * tp) % (ep * etp) == 0


def pipelining_problem(schedule: str, pp: int, num_micro_batches: int) -> str | None:
    """What torch.distributed.pipelining's schedule needs of the micro-batch count, when
    ``num_micro_batches`` breaks it (torch/distributed/pipelining/schedules.py: 1F1B refuses
    fewer micro-batches than stages; interleaved 1F1B and zero bubble run them in rounds of
    max(1, m // pp) and need m to be a multiple; DualPipeV needs at least as many as its 2pp
    stages; ZBVZeroBubble runs any count); ``None`` when it runs."""
    m = num_micro_batches
    if pp > 1 and schedule == "1f1b" and m < pp:
        return f"1F1B schedule needs at least pp={pp} micro-batches, got {m}"
    if pp > 1 and schedule == "dualpipev" and m < 2 * pp:
        return (f"DualPipeV schedule needs at least 2 * pp = {2 * pp} micro-batches, got {m} "
                f"(it runs two stages per rank)")
    rounds = max(1, m // pp)
    if pp > 1 and schedule in ("interleaved-1f1b", "zero-bubble") and m % rounds:
        return (f"{schedule} schedule needs the number of micro-batches ({m}) to be a "
                f"multiple of micro-batches // pp = {rounds}")
    return None


def schedule_problem(fw: Framework, schedule: str, pp: int, num_micro_batches: int
                     ) -> str | None:
    """What ``fw``'s pipeline schedule needs of the micro-batch count, when
    ``num_micro_batches`` breaks it; ``None`` when it runs (or without a pipeline)."""
    if pp < 2:
        return None
    if schedule == "dualpipe" and (num_micro_batches % 2 or num_micro_batches < 2 * pp):
        # deepseek-ai/DualPipe dualpipe.py DualPipe.step: "assert num_chunks > 0 and
        # num_chunks % 2 == 0 and num_chunks >= num_ranks * 2" (half from each end).
        return (f"DualPipe needs an even number of micro-batches, at least 2 * pp = {2 * pp} "
                f"(half enter at each end), got {num_micro_batches}")
    if fw.torch_pipelining:
        return pipelining_problem(schedule, pp, num_micro_batches)
    if fw.interleaved_needs_multiple and schedule in ("interleaved-1f1b", "combined-1f1b") \
            and num_micro_batches % pp:
        return (f"Megatron-LM's interleaved schedule needs the number of micro-batches "
                f"({num_micro_batches}) to be a multiple of pp={pp}")
    return None


def padded_vocab(fw: Framework, vocab_size: int, tp: np.ndarray) -> np.ndarray:
    """The vocabulary the embedding and LM head hold, per row of ``tp``: ``vocab_size``
    rounded up to a multiple of ``vocab_multiple * tp`` (Megatron-LM's
    ``_vocab_size_with_padding``), unchanged for trainers that do not pad."""
    mult = fw.vocab_multiple * np.asarray(tp, dtype=float)
    return np.ceil(vocab_size / mult) * mult


FRAMEWORKS: tuple[Framework, ...] = (
    Framework(
        name="megatron",
        zero_stages=(0, 1, 3),
        # combined-1f1b: --overlap-moe-expert-parallel-comm (core_v0.14.0, combined_1f1b.py).
        schedules=("1f1b", "interleaved-1f1b", "combined-1f1b"),
        costed_schedules=("dualpipe",),
        moe_dispatchers=("alltoall", "allgather", "deepep"),
        moe_host_sync=True,
        expert_tp="divisors",
        moe_probs_in_activation=True,
        offloads=(("none", 0), ("optimizer", 1)),
        zero_with_pp=(0, 1),
        param_shard_stage=3,
        # --num-distributed-optimizer-instances: one distributed optimizer per DP sub-group.
        hybrid_shard_stages=(1,),
        # Megatron's fused bias-SwiGLU saves the concatenated gate/up output (2 widths) and
        # the down-projection input (1 width).
        gated_mlp_saved_widths=3,
        note_zero="Megatron-LM runs ZeRO-1 as its distributed optimizer and ZeRO-3 as its "
        "FSDP mode; it has no ZeRO-2",
        fused_cross_entropy=True,
        cross_entropy_fusion_opt_in=True,
        vocab_multiple=128,
        interleaved_needs_multiple=True,
        # Transformer Engine's get_attention_backend disables FlashAttention "to give
        # FusedAttention preference on Hopper+ for performance reasons" when both can run
        # (transformer_engine/pytorch/attention/dot_product_attention/utils.py; for sm90 since
        # TE's cuDNN frontend integration, NVIDIA/TransformerEngine@32db39288, December
        # 2023): "sm90 (Hopper): cuDNN attention > flash-attention", sm8x the other way round
        # (docs/examples/attention/attention.ipynb).
        cudnn_attention_archs=("hopper", "blackwell"),
        selects_attention_kernel=True,
    ),
    Framework(
        name="deepspeed",
        zero_stages=(0, 1, 2, 3),
        schedules=("1f1b",),
        offloads=(("none", 0), ("optimizer", 1), ("optimizer+params", 3)),
        zero_with_pp=(0, 1),
        param_shard_stage=3,
        # No hybrid sharding: DeepSpeed 0.19 removed MiCS (zero_optimization.mics_shard_size,
        # deepspeedai/DeepSpeed issue 8489), its ZeRO-3 over a sub-group of dp.
        hybrid_shard_stages=(),
        sequence_parallel=False,
        # Eager SwiGLU: silu saves its input, the product saves silu(gate) and up, and the
        # down projection saves the product: 4 ffn-wide tensors.
        gated_mlp_saved_widths=4,
        note_zero="DeepSpeed runs ZeRO stages 0-3",
    ),
    Framework(
        name="torchtitan",
        zero_stages=(0, 2, 3),
        # ZBVZeroBubble and DualPipeV (torch.distributed.pipelining, two stages per rank placed
        # as a V: torchtitan/distributed/pipeline_parallel.py).
        schedules=("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev"),
        costed_schedules=("dualpipe",),
        dualpipev_ep_overlap=True,
        moe_dispatchers=("alltoall", "deepep"),
        expert_tp="tp_or_1",
        folded_zero_max=3,
        ep_in_shard_group=True,
        offloads=(("none", 0), ("optimizer+params", 3)),
        zero_with_pp=(0, 2, 3),
        # FSDP shards the stored fp32 parameters at "ZeRO-2" too; only the bf16 unsharded
        # copies are kept between forward and backward.
        param_shard_stage=2,
        # HSDP: data_parallel_shard_degree x data_parallel_replicate_degree.
        hybrid_shard_stages=(2, 3),
        gated_mlp_saved_widths=4,
        note_zero="torchtitan runs DDP (0), FSDP without resharding after forward (2) and "
        "FSDP (3); it has no ZeRO-1",
        torch_pipelining=True,
        autocast_ddp=True,
        selective_recompute="op",
        eager_kernels=True,
        separate_projections=True,
        grouped_experts=True,
        moe_scores_before_experts=True,
        torchao_float8=True,
        compiles_loss=True,
        # torchtitan 0.2.2 refuses a multi-stage schedule with one stage per rank
        # (torchtitan/distributed/pipeline_parallel.py), and zero bubble as estimated (ZB-H1,
        # torch's ScheduleInterleavedZeroBubble with one stage per rank) is one; it runs zero
        # bubble as the V-shaped ZBVZeroBubble (``zbv``).
        unsearched_schedules=("zero-bubble",),
        # ScaledDotProductAttention asks SDPA for cuDNN first (sdpa_kernel([CUDNN_ATTENTION,
        # FLASH_ATTENTION, ...], set_priority=True), torchtitan/models/common/attention.py,
        # since pytorch/torchtitan@6a3a9da95, October 2025; on B200 since 3b85aa31f, May
        # 2025). Its earlier H100 runs used FlashAttention-2 (published runs map that with
        # Job.attention_kernel).
        cudnn_attention_archs=("hopper", "blackwell"),
        # On ROCm, SDPA's flash backend is AOTriton unless TORCH_ROCM_FA_PREFER_CK=1 asks for
        # Composable Kernel's (aten/src/ATen/Context.h rocm_fa_preferred_backend: Ck only
        # with that variable, else Default, AOTriton; ROCm/pytorch PR #2053).
        rocm_attention="aotriton",
    ),
)


def framework(name: str) -> Framework:
    """The Framework entry for ``name``; KeyError is turned into SpecError by the callers."""
    for f in FRAMEWORKS:
        if f.name == name:
            return f
    raise KeyError(name)

"""Megatron-LM ``pretrain_gpt.py`` arguments, as a bash array ``MEGATRON_ARGS``.

Flag names and choices are those of ``megatron/training/arguments.py`` at the Megatron-LM commit
recorded in ``tests/data/megatron_args.json`` (the 0.16 release line), which a test parses the
emitted list with. Meanings (Megatron-LM docs and ``arguments.py`` help): ZeRO-1 is
``--use-distributed-optimizer`` (``--num-distributed-optimizer-instances`` for hybrid
sharding), ZeRO-3 is Megatron FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params``); ``--recompute-granularity selective`` recomputes the attention core
(Korthikanti et al. 2022); ``full`` with ``--recompute-method block --recompute-num-layers N``
recomputes the first N layers of each pipeline chunk and ``uniform ... 1`` every layer; a
non-uniform stage split is ``--pipeline-model-parallel-layout`` ("E" embedding, "t" a
transformer layer, "L" the loss, "|" between stages, "t*n" n layers).
"""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.estimate import Estimate
from costmodel.model import ModelSpec
from planner.emit.common import (
    Lowered,
    ReadBack,
    Target,
    commented,
    header_lines,
    to_framework,
    uniform_stage_recompute,
)

# NVFP4: Transformer Engine's NVFP4BlockScaling recipe, every transformer layer's linears
# (megatron/training/arguments.py: --fp4-format e2m1, --fp4-recipe nvfp4; without
# --first-last-layers-bf16, as the cost model assumes, no layer is kept in bf16). MXFP4: the
# recipe AMD's Megatron-LM adds (Primus patches --fp4-recipe to take mxfp4: AMD-AGI/Primus
# primus/backends/megatron/core/enums.py Fp4Recipe, examples/megatron/configs/MI355X/
# llama3.1_8B-MXFP4-pretrain.yaml 'fp4: e2m1', 'fp4_recipe: mxfp4'); upstream Megatron-LM's
# --fp4-recipe takes nvfp4 and custom only, so only a GPU with an mxfp4 peak (CDNA 4) gets it.
PRECISION_FLAGS = {"bf16": ["--bf16"], "fp16": ["--fp16"],
                   "fp8": ["--bf16", "--fp8-format", "hybrid"],
                   "nvfp4": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
                   "mxfp4": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "mxfp4"],
                   "fp32": []}


def lower(model: ModelSpec, job: Job, cfg: ParallelConfig) -> Lowered:
    """``cfg`` as Megatron-LM runs it (see the module docstring)."""
    if not model.causal or model.patch_size:
        raise SpecError(f"the megatron target writes pretrain_gpt.py arguments for decoder-only "
                        f"models; {model.name} is not one: emit it for deepspeed instead")
    ch = to_framework(cfg, job, "megatron", "Megatron-LM")
    for bad, what in ((model.post_norms, "norms after the attention and the MLP (Gemma)"),
                      (model.chunked_attention, "chunked attention (Llama 4)")):
        if bad:
            ch.warnings.append(f"pretrain_gpt.py's GPT has no {what}: the file trains "
                               f"{model.name} without it (use Megatron-Bridge's model for it)")
    uniform_stage_recompute(ch, "Megatron-LM")
    if job.optimizer not in ("adam", "adamw", "sgd"):
        ch.set_job(f"Megatron-LM's optimizers are Adam(W) and SGD, not {job.optimizer}: "
                   f"emitted adam", optimizer="adamw")
    return ch.result()


def layout(stage_layers: tuple[int, ...], mtp: int = 0) -> str:
    """A ``--pipeline-model-parallel-layout`` string for explicit layers per stage (per
    chunk in virtual order when interleaved: Megatron-Core's ``PipelineParallelLayerLayout``
    reads ``len / pp`` virtual stages), the multi-token prediction modules ("m") with the
    loss; commas are cosmetic there."""
    stages = [f"t*{n}" if n else "" for n in stage_layers]
    stages[0] = "E" + ("," + stages[0] if stages[0] else "")
    end = "m," * mtp + "L"
    stages[-1] = (stages[-1] + "," if stages[-1] else "") + end
    return "|".join(stages)


def layout_layers(text: str) -> tuple[int, ...]:
    """Transformer layers per stage (chunk) of a ``--pipeline-model-parallel-layout``
    string, read as Megatron-Core's ``parse_str_to_list`` does: commas dropped,
    ``(...)*n`` and ``x*n`` unrolled, stages split at ``|``, a ``t`` per layer."""
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    return tuple(stage.count("t") for stage in s.split("|"))


def _model_args(m: ModelSpec, job: Job) -> list[Any]:
    """The model's shape: layers, widths, heads (grouped-query attention, the head width when
    it is not ``hidden / heads``, multi-head latent attention, the query and key norms),
    multi-token prediction, the sequence length in tokens and
    position embeddings, the norm, MLP, embeddings, biases and dropout, and the vocabulary
    (``NullTokenizer``)."""
    a: list[Any] = ["--num-layers", m.num_layers, "--hidden-size", m.hidden_size,
                    "--ffn-hidden-size", m.ffn_hidden_size, "--num-attention-heads", m.num_heads]
    if m.num_kv_heads != m.num_heads:
        a += ["--group-query-attention", "--num-query-groups", m.num_kv_heads]
    assert m.head_dim is not None  # ModelSpec.__post_init__ sets it
    if m.is_mla:
        # Megatron-Core's MLATransformerConfig (megatron/training/arguments.py at the commit of
        # tests/data/megatron_args.json): --qk-head-dim is the no-rotary part of a head.
        a += ["--multi-latent-attention", "--kv-lora-rank", m.kv_lora_rank,
              "--qk-head-dim", m.head_dim - m.qk_rope_head_dim,
              "--qk-pos-emb-head-dim", m.qk_rope_head_dim, "--v-head-dim", m.v_head_dim]
        if m.q_lora_rank:
            a += ["--q-lora-rank", m.q_lora_rank]
    elif m.head_dim * m.num_heads != m.hidden_size:
        a += ["--kv-channels", m.head_dim]
    if m.mtp_layers:
        a += ["--mtp-num-layers", m.mtp_layers]
    if m.sliding_window and not m.chunked_attention:
        # Megatron-Core's TransformerConfig.window_size (left, right) and
        # window_attn_skip_freq: layer n (1-based) is full where n % freq == 0.
        a += ["--window-size", f"{m.sliding_window},0"]
        if m.global_every:
            a += ["--window-attn-skip-freq", m.global_every]
    if m.attention_sinks:  # a learned logit per head in the softmax (GPT-OSS)
        a += ["--softmax-type", "learnable"]
    a += ["--seq-length", job.seq_len,
          "--max-position-embeddings", max(job.seq_len, m.max_position_embeddings),
          "--position-embedding-type", {"rope": "rope", "learned": "learned_absolute",
                                        "none": "none"}[m.position_embedding],
          "--normalization", {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]]
    if m.qk_norm:  # Megatron-Core's TransformerConfig.qk_layernorm (its --normalization)
        a.append("--qk-layernorm")
    if m.gated_mlp:
        a.append("--swiglu")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        a.append("--disable-bias-linear")
        if m.qkv_bias:
            a.append("--add-qkv-bias")
    if not m.dropout:
        a += ["--attention-dropout", 0.0, "--hidden-dropout", 0.0]
    return [*a, "--tokenizer-type", "NullTokenizer", "--vocab-size", m.vocab_size]


#: Megatron-LM's token dispatcher for each of ``Job.moe_dispatcher``'s (megatron/training/
#: arguments.py at the recorded commit: --moe-token-dispatcher-type {allgather,alltoall,
#: flex}; DeepEP is the flex dispatcher with --moe-enable-deepep).
DISPATCHER_FLAGS = {"alltoall": ["--moe-token-dispatcher-type", "alltoall"],
                    "allgather": ["--moe-token-dispatcher-type", "allgather"],
                    "deepep": ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"]}


def _moe_args(m: ModelSpec, job: Job) -> list[Any]:
    """The mixture-of-experts layers (none for a dense model): experts, top-k routing, the
    expert MLP width, shared experts, the leading dense layers and the capacity factor."""
    if not m.num_experts:
        return []
    a: list[Any] = ["--num-experts", m.num_experts, "--moe-router-topk", m.top_k,
                    "--moe-ffn-hidden-size", m.moe_ffn_hidden_size, "--moe-grouped-gemm",
                    *DISPATCHER_FLAGS[job.moe_dispatcher]]
    assert m.moe_ffn_hidden_size is not None  # ModelSpec.__post_init__ sets it for MoE
    if m.num_shared_experts:
        a += ["--moe-shared-expert-intermediate-size",
              m.num_shared_experts * m.moe_ffn_hidden_size]
    if m.moe_every > 1:  # the pattern as a list of 0 (dense) and 1 (MoE), layer by layer
        a += ["--moe-layer-freq",
              "[" + ",".join(str(int(m.layer_is_moe(i))) for i in range(m.num_layers)) + "]"]
    elif m.first_dense_layers:
        a += ["--moe-layer-freq",
              f"([0]*{m.first_dense_layers}+[1]*{m.num_layers - m.first_dense_layers})"]
    if job.moe_capacity_factor is not None:
        a += ["--moe-expert-capacity-factor", job.moe_capacity_factor]
    return a


def _pipeline_args(m: ModelSpec, job: Job, cfg: ParallelConfig) -> list[Any]:
    """The pipeline schedule: interleaving (layers per virtual stage, and blocking
    point-to-point transfers when the job does not overlap them), an explicit layout of
    layers per stage, and combined 1F1B's expert all-to-all overlap."""
    a: list[Any] = []
    if cfg.virtual_pipeline_stages > 1:
        if not cfg.stage_layers:  # an explicit layout gives the virtual stages itself
            a += ["--num-layers-per-virtual-pipeline-stage",
                  m.num_layers // (cfg.pp * cfg.virtual_pipeline_stages)]
        if not job.overlap_p2p_comm:
            a.append("--no-overlap-p2p-communication")
    if cfg.stage_layers:
        a += ["--pipeline-model-parallel-layout", layout(cfg.stage_layers, m.mtp_layers)]
    if cfg.pipeline_schedule == "combined-1f1b":
        # Combined 1F1B: each forward paired with another micro-batch's backward, one's
        # expert all-to-alls under the other's compute (core_v0.14.0, combined_1f1b.py).
        a.append("--overlap-moe-expert-parallel-comm")
    return a


def _sequence_parallel_args(job: Job, cfg: ParallelConfig) -> list[Any]:
    """Sequence parallel, and the tensor-parallel communication overlap that needs it."""
    if not cfg.sequence_parallel:
        return []
    # Megatron-LM asserts sequence parallel for --tp-comm-overlap.
    return ["--sequence-parallel", *(["--tp-comm-overlap"] if job.tp_comm_overlap else [])]


def _parallel_args(m: ModelSpec, job: Job, cfg: ParallelConfig) -> list[Any]:
    """The parallel degrees (tensor, pipeline and its schedule, sequence, context, expert)
    and the batch: sequences per micro-batch and per step."""
    return ["--tensor-model-parallel-size", cfg.tp, "--pipeline-model-parallel-size", cfg.pp,
            *_pipeline_args(m, job, cfg), *_sequence_parallel_args(job, cfg),
            "--context-parallel-size", cfg.cp, "--expert-model-parallel-size", cfg.ep,
            # MoE parallel folding: the experts' own TP degree (default: tp).
            *(["--expert-tensor-parallel-size", cfg.etp] if cfg.etp is not None else []),
            "--micro-batch-size", cfg.micro_batch_size,
            "--global-batch-size", job.global_batch_size]


def _zero_args(cfg: ParallelConfig) -> list[Any]:
    """The ZeRO stage: 1 is the distributed optimizer (instances for hybrid sharding over
    ``sharding_group`` ranks), 3 is Megatron FSDP; 0 and 2 add nothing."""
    if cfg.zero_stage == 1:
        group = cfg.sharding_group
        if group is not None and group != cfg.dp:
            return ["--use-distributed-optimizer", "--num-distributed-optimizer-instances",
                    cfg.dp // group]
        return ["--use-distributed-optimizer"]
    if cfg.zero_stage == 3:
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                "optim_grads_params", "--use-distributed-optimizer", "--ckpt-format",
                "fsdp_dtensor"]
    return []


def _overlap_args(job: Job, cfg: ParallelConfig) -> list[Any]:
    """Gradient reduction overlapped with backward (and, with the distributed optimizer,
    the parameter gather with forward) when there is data or context parallelism."""
    if not (job.overlap_grad_reduce and cfg.dp * cfg.cp > 1):
        return []
    return ["--overlap-grad-reduce", *(["--overlap-param-gather"] if cfg.zero_stage == 1
                                       else [])]


def _offload_args(cfg: ParallelConfig) -> list[Any]:
    """Optimizer states and step on the CPU (all of them) for ``offload = "optimizer"``."""
    if cfg.offload != "optimizer":
        return []
    return ["--optimizer-cpu-offload", "--optimizer-offload-fraction", 1.0,
            "--use-precision-aware-optimizer"]


def _recompute_args(job: Job, cfg: ParallelConfig) -> list[Any]:
    """Activation recompute: the attention core (``selective``), or whole layers (``full``:
    the first ``recompute_num_layers`` of each pipeline chunk, or every layer), their saved
    inputs split over the TP ranks when the job distributes them (Megatron-LM allows it with
    full recompute, tp > 1 and no sequence parallel)."""
    if cfg.recompute == "selective":
        mods = list(job.recompute_modules)
        # --recompute-modules: what selective recompute re-runs (default core_attn alone).
        return ["--recompute-granularity", "selective",
                *(["--recompute-modules", *mods] if mods != ["core_attn"] else [])]
    if cfg.recompute == "full":
        n = cfg.recompute_num_layers
        a: list[Any] = ["--recompute-granularity", "full", "--recompute-method",
                        "uniform" if n is None else "block", "--recompute-num-layers", n or 1]
        if job.distribute_saved_activations and cfg.tp > 1 and not cfg.sequence_parallel:
            a.append("--distribute-saved-activations")
        return a
    return []


def _precision_args(job: Job, cfg: ParallelConfig) -> list[Any]:
    """The training precision (``PRECISION_FLAGS``), and fp8 parameters gathered by the
    distributed optimizer when the job asks for them."""
    a: list[Any] = list(PRECISION_FLAGS[job.precision])
    if job.precision == "fp8" and job.float8_recipe in ("mxfp8", "blockwise"):
        # Transformer Engine's block-scaled recipes (megatron/training/arguments.py
        # --fp8-recipe choices at the recorded commit: tensorwise, delayed, mxfp8, blockwise);
        # MXFP8 keeps e4m3 for gradients too.
        a += ["--fp8-recipe", job.float8_recipe]
        if job.float8_recipe == "mxfp8":
            a[a.index("hybrid")] = "e4m3"
    if job.precision == "fp8" and job.fp8_param_gather and cfg.zero_stage >= 1:
        a.append("--fp8-param-gather")
    if job.precision == "fp8" and not job.fp8_weight_transpose_cache:
        # ROCm's Megatron-LM (rocm/megatron-lm images; examples/llama/train_llama3.sh with
        # FP8_WEIGHT_TRANSPOSE_CACHE=0): Transformer Engine on ROCm remakes each fp8 weight
        # transpose at use (checks refuse it elsewhere).
        a.append("--no-fp8-weight-transpose-cache")
    if job.low_precision_states:
        # Transformer Engine's FusedAdam keeps the moments and masters in these dtypes
        # (megatron/training/arguments.py: _add_training_args, --use-precision-aware-optimizer).
        a += ["--use-precision-aware-optimizer",
              "--exp-avg-dtype", job.optimizer_state_dtype,
              "--exp-avg-sq-dtype", job.optimizer_state_dtype,
              "--main-params-dtype", job.master_weights_dtype]
    return a


def _kernel_args(job: Job) -> list[Any]:
    """The attention kernel (flash or unfused), the optimizer (Adam or SGD) and, where the
    job assumes it, the fused cross entropy (``Job.fused_cross_entropy``)."""
    return ["--attention-backend", "flash" if job.flash_attention else "unfused",
            "--optimizer", "sgd" if job.optimizer == "sgd" else "adam",
            *(["--cross-entropy-loss-fusion"] if job.fused_cross_entropy else [])]


def arguments(model: ModelSpec, job: Job, cfg: ParallelConfig) -> list[str]:
    """The argument list (model shape, parallelism, batch, memory and precision flags), one
    group of trainer arguments after the other."""
    a = [*_model_args(model, job), *_moe_args(model, job), *_parallel_args(model, job, cfg),
         *_zero_args(cfg), *_overlap_args(job, cfg), *_offload_args(cfg),
         *_recompute_args(job, cfg), *_precision_args(job, cfg), *_kernel_args(job)]
    return [str(x) for x in a]


def render(*, plan: Any, config: ParallelConfig, job: Job, estimate: Estimate, command: str,
           warnings: tuple[str, ...]) -> str:
    """The bash text: the header, the ``MEGATRON_ARGS`` array, and how to launch it."""
    head = header_lines(plan, config, job, estimate, command, warnings)
    c = plan.cluster
    head += [f"run: torchrun --nproc-per-node {c.gpus_per_node} --nnodes {c.num_nodes} "
             '--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 29500 '
             'pretrain_gpt.py "${MEGATRON_ARGS[@]}"',
             "add your data, tokenizer, learning-rate and iteration flags (replace "
             "NullTokenizer with your tokenizer; --mock-data for a smoke test)"]
    args = arguments(plan.model, job, config)
    lines, i = [], 0
    while i < len(args):
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        lines.append("    " + " ".join(shlex.quote(x) for x in args[i:i + 1 + takes_value]))
        i += 1 + takes_value
    # validate_args: tensor or context parallelism needs one CUDA connection (communication
    # kernels launch in order), Megatron FSDP needs more than one, and so does combined
    # 1F1B's all-to-all overlap (it warns otherwise, megatron/training/arguments.py; 32 where
    # the overlap is preferred over TP's ordering).
    conns = 8 if config.zero_stage == 3 else 32 if config.pipeline_schedule == "combined-1f1b" \
        else 1
    env = f"export CUDA_DEVICE_MAX_CONNECTIONS={conns}  # Megatron-LM validate_args\n"
    # Transformer Engine picks cuDNN's attention on Hopper and later, FlashAttention before
    # (costmodel.frameworks); turning the other backend off holds the plan's kernel.
    if job.attention_kernel == "flash":
        env += "export NVTE_FUSED_ATTN=0  # Transformer Engine: FlashAttention, as planned\n"
    elif job.attention_kernel == "cudnn" and c.gpu.amd:
        # Transformer Engine on ROCm runs AMD's v3 attention kernels only when asked
        # (NVTE_CK_USES_FWD_V3 / NVTE_CK_USES_BWD_V3; the ROCm Primus-Megatron docs export the
        # backward's).
        env += ("export NVTE_FLASH_ATTN=0 NVTE_CK_USES_FWD_V3=1 NVTE_CK_USES_BWD_V3=1  "
                "# Transformer Engine on ROCm: AMD's v3 attention, as planned\n")
    elif job.attention_kernel == "cudnn":
        env += "export NVTE_FLASH_ATTN=0  # Transformer Engine: cuDNN attention, as planned\n"
    elif job.attention_kernel == "aotriton":
        # Transformer Engine on ROCm has an AOTriton fused-attention backend beside Composable
        # Kernel's (ROCm/TransformerEngine README: NVTE_FUSED_ATTN_CK, NVTE_FUSED_ATTN_AOTRITON).
        env += ("export NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN_CK=0 NVTE_FUSED_ATTN_AOTRITON=1  "
                "# Transformer Engine on ROCm: AOTriton attention, as planned\n")
    return (commented(head) + "\n" + env + "MEGATRON_ARGS=(\n" + "\n".join(lines)
            + "\n)\n")


def parse_array(text: str) -> list[str]:
    """The words of the ``MEGATRON_ARGS=( ... )`` array in ``text``."""
    found = re.search(r"^MEGATRON_ARGS=\((.*?)^\)", text, re.S | re.M)
    if not found:
        raise SpecError("no MEGATRON_ARGS=( ... ) array in the text")
    return shlex.split(found.group(1), comments=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--num-layers", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                 "--context-parallel-size", "--expert-model-parallel-size",
                 "--expert-tensor-parallel-size",
                 "--micro-batch-size", "--global-batch-size", "--recompute-num-layers",
                 "--num-distributed-optimizer-instances", "--seq-length"):
        p.add_argument(flag, type=int)
    for flag in ("--pipeline-model-parallel-layout", "--data-parallel-sharding-strategy",
                 "--recompute-granularity", "--recompute-method"):
        p.add_argument(flag)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--optimizer-cpu-offload", "--overlap-moe-expert-parallel-comm"):
        p.add_argument(flag, action="store_true")
    return p


def read(text: str, model: ModelSpec) -> ReadBack:
    """The configuration a ``MEGATRON_ARGS`` array written by ``render`` describes. As in
    Megatron-LM, the data-parallel degree is what the GPUs of the ``torchrun`` line leave
    after tensor, pipeline and context parallelism."""
    ns, _ = _parser().parse_known_args(parse_array(text))
    run = re.search(r"--nproc-per-node (\d+) --nnodes (\d+)", text)
    if not run:
        raise SpecError("no torchrun line (--nproc-per-node N --nnodes M) in the text")
    num_gpus = int(run.group(1)) * int(run.group(2))
    pp = ns.pipeline_model_parallel_size
    dp = num_gpus // (ns.tensor_model_parallel_size * pp * ns.context_parallel_size)
    v = (ns.num_layers // (pp * ns.num_layers_per_virtual_pipeline_stage)
         if ns.num_layers_per_virtual_pipeline_stage else 1)
    stage_layers = None
    if ns.pipeline_model_parallel_layout:
        stage_layers = layout_layers(ns.pipeline_model_parallel_layout)
        v = len(stage_layers) // pp
    zero = 3 if ns.use_megatron_fsdp else 1 if ns.use_distributed_optimizer else 0
    inst = ns.num_distributed_optimizer_instances
    rec = ns.recompute_granularity or "none"
    cfg = ParallelConfig(
        dp=dp, tp=ns.tensor_model_parallel_size, pp=pp, cp=ns.context_parallel_size,
        ep=ns.expert_model_parallel_size, etp=ns.expert_tensor_parallel_size, zero_stage=zero,
        sharding_group=dp // inst if inst and inst > 1 else None,
        sequence_parallel=ns.sequence_parallel, micro_batch_size=ns.micro_batch_size,
        virtual_pipeline_stages=v, stage_layers=stage_layers, recompute=rec,
        pipeline_schedule="combined-1f1b" if ns.overlap_moe_expert_parallel_comm else None,
        recompute_num_layers=ns.recompute_num_layers if ns.recompute_method == "block" else None,
        offload="optimizer" if ns.optimizer_cpu_offload else "none")
    return ReadBack(config=cfg, global_batch_size=ns.global_batch_size, seq_len=ns.seq_length,
                    num_gpus=num_gpus)


TARGET = Target(name="megatron", filename="megatron_args.sh", lower=lower, render=render,
                read=read)

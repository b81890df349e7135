"""A parallel configuration checked against a model, a cluster and a job.

``ParallelConfig`` checks what it can alone (``costmodel.config``); ``validate`` checks the rest:
the degrees fill the cluster, divide the model's heads and layers (a preset's, or the blocks of a
traced graph's ``LayerCosts``), the batch and the experts, and what the job's trainer runs. It
raises ``SpecError`` naming the offending values and a fix, never ``assert``.
"""

from __future__ import annotations

from costmodel.config import V_SCHEDULES, Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.roofline import high_precision
from costmodel.frameworks import Framework, experts_fit, framework, schedule_problem
from costmodel.hardware import GPU, Cluster
from costmodel.model import ModelSpec

__all__ = ["validate"]


def validate(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, cfg: ParallelConfig
             ) -> None:
    """Check ``cfg`` against the model (a preset, or the ``LayerCosts`` of a traced graph),
    the cluster and the job; SpecError names what is wrong."""
    _check_placement(model, cluster, cfg)
    _check_layers(model, cfg)
    _check_first_stage(model, cfg)
    _check_batch(job, cfg)
    _check_experts(model, cfg, framework(job.framework))
    _check_job(model, cluster, job)
    _check_framework(framework(job.framework), job, cfg)
    if cfg.pipeline_schedule == "combined-1f1b":
        _check_combined(model, framework(job.framework), job, cfg)


def job_problem(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job) -> str | None:
    """Why ``job`` cannot run on its trainer and this cluster whatever the configuration (a
    setting another trainer owns, a precision or kernel the GPU or trainer lacks), or None:
    the check ``validate`` starts with, which a search over several trainers uses to leave
    out the ones that cannot run the job (``planner.space.spaces``)."""
    try:
        _check_job(model, cluster, job)
    except SpecError as e:
        return str(e)
    return None


def _check_job(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job) -> None:
    """The job's settings against its trainer, the model and the GPU (``job_problem``)."""
    if job.recompute_modules != ("core_attn",) and job.framework != "megatron":
        raise SpecError(f"recompute_modules {list(job.recompute_modules)} is Megatron-LM's "
                        f"--recompute-modules; {job.framework}'s selective recompute is its own: "
                        "leave it at core_attn or use --framework megatron")
    spec = model if isinstance(model, ModelSpec) else model.spec
    if "mla_up_proj" in job.recompute_modules and spec is not None and not spec.is_mla:
        # megatron/core/transformer/transformer_config.py: "mla_up_proj in recompute_modules
        # is only supported with multi_latent_attention".
        raise SpecError(f"recompute module mla_up_proj re-runs latent attention's up "
                        f"projections; {model.name} has no multi-head latent attention: drop it "
                        "from --recompute-modules")
    if job.activation_func_fp8_input_store and (
            job.framework != "megatron" or spec is None or not spec.gated_mlp):
        # transformer_config.py: "Storing activation input in FP8 is supported only for
        # SwiGLU."
        raise SpecError("activation_func_fp8_input_store is Megatron-Core's fp8 store of a "
                        "SwiGLU's input; it needs framework='megatron' and a model config with "
                        f"a gated MLP ({job.framework}, {model.name}): leave it off")
    if not job.fp8_weight_transpose_cache and (
            job.framework != "megatron" or job.precision != "fp8" or not cluster.gpu.amd):
        raise SpecError("fp8_weight_transpose_cache=False is ROCm Megatron-LM's "
                        "--no-fp8-weight-transpose-cache (Transformer Engine on ROCm) for fp8 "
                        f"jobs on AMD GPUs; this job is {job.framework}, {job.precision} on "
                        f"{cluster.gpu.name}: leave the transpose cache on")
    _check_precision(cluster, job)
    _check_attention(cluster, job)


def _check_attention(cluster: Cluster, job: Job) -> None:
    """On AMD Instinct GPUs the ``cudnn`` kernel is AMD's v3 attention, which only Transformer
    Engine on ROCm runs (``NVTE_CK_USES_FWD_V3`` / ``NVTE_CK_USES_BWD_V3``): PyTorch's SDPA has
    no cuDNN backend on ROCm. ``aotriton`` is AMD's Triton FlashAttention, which only ROCm
    has."""
    gpu = cluster.gpu
    if job.attention_kernel == "cudnn" and gpu.amd and job.framework != "megatron":
        raise SpecError(f"attention_kernel='cudnn' on {gpu.name} is AMD's v3 attention, which "
                        "Transformer Engine on ROCm runs (Megatron-LM); "
                        f"{job.framework}'s attention on ROCm is PyTorch's SDPA, which has no "
                        "such backend: use --attention-kernel aotriton (SDPA's default on "
                        "ROCm) or flash, or --framework megatron")
    if job.attention_kernel == "aotriton" and not gpu.amd:
        raise SpecError(f"attention_kernel='aotriton' is AMD's Triton FlashAttention, PyTorch "
                        f"SDPA's kernel on ROCm; {gpu.name} is not an AMD GPU: use "
                        "--attention-kernel flash or cudnn")


def _check_placement(model: ModelSpec | LayerCosts, cluster: Cluster, cfg: ParallelConfig
                     ) -> None:
    """The degrees fill the cluster; tensor parallel stays in a scale-up domain (a node, or
    an NVLink domain of several) and divides the heads
    and the MLP (a traced graph: is one of the degrees its blocks were sharded at)."""
    if cfg.world_size != cluster.num_gpus:
        raise SpecError(
            f"dp*tp*pp*cp = {cfg.dp}*{cfg.tp}*{cfg.pp}*{cfg.cp} = {cfg.world_size} but the "
            f"cluster has {cluster.num_gpus} GPUs; make the degrees multiply to {cluster.num_gpus}"
        )
    if cfg.tp > cluster.scale_up:
        raise SpecError(
            f"tp={cfg.tp} exceeds {cluster.domain_words()}; tensor parallel must stay inside a "
            "node or NVLink domain"
        )
    if not isinstance(model, ModelSpec):
        if model.spec is None:
            _check_traced(model, cfg)
            return
        model = model.spec
    for key, value in (("num_heads", model.num_heads), ("num_kv_heads", model.num_kv_heads),
                       ("ffn_hidden_size", model.ffn_hidden_size)):
        assert value is not None, "ModelSpec.__post_init__ fills the defaults"
        if value % cfg.tp:
            raise SpecError(f"tp={cfg.tp} does not divide {key}={value}; pick tp dividing it")
    if model.is_moe and int(model.moe_ffn_hidden_size or 0) % cfg.tp:
        raise SpecError(
            f"tp={cfg.tp} does not divide moe_ffn_hidden_size={model.moe_ffn_hidden_size}"
        )


def _check_traced(costs: LayerCosts, cfg: ParallelConfig) -> None:
    """A traced graph's costs exist at the TP degrees and with the sequence parallelism its
    blocks were sharded with; context parallelism only where its layers mix tokens in fused
    attention alone."""
    if cfg.tp not in costs.tp_degrees:
        raise SpecError(f"{costs.name}: tp={cfg.tp} is not among the degrees its blocks were "
                        f"sharded at ({', '.join(map(str, costs.tp_degrees))})")
    if cfg.tp > 1 and cfg.sequence_parallel not in costs.sp_options:
        raise SpecError(f"{costs.name}: its blocks were sharded "
                        f"{'with' if costs.sequence_parallel else 'without'} sequence "
                        "parallelism; cost it the other way for the other (or both: "
                        "costs_from_graph(..., sequence_parallel='both'))")
    if cfg.cp > 1 and not costs.context_parallel_ok:
        raise SpecError(f"{costs.name}: context parallelism splits the sequence, but "
                        f"{costs.token_mixer} reduces over the tokens outside a fused "
                        "attention; use cp=1")


def _check_layers(model: ModelSpec | LayerCosts, cfg: ParallelConfig) -> None:
    """The pipeline's stages and chunks split the model's layers (a V schedule's uneven
    split is torchtitan's own, ``vschedules.v_split``)."""
    chunks = cfg.pp * cfg.virtual_pipeline_stages
    # Explicit layers per chunk may leave a chunk only the embedding or the loss
    # (Megatron-LM's accounted split of 94 layers over 32 x 3 chunks).
    if cfg.stage_layers is None and model.num_layers < chunks:
        raise SpecError(
            f"the model has {model.num_layers} layers, fewer than pp*virtual stages = {chunks}; "
            "lower pp or virtual_pipeline_stages"
        )
    if cfg.virtual_pipeline_stages > 1 and model.num_layers % chunks and \
            cfg.chunk_layers is None and cfg.pipeline_schedule not in V_SCHEDULES:
        raise SpecError(
            f"interleaving needs num_layers={model.num_layers} divisible by "
            f"pp*virtual_pipeline_stages={chunks}, or explicit layers per chunk "
            f"(stage_layers, pp*virtual_pipeline_stages of them; "
            f"costmodel.config.accounted_split gives Megatron-LM's)"
        )
    if cfg.stage_layers is not None and sum(cfg.stage_layers) != model.num_layers:
        raise SpecError(
            f"stage_layers {list(cfg.stage_layers)} sum to {sum(cfg.stage_layers)}, "
            f"not the model's {model.num_layers} layers"
        )


def _check_first_stage(model: ModelSpec | LayerCosts, cfg: ParallelConfig) -> None:
    """A traced graph's first pipeline stage holds the layers before its last op that reads
    the model's own inputs (``LayerCosts.first_stage_layers``)."""
    need = model.first_stage_layers
    if cfg.pp == 1 or not need:
        return
    chunks = cfg.pp * cfg.virtual_pipeline_stages
    first = cfg.stage_layers[0] if cfg.stage_layers is not None \
        else model.num_layers // chunks
    if first < need:
        raise SpecError(
            f"the first pipeline stage holds {first} layers, but {model.name} reads its own "
            f"inputs until after its first {need} layers, and torch.distributed.pipelining "
            f"gives a later stage only the previous stage's outputs; give the first stage at "
            f"least {need} layers (stage_layers), or fewer stages")


def _check_batch(job: Job, cfg: ParallelConfig) -> None:
    """The batch splits over data parallel and micro-batches, the sequence over context and
    sequence parallel."""
    if job.global_batch_size % (cfg.dp * cfg.micro_batch_size):
        raise SpecError(
            f"global_batch_size={job.global_batch_size} is not divisible by "
            f"dp*micro_batch_size = {cfg.dp}*{cfg.micro_batch_size}"
        )
    if job.seq_len % cfg.cp:
        raise SpecError(f"seq_len={job.seq_len} is not divisible by cp={cfg.cp}")
    if cfg.sequence_parallel and (job.seq_len // cfg.cp) % cfg.tp:
        raise SpecError(
            f"sequence_parallel splits seq_len/cp = {job.seq_len // cfg.cp} over tp={cfg.tp}; "
            "it must divide"
        )


def _check_experts(model: ModelSpec | LayerCosts, cfg: ParallelConfig, fw: Framework
                   ) -> None:
    """Expert parallel needs an MoE model whose experts, and the ranks it reuses, it divides;
    a folded expert mesh (``etp``) the same (``_check_folding``)."""
    if cfg.etp is not None and cfg.etp != cfg.tp:
        _check_folding(model, cfg, fw)
    elif cfg.ep > 1:
        if not model.is_moe:
            raise SpecError(f"ep={cfg.ep} needs a mixture-of-experts model; {model.name} is "
                            "dense")
        experts = model.num_experts if isinstance(model, ModelSpec) else model.moe_routing()[1]
        if experts % cfg.ep:
            raise SpecError(f"ep={cfg.ep} does not divide num_experts={experts}")
        if (cfg.dp * cfg.cp) % cfg.ep:
            raise SpecError(
                f"ep={cfg.ep} must divide dp*cp = {cfg.dp * cfg.cp} (expert parallel reuses "
                "the data- and context-parallel ranks)"
            )
        if cfg.zero_stage and cfg.shard_degree % cfg.ep:
            raise SpecError(
                f"ep={cfg.ep} must divide the ZeRO shard degree {cfg.shard_degree} "
                "(sharding_group*cp) so expert states shard evenly"
            )
    shard = (cfg.sharding_group or cfg.dp) if cfg.zero_stage else 1
    if fw.ep_in_shard_group and cfg.ep > 1 and \
            not experts_fit(shard, cfg.cp, cfg.tp, cfg.ep, cfg.expert_tp):
        room = shard * cfg.cp * cfg.tp
        raise SpecError(
            f"{fw.name}: ep*etp = {cfg.ep * cfg.expert_tp} must divide the FSDP shard "
            f"group x cp x tp = {room} (its experts' mesh: efsdp = dp_shard * cp * tp / "
            "(etp * ep), torchtitan/distributed/parallel_dims.py); DDP (zero_stage 0) "
            "shards nothing: use zero_stage 2 or 3, or a smaller ep")


def _check_folding(model: ModelSpec | LayerCosts, cfg: ParallelConfig, fw: Framework
                   ) -> None:
    """A folded expert mesh: the experts' etp x ep x expert-DP mesh covers a pipeline stage's
    tp * cp * dp ranks (Megatron-Core's MoE parallel folding, megatron/core/parallel_state.py
    ``initialize_model_parallel``: the expert data-parallel size is the world over
    etp * ep * pp, which must divide it; torchtitan's etp 1, parallel_dims.py), the experts
    divide by ep and their MLP width by etp, with the ZeRO stages the trainer folds with
    (``Framework.folded_zero_max``: Megatron-LM's distributed optimizer, torchtitan's
    FSDP)."""
    etp = cfg.expert_tp
    if not fw.runs_expert_tp(cfg.tp, etp):
        allowed = "1 or tp" if fw.expert_tp == "tp_or_1" else "tp"
        raise SpecError(f"etp={etp} under tp={cfg.tp}: {fw.name} splits its experts over "
                        f"etp = {allowed} (any etp dividing tp is Megatron-Core's MoE parallel "
                        "folding): change etp or use --framework megatron")
    if not isinstance(model, ModelSpec):
        raise SpecError("etp (expert tensor parallel other than tp) is costed for model "
                        "presets and configs, not traced modules; leave etp unset")
    if not model.is_moe:
        raise SpecError(f"etp={cfg.etp} needs a mixture-of-experts model; {model.name} is dense")
    if not experts_fit(cfg.dp, cfg.cp, cfg.tp, cfg.ep, etp):
        raise SpecError(f"etp*ep = {etp * cfg.ep} must divide tp*cp*dp = "
                        f"{cfg.tp * cfg.cp * cfg.dp} "
                        "(the experts' mesh folds over a pipeline stage's ranks)")
    if model.num_experts % cfg.ep:
        raise SpecError(f"ep={cfg.ep} does not divide num_experts={model.num_experts}")
    if (model.moe_ffn_hidden_size or 0) % etp:
        raise SpecError(f"etp={etp} does not divide the experts' MLP width "
                        f"{model.moe_ffn_hidden_size}")
    if cfg.zero_stage > fw.folded_zero_max:
        raise SpecError(f"etp={cfg.etp} with zero_stage={cfg.zero_stage}: {fw.name}'s folded "
                        f"expert meshes run with zero_stage {fw.folded_zero_max} at most "
                        "(Megatron-LM's distributed optimizer)")


_COMBINED = "pipeline_schedule='combined-1f1b' (--overlap-moe-expert-parallel-comm)"


def combined_job_problem(model: ModelSpec | LayerCosts, job: Job) -> str | None:
    """What keeps the model and job from Megatron-LM's combined 1F1B whatever the
    configuration (``_check_combined``: a mixture of experts, the alltoall or flex
    dispatcher, bf16 or fp16, at most one multi-token prediction module); None when nothing
    does. The search offers the schedule only where this is None."""
    if not model.is_moe:
        return f"{_COMBINED} overlaps expert-parallel all-to-alls: it needs a mixture of experts"
    if job.moe_dispatcher == "allgather":
        return f"{_COMBINED} runs with the alltoall or deepep (flex) dispatcher, not allgather"
    if job.precision == "fp32":
        return f"{_COMBINED} needs bf16 or fp16 training"
    if model.mtp_layers > 1:
        return (f"{_COMBINED} runs with at most one multi-token prediction module, "
                f"{model.name} has {model.mtp_layers}")
    return None


def _check_combined(model: ModelSpec | LayerCosts, fw: Framework, job: Job,
                    cfg: ParallelConfig) -> None:
    """What Megatron-LM's --overlap-moe-expert-parallel-comm (combined 1F1B) needs, as
    megatron/core/transformer/transformer_config.py asserts it (core_v0.14.0): the model and
    job's part (``combined_job_problem``), expert parallel and no full recompute."""
    if "combined-1f1b" not in fw.schedules:
        raise SpecError(f"{_COMBINED} is Megatron-LM's; framework={fw.name!r} does not run it")
    problem = combined_job_problem(model, job)
    if problem:
        raise SpecError(problem)
    if cfg.ep < 2:
        raise SpecError(f"{_COMBINED} overlaps expert-parallel all-to-alls: it needs ep >= 2, "
                        f"got ep={cfg.ep}")
    if cfg.recompute == "full":
        raise SpecError(f"{_COMBINED} refuses full recompute; use recompute 'selective' or "
                        "'none'")
    if cfg.recompute == "selective" and "moe" in job.recompute_modules:
        # transformer_config.py: "disable moe in recompute_modules when enabling
        # overlap_moe_expert_parallel_comm".
        raise SpecError(f"{_COMBINED} refuses the recompute module moe (the whole MoE layer "
                        "re-run); drop it from --recompute-modules or use another schedule")


def _check_framework(fw: Framework, job: Job, cfg: ParallelConfig) -> None:
    """The trainer can run the ZeRO stage, its combination with a pipeline, the schedule
    and the offload."""
    if cfg.zero_stage not in fw.zero_stages:
        raise SpecError(
            f"framework={fw.name!r} cannot run zero_stage={cfg.zero_stage}: {fw.note_zero}"
        )
    if cfg.pp > 1 and cfg.zero_stage not in fw.zero_with_pp:
        raise SpecError(
            f"framework={fw.name!r} cannot combine pipeline parallel (pp={cfg.pp}) with "
            f"zero_stage={cfg.zero_stage}; use zero_stage in {list(fw.zero_with_pp)}"
        )
    if cfg.pp > 1 and cfg.pipeline_schedule not in fw.schedules + fw.costed_schedules:
        raise SpecError(
            f"framework={fw.name!r} has no {cfg.pipeline_schedule!r} schedule; it has "
            f"{', '.join(fw.schedules)}"
        )
    problem = schedule_problem(fw, str(cfg.pipeline_schedule), cfg.pp,
                               job.global_batch_size // (cfg.dp * cfg.micro_batch_size))
    if problem:
        how = " pipelines with torch.distributed.pipelining:" if fw.torch_pipelining and \
            cfg.pipeline_schedule in fw.schedules else ":"
        raise SpecError(f"framework={fw.name!r}{how} {problem}; change micro_batch_size or "
                        "the schedule")
    for key, value in job.low_precision_states.items():
        if fw.name != "megatron":
            raise SpecError(
                f"framework={fw.name!r} keeps its optimizer states and master weights in "
                f"fp32; {key}={value!r} is Megatron-LM's precision-aware "
                "optimizer: use framework='megatron' or leave it fp32")
    least = dict(fw.offloads).get(cfg.offload)
    if least is None:
        raise SpecError(
            f"framework={fw.name!r} cannot offload {cfg.offload!r}; it offloads "
            f"{', '.join(m for m, _ in fw.offloads if m != 'none') or 'nothing'}"
        )
    if cfg.zero_stage < least:
        raise SpecError(
            f"offload={cfg.offload!r} with framework={fw.name!r} needs zero_stage >= {least}"
        )


#: Per FP4 precision: (the GPUs that run it, the recipe flags it is modelled as, what to use
#: elsewhere).
_FP4 = {
    "nvfp4": ("Blackwell (B200, B300, GB200, GB300)",
              "Transformer Engine's NVFP4 training recipe (Megatron-LM --fp4-format e2m1 "
              "--fp4-recipe nvfp4)",
              "--precision fp8 (MI355X: --precision mxfp4)"),
    "mxfp4": ("CDNA 4 (MI355X, MI350X)",
              "AMD's MXFP4 training recipe (Megatron-LM under Primus / ROCm Transformer "
              "Engine, --fp4-format e2m1 --fp4-recipe mxfp4)",
              "--precision fp8 (Blackwell: --precision nvfp4)"),
}


def _check_fp4(gpu: GPU, job: Job) -> None:
    """An FP4 precision runs on a GPU whose profile has its peak, under Megatron-LM, without
    the fp8 parameter gather."""
    if job.precision not in _FP4:
        return
    where, recipe, other = _FP4[job.precision]
    name = job.precision.upper()
    if not gpu.supports(job.precision):
        raise SpecError(f"{gpu.name} has no {job.precision} in its profile: {name}'s "
                        f"block-scaled matmuls run on {where}; use {other} here")
    if job.framework != "megatron":
        raise SpecError(f"precision={job.precision!r} is modelled as {recipe}; "
                        f"{job.framework}'s {name} linears are not modelled: use --framework "
                        "megatron, or --precision fp8")
    if job.fp8_param_gather:
        raise SpecError("fp8_param_gather is Megatron-LM's --fp8-param-gather, for fp8 jobs; "
                        "its FP4 counterpart (--fp4-param-gather) is not modelled: drop "
                        f"--fp8-param-gather with --precision {job.precision}")


def _check_precision(cluster: Cluster, job: Job) -> None:
    """The GPU supports the job's precision (and its float8 recipe)."""
    gpu = cluster.gpu
    if job.precision == "fp8" and job.float8_recipe == "mxfp8" and not gpu.supports("mxfp8"):
        raise SpecError(f"{gpu.name} has no mxfp8 in its profile: MXFP8's block-scaled matmuls "
                        "run on Blackwell (B200, B300, GB200, GB300) and CDNA 4 (MI355X); use "
                        "--float8-recipe tensorwise or rowwise here")
    if job.precision == "fp8" and job.float8_recipe == "blockwise" and job.framework != "megatron":
        raise SpecError(f"float8_recipe='blockwise' is Transformer Engine's (Megatron-LM "
                        f"--fp8-recipe blockwise); {job.framework} has no block-wise float8 "
                        "linear: use tensorwise, rowwise or mxfp8")
    _check_fp4(gpu, job)
    dtype = high_precision(job.precision)
    for need in {dtype, job.precision}:
        if not gpu.supports(need):
            raise SpecError(
                f"{gpu.name} has no {need} support in its profile; choose another precision "
                "(e.g. fp16 on V100)"
            )

"""``planner estimate``: the memory per GPU and step time of one configuration (or, with
``--inference``, one serving configuration); also the report ``planner plan`` prints for the
configuration it chose."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

import hardware_profiles
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.config import OFFLOADS, RECOMPUTE, SCHEDULES, V_SCHEDULES
from costmodel.formulas.arrays import interleaved_split
from costmodel.formulas.eager import float8_gathered_rows
from costmodel.formulas.estimate import NEAR_CAPACITY, Estimate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import TERMS
from costmodel.formulas.moe import routing_words
from costmodel.formulas.roofline import attention_kernel, attention_name
from costmodel.formulas.steptime import TIME_TERMS, host_words
from costmodel.formulas.vschedules import v_split
from costmodel.serving.inference import InferenceConfig, InferenceJob, estimate_inference
from costmodel.units import GIB, plural
from planner.alternatives import layer_list, params_text
from planner.cli.common import (
    add_command,
    add_common_args,
    add_inference_args,
    load_problem,
    positive_int,
    print_json,
    stage_layers,
    warn,
)

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """example:
  planner estimate --model gpt3-175b --cluster selene --num-nodes 8 \\
      --global-batch-size 64 --seq-len 2048 --framework megatron \\
      --tp 8 --pp 8 --micro-batch-size 1 --sequence-parallel --recompute selective \\
      --virtual-stages 3
  planner estimate --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192 --tp 8 --pp 4 --zero 1 --json
  planner estimate --inference --model llama-2-70b --gpus 4 --gpu a100-80gb \\
      --prompt-len 128 --output-len 2048 --tp 4 --batch-size 16 --dtype fp16
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner estimate`` to ``sub``."""
    est = add_command(
        sub, "estimate", help="memory per GPU and step time of one parallel configuration",
        description="Estimate per-GPU memory (by term and pipeline stage) and step time (by "
        "term: compute, recompute, exposed communication, bubble, optimizer) of one "
        "configuration.", epilog=EPILOG)
    add_common_args(est)
    pc = est.add_argument_group("parallel configuration")
    pc.add_argument("--dp", type=positive_int, help="data parallel (default: GPUs / (tp*pp*cp))")
    pc.add_argument("--tp", type=positive_int, default=1, help="tensor parallel")
    pc.add_argument("--pp", type=positive_int, default=1, help="pipeline parallel")
    pc.add_argument("--cp", type=positive_int, default=1, help="context parallel")
    pc.add_argument("--ep", type=positive_int, default=1, help="expert parallel (within dp*cp)")
    pc.add_argument("--etp", type=positive_int,
                    help="the experts' own tensor parallel degree (Megatron-Core's MoE "
                    "parallel folding: etp*ep divides tp*cp*dp); default: tp")
    pc.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage")
    pc.add_argument("--sharding-group", type=positive_int,
                    help="HSDP: data-parallel ranks per shard")
    pc.add_argument("--micro-batch-size", type=positive_int, default=1)
    pc.add_argument("--sequence-parallel", choices=("on", "off"), nargs="?", const="on",
                    default="off", help="sequence parallel on or off (bare: on; default off)")
    pc.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    pc.add_argument("--virtual-stages", type=positive_int,
                    help="virtual pipeline stages per rank (interleaved 1F1B); default 1, "
                         "and 2 under the V schedules (zbv, dualpipev), which place two "
                         "chunks on every rank")
    pc.add_argument("--stage-layers", type=stage_layers,
                    help="layers per pipeline stage, or per chunk in virtual order when "
                         "interleaved: counts ('1,2x30,0': 1, thirty 2s, 0) or Megatron-LM's "
                         "--pipeline-model-parallel-layout ('Et|(tt|)*30mL'). Default: even; "
                         "interleaved chunks that do not split the layers evenly count the "
                         "embedding and the loss as layers (Megatron-LM's accounted split)")
    pc.add_argument("--recompute", default="none", choices=RECOMPUTE)
    pc.add_argument("--recompute-num-layers", type=positive_int,
                    help="with --recompute full: only the first N layers of each chunk")
    pc.add_argument("--offload", default="none", choices=OFFLOADS)
    add_inference_args(est, search=False)
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    """``planner estimate``: memory of one configuration."""
    model, cluster, job = load_problem(args)
    if isinstance(job, InferenceJob):
        return _estimate_inference(args, model, cluster, job)
    cfg = _config(args, cluster, model)
    est = estimate(model, cluster, job, cfg)
    if args.json:
        print_json({"config": cfg.to_dict(), "estimate": est.to_dict(),
                    "model": _model_dict(model), "cluster": _cluster_dict(cluster),
                    "job": dataclasses.asdict(job)})
    else:
        print(estimate_report(model, cluster, job, est))
    return 0


def _model_dict(model: ModelSpec) -> dict[str, object]:
    """The model in ``--json`` output."""
    return {"name": model.name, "num_params": model.num_params()}


def _cluster_dict(cluster: Cluster) -> dict[str, object]:
    """The cluster in ``--json`` output."""
    return {"gpu": cluster.gpu.name, "num_nodes": cluster.num_nodes,
            "gpus_per_node": cluster.gpus_per_node}


def _config(args: argparse.Namespace, cluster: Cluster, model: ModelSpec) -> ParallelConfig:
    """The configuration of the flags; without ``--dp``, data parallelism fills the cluster."""
    rest = args.tp * args.pp * args.cp
    dp = args.dp
    if dp is None:
        if cluster.num_gpus % rest:
            raise SpecError(
                f"tp*pp*cp = {rest} does not divide the {cluster.num_gpus} GPUs; pass --dp or "
                "change the degrees"
            )
        dp = cluster.num_gpus // rest
    if args.schedule == "interleaved-1f1b" and args.virtual_stages is None:
        raise SpecError("--schedule interleaved-1f1b runs several model chunks on every "
                        "pipeline rank: give their number with --virtual-stages (2 or more)")
    v = args.virtual_stages or (2 if args.schedule in V_SCHEDULES else 1)
    if args.schedule in V_SCHEDULES:
        # The cost model places a V's layers as torchtitan splits them (vschedules.v_split).
        split = args.stage_layers
        if not split and v == 2 and args.pp > 1:
            warn(f"{model.num_layers} layers on a V of pp={args.pp} x 2 stages: estimated with "
                 f"torchtitan's split {layer_list(v_split(model.num_layers, args.pp))} (the "
                 "embedding and the output layer counted as layers); --stage-layers sets "
                 "another")
    else:
        split = args.stage_layers or interleaved_split(model.num_layers, args.pp, v,
                                                       model.mtp_layers)
        if split and not args.stage_layers:
            warn(f"{model.num_layers} layers on pp={args.pp} x {v} virtual "
                 f"stages: estimated with Megatron-LM's accounted split {layer_list(split)} "
                 "(the embedding and the loss counted as layers); --stage-layers sets another")
    return ParallelConfig(
        dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, etp=args.etp,
        zero_stage=args.zero,
        sharding_group=args.sharding_group, sequence_parallel=args.sequence_parallel == "on",
        micro_batch_size=args.micro_batch_size, pipeline_schedule=args.schedule,
        virtual_pipeline_stages=v, recompute=args.recompute,
        recompute_num_layers=args.recompute_num_layers, offload=args.offload,
        stage_layers=split,
    )


def _estimate_inference(args: argparse.Namespace, model: ModelSpec, cluster: Cluster,
                        job: InferenceJob) -> int:
    """``planner estimate --inference``: one serving configuration."""
    if len(job.weight_precisions) > 1:
        raise SpecError("planner estimate takes one --weight-precision; 'planner plan "
                        "--inference' chooses among several")
    width = args.tp * args.pp
    replicas = args.replicas or max(1, cluster.num_gpus // width)
    cfg = InferenceConfig(tp=args.tp, pp=args.pp, replicas=replicas,
                          batch_size=job.batch_size or 1,
                          weight_precision=job.weight_precisions[0])
    est = estimate_inference(model, cluster, job, cfg)
    if args.json:
        print_json({"config": cfg.to_dict(), "estimate": est.to_dict(),
                    "model": _model_dict(model), "cluster": _cluster_dict(cluster),
                    "job": job.to_dict()})
    else:
        print(f"model    {model.name}: {params_text(model)}; "
              f"{cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}; serving "
              f"{job.prompt_len:,}-token prompts, {job.output_len:,} output tokens")
        print(est.summary())
    return 0


# -- the report ---------------------------------------------------------------------------

def _fmt_s(x: float) -> str:
    """Seconds in the unit people read: ms below one second."""
    return f"{1e3 * x:10.1f} ms" if x < 1 else f"{x:10.3f} s "


def _fmt_gib(x: float) -> str:
    """Bytes in GiB, aligned."""
    return f"{x / GIB:8.2f} GiB"


def estimate_report(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, est: Estimate
                    ) -> str:
    """``planner estimate``'s text: the problem, the configuration, memory per GPU by term
    (and pipeline stage) and the step time by term."""
    return "\n".join([*_header(model, cluster, job, est), "", *_memory_lines(est),
                      *_time_lines(cluster, job, est)])


def _header(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, est: Estimate
            ) -> list[str]:
    """The model, cluster, job and configuration, a line each."""
    cfg = est.config
    fit = hardware_profiles.fit_note(cluster.gpu.name)
    return [
        *([f"fit      {fit}"] if fit else []),
        f"model    {model.name}: {params_text(model)}",
        f"cluster  {cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name} "
        f"({cluster.gpu.memory_bytes / GIB:.1f} GiB"
        + (f", held at {cluster.power_limit_w:g} W" if cluster.power_limit_w else "")
        + f"), {cluster.intra_link.name} "
        + (f"across {cluster.scale_up}-GPU domains, {cluster.nics_per_node} x "
           f"{cluster.inter_link.name} per node" if cluster.scale_up > cluster.gpus_per_node
           else f"inside nodes, {cluster.nics_per_node} x {cluster.inter_link.name} per node"
           if cluster.num_nodes > 1 else "inside the node (one node)"),
        f"job      {job.global_batch_size} x {job.seq_len} {job.unit}, {job.precision}, "
        f"{job.optimizer}{_state_dtypes(job)}, {job.framework} conventions"
        + (", TP collectives pipelined with matmuls (--tp-comm-overlap)"
           if job.tp_comm_overlap and job.framework != "deepspeed" else "")
        + (", torch.compile" if job.compile and job.framework == "torchtitan" else "")
        + (", fp8 parameters" if job.fp8_param_gather and job.framework == "megatron"
           and job.precision == "fp8" else "")
        + (", float8 FSDP all-gather" if float8_gathered_rows(job.framework, job, cfg.zero_stage)
           else "")
        + (", SwiGLU input kept in fp8" if job.activation_func_fp8_input_store else "")
        + ("" if job.fp8_weight_transpose_cache else ", no fp8 weight transpose cache")
        + (", " + attention_name(attention_kernel(job, cluster.gpu), cluster.gpu)
           if job.flash_attention else ", unfused attention"),
        f"config   dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp} ep={cfg.ep} "
        + (f"etp={cfg.etp} " if cfg.etp is not None else "")
        + f"zero={cfg.zero_stage} sp={'on' if cfg.sequence_parallel else 'off'} "
        f"mbs={cfg.micro_batch_size} ({plural(est.num_micro_batches, 'micro-batch')}) "
        f"schedule={cfg.pipeline_schedule}"
        + (f" v={cfg.virtual_pipeline_stages}" if cfg.virtual_pipeline_stages > 1 else "")
        + f" recompute={cfg.recompute}"
        + (f"({cfg.recompute_num_layers} layers)" if cfg.recompute_num_layers else "")
        + (f" offload={cfg.offload}" if cfg.offload != "none" else ""),
        *([f"routing  {routing_words(job)}"] if getattr(model, "is_moe", False) else []),
        *([f"host     {host}"] if (host := host_words(est.time_breakdown_s)) else []),
    ]


def _state_dtypes(job: Job) -> str:
    """The optimizer's state and master dtypes where not fp32: " (bf16 states, fp16
    masters)"."""
    low = [f"{v} {what}" for v, what in ((job.optimizer_state_dtype, "states"),
                                         (job.master_weights_dtype, "masters")) if v != "fp32"]
    return f" ({', '.join(low)})" if low else ""


def _memory_lines(est: Estimate) -> list[str]:
    """Memory per GPU of the fullest stage by term, whether it fits, and the stages."""
    lines = [f"memory per GPU (fullest: stage {est.peak_stage})"]
    for t in TERMS:
        lines.append(f"  {t:<12s}{_fmt_gib(getattr(est.memory, f'{t}_bytes'))}")
    lines.append(f"  {'total':<12s}{_fmt_gib(est.peak_memory_bytes)}  of "
                 f"{est.memory_capacity_bytes / GIB:.1f} GiB: "
                 + (f"fits, headroom {est.headroom_bytes / GIB:.2f} GiB" if est.fits else
                    f"DOES NOT FIT, over by {est.over_capacity_bytes / GIB:.2f} GiB"
                    if est.over_capacity_bytes else "DOES NOT FIT in host memory"))
    if est.fits and est.near_capacity:
        lines.append(f"  warning: above {100 * NEAR_CAPACITY:.0f}% of the GPU's memory; "
                     "allocator fragmentation and buffers the estimate does not count may run "
                     "it out of memory")
    elif est.fits and not est.within_reserve:
        lines.append(f"  note: leaves less than the job's {100 * est.memory_reserve:.0f}% "
                     "memory reserve free (--memory-reserve), so a search would not pick it")
    if est.cpu_memory_bytes:
        lines.append(f"  offloaded to host memory: {est.cpu_memory_bytes / GIB:.2f} GiB per GPU")
    if len(est.stages) > 1:
        lines += ["", "  stage  layers  in-flight  total"]
        for i in sorted({0, est.peak_stage, len(est.stages) - 1}):
            s = est.stages[i]
            lines.append(f"  {i:>5d}  {s.num_layers:>6d}  {s.in_flight_micro_batches:>9.2f}  "
                         f"{s.memory.total_bytes / GIB:8.2f} GiB")
    return lines


def _time_lines(cluster: Cluster, job: Job, est: Estimate) -> list[str]:
    """The step time of the bottleneck stage by term, throughput and, where the GPU profile
    has a price, the cost (none for an ``Estimate`` of memory only)."""
    step, mfu, hfu = est.step_time_s, est.mfu, est.hfu
    if step is None or mfu is None or hfu is None:
        return []
    lines = ["", f"step time (bottleneck: stage {est.bottleneck_stage})"]
    bd = est.time_breakdown_s
    for t in TIME_TERMS:
        v = bd[t]
        total = bd.get(f"{t}_total", v)
        if v > 0 or total > 0 or t in ("compute", "bubble"):
            hidden = f"   ({_fmt_s(total - v).strip()} hidden behind compute)" \
                if total > v else ""
            lines.append(f"  {t:<12s}{_fmt_s(v)}{hidden}")
    band = f"   ± {100 * est.step_time_band:.0f} %: {est.step_time_band_basis}" \
        if est.step_time_band else ""
    lines.append(f"  {'step':<12s}{_fmt_s(step)}{band}")
    lines.append(f"  {est.tokens_per_s:,.0f} {job.unit}/s, {est.model_tflops_per_gpu:.1f} model "
                 f"TFLOP/s per GPU, MFU {100 * mfu:.1f}%, HFU {100 * hfu:.1f}%")
    price = cluster.gpu.usd_per_gpu_hour
    if est.usd_per_million_tokens is not None and price is not None:
        lines.append(f"  ${est.usd_per_million_tokens:.3f} per million {job.unit} at "
                     f"${price:.2f} per GPU-hour "
                     f"(${price * cluster.num_gpus:,.0f}/h for the "
                     "cluster; the profile's on-demand price)")
    return lines

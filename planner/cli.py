"""Command line: ``planner plan``, ``estimate``, ``explain``, ``compare``, ``emit``, ``run``,
``validate``, ``profile``, ``calibrate``, ``models``, ``gpus``, ``clusters``.

Bad input prints one line naming what is wrong and exits with status 2, never a traceback; a
valid question that no configuration answers (nothing fits) exits with status 3 and says what
would fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import hardware_profiles
from costmodel import Cluster, Infeasible, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.config import FRAMEWORK_NAMES, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES
from costmodel.estimate import NEAR_CAPACITY, Estimate
from costmodel.hardware import GPU
from costmodel.inference import (
    KV_PRECISIONS,
    OBJECTIVES,
    WEIGHT_PRECISIONS,
    InferenceConfig,
    InferenceJob,
    estimate_inference,
)
from costmodel.memory import TERMS
from costmodel.steptime import TIME_TERMS
from hardware_profiles.files import write_text
from planner.compare import RANKINGS, Candidate, Comparison, compare
from planner.emit import TARGETS, emit
from planner.explain import explain
from planner.models import load_model, load_model_or_module
from planner.plan import Plan, load_plan, plan
from planner.progress import Progress
from planner.space import PRESETS, Constraints

GIB = 1024**3
#: Types of the keys of a cluster TOML file.
CLUSTER_KEYS: dict[str, type | tuple[type, ...]] = {
    "gpu": str, "num_nodes": int, "gpus_per_node": int, "intra_node_link": str,
    "inter_node_link": str, "nics_per_node": int, "host_memory_gib": (int, float), "name": str}
CLUSTER_KINDS = {str: "a name in quotes", int: "a whole number", (int, float): "a number"}
#: Exit statuses: bad input, and a valid question with no configuration that fits.
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3

EPILOG_ESTIMATE = """example:
  planner estimate --model gpt3-175b --cluster selene --num-nodes 8 \\
      --global-batch-size 64 --seq-len 2048 --framework megatron \\
      --tp 8 --pp 8 --micro-batch-size 1 --sequence-parallel --recompute selective \\
      --virtual-stages 3
  planner estimate --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192 --tp 8 --pp 4 --zero 1 --json
  planner estimate --inference --model llama-2-70b --gpus 4 --gpu a100-80gb \\
      --prompt-len 128 --output-len 2048 --tp 4 --batch-size 16 --dtype fp16
"""


EPILOG_PLAN = """examples:
  planner plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192
  planner plan --model gpt3-175b --cluster selene --num-nodes 128 \\
      --global-batch-size 1536 --seq-len 2048 --framework megatron --max pp=16 --json
  planner plan --model llama-3-8b --gpus 8 --global-batch-size 64 --seq-len 8192 \\
      --preset fsdp -o plan.json
  planner plan --inference --model llama-2-70b --gpus 8 --gpu h100-sxm \\
      --prompt-len 2048 --output-len 256                # serving: lowest latency
  planner plan --inference --model llama-3-70b --gpus 16 --gpu a100-80gb \\
      --prompt-len 1024 --output-len 512 --objective throughput --max-tpot-ms 50 \\
      --weight-precision bf16,int8,int4 -o serve.json
  planner emit serve.json --target vllm -o serve.sh
  planner plan --model mymodels:Net --gpus 16 --global-batch-size 256 --seq-len 2048
      # a torch nn.Module (class, factory or instance in mymodels.py): traced on the
      # meta device and sharded op by op (token ids in when its first layer is an
      # nn.Embedding; otherwise give --input-shape, e.g. 8x3x224x224)
"""

EPILOG_EXPLAIN = """examples:
  planner explain --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192
  planner explain plan.json --json
"""

EPILOG_COMPARE = """examples:
  planner compare --model llama-3-70b --gpus 64 --gpu h100-sxm --global-batch-size 512 \\
      --seq-len 8192 --config "tp=8 pp=4 zero=1 sp" --config "tp=2 cp=4 zero=3 sp"
  planner compare --model llama-3-70b --gpus 64 --gpus 128 --gpu h100-sxm --gpu h200 \\
      --global-batch-size 512 --seq-len 8192          # plan each of 4 clusters
  planner compare --plan a.json --plan b.json
  planner compare --model llama-3-8b --gpus 64 --gpu h100-sxm --gpu h200 --gpu a100-80gb \\
      --global-batch-size 512 --seq-len 8192 --rank-by cost   # cheapest per token first
"""

EPILOG_RUN = """examples:
  planner plan --model gpt3-125m --gpus 2 --gpu h100-sxm --global-batch-size 4 \\
      --seq-len 128 --preset fsdp -o plan.json
  planner run plan.json                         # the minimal training loop, 2 processes
  planner run plan.json -- --steps 20
  planner run plan.json --script train.py -- --lr 3e-4
  planner run plan.json --dry-run               # print the torchrun command
  planner run big_plan.json -o train.sbatch     # a multi-node plan: write the sbatch script
"""

EPILOG_EMIT = """examples:
  planner plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192 -o plan.json
  planner emit plan.json --target torchtitan -o torchtitan.toml
  planner emit plan.json --target deepspeed -o ds_config.json
  planner emit plan.json --target megatron -o megatron_args.sh
  planner emit plan.json --target slurm -o train.sbatch && sbatch train.sbatch
  planner emit serve.json --target vllm -o serve.sh       # a serving plan (--inference)
  planner emit serve.json --target tensorrt-llm -o build_and_serve.sh
"""


def _cluster(args: argparse.Namespace) -> Cluster:
    """``--cluster`` (preset or TOML file) or the short form ``--gpus --gpu --gpus-per-node``,
    with the GPU of ``--profile`` where given."""
    return _make_cluster(args.cluster, args.num_nodes, args.gpus, args.gpu, args.gpus_per_node,
                         args.intra_node, args.inter_node, _profile(args))


def _profile(args: argparse.Namespace) -> GPU | None:
    """The GPU of ``--profile FILE`` (a measured or hand-written GPU profile), if given."""
    path = getattr(args, "profile", None)
    return GPU.from_file(path) if path else None


def _clusters(args: argparse.Namespace) -> list[Cluster]:
    """``planner compare``: every cluster its repeatable flags name (``--cluster`` each with
    each ``--num-nodes``; each ``--gpus`` with each ``--gpu`` and ``--inter-node``)."""
    out = []
    kinds, nics = args.gpu or [None], args.inter_node or [None]
    measured = _profile(args)
    for c, n, kind, nic in itertools.product(args.cluster or [], args.num_nodes or [None],
                                             kinds, nics):
        out.append(_make_cluster(c, n, None, kind, args.gpus_per_node, args.intra_node, nic,
                                 measured))
    if args.gpus and args.num_nodes and not args.cluster:
        raise SpecError("--num-nodes goes with --cluster; with --gpus give the total GPUs")
    for g, kind, nic in itertools.product(args.gpus or [], kinds, nics):
        out.append(_make_cluster(None, None, g, kind, args.gpus_per_node, args.intra_node,
                                 nic, measured))
    if not out:
        raise SpecError("say which GPUs: --cluster NAME, or --gpus N --gpu NAME (each may be "
                        "repeated to compare clusters)")
    return out


def _check_profile(measured: GPU | None, gpu: str | None, where: str) -> None:
    """A ``--profile`` must describe the GPU the cluster flags name, if they name one."""
    if measured is not None and gpu is not None and str(gpu).strip().lower() != measured.name:
        raise SpecError(f"--profile measured {measured.name!r} but {where} names {gpu!r}; "
                        f"drop --gpu, use --gpus N --profile FILE, or profile that GPU")


def _make_cluster(cluster: str | None, num_nodes: int | None, gpus: int | None,
                  gpu: str | None, gpus_per_node: int | None, intra: str | None,
                  inter: str | None, measured: GPU | None = None) -> Cluster:
    if cluster and gpus:
        raise SpecError("give either --cluster or --gpus/--gpu, not both")
    _check_profile(measured, gpu, "--gpu")
    if cluster:
        if cluster.endswith(".toml"):
            data = hardware_profiles.load_file(cluster)
            allowed = {f.name for f in dataclasses.fields(Cluster)}
            unknown = set(data) - allowed - {"description", "source"}
            if unknown:
                raise SpecError(
                    f"cluster file {cluster!r} has unknown keys {sorted(unknown)}; "
                    f"allowed: {sorted(allowed)}"
                )
            fields = {k: v for k, v in data.items() if k in allowed}
            if num_nodes:
                fields["num_nodes"] = num_nodes
            if "gpu" not in fields:
                raise SpecError(f"cluster file {cluster!r} names no gpu; add e.g. "
                                'gpu = "h100-sxm" (see \'planner gpus\')')
            for key, kind in CLUSTER_KEYS.items():
                if key in fields and (not isinstance(fields[key], kind)
                                      or isinstance(fields[key], bool)):
                    raise SpecError(f"cluster file {cluster!r}: {key} = {fields[key]!r} should "
                                    f"be {CLUSTER_KINDS[kind]}")
            if measured is not None:
                _check_profile(measured, fields["gpu"], f"cluster file {cluster!r}")
                fields["gpu"] = measured
            return Cluster(**fields)
        if measured is not None:
            _check_profile(measured, hardware_profiles.load("clusters", cluster)["gpu"],
                           f"cluster {cluster!r}")
        out = Cluster.preset(cluster, num_nodes=num_nodes, gpu=measured or gpu,
                             gpus_per_node=gpus_per_node)
        links = {k: v for k, v in (("intra_node_link", intra), ("inter_node_link", inter)) if v}
        return dataclasses.replace(out, **links) if links else out
    if num_nodes:
        raise SpecError("--num-nodes goes with --cluster; with --gpus give the total GPUs")
    if not gpus:
        raise SpecError("say which GPUs: --cluster NAME, or --gpus N --gpu NAME")
    if gpus < 1:
        raise SpecError(f"--gpus {gpus}: give a positive number of GPUs")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise SpecError(f"--gpus-per-node {gpus_per_node}: give a positive number")
    per_node = gpus_per_node or min(gpus, 8)
    if gpus % per_node:
        raise SpecError(f"--gpus {gpus} is not a multiple of --gpus-per-node {per_node}")
    return Cluster(gpu=measured or gpu or "h100-sxm", num_nodes=gpus // per_node,
                   gpus_per_node=per_node, intra_node_link=intra, inter_node_link=inter)


def _inference_job(args: argparse.Namespace) -> InferenceJob:
    """The serving job of ``--inference`` and its flags."""
    for flag in ("prompt_len", "output_len"):
        if getattr(args, flag, None) is None:
            raise SpecError(f"--inference needs --{flag.replace('_', '-')} (e.g. --prompt-len "
                            "2048 --output-len 256)")
    precisions = tuple(p.strip() for p in (args.weight_precision or "bf16").split(","))

    def seconds(ms: float | None, flag: str) -> float | None:
        if ms is not None and not ms > 0:
            raise SpecError(f"--{flag} must be a positive number of milliseconds, got {ms}")
        return None if ms is None else ms / 1e3

    return InferenceJob(prompt_len=args.prompt_len, output_len=args.output_len,
                        batch_size=args.batch_size, weight_precision=precisions,
                        kv_cache_precision=args.kv_cache_precision, objective=args.objective,
                        max_ttft_s=seconds(args.max_ttft_ms, "max-ttft-ms"),
                        max_tpot_s=seconds(args.max_tpot_ms, "max-tpot-ms"),
                        prefill_chunk_tokens=args.prefill_chunk, dtype=args.dtype)


def _problem(args: argparse.Namespace, many: bool = False, modules: bool = False
             ) -> tuple[Any, list[Cluster], Job | InferenceJob]:
    """The model, clusters (one unless ``many``) and job the flags name; with ``modules``
    the model may be a torch ``nn.Module`` (planned from its traced graph)."""
    if not args.model:
        raise SpecError("--model is required (a preset such as llama-3-70b, a config.json "
                        "path, or module:attr)")
    model = load_model_or_module(args.model) if modules else load_model(args.model)
    if getattr(args, "inference", False):
        if not isinstance(model, ModelSpec):
            raise SpecError(f"--inference plans serving of a preset, config.json or "
                            f"ModelSpec; {args.model!r} is a torch module")
        return model, _clusters(args) if many else [_cluster(args)], _inference_job(args)
    if not isinstance(model, ModelSpec) and args.seq_len is None:
        if not args.input_shape:
            raise SpecError(f"--model {args.model} is a torch module: give --seq-len for one "
                            "fed token ids, or --input-shape for other inputs, e.g. "
                            "--input-shape 8x3x224x224 (micro-batch first)")
        args.seq_len = 1  # a module fed --input-shape: throughput counts samples
    for flag in ("global_batch_size", "seq_len"):
        if getattr(args, flag) is None:
            raise SpecError(f"--{flag.replace('_', '-')} is required (e.g. "
                            "--global-batch-size 512 --seq-len 8192)")
    job = Job(global_batch_size=args.global_batch_size, seq_len=args.seq_len,
              precision=args.precision, optimizer=args.optimizer, framework=args.framework,
              flash_attention=not args.no_flash_attention,
              overlap_grad_reduce=not args.no_overlap_grad_reduce,
              tp_comm_overlap=args.tp_comm_overlap, compile=args.compile,
              fp8_param_gather=args.fp8_param_gather,
              fused_cross_entropy=True if args.fused_cross_entropy else None,
              overlap_p2p_comm=not args.no_overlap_p2p_communication,
              moe_capacity_factor=args.moe_capacity_factor,
              memory_reserve=args.memory_reserve / 100)
    return model, _clusters(args) if many else [_cluster(args)], job


def _constraints(args: argparse.Namespace) -> Constraints:
    """Constraints from ``planner plan``'s flags: fixed fields, caps, preset, trainers."""
    fixed: dict[str, object] = {}
    for flag, key in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"),
                      ("zero", "zero_stage"), ("micro_batch_size", "micro_batch_size"),
                      ("schedule", "pipeline_schedule"),
                      ("virtual_stages", "virtual_pipeline_stages"),
                      ("recompute", "recompute"), ("offload", "offload")):
        if getattr(args, flag, None) is not None:
            fixed[key] = getattr(args, flag)
    if getattr(args, "sequence_parallel", None) is not None:
        fixed["sequence_parallel"] = args.sequence_parallel == "on"
    caps: dict[str, int] = {}
    for item in args.max:
        key, _, value = item.partition("=")
        key = {"zero": "zero_stage", "mbs": "micro_batch_size",
               "v": "virtual_pipeline_stages"}.get(key.strip(), key.strip())
        try:
            caps[key] = int(value)
        except ValueError:
            raise SpecError(f"--max {item!r}: write FIELD=N with an integer N, e.g. tp=4") \
                from None
    frameworks = tuple(f.strip() for f in args.frameworks.split(",")) if args.frameworks \
        else None
    own = Constraints(fixed=fixed, max=caps, frameworks=frameworks)
    return Constraints.preset(args.preset).merge(own) if args.preset else own


def _search(args: argparse.Namespace, modules: bool = False
            ) -> tuple[Any, Cluster, Job | InferenceJob, Any]:
    """The plan the flags ask for, with a progress bar on a terminal after one second;
    with ``modules``, a torch module is traced and planned (a ``GraphPlan``)."""
    model, (cluster,), job = _problem(args, modules=modules)
    if not isinstance(model, ModelSpec):
        assert isinstance(job, Job)
        return model, cluster, job, _plan_module(args, model, cluster, job)
    if isinstance(job, InferenceJob):
        if args.preset or args.frameworks:
            raise SpecError("--preset and --frameworks describe trainers; a serving search "
                            "(--inference) takes --tp, --pp, --replicas and --max")
        cons = _constraints(args)
        if args.replicas is not None:
            cons = cons.merge(Constraints(fixed={"replicas": args.replicas}))
        return model, cluster, job, plan(model, cluster, job, constraints=cons,
                                         top_k=args.top_k)
    with Progress("searching") as bar:
        result = plan(model, cluster, job, constraints=_constraints(args), top_k=args.top_k,
                      progress=bar)
    return model, cluster, job, result


#: ``planner plan`` flags that fix or cap a field of the analytic search; the graph planner
#: of a torch module chooses its own sharding, so they do not apply to one.
SEARCH_ONLY_FLAGS = ("dp", "tp", "pp", "cp", "ep", "zero", "schedule", "virtual_stages",
                     "recompute", "offload", "sequence_parallel", "preset", "frameworks")


def _plan_module(args: argparse.Namespace, module: Any, cluster: Cluster, job: Job) -> Any:
    """``planner plan`` of a torch module: its inputs from the flags, then ``plan``."""
    fixed = [f"--{f.replace('_', '-')}" for f in SEARCH_ONLY_FLAGS
             if getattr(args, f, None) is not None] + (["--max"] if args.max else [])
    if fixed:
        raise SpecError(f"{', '.join(fixed)}: only for presets, config.json and ModelSpec "
                        "models; a torch module is sharded op by op by the graph planner (it "
                        "takes --micro-batch-size and --input-shape)")
    inputs = _module_inputs(args, module, job)
    with Progress("tracing and sharding") as bar:
        return plan(module, cluster, job, example_inputs=inputs, progress=bar)


def _input_shapes(text: str) -> list[tuple[int, ...]]:
    """``--input-shape``: tensors separated by commas, dimensions by ``x``."""
    shapes = []
    for part in text.split(","):
        try:
            dims = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            raise SpecError(f"--input-shape {text!r}: write each input's dimensions joined by "
                            "x, inputs separated by commas, e.g. 8x3x224x224 or "
                            "4x2048,4x2048") from None
        if not dims or any(d < 1 for d in dims) or len(dims) > 8:
            raise SpecError(f"--input-shape {part.strip()!r}: give 1 to 8 positive "
                            "dimensions, the micro-batch first")
        if math.prod(dims) > 2**36:
            raise SpecError(f"--input-shape {part.strip()!r}: {math.prod(dims):,} elements "
                            "in one micro-batch is absurd; check the dimensions")
        shapes.append(dims)
    return shapes


def _module_inputs(args: argparse.Namespace, module: Any, job: Job) -> Any:
    """One micro-batch for ``module`` (or a function of the micro-batch size returning
    one): ``--input-shape`` tensors, else token ids when its first layer is an embedding."""
    try:
        import torch
    except ImportError:
        raise SpecError("planning a torch module needs torch: pip install torch") from None
    first = next((m for m in module.modules() if not list(m.children())
                  and any(True for _ in m.parameters(recurse=False))), None)
    tokens = isinstance(first, torch.nn.Embedding)
    dtype = {"int64": torch.int64, "float": torch.float32}.get(
        args.input_dtype, torch.int64 if tokens else torch.float32)
    mbs = args.micro_batch_size
    if args.input_shape:
        shapes = _input_shapes(args.input_shape)
        if mbs is not None and shapes[0][0] != mbs:
            raise SpecError(f"--micro-batch-size {mbs} differs from the first dimension of "
                            f"--input-shape {args.input_shape}; give one of them")
        return tuple(torch.empty(s, dtype=dtype, device="meta") for s in shapes)
    if not tokens:
        raise SpecError(f"--model {args.model}: its first layer is a "
                        f"{type(first).__name__ if first is not None else 'module without weights'}"
                        ", not an nn.Embedding, so its input cannot be guessed; give "
                        "--input-shape, e.g. --input-shape 8x3x224x224 (micro-batch first)")

    def ids(b: int) -> Any:
        return torch.zeros((b, job.seq_len), dtype=dtype, device="meta")

    return ids(mbs) if mbs is not None else ids


def _graph_report(model: Any, cluster: Cluster, job: Job, found: Any, rows: int) -> str:
    """``planner plan``'s text for a torch module's ``GraphPlan``."""
    graph = found.graph
    unit = "tokens" if job.seq_len > 1 else "samples"
    return "\n".join([
        f"model    {graph.name}: {graph.num_params() / 1e9:.2f}B parameters, traced into "
        f"{graph.graph.number_of_nodes()} ops in {len(graph.layers)} layers "
        f"({type(model).__name__}); {cluster.num_nodes} x {cluster.gpus_per_node} "
        f"{cluster.gpu.name}; global batch {job.global_batch_size}, {job.precision}",
        found.summary(rows=rows),
        f"throughput  {found.tokens_per_s:,.0f} {unit}/s "
        f"({found.tokens_per_s / cluster.num_gpus:,.0f} per GPU)"
        + (f", ${found.usd_per_million_tokens:.3f} per million {unit}"
           if found.usd_per_million_tokens is not None else "")])


def cmd_plan(args: argparse.Namespace) -> int:
    """``planner plan``: the fastest configuration that fits."""
    model, cluster, job, result = _search(args, modules=True)
    if args.output:
        result.to_json(args.output)
    if args.json:
        print(result.to_json())
        return 0
    if not isinstance(model, ModelSpec):
        print(_graph_report(model, cluster, job, result, max(0, args.why)))
        if args.output:
            print(f"\nplan written to {args.output}")
        return 0
    if isinstance(job, InferenceJob):
        print(result.summary(rows=max(0, args.why)))
        if args.output:
            print(f"\nplan written to {args.output}; serve it with 'planner emit "
                  f"{args.output} --target vllm'")
        return 0
    print(f"model    {model.name}: {model.num_params() / 1e9:.2f}B parameters; "
          f"{cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}; "
          f"{job.global_batch_size} x {job.seq_len} tokens, {job.precision}")
    print(result.summary(rows=max(0, args.why)))
    print()
    print(_estimate_report(model, cluster, result.job, result.estimate))
    if args.output:
        print(f"\nplan written to {args.output}")
    return 0


FORCE_HELP = ("use a saved plan that does not fit its GPUs' memory anyway (a plan whose "
              "configuration no longer runs is refused whatever)")


def _load(path: str, args: argparse.Namespace) -> Plan:
    """A saved plan, re-validated and re-estimated (``planner.plan.load_plan``): refused
    (exit 3) when it no longer runs or fits, unless ``--force``; warnings on stderr."""
    p, warnings = load_plan(path, force=getattr(args, "force", False))
    for w in warnings:
        print(f"planner: warning: {w}", file=sys.stderr)
    return p


def cmd_explain(args: argparse.Namespace) -> int:
    """``planner explain``: why this plan, and what every other choice would cost."""
    result = _load(args.plan, args) if args.plan else _search(args)[3]
    with Progress("explaining") as bar:
        why = explain(result, progress=bar)
    if args.json:
        print(json.dumps(why.to_dict(), indent=2))
    else:
        print(why.summary())
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``planner compare``: configurations and clusters side by side."""
    candidates: list[Candidate] = []
    model = None
    if args.model or not args.plan:
        model, clusters, job = _problem(args, many=True)
        configs: list[str | None] = list(args.config) or [None]
        with Progress("comparing") as bar:
            cmp = compare(model, clusters, job, configs, constraints=_constraints(args),
                          progress=bar)
        candidates += cmp.candidates
    for path in args.plan:
        p = _load(path, args)
        if p.is_inference:
            raise SpecError(f"{path} is a serving plan; planner compare puts training plans "
                            "side by side (see the serving plan's own summary: "
                            "'planner explain PLAN')")
        model = model or p.model
        candidates.append(Candidate(label=Path(path).name, cluster=p.cluster,
                                    job=p.job,  # type: ignore[arg-type]
                                    config=p.config,  # type: ignore[arg-type]
                                    estimate=p.estimate,  # type: ignore[arg-type]
                                    searched=True))
    assert model is not None
    result = Comparison(model=model, candidates=tuple(candidates))
    if args.rank_by:
        result = result.ranked(args.rank_by)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"model    {model.name}: {model.num_params() / 1e9:.2f}B parameters\n")
        print(result.table())
    if all(c.estimate is None for c in candidates):
        infeasible = all((c.error or "").startswith("infeasible") for c in candidates)
        print(f"planner: {'infeasible' if infeasible else 'error'}: no candidate can run",
              file=sys.stderr)
        return EXIT_INFEASIBLE if infeasible else EXIT_USAGE
    return 0


def cmd_emit(args: argparse.Namespace) -> int:
    """``planner emit``: a saved plan as a trainer's config file."""
    out = emit(_load(args.plan, args), args.target, command=args.command_line,
               strict=args.strict)
    for w in out.warnings:
        print(f"planner: warning: {w}", file=sys.stderr)
    est = out.estimate
    if isinstance(est, Estimate) and not est.fits:
        msg = (f"the {args.target} file does not fit: {est.peak_memory_bytes / GIB:.1f} GiB "
               f"per GPU under {args.target}'s conventions, of "
               f"{est.memory_capacity_bytes / GIB:.1f} GiB")
        if not args.force:
            raise Infeasible(f"{msg}; re-plan for it ('planner plan --framework "
                             f"{out.job.framework}'), or pass --force to write it anyway")
        print(f"planner: warning: {msg}; written anyway (--force)", file=sys.stderr)
    if args.output:
        write_text(args.output, out.text, f"{args.target} file")
        print(f"{args.target} file written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(out.text)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """``planner plot``: a saved plan's memory per stage, step time and pipeline timeline."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise SpecError("planner plot needs matplotlib: pip install "
                        "'autoparallel-planner[plots]'")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from planner.plots import plot_plan

    plan = _load(args.plan, args)
    out = args.output or str(Path(args.plan).with_suffix(".png"))
    if Path(out).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"-o {out!r}: write a .png, .svg or .pdf file")
    plot_plan(plan, out, max_micro_batches=args.micro_batches)
    print(f"plot written to {out}", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``planner run``: start a saved plan's processes (or write its multi-node script)."""
    import importlib.util

    from planner.runtime.launch import launch

    if importlib.util.find_spec("torch") is None:
        raise SpecError("planner run needs torch: pip install 'autoparallel-planner[torch]'")
    return launch(args.plan, args.script, args.script_args, dry_run=args.dry_run,
                  output=args.output, command=args.command_line, force=args.force)


def _config(args: argparse.Namespace, cluster: Cluster) -> ParallelConfig:
    rest = args.tp * args.pp * args.cp
    dp = args.dp
    if dp is None:
        if cluster.num_gpus % rest:
            raise SpecError(
                f"tp*pp*cp = {rest} does not divide the {cluster.num_gpus} GPUs; pass --dp or "
                "change the degrees"
            )
        dp = cluster.num_gpus // rest
    return ParallelConfig(
        dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, zero_stage=args.zero,
        sharding_group=args.sharding_group, sequence_parallel=args.sequence_parallel == "on",
        micro_batch_size=args.micro_batch_size, pipeline_schedule=args.schedule,
        virtual_pipeline_stages=args.virtual_stages, recompute=args.recompute,
        recompute_num_layers=args.recompute_num_layers, offload=args.offload,
    )


def _fmt_s(x: float) -> str:
    """Seconds in the unit people read: ms below one second."""
    return f"{1e3 * x:10.1f} ms" if x < 1 else f"{x:10.3f} s "


def _fmt_gib(x: float) -> str:
    return f"{x / GIB:8.2f} GiB"


def _estimate_report(model: ModelSpec, cluster: Cluster, job: Job, est: Any) -> str:
    cfg = est.config
    lines = [
        f"model    {model.name}: {model.num_params() / 1e9:.2f}B parameters",
        f"cluster  {cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name} "
        f"({cluster.gpu.memory_bytes / GIB:.1f} GiB), {cluster.intra_node_link.name} inside "
        f"nodes, {cluster.nics_per_node} x {cluster.inter_node_link.name} per node",
        f"job      {job.global_batch_size} x {job.seq_len} tokens, {job.precision}, "
        f"{job.optimizer}, {job.framework} conventions"
        + (", TP collectives pipelined with matmuls (--tp-comm-overlap)"
           if job.tp_comm_overlap and job.framework != "deepspeed" else "")
        + (", torch.compile" if job.compile and job.framework == "torchtitan" else "")
        + (", fp8 parameters" if job.fp8_param_gather and job.framework == "megatron"
           and job.precision == "fp8" else ""),
        f"config   dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp} ep={cfg.ep} "
        f"zero={cfg.zero_stage} sp={'on' if cfg.sequence_parallel else 'off'} "
        f"mbs={cfg.micro_batch_size} ({est.num_micro_batches} micro-batches) "
        f"schedule={cfg.pipeline_schedule}"
        + (f" v={cfg.virtual_pipeline_stages}" if cfg.virtual_pipeline_stages > 1 else "")
        + f" recompute={cfg.recompute}"
        + (f"({cfg.recompute_num_layers} layers)" if cfg.recompute_num_layers else "")
        + (f" offload={cfg.offload}" if cfg.offload != "none" else ""),
        "",
        f"memory per GPU (fullest: stage {est.peak_stage})",
    ]
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
        shown = sorted({0, est.peak_stage, len(est.stages) - 1})
        for i in shown:
            s = est.stages[i]
            lines.append(f"  {i:>5d}  {s.num_layers:>6d}  {s.in_flight_micro_batches:>9.2f}  "
                         f"{s.memory.total_bytes / GIB:8.2f} GiB")
    lines += ["", f"step time (bottleneck: stage {est.bottleneck_stage})"]
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
    lines.append(f"  {'step':<12s}{_fmt_s(est.step_time_s)}{band}")
    lines.append(f"  {est.tokens_per_s:,.0f} tokens/s, {est.model_tflops_per_gpu:.1f} model "
                 f"TFLOP/s per GPU, MFU {100 * est.mfu:.1f}%, HFU {100 * est.hfu:.1f}%")
    if est.usd_per_million_tokens is not None:
        lines.append(f"  ${est.usd_per_million_tokens:.3f} per million tokens at "
                     f"${cluster.gpu.usd_per_gpu_hour:.2f} per GPU-hour "
                     f"(${cluster.gpu.usd_per_gpu_hour * cluster.num_gpus:,.0f}/h for the "
                     "cluster; the profile's on-demand price)")
    return "\n".join(lines)


def cmd_estimate(args: argparse.Namespace) -> int:
    """``planner estimate``: memory of one configuration."""
    model, (cluster,), job = _problem(args)
    if isinstance(job, InferenceJob):
        return _estimate_inference(args, model, cluster, job)
    cfg = _config(args, cluster)
    est = estimate(model, cluster, job, cfg)
    if args.json:
        out = {
            "config": cfg.to_dict(),
            "estimate": est.to_dict(),
            "model": {"name": model.name, "num_params": model.num_params()},
            "cluster": {"gpu": cluster.gpu.name, "num_nodes": cluster.num_nodes,
                        "gpus_per_node": cluster.gpus_per_node},
            "job": dataclasses.asdict(job),
        }
        print(json.dumps(out, indent=2))
    else:
        print(_estimate_report(model, cluster, job, est))
    return 0


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
        print(json.dumps({"config": cfg.to_dict(), "estimate": est.to_dict(),
                          "model": {"name": model.name, "num_params": model.num_params()},
                          "cluster": {"gpu": cluster.gpu.name, "num_nodes": cluster.num_nodes,
                                      "gpus_per_node": cluster.gpus_per_node},
                          "job": job.to_dict()}, indent=2))
    else:
        print(f"model    {model.name}: {model.num_params() / 1e9:.2f}B parameters; "
              f"{cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}; serving "
              f"{job.prompt_len:,}-token prompts, {job.output_len:,} output tokens")
        print(est.summary())
    return 0


def _comparison_rows(comps: list[Any]) -> list[dict[str, Any]]:
    from costmodel.calibration import run_group

    return [{"id": c.run.id, "group": run_group(c.run), "measure": c.run.measure,
             "predicted": c.predicted, "measured": c.measured, "error": c.error,
             "step_time_s": c.estimate.step_time_s, "fits": c.estimate.fits}
            for c in comps]


def _summaries(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key in [*dict.fromkeys(r["group"] for r in rows), "all"]:
        errs = [abs(r["error"]) for r in rows if key in ("all", r["group"])]
        out[key] = {"runs": len(errs), "mean_abs_error": sum(errs) / len(errs),
                    "max_abs_error": max(errs)}
    return out


def _print_comparisons(rows: list[dict[str, Any]]) -> None:
    from planner.accuracy import UNITS as units

    print(f"{'run':<44s} {'measure':<12s} {'predicted':>10s} {'measured':>10s} {'error':>7s}")
    for r in rows:
        print(f"{r['id']:<44s} {units[r['measure']]:<12s} {r['predicted']:>10.2f} "
              f"{r['measured']:>10.2f} {100 * r['error']:>+6.1f}%")
    print()
    for key, sm in _summaries(rows).items():
        print(f"{key:<30s} {sm['runs']:>3.0f} runs   mean |error| "
              f"{100 * sm['mean_abs_error']:5.2f}%   max {100 * sm['max_abs_error']:5.2f}%")


def cmd_validate(args: argparse.Namespace) -> int:
    """``planner validate``: published runs predicted under the fit, and with their source
    left out of it (costmodel.calibration)."""
    from costmodel.calibration import load_fit, validation_report
    from costmodel.published import default_runs_path, load_runs
    from planner.accuracy import describe, print_results, result_rows, summary

    chosen = [k for k in ("runs", "heldout", "calibration") if getattr(args, k)]
    if len(chosen) > 1:
        raise SpecError("give one of --runs FILE, --heldout and --calibration")
    if args.profile:
        path = args.runs or default_runs_path("published" if args.heldout else "calibration")
        return _validate_profile(args, path)
    fit = load_fit()
    if args.runs:
        # Runs outside the fit's training rows: their error under the fit is held out already.
        results = validation_report(load_runs(args.runs), fit, loso=False)
        shown = str(args.runs)
    else:
        calibration = load_runs(default_runs_path("calibration"))
        published = load_runs(default_runs_path("published"))
        results = validation_report(calibration + published, fit, loso=not args.no_loso)
        if args.heldout or args.calibration:
            keep = {r.id for r in (published if args.heldout else calibration)}
            results = [r for r in results if r.run.id in keep]
        shown = "shipped"
    if args.json:
        print(json.dumps({"runs_file": shown, "fit": describe(fit),
                          "runs": result_rows(results), "summary": summary(results)}, indent=2))
    else:
        print_results(results, fit, runs_table=not args.summary)
    return 0


def _validate_profile(args: argparse.Namespace, path: str | Path) -> int:
    """``planner validate --profile FILE``: the runs on the profile's GPU predicted with the
    shipped profile and with the measured one, side by side."""
    from costmodel.published import compare, load_runs

    measured = GPU.from_file(args.profile)
    runs = load_runs(path)
    mine = [r for r in runs if r.cluster.gpu.name == measured.name]
    if not mine:
        have = sorted({r.cluster.gpu.name for r in runs})
        raise SpecError(f"no run in {str(path)!r} was measured on {measured.name!r}, the GPU "
                        f"of {args.profile!r} (its runs are on {', '.join(have)}); pass --runs "
                        "with runs on that GPU (the planner's runs JSON schema)")
    shipped = _comparison_rows(compare(mine))
    profiled = _comparison_rows(compare(mine, gpu=measured))
    summary = {"shipped": _summaries(shipped)["all"], "profile": _summaries(profiled)["all"]}
    if args.json:
        runs_out = [{"id": a["id"], "measure": a["measure"], "measured": a["measured"],
                     "shipped": {k: a[k] for k in ("predicted", "error", "step_time_s")},
                     "profile": {k: b[k] for k in ("predicted", "error", "step_time_s")}}
                    for a, b in zip(shipped, profiled, strict=True)]
        print(json.dumps({"runs_file": str(path), "profile": args.profile,
                          "gpu": measured.name, "runs": runs_out, "summary": summary},
                         indent=2))
        return 0
    print(f"{len(mine)} of {len(runs)} runs are on {measured.name}; predicted with the shipped "
          f"profile and with {args.profile}")
    print(f"{'run':<44s} {'measured':>10s} {'shipped':>10s} {'error':>7s} {'profile':>10s} "
          f"{'error':>7s}")
    for a, b in zip(shipped, profiled, strict=True):
        print(f"{a['id']:<44s} {a['measured']:>10.2f} {a['predicted']:>10.2f} "
              f"{100 * a['error']:>+6.1f}% {b['predicted']:>10.2f} {100 * b['error']:>+6.1f}%")
    print()
    for key, sm in summary.items():
        print(f"{key:<10s} mean |error| {100 * sm['mean_abs_error']:5.2f}%   max "
              f"{100 * sm['max_abs_error']:5.2f}%")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """``planner profile``: measure this machine and write a GPU profile TOML."""
    import datetime
    import importlib.util

    from costmodel.measured import fit_profile, profile_toml
    from planner.profile import profile

    if importlib.util.find_spec("torch") is None:
        raise SpecError("planner profile measures with torch, which is not installed: "
                        "pip install 'autoparallel-planner[torch]'")
    sweep = "quick" if args.quick else "full" if args.full else "standard"
    with Progress("profiling") as bar:
        meas = profile(args.device, sweep=sweep, processes=args.procs, gpu=args.gpu,
                       full=args.full, progress=bar)
    table = fit_profile(meas)
    name = str(table["name"])
    out = Path(args.output or f"{name}-{datetime.date.today().isoformat()}.toml")
    write_text(out, profile_toml(meas, table), "profile")
    fit = table["measured"]["fit"]
    if args.json:
        summary = {k: v for k, v in table.items() if k != "measured"}
        print(json.dumps({"written": str(out), "duration_s": meas.duration_s, "profile": summary,
                          "fit": fit}, indent=2))
        return 0
    eff = table["efficiency"]
    best = meas.best_tflops()
    print(f"profiled {meas.device_name} in {meas.duration_s:.1f} s ({sweep} sweep"
          + (f", datasheet {meas.gpu}" if meas.gpu else ", no datasheet profile") + ")")
    print("  matmul    best " + ", ".join(f"{d} {v:.1f}" for d, v in best.items())
          + f" TFLOP/s; gemm {eff['gemm']:.3f} of peak, kernel overhead "
          f"{eff['kernel_overhead_us']:.2f} us (fit error {100 * fit['gemm_error']:.1f}%)")
    if "gemm_unaligned" in eff:
        print(f"  unaligned matmuls (a dimension off the 16-byte grid) {eff['gemm_unaligned']:.3f}"
              f" of peak (fit error {100 * fit.get('gemm_unaligned_error', 0.0):.1f}%)")
    if meas.attention:
        print(f"  attention forward {eff['attention']:.3f}, backward "
              f"{eff['attention_backward']:.3f} of peak")
    if meas.copy:
        print(f"  memory    best copy {max(p_.gb_per_s for p_ in meas.copy):.0f} GB/s; "
              f"{eff['memory']:.3f} of {table['memory_bandwidth_gb_per_s']} GB/s")
    for key, label in (("host_link", "host link"), ("intra_node_link", "link")):
        if isinstance(table.get(key), dict):
            link = table[key]
            achieved = link["bandwidth_gb_per_s"] * link["efficiency"]
            simple = (f" ({link['simple_latency_us']:.1f} us in NCCL's Simple protocol)"
                      if "simple_latency_us" in link else "")
            print(f"  {label:<9s} {achieved:.1f} GB/s per direction, {link['latency_us']:.1f} us "
                  f"per hop{simple} (fit error {100 * fit[key + '_error']:.1f}%)")
    print(f"written to {out}; plan with it: planner plan ... --profile {out}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``planner calibrate``: fit the efficiencies every GPU takes (or, with ``--gpu``, one
    GPU profile's own) to published runs, and write them."""
    import datetime

    if args.gpu:
        return _calibrate_gpu(args)
    from costmodel.calibration import (
        fit_transfer,
        leave_one_source_out,
        run_group,
        transfer_toml,
        validation_report,
    )
    from costmodel.published import load_runs, shipped_runs
    from planner.accuracy import describe, print_results, result_rows, summary

    runs = [r for f in args.runs for r in load_runs(f)] if args.runs else shipped_runs()
    if args.groups:
        wanted = {g.strip() for g in args.groups.split(",") if g.strip()}
        have = {run_group(r) for r in runs}
        if not wanted <= have:
            raise SpecError(f"--groups names sources the runs do not have: "
                            f"{', '.join(sorted(wanted - have))}; they have "
                            f"{', '.join(sorted(have))}")
        runs = [r for r in runs if run_group(r) in wanted]
    fit, log_errors = fit_transfer(runs)
    folds = leave_one_source_out(runs, fit, log_errors=log_errors) \
        if len({run_group(r) for r in runs}) > 1 else {}
    shown = ", ".join(args.runs) if args.runs else "the shipped published runs"
    prov = (f"planner calibrate on {shown}"
            + (f" (sources {args.groups})" if args.groups else "")
            + f", {len(runs)} runs, {datetime.date.today().isoformat()}")
    out = Path(args.output) if args.output else \
        hardware_profiles.user_calibrated_path("transfer")
    write_text(out, transfer_toml(fit, runs, log_errors, folds, prov), "calibration")
    results = validation_report(runs, fit, folds=folds)
    if args.json:
        print(json.dumps({"fitted": dataclasses.asdict(fit), "written": str(out),
                          "runs": result_rows(results), "summary": summary(results)},
                         indent=2))
    else:
        print(f"fitted: {describe(fit)}\nwritten to {out}\n")
        print_results(results, None, runs_table=False)
    return 0


def _calibrate_gpu(args: argparse.Namespace) -> int:
    """``planner calibrate --gpu NAME``: fit one GPU profile's own matmul fraction and
    per-kernel overhead to the runs measured on it, and write them."""
    import datetime

    from costmodel.published import (
        calibration_toml,
        default_runs_path,
        fit_efficiency,
        load_runs,
    )

    if args.groups:
        raise SpecError("--groups selects the sources of the all-GPU fit; with --gpu every "
                        "run on that GPU is fitted")
    if args.runs and len(args.runs) > 1:
        raise SpecError("--gpu fits one runs file; give --runs once")
    gpu = GPU.preset(args.gpu, calibrated=False)
    path = args.runs[0] if args.runs else default_runs_path()
    values, comps = fit_efficiency(load_runs(path), gpu)
    shown = args.runs[0] if args.runs else "costmodel/data/calibration.json"
    text = calibration_toml(gpu, values, comps, shown, datetime.date.today().isoformat())
    out = Path(args.output) if args.output else \
        hardware_profiles.user_calibrated_path(gpu.name)
    write_text(out, text, "calibration")
    rows = _comparison_rows(comps)
    if args.json:
        print(json.dumps({"gpu": gpu.name, "fitted": values, "written": str(out), "runs": rows,
                          "summary": _summaries(rows)}, indent=2))
    else:
        print(f"fitted {gpu.name}: " + ", ".join(f"{k} = {v:.4g}" for k, v in values.items()))
        print(f"written to {out}\n")
        _print_comparisons(rows)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """``planner models``: the model presets with their sizes."""
    rows = []
    for name in ModelSpec.preset_names():
        m = ModelSpec.preset(name)
        rows.append({"name": name, "num_params": m.num_params(),
                     "num_active_params": m.num_active_params(), "num_layers": m.num_layers,
                     "hidden_size": m.hidden_size, "source": m.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':<18s} {'params':>10s} {'active':>10s} {'layers':>6s} {'hidden':>6s}")
    for r in rows:
        total, active = r["num_params"] / 1e9, r["num_active_params"] / 1e9
        print(f"{r['name']:<18s} {total:>9.2f}B {active:>9.2f}B"
              f" {r['num_layers']:>6d} {r['hidden_size']:>6d}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    """``planner gpus``: the GPU profiles with memory and dense peaks."""
    rows = []
    for name in hardware_profiles.names("gpus"):
        g = GPU.preset(name)
        rows.append({"name": name, "memory_gib": g.memory_bytes / GIB,
                     "memory_bandwidth_gb_per_s": g.memory_bandwidth_bytes_per_s / 1e9,
                     "peak_tflops": {d: f / 1e12 for d, f in g.peak_flops_by_dtype},
                     "description": g.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'gpu':<11s} {'memory':>8s} {'HBM GB/s':>9s} {'bf16':>7s} {'fp16':>7s} {'fp8':>7s}"
          "  (dense TFLOP/s)")
    for r in rows:
        pk = r["peak_tflops"]
        cells = " ".join(f"{pk[d]:>7.0f}" if d in pk else f"{'-':>7s}" for d in
                         ("bf16", "fp16", "fp8"))
        print(f"{r['name']:<11s} {r['memory_gib']:>4.0f} GiB {r['memory_bandwidth_gb_per_s']:>9.0f}"
              f" {cells}")
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:
    """``planner clusters``: the cluster presets."""
    rows = [hardware_profiles.load("clusters", n) for n in hardware_profiles.names("clusters")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']:<11s} {r['gpus_per_node']} x {r['gpu']} per node, "
              f"{r['intra_node_link']} + {r['nics_per_node']} x {r['inter_node_link']}: "
              f"{r['description']}")
    return 0


def _common_args(p: argparse.ArgumentParser, *, model_required: bool = True,
                 many: bool = False) -> None:
    """--model, the cluster and the job: shared by ``estimate``, ``plan``, ``explain`` and
    ``compare`` (``many``: the cluster flags repeat, one cluster per value)."""
    p.add_argument("--model", required=model_required,
                   help="preset name (see 'planner models'), a Hugging Face config.json path, "
                   "or module:attr of a ModelSpec, HF config or transformers model (or, for "
                   "'planner plan', of any torch nn.Module)")
    hw = p.add_argument_group("cluster" + (" (repeat a flag to compare clusters)" if many
                                           else ""))
    rep: dict[str, Any] = {"action": "append"} if many else {}
    hw.add_argument("--cluster", help="cluster preset ('planner clusters') or a TOML file",
                    **rep)
    hw.add_argument("--num-nodes", type=positive_int, help="nodes of the cluster preset to use",
                    **rep)
    hw.add_argument("--gpus", type=positive_int, help="total GPUs (short form, with --gpu)", **rep)
    hw.add_argument("--gpu", help="GPU profile name ('planner gpus'); default h100-sxm", **rep)
    hw.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node (default 8)")
    hw.add_argument("--intra-node", help="link inside a node (default: the GPU's own)")
    hw.add_argument("--inter-node", help="NIC between nodes (default ib-ndr)", **rep)
    hw.add_argument("--profile", metavar="FILE", help="plan with a measured GPU profile "
                    "('planner profile -o FILE') instead of the shipped datasheet one")
    jb = p.add_argument_group("job")
    jb.add_argument("--global-batch-size", type=positive_int, help="sequences per step (required)")
    jb.add_argument("--seq-len", type=positive_int, help="tokens per sequence (required)")
    jb.add_argument("--precision", default="bf16", choices=PRECISIONS)
    jb.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    jb.add_argument("--framework", default="torchtitan", choices=FRAMEWORK_NAMES,
                    help="trainer whose conventions to follow (default torchtitan)")
    jb.add_argument("--no-flash-attention", action="store_true",
                    help="attention saves its score matrix (no fused kernel)")
    jb.add_argument("--no-overlap-grad-reduce", action="store_true",
                    help="gradients are reduced after the backward pass, not overlapped with it")
    jb.add_argument("--no-overlap-p2p-communication", action="store_true",
                    help="Megatron-LM: interleaved pipelines wait for each send and receive "
                    "(releases before October 2023)")
    jb.add_argument("--tp-comm-overlap", action="store_true",
                    help="pipeline tensor-parallel collectives with the linear layers' "
                    "matmuls: Megatron-LM's Transformer Engine userbuffers (sequence parallel "
                    "rows), torchtitan's async TP")
    jb.add_argument("--compile", action="store_true",
                    help="torchtitan: the model runs under torch.compile (fused memory-bound "
                    "kernels; torchtitan's default is eager)")
    jb.add_argument("--fused-cross-entropy", action="store_true",
                    help="the loss is a fused cross entropy on one fp32 copy of the logits "
                    "(llm-foundry's default; Megatron-LM's always)")
    jb.add_argument("--fp8-param-gather", action="store_true",
                    help="Megatron-LM fp8: parameters kept and gathered in fp8 (NeMo's fp8 "
                    "recipes set it)")
    jb.add_argument("--moe-capacity-factor", type=float,
                    help="expert capacity factor (default: dropless, even routing)")
    jb.add_argument("--memory-reserve", type=float, default=5.0, metavar="PERCENT",
                    help="share of each GPU's memory a plan keeps free for allocator "
                    "fragmentation and buffers the estimate does not count (default 5)")


def _inference_args(p: argparse.ArgumentParser, *, search: bool) -> None:
    """The serving flags of ``planner plan`` / ``estimate`` / ``explain`` (``--inference``)."""
    inf = p.add_argument_group("serving (--inference; replaces the training job flags)")
    inf.add_argument("--inference", action="store_true",
                     help="plan or estimate serving the model instead of training it")
    inf.add_argument("--prompt-len", type=positive_int, help="prompt tokens per request")
    inf.add_argument("--output-len", type=positive_int, help="generated tokens per request")
    inf.add_argument("--batch-size", type=positive_int,
                     help="sequences a replica serves at once (default: searched, or 1)")
    inf.add_argument("--weight-precision",
                     help=f"weight format, or several comma-separated for the search to choose "
                     f"from ({','.join(WEIGHT_PRECISIONS)}; default bf16)")
    inf.add_argument("--kv-cache-precision", default="bf16", choices=KV_PRECISIONS)
    inf.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"),
                     help="activations and 16-bit weights (default bf16)")
    inf.add_argument("--prefill-chunk", type=positive_int,
                     help="most prompt tokens per forward pass (chunked prefill)")
    inf.add_argument("--replicas", type=positive_int,
                     help="model copies (default: as many as the GPUs hold)")
    if search:
        inf.add_argument("--objective", default="latency", choices=OBJECTIVES,
                         help="lowest request latency, or most output tokens/s (default latency)")
        inf.add_argument("--max-ttft-ms", type=float, help="bound on the time to first token")
        inf.add_argument("--max-tpot-ms", type=float,
                         help="bound on the time per output token")
    else:
        p.set_defaults(objective="latency", max_ttft_ms=None, max_tpot_ms=None)


def _whole_number(text: str, least: int, words: str) -> int:
    """``text`` as an int of at least ``least`` for argparse (``words``: the bound said)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} must be {words}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1 (degrees, sizes, counts)."""
    return _whole_number(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: a whole number of at least 0 (row counts)."""
    return _whole_number(text, 0, "0 or more")


def _search_args(p: argparse.ArgumentParser) -> None:
    """The constraint flags of ``planner plan`` (each fixes or caps one field)."""
    fx = p.add_argument_group("constraints (each flag fixes that field)")
    pos = positive_int
    for flag, kind, extra in (("--dp", pos, {}), ("--tp", pos, {}), ("--pp", pos, {}),
                              ("--cp", pos, {}), ("--ep", pos, {}),
                              ("--zero", int, {"choices": (0, 1, 2, 3)}),
                              ("--micro-batch-size", pos, {}),
                              ("--schedule", str, {"choices": SCHEDULES}),
                              ("--virtual-stages", pos, {}),
                              ("--recompute", str, {"choices": RECOMPUTE}),
                              ("--offload", str, {"choices": OFFLOADS})):
        fx.add_argument(flag, type=kind, **extra)
    fx.add_argument("--sequence-parallel", choices=("on", "off"), nargs="?", const="on",
                    help="fix sequence parallel on or off (bare: on)")
    fx.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset")
    fx.add_argument("--max", action="append", default=[], metavar="FIELD=N",
                    help="cap a degree, e.g. --max tp=4 --max pp=8")
    fx.add_argument("--frameworks", help="trainers to search, comma-separated "
                    f"({','.join(FRAMEWORK_NAMES)}); default --framework")
    p.add_argument("--top-k", type=positive_int, default=5,
                   help="configurations to rank (default 5)")


def _one_line(text: object) -> str:
    """``text`` with its control characters (what a user typed may hold them) escaped, so
    an error stays one line."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``planner: error: ...`` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        # Control characters of what was typed are shown escaped, so the error stays a line.
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``planner`` command."""
    parser = _Parser(
        prog="planner",
        description="Auto-parallel planner: how to split training of a large model, and "
        "whether it fits in memory.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    est = sub.add_parser(
        "estimate", help="memory per GPU and step time of one parallel configuration",
        description="Estimate per-GPU memory (by term and pipeline stage) and step time (by "
        "term: compute, recompute, exposed communication, bubble, optimizer) of one "
        "configuration.",
        epilog=EPILOG_ESTIMATE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common_args(est)
    pc = est.add_argument_group("parallel configuration")
    pc.add_argument("--dp", type=positive_int, help="data parallel (default: GPUs / (tp*pp*cp))")
    pc.add_argument("--tp", type=positive_int, default=1, help="tensor parallel")
    pc.add_argument("--pp", type=positive_int, default=1, help="pipeline parallel")
    pc.add_argument("--cp", type=positive_int, default=1, help="context parallel")
    pc.add_argument("--ep", type=positive_int, default=1, help="expert parallel (within dp*cp)")
    pc.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage")
    pc.add_argument("--sharding-group", type=positive_int,
                    help="HSDP: data-parallel ranks per shard")
    pc.add_argument("--micro-batch-size", type=positive_int, default=1)
    pc.add_argument("--sequence-parallel", choices=("on", "off"), nargs="?", const="on",
                    default="off", help="sequence parallel on or off (bare: on; default off)")
    pc.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    pc.add_argument("--virtual-stages", type=positive_int, default=1,
                    help="virtual pipeline stages per rank (interleaved 1F1B)")
    pc.add_argument("--recompute", default="none", choices=RECOMPUTE)
    pc.add_argument("--recompute-num-layers", type=positive_int,
                    help="with --recompute full: only the first N layers of each chunk")
    pc.add_argument("--offload", default="none", choices=OFFLOADS)
    _inference_args(est, search=False)
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.set_defaults(func=cmd_estimate)

    pl = sub.add_parser(
        "plan", help="search every parallel configuration; the fastest that fits, and why",
        description="Search the whole space (dp, tp, pp, cp, ep, ZeRO stage and sharding "
        "group, sequence parallel, micro-batch, pipeline schedule and virtual stages, "
        "recompute, offload) for the fastest configuration that fits in memory; print it with "
        "its estimate, the runners-up and why the others lost. Any degree or option given "
        "below is fixed; --max caps one; --preset starts from a named set of constraints. "
        "Exits with status 3, saying what would fit, when nothing does.",
        epilog=EPILOG_PLAN, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common_args(pl)
    _search_args(pl)
    _inference_args(pl, search=True)
    tm = pl.add_argument_group("torch module (--model module:attr naming an nn.Module)")
    tm.add_argument("--input-shape", metavar="DIMS",
                    help="one micro-batch's inputs, micro-batch first: dimensions joined by x, "
                    "inputs by commas, e.g. 8x3x224x224 (default for a module whose first "
                    "layer is an nn.Embedding: micro-batch x --seq-len token ids, trying every "
                    "power-of-two micro-batch up to the GPU count)")
    tm.add_argument("--input-dtype", choices=("int64", "float"),
                    help="element type of --input-shape tensors (default: int64 token ids "
                    "when the first layer is an nn.Embedding, else float in --precision)")
    pl.add_argument("--why", type=non_negative_int, default=12,
                    help="rows of the why-not table (for a torch module: of the per-op "
                    "sharding) shown")
    pl.add_argument("-o", "--output", help="also write the plan as JSON to this file")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plan)

    ex = sub.add_parser(
        "explain", help="why this plan: what every other choice would cost",
        description="For each choice of the plan (tp, pp, cp, ep, ZeRO stage, sequence "
        "parallel, micro-batch, schedule, virtual stages, recompute, offload, trainer), search "
        "again with each other value fixed and say what the fastest configuration with it "
        "costs: slower by how much and which term grew, or how far over the memory it is. "
        "Give a saved plan, or the flags of 'planner plan' to search first.",
        epilog=EPILOG_EXPLAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("plan", nargs="?", help="a plan JSON file written by 'planner plan -o'")
    _common_args(ex, model_required=False)
    _search_args(ex)
    _inference_args(ex, search=True)
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.add_argument("--force", action="store_true", help=FORCE_HELP)
    ex.set_defaults(func=cmd_explain)

    cp = sub.add_parser(
        "compare", help="configurations or clusters side by side",
        description="Estimate each --config on each cluster (or search for the plan when no "
        "--config is given) and print them side by side: step time, tokens/s, tokens/s per "
        "GPU, MFU, memory, and the speed-up over the first. Repeat --cluster, --gpus, --gpu, "
        "--inter-node or --num-nodes to compare clusters; --plan adds saved plans.",
        epilog=EPILOG_COMPARE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_args(cp, model_required=False, many=True)
    cp.add_argument("--config", action="append", default=[], metavar="SPEC",
                    help="a configuration, e.g. 'tp=8 pp=4 zero=1 sp mbs=1 "
                    "recompute=selective'; without dp=, dp fills the cluster")
    cp.add_argument("--plan", action="append", default=[], metavar="FILE",
                    help="a saved plan (planner plan -o) to add as a candidate")
    cp.add_argument("--preset", choices=sorted(PRESETS),
                    help="constraints for the searched candidates")
    cp.add_argument("--max", action="append", default=[], metavar="FIELD=N",
                    help="cap a degree of the searched candidates, e.g. --max tp=4")
    cp.add_argument("--frameworks", help="trainers the searched candidates may use")
    cp.add_argument("--rank-by", choices=RANKINGS,
                    help="list the candidates best first: by tokens/s, or by cost (US$ per "
                    "million tokens at the GPU profiles' on-demand prices); default: as given")
    cp.add_argument("--json", action="store_true", help="machine-readable output")
    cp.add_argument("--force", action="store_true", help=FORCE_HELP)
    cp.set_defaults(func=cmd_compare)

    em = sub.add_parser(
        "emit", help="write a saved plan for a trainer (torchtitan, DeepSpeed, Megatron-LM, "
        "Slurm) or, for a serving plan, an engine (vLLM, TensorRT-LLM)",
        description="Write the plan saved by 'planner plan -o plan.json' in the form a "
        "trainer takes: a torchtitan job TOML, a DeepSpeed ds_config.json, the Megatron-LM "
        "pretrain_gpt.py arguments, or a Slurm sbatch script that starts the plan's trainer "
        "with torchrun; a serving plan ('planner plan --inference') as a vllm serve script or "
        "the TensorRT-LLM convert, build and serve steps. A feature the target cannot "
        "express is mapped to its nearest setting with a warning (also in the file's header, "
        "with the new prediction); --strict refuses instead.",
        epilog=EPILOG_EMIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    em.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    em.add_argument("--target", required=True, choices=TARGETS, help="what to write")
    em.add_argument("-o", "--output", help="write to this file (default: standard output)")
    em.add_argument("--force", action="store_true", help=FORCE_HELP + "; write a file "
                    "that does not fit under the target's conventions anyway")
    em.add_argument("--strict", action="store_true",
                    help="refuse a plan the target cannot run unchanged")
    em.set_defaults(func=cmd_emit)

    plt_ = sub.add_parser(
        "plot", help="draw a saved plan: memory per stage, step time, pipeline timeline",
        description="Draw a saved training plan on one figure: memory per GPU of each "
        "pipeline stage by term against the GPU's capacity, the step time by term (hidden "
        "communication hatched), and the pipeline schedule as it runs (planner.timeline). "
        "Legends sit beside the data.",
        epilog="examples:\n  planner plot plan.json\n  planner plot plan.json -o plan.svg "
        "--micro-batches 8", formatter_class=argparse.RawDescriptionHelpFormatter)
    plt_.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    plt_.add_argument("-o", "--output", help="the figure: .png, .svg or .pdf (default: the "
                      "plan's name with .png)")
    plt_.add_argument("--micro-batches", type=positive_int, help="draw the timeline's first "
                      "N micro-batches' worth of time (default: 4 per pipeline stage)")
    plt_.add_argument("--force", action="store_true", help=FORCE_HELP)
    plt_.set_defaults(func=cmd_plot)

    run = sub.add_parser(
        "run", help="train with a saved plan: torchrun on this node, or an sbatch script",
        description="Start the plan's processes with torchrun on this node (one per rank; "
        "the script reads the plan from $PLANNER_PLAN and calls planner.apply), or, for a "
        "plan on several nodes, write an sbatch script that starts them. Features the "
        "runtime cannot execute are refused before anything starts. Without --script, the "
        "minimal loop (python -m planner.runtime.train: the reference transformer on "
        "synthetic tokens, the loss printed by rank 0) trains.",
        epilog=EPILOG_RUN, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    run.add_argument("--script", help="training script each process runs (default: "
                     "python -m planner.runtime.train)")
    run.add_argument("--force", action="store_true", help=FORCE_HELP)
    run.add_argument("--dry-run", action="store_true",
                     help="print the torchrun command instead of running it")
    run.add_argument("-o", "--output", help="where a multi-node plan's sbatch script goes "
                     "(default train.sbatch)")
    run.set_defaults(func=cmd_run)
    run.usage = ("planner run [-h] [--script SCRIPT] [--force] [--dry-run] [-o OUTPUT] plan "
                 "[-- ARGS]")

    val = sub.add_parser(
        "validate", help="predicted vs measured for published training runs",
        description="Predict every shipped published run (the calibration set and the "
        "published runs of other sources, costmodel/data) with the fitted efficiencies and "
        "compare with what was measured (iteration time, tokens/s per GPU or TFLOP/s per GPU, "
        "as the source reports), and again with the run's source left out of the fit "
        "(leave-one-source-out: the accuracy to expect on runs the fit has not seen). Per "
        "source: mean and worst error of both; then peak memory where the source publishes "
        "it, and which runs would be predicted not to fit.",
        epilog="examples:\n  planner validate\n  planner validate --summary\n"
        "  planner validate --heldout --json\n"
        "  planner validate --runs ../shared/data/calibration.json\n"
        "  planner validate --heldout --profile h100-sxm-2026-11-22.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    val.add_argument("--runs", help="your own runs JSON file (calibration.json schema or the "
                     "planner's): their error under the shipped fit, which never saw them")
    val.add_argument("--heldout", action="store_true", help="only the published runs beyond "
                     "the calibration set")
    val.add_argument("--calibration", action="store_true", help="only the calibration set "
                     "(Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Table 5)")
    val.add_argument("--summary", action="store_true", help="the per-source table only")
    val.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out "
                     "refits (a few seconds)")
    val.add_argument("--profile", metavar="FILE", help="also predict the runs on this "
                     "profile's GPU with it ('planner profile -o FILE') and show both")
    val.add_argument("--json", action="store_true", help="machine-readable output")
    val.set_defaults(func=cmd_validate)

    prof = sub.add_parser(
        "profile", help="measure this GPU (or CPU) and its links; write a profile to plan with",
        description="Measure, with torch, matmul throughput over a grid of shapes per dtype, "
        "fused attention against sequence length and head dimension, memory bandwidth, "
        "pinned host-device bandwidth and, with more than one process, all-reduce, "
        "all-gather, reduce-scatter, all-to-all and send/recv against message size (NCCL on "
        "GPUs, gloo on the CPU). Fit the cost model's parameters to the times and write a GPU "
        "profile TOML (the hardware_profiles/gpus format, marked as measured, with the date "
        "and the torch and driver versions) that --profile FILE plans with. A sweep "
        "predicted to take over two minutes needs --full.",
        epilog="examples:\n  planner profile -o h100.toml                  # every GPU of "
        "this node\n  planner profile --device cpu --procs 2 --quick -o cpu.toml\n"
        "  planner profile --full --gpu h100-sxm -o h100-full.toml\n"
        "  planner plan --model llama-3-8b --gpus 8 --global-batch-size 256 --seq-len 8192 "
        "--profile h100.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    prof.add_argument("--device", choices=("cuda", "cpu"),
                      help="what to measure (default: cuda when torch sees a GPU, else cpu)")
    prof.add_argument("-o", "--output", help="where to write the TOML (default "
                      "<gpu>-<date>.toml here)")
    prof.add_argument("--gpu", help="the shipped datasheet profile of this GPU, whose peaks "
                      "the efficiencies are fractions of (default: from the device name; "
                      "'none' for none)")
    prof.add_argument("--procs", type=positive_int, help="processes for the collectives "
                      "(default: every GPU; 1 on the CPU, which measures none)")
    size = prof.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a smoke run of a few small shapes")
    size.add_argument("--full", action="store_true", help="every shape and size, however "
                      "long it takes (needed when a sweep would take over two minutes)")
    prof.add_argument("--json", action="store_true", help="machine-readable output")
    prof.set_defaults(func=cmd_profile)

    cal = sub.add_parser(
        "calibrate", help="fit the GPU efficiencies to published runs",
        description="Fit the parameters the step-time model does not take from a datasheet "
        "or a microbenchmark: per GPU architecture, the ratio of the matmul fraction "
        "training reaches to the profile's microbenchmark fraction; the same for fused "
        "attention; the fixed cost of one kernel; and the compute lost per second of "
        "communication overlapped with it. scipy least squares on log error with a robust "
        "(soft L1) loss, over the shipped published runs or --runs FILE; --groups names the "
        "sources to fit on. Also refits without each source in turn and prints what that "
        "source's runs then get (leave-one-source-out), and writes the uncertainty bands "
        "estimates carry. Written, with its provenance, to your own "
        "~/.config/autoparallel-planner/calibrated/transfer.toml ($PLANNER_CONFIG_DIR or "
        "$XDG_CONFIG_HOME move it), which every GPU profile then takes, or to -o FILE; the "
        "installed package is never written. --gpu NAME instead fits that profile's own "
        "matmul fraction and kernel overhead to the runs on it.",
        epilog="examples:\n  planner calibrate\n"
        "  planner calibrate --groups megatron2021,korthikanti2022 -o /tmp/transfer.toml\n"
        "  planner calibrate --gpu a100-80gb --runs ../shared/data/calibration.json "
        "-o /tmp/a100.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    cal.add_argument("--gpu", help="fit only this GPU profile's own efficiencies")
    cal.add_argument("--runs", action="append", help="runs JSON file (repeatable; default: "
                     "the shipped published runs)")
    cal.add_argument("--groups", help="comma-separated sources (a run's group) to fit on")
    cal.add_argument("-o", "--output", help="where to write the TOML (default: your own "
                     "calibrated/transfer.toml, or calibrated/<gpu>.toml with --gpu)")
    cal.add_argument("--json", action="store_true", help="machine-readable output")
    cal.set_defaults(func=cmd_calibrate)

    for name, func, text in (("models", cmd_models, "list model presets"),
                             ("gpus", cmd_gpus, "list GPU profiles"),
                             ("clusters", cmd_clusters, "list cluster presets")):
        p = sub.add_parser(name, help=text, description=text,
                           epilog=f"example:\n  planner {name} --json",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, 2 for bad input, 3 when nothing fits."""
    words = list(sys.argv[1:] if argv is None else argv)
    # `planner run PLAN ... -- ARGS`: what follows "--" belongs to the training script.
    script_args: list[str] = []
    if words[:1] == ["run"] and "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    args = build_parser().parse_args(words)
    args.script_args = script_args
    args.command_line = "planner " + shlex.join(words)
    try:
        return int(args.func(args))
    except SpecError as e:
        print(f"planner: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Infeasible as e:
        print(f"planner: infeasible: {_one_line(e)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except BrokenPipeError:
        # Output piped into a command that stopped reading (e.g. `| head`): not an error.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0

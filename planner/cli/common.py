"""What the subcommands share: the flags of the model, the cluster, the job, the search's
constraints and serving; turning those flags into a model, a job and constraints (the
cluster: ``planner.cli.clusterflags``); argparse types and the one-line error parser; loading
a saved plan. Warnings and JSON output: ``planner.cli.messages``.

Bad input raises ``SpecError`` here; ``planner.cli.main`` prints it as one line and exits
with ``EXIT_USAGE``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from costmodel import Cluster, Job, ModelSpec, SpecError
from costmodel.config import (
    ATTENTION_KERNELS,
    FLOAT8_RECIPES,
    FRAMEWORK_NAMES,
    MASTER_DTYPES,
    MOE_DISPATCHERS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    SCHEDULES,
    STATE_DTYPES,
)
from costmodel.serving.inference import KV_PRECISIONS, OBJECTIVES, WEIGHT_PRECISIONS, InferenceJob
from hardware_profiles.files import is_file, printable

# Re-exported: the subcommands import them from here with the rest of what they share.
from planner.cli.clusterflags import load_cluster as load_cluster
from planner.cli.clusterflags import load_clusters as load_clusters
from planner.cli.messages import print_json as print_json
from planner.cli.messages import warn as warn
from planner.cli.switches import JOB_SWITCHES, SAME_NAMED
from planner.models import load_model, load_model_or_module
from planner.result import MAX_TOP_K, Plan, load_plan
from planner.space import PRESETS, Constraints

if TYPE_CHECKING:
    from typing import TypeAlias

    #: What ``add_subparsers`` returns: each subcommand module adds its parser to it.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: Exit statuses: bad input, and a valid question with no configuration that fits.
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
#: Exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130

FORCE_HELP = ("use a saved plan that does not fit its GPUs' memory anyway (a plan whose "
              "configuration no longer runs is refused whatever)")


# -- argparse: types, errors, output ---------------------------------------------------------

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


def stage_layers(text: str) -> tuple[int, ...]:
    """argparse type: layers per pipeline stage (chunk): counts, a run written ``NxK``
    (``1,2x30,0``), or a Megatron-LM ``--pipeline-model-parallel-layout`` string
    (``Et|(tt|)*30mL``)."""
    from planner.emit.megatron import layout_layers

    t = text.strip()
    if any(c in t for c in "Et|L"):
        if not re.fullmatch(r"[EtmL|(),*0-9 ]+", t):
            raise argparse.ArgumentTypeError(f"{text!r} is not a pipeline layout: use E, t, "
                                             "m, L, |, (...)*n and t*n")
        return layout_layers(t)
    try:
        return tuple(int(n) for x in t.replace(" ", "").split(",") if x
                     for n, _, k in (x.partition("x"),) for _ in range(int(k or 1)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of layer counts (e.g. "
                                         "'1,2x30,0')") from None


def top_k(text: str) -> int:
    """argparse type: how many configurations to rank, 1 to ``MAX_TOP_K``."""
    value = positive_int(text)
    if value > MAX_TOP_K:
        raise argparse.ArgumentTypeError(f"{value} is more than the {MAX_TOP_K} runners-up a "
                                         "plan ranks; ask for at most that")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a whole number of at least 0 (row counts)."""
    return _whole_number(text, 0, "0 or more")


def one_line(text: object) -> str:
    """``text`` with its control characters (what a user typed may hold them) escaped, so
    an error stays one line."""
    return printable(text)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``planner: error: ...`` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 and one line naming what is wrong."""
        # Control characters of what was typed are shown escaped, so the error stays a line.
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


#: The flags whose values are files a command writes.
OUTPUT_FLAGS = ("output", "dot", "graphml")


def _read_files(args: argparse.Namespace) -> list[str]:
    """The files a command's flags name that exist (what it reads): every string value, and
    a ``module:attr`` model's ``module.py``."""
    values: list[str] = []
    for key, value in vars(args).items():
        if key in OUTPUT_FLAGS or key == "command_line":
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str):
                values += [v, v.partition(":")[0] + ".py"] if ":" in v else [v]
    return [v for v in values if is_file(v)]


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output file that is one of the command's own inputs (``planner emit p.json
    -o p.json``): writing it would destroy what was read."""
    read = _read_files(args)
    for flag in OUTPUT_FLAGS:
        out = getattr(args, flag, None)
        if not isinstance(out, str) or out == "-" or not is_file(out):
            continue
        for source in read:
            if _same_file(out, source):
                raise SpecError(f"--{flag} {printable(out)!r} is a file this command reads "
                                f"({printable(source)!r}); writing it would destroy that "
                                "input: give another output file")


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are the same file (False where either cannot be looked at)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


#: Seconds a command on a model's own code (``--model module:attr``) may run by default.
TRACE_TIMEOUT_S = 600.0


class TimeLimit(BaseException):
    """A command on a model's own code ran past ``--trace-timeout`` (a ``BaseException``,
    as ``KeyboardInterrupt``: the handlers that turn the model's own errors into one line
    must not take it for one)."""


def add_trace_timeout(p: argparse.ArgumentParser) -> None:
    """``--trace-timeout``: how long a command on module:attr code may run."""
    p.add_argument("--trace-timeout", type=float, default=TRACE_TIMEOUT_S, metavar="SECONDS",
                   help="with --model module:attr, stop with an error after this many "
                   "seconds (the model's code may never return; default "
                   f"{TRACE_TIMEOUT_S:.0f})")


def user_code_timeout(args: argparse.Namespace) -> float | None:
    """``--trace-timeout`` where the command runs a model's own code (``module:attr``),
    else None."""
    model = getattr(args, "model", None)
    timeout = getattr(args, "trace_timeout", None)
    if not isinstance(model, str) or ":" not in model or is_file(model) or timeout is None:
        return None
    if not 0 < timeout < float("inf"):
        raise SpecError(f"--trace-timeout {timeout:g}: give a positive number of seconds")
    return float(timeout)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``TimeLimit`` in the main thread after ``seconds`` (``SIGALRM``; no limit where
    the platform has no timer, off the main thread, or for ``None``)."""
    if seconds is None or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise TimeLimit(f"the command on the model's own code ran for more than {seconds:g} s "
                        "(its import, build or trace may never return); if it is only slow, "
                        "raise --trace-timeout")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def add_command(sub: Subparsers, name: str, *, help: str, description: str, epilog: str
                ) -> argparse.ArgumentParser:
    """A subcommand's parser, its epilog (examples) printed as written."""
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)



# -- flags --------------------------------------------------------------------------------

def add_common_args(p: argparse.ArgumentParser, *, model_required: bool = True,
                    many: bool = False) -> None:
    """--model, the cluster and the job: shared by ``estimate``, ``plan``, ``explain`` and
    ``compare`` (``many``: the cluster flags repeat, one cluster per value)."""
    p.add_argument("--model", required=model_required,
                   help="preset name (see 'planner models'), a Hugging Face config.json path, "
                   "or module:attr of a ModelSpec, HF config or transformers model (or, for "
                   "'planner plan', of any torch nn.Module)")
    add_trace_timeout(p)
    _add_cluster_args(p, many=many)
    _add_job_args(p)


def _add_cluster_args(p: argparse.ArgumentParser, *, many: bool) -> None:
    """The cluster flags (``many``: repeatable, one cluster per value)."""
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
    hw.add_argument("--gpus-per-domain", type=positive_int, metavar="N",
                    help="GPUs one NVLink / Infinity Fabric domain joins, a multiple of the "
                    "GPUs per node (default: one node; 72 on an NVL72 rack of 18 trays of 4)")
    hw.add_argument("--power-limit", type=float, metavar="WATTS",
                    help="power limit each GPU is held at, below its TDP (nvidia-smi -pl): "
                    "matmul and attention slow by (limit/TDP)^0.47 (software.toml [power])")
    hw.add_argument("--intra-node", help="link inside a node (default: the GPU's own)")
    hw.add_argument("--inter-node", help="NIC between nodes (default ib-ndr)", **rep)
    hw.add_argument("--profile", metavar="FILE", help="plan with a measured GPU profile "
                    "('planner profile -o FILE') instead of the shipped datasheet one")


def _add_job_args(p: argparse.ArgumentParser) -> None:
    """The training job flags."""
    jb = p.add_argument_group("job")
    jb.add_argument("--global-batch-size", type=positive_int, help="sequences per step (required)")
    jb.add_argument("--seq-len", type=positive_int, help="tokens per sequence (required)")
    jb.add_argument("--precision", default="bf16", choices=PRECISIONS, help="matmul format: "
                    "fp8 (see --float8-recipe), nvfp4 (Blackwell, Megatron-LM's NVFP4 recipe), "
                    "mxfp4 (MI355X / MI350X, AMD's Megatron-LM MXFP4 recipe)")
    jb.add_argument("--float8-recipe", default="tensorwise", choices=FLOAT8_RECIPES,
                    help="fp8 scaling recipe: torchao's tensorwise (default) or rowwise, "
                    "mxfp8 (Blackwell, MI355X: torchao MX / Megatron-LM --fp8-recipe mxfp8), "
                    "blockwise (Megatron-LM: DeepSeek-V3's 1x128 / 128x128 scales)")
    jb.add_argument("--attention-kernel", choices=ATTENTION_KERNELS,
                    help="fused attention kernel: flash (FlashAttention-2; Composable "
                    "Kernel's on AMD), cudnn (cuDNN's; AMD's v3 kernels on AMD) or aotriton "
                    "(PyTorch SDPA's on ROCm); default: the trainer's own on the GPU "
                    "(Megatron-LM's Transformer Engine and torchtitan pick cuDNN's on Hopper "
                    "and Blackwell; torchtitan's SDPA AOTriton on AMD)")
    jb.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    jb.add_argument("--optimizer-state-dtype", default="fp32", choices=tuple(STATE_DTYPES),
                    help="dtype of Adam's moments: bf16/fp16/fp8 is Megatron-LM's "
                    "precision-aware optimizer (--exp-avg-dtype; NeMo's optim.dtype); "
                    "default fp32")
    jb.add_argument("--master-weights-dtype", default="fp32", choices=tuple(MASTER_DTYPES),
                    help="dtype of the master weights: fp16 is Megatron-LM's "
                    "--main-params-dtype fp16; default fp32")
    jb.add_argument("--framework", default="torchtitan", choices=FRAMEWORK_NAMES,
                    help="trainer whose conventions to follow (default torchtitan)")
    for flag, what in JOB_SWITCHES:
        jb.add_argument(flag, action="store_true", help=what)
    jb.add_argument("--moe-capacity-factor", type=float,
                    help="expert capacity factor, tokens beyond it dropped (default: dropless)")
    jb.add_argument("--moe-load-imbalance", type=float, metavar="RATIO", help="busiest "
                    "expert-parallel rank's routed tokens over the even share (1 = forced even)")
    jb.add_argument("--moe-dispatcher", default="alltoall", choices=MOE_DISPATCHERS,
                    help="MoE token dispatcher: alltoall (NCCL, default), allgather "
                    "(Megatron-LM's) or deepep (one network copy per destination node)")
    jb.add_argument("--recompute-modules", nargs="+", choices=RECOMPUTE_MODULES,
                    default=["core_attn"], help="what Megatron-LM's selective recompute "
                    "re-runs (--recompute-modules; default core_attn)")
    jb.add_argument("--memory-reserve", type=float, default=5.0, metavar="PERCENT",
                    help="share of each GPU's memory a plan keeps free for allocator "
                    "fragmentation and buffers the estimate does not count (default 5)")


def add_inference_args(p: argparse.ArgumentParser, *, search: bool) -> None:
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


def add_search_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--top-k", type=top_k, default=5,
                   help=f"configurations to rank (default 5, at most {MAX_TOP_K})")


# -- the model and the job ----------------------------------------------------------------

def model_arg(args: argparse.Namespace) -> str:
    """``--model``, which every command that plans or estimates needs."""
    if not args.model:
        raise SpecError("--model is required (a preset such as llama-3-70b, a config.json "
                        "path, or module:attr)")
    return str(args.model)


def load_problem(args: argparse.Namespace, *, modules: bool = False
                 ) -> tuple[Any, Cluster, Job | InferenceJob]:
    """The model, cluster and job (a serving one with ``--inference``) the flags name; with
    ``modules`` the model may be a torch ``nn.Module`` (planned from its traced graph)."""
    name = model_arg(args)
    model = load_model_or_module(name) if modules else load_model(name)
    if getattr(args, "inference", False):
        if not isinstance(model, ModelSpec):
            raise SpecError(f"--inference plans serving of a preset, config.json or "
                            f"ModelSpec; {args.model!r} is a torch module")
        cluster = load_cluster(args)
        return model, cluster, inference_job(args)
    job = training_job(args, model)
    return model, load_cluster(args), job


def training_job(args: argparse.Namespace, model: Any) -> Job:
    """The training job of the job flags (``model``: a torch module fed ``--input-shape``
    needs no ``--seq-len``; its throughput then counts samples)."""
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
    return Job(global_batch_size=args.global_batch_size, seq_len=args.seq_len,
               precision=args.precision, optimizer=args.optimizer, framework=args.framework,
               flash_attention=not args.no_flash_attention,
               overlap_grad_reduce=not args.no_overlap_grad_reduce,
               **{k: getattr(args, k) for k in SAME_NAMED}, float8_recipe=args.float8_recipe,
               optimizer_state_dtype=args.optimizer_state_dtype,
               master_weights_dtype=args.master_weights_dtype,
               attention_kernel=getattr(args, "attention_kernel", None),
               fused_cross_entropy=True if args.fused_cross_entropy else None,
               compile_loss=False if args.no_compile_loss else None,
               grad_reduce_in_fp32=False if args.no_grad_reduce_in_fp32 else None,
               overlap_p2p_comm=not args.no_overlap_p2p_communication,
               fp8_weight_transpose_cache=not args.no_fp8_weight_transpose_cache,
               moe_capacity_factor=args.moe_capacity_factor,
               moe_load_imbalance=args.moe_load_imbalance,
               moe_dispatcher=args.moe_dispatcher, recompute_modules=args.recompute_modules,
               memory_reserve=args.memory_reserve / 100)


def inference_job(args: argparse.Namespace) -> InferenceJob:
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


#: Constraint flag -> the ``ParallelConfig`` field it fixes.
FIXED_FLAGS = (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"),
               ("zero", "zero_stage"), ("micro_batch_size", "micro_batch_size"),
               ("schedule", "pipeline_schedule"), ("virtual_stages", "virtual_pipeline_stages"),
               ("recompute", "recompute"), ("offload", "offload"))
#: Short names ``--max`` takes for a field.
MAX_ALIASES = {"zero": "zero_stage", "mbs": "micro_batch_size", "v": "virtual_pipeline_stages"}


def load_constraints(args: argparse.Namespace) -> Constraints:
    """Constraints from the search flags: fixed fields, caps, preset, trainers."""
    fixed: dict[str, object] = {key: getattr(args, flag) for flag, key in FIXED_FLAGS
                                if getattr(args, flag, None) is not None}
    if getattr(args, "sequence_parallel", None) is not None:
        fixed["sequence_parallel"] = args.sequence_parallel == "on"
    caps: dict[str, int] = {}
    for item in args.max:
        key, _, value = item.partition("=")
        key = MAX_ALIASES.get(key.strip(), key.strip())
        try:
            caps[key] = int(value)
        except ValueError:
            raise SpecError(f"--max {item!r}: write FIELD=N with an integer N, e.g. tp=4") \
                from None
    frameworks = tuple(f.strip() for f in args.frameworks.split(",")) if args.frameworks \
        else None
    own = Constraints(fixed=fixed, max=caps, frameworks=frameworks)
    return Constraints.preset(args.preset).merge(own) if args.preset else own


# -- saved plans --------------------------------------------------------------------------

def load_saved_plan(path: str, args: argparse.Namespace) -> Plan:
    """A saved plan, re-validated and re-estimated (``planner.plan.load_plan``): refused
    (exit 3) when it no longer runs or fits, unless ``--force``; warnings on stderr."""
    p, warnings = load_plan(path, force=getattr(args, "force", False))
    for w in warnings:
        warn(w)
    return p

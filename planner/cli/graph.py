"""``planner graph``: a model's layer graph (traced on the meta device) and its
``LayerCosts``, the per-block costs the planner reads, at each tensor-parallel degree; the
graph with the layouts the sharding ILP chose, as DOT or GraphML."""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING, Any

from costmodel import Cluster, Job, ModelSpec, SpecError
from costmodel.config import FRAMEWORK_NAMES, PRECISIONS
from costmodel.errors import install_hint
from costmodel.units import count
from hardware_profiles.files import printable, write_text
from planner.cli.common import (
    _add_cluster_args,
    add_command,
    add_trace_timeout,
    load_cluster,
    positive_int,
    print_json,
)
from planner.cli.torchmodule import add_module_args, module_inputs
from planner.models import load_model_or_module
from planner.plan import trace_dtype

if TYPE_CHECKING:
    from costmodel.formulas.layercosts import LayerCosts
    from costmodel.trace.graph import LayerGraph
    from planner.cli.common import Subparsers

__all__ = ["add_parser", "cmd_graph", "to_dot"]

EPILOG = """examples:
  planner graph mymodels:Decoder --seq-len 2048
  planner graph llama-3-8b --seq-len 4096 --tp 1,8 --sequence-parallel
  planner graph mymodels:Decoder --seq-len 2048 --dot decoder.dot   # dot -Tsvg decoder.dot
  planner graph mymodels:ViT --input-shape 8x3x224x224 --graphml vit.graphml
"""


def add_parser(sub: Subparsers) -> None:
    """Register ``planner graph``."""
    g = add_command(
        sub, "graph", help="a model's layer graph and per-block costs per TP degree",
        description="Trace a model on the meta device (nothing is allocated) into its layer "
        "graph, shard each distinct block by the sharding ILP at each tensor-parallel degree, "
        "and print the blocks with what one rank holds and does per micro-batch: "
        "parameters, FLOPs, activations, collectives (the LayerCosts the planner reads). "
        "--dot / --graphml write the forward graph with the layouts the ILP chose.",
        epilog=EPILOG)
    g.add_argument("model", help="module:attr naming a torch nn.Module (or a preset, traced "
                   "as the reference transformer)")
    add_trace_timeout(g)
    _add_cluster_args(g, many=False)  # default: one node of 8 h100-sxm
    jb = g.add_argument_group("micro-batch")
    jb.add_argument("--seq-len", type=positive_int, help="tokens per sequence (a model fed "
                    "token ids)")
    jb.add_argument("--micro-batch-size", type=positive_int, default=1,
                    help="sequences per micro-batch (default 1; with --input-shape, its first "
                    "dimension)")
    jb.add_argument("--precision", default="bf16", choices=PRECISIONS)
    jb.add_argument("--framework", default="torchtitan", choices=FRAMEWORK_NAMES,
                    help="trainer whose conventions the costs follow (default torchtitan)")
    jb.add_argument("--sequence-parallel", action="store_true",
                    help="norms and elementwise ops split the sequence over the TP ranks")
    add_module_args(g, "the model's inputs")
    g.add_argument("--tp", metavar="DEGREES",
                   help="tensor-parallel degrees, comma-separated (default: the divisors of "
                   "a node's GPUs)")
    g.add_argument("--dot", nargs="?", const="-", metavar="FILE",
                   help="write the forward graph as Graphviz DOT (to stdout without FILE)")
    g.add_argument("--graphml", metavar="FILE", help="write the forward graph as GraphML")
    g.add_argument("--layouts-tp", type=int, metavar="T",
                   help="the TP degree whose layouts --dot / --graphml show (default: the "
                   "largest)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.set_defaults(func=cmd_graph)


def cmd_graph(args: argparse.Namespace) -> int:
    """``planner graph``: the traced graph and its LayerCosts (the trace side is imported
    here, so that the other commands do not load it)."""
    from costmodel.trace.blockcosts import costs_from_graph

    if not args.cluster and not args.gpus:
        args.gpus = args.gpus_per_node or 8  # one node: what a TP group spans
    cluster = load_cluster(args)
    graph, job = _trace(args)
    degrees = _degrees(args.tp, cluster)
    costs = costs_from_graph(graph, cluster, job, tp_degrees=degrees,
                             sequence_parallel=args.sequence_parallel)
    shown = args.layouts_tp or max(degrees)
    if shown not in degrees:
        raise SpecError(f"--layouts-tp {shown}: not among the degrees traced "
                        f"({', '.join(map(str, degrees))}); add it to --tp")
    if args.dot:
        _write(args.dot, to_dot(graph, costs, shown))
    if args.graphml:
        _write_graphml(args.graphml, graph, costs, shown)
    if args.json:
        print_json({"graph": _graph_dict(graph), "layer_costs": costs.to_dict()})
        return 0
    if args.dot == "-":
        return 0
    print(f"model    {graph.name}: {count(graph.num_params())}, traced into "
          f"{graph.graph.number_of_nodes()} ops; one micro-batch "
          f"{'x'.join(map(str, graph.inputs[0])) if graph.inputs else '()'}, {job.precision}")
    print(graph.summary())
    print(f"\nper block, one rank of a TP group, one micro-batch "
          f"({'with' if args.sequence_parallel else 'without'} sequence parallel):")
    for t in degrees:
        print()
        print(costs.summary(t))
    for path, what in ((args.dot, "DOT"), (args.graphml, "GraphML")):
        if path and path != "-":
            print(f"\n{what} graph with the tp={shown} layouts written to {path}")
    return 0


def _trace(args: argparse.Namespace) -> tuple[LayerGraph, Job]:
    """The model's graph, traced on one micro-batch, and the job it was traced for."""
    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"planner graph traces with torch: {install_hint('torch')}")
    from costmodel.trace.graph import LayerGraph
    from costmodel.trace.recorder import training_loss

    model = load_model_or_module(args.model)
    if isinstance(model, ModelSpec):
        from planner.runtime.model import build_model

        model = build_model(model, device="meta")
    if args.seq_len is None and not args.input_shape:
        raise SpecError(f"{args.model}: give --seq-len for a model fed token ids, or "
                        "--input-shape, e.g. --input-shape 8x3x224x224 (micro-batch first)")
    job = Job(global_batch_size=1, seq_len=args.seq_len or 1, precision=args.precision,
              framework=args.framework)
    inputs = module_inputs(args, model, job, batch=args.micro_batch_size)
    # Traced from the loss planner plan costs and planner run trains it with.
    return LayerGraph.from_module(model, inputs, dtype=trace_dtype(job),
                                  loss_fn=training_loss), job


def _degrees(text: str | None, cluster: Cluster) -> list[int]:
    """``--tp``: degrees dividing a scale-up domain's GPUs (default: ``traced_degrees``)."""
    from costmodel.trace.blockcosts import traced_degrees

    if not text:
        return list(traced_degrees(cluster))
    try:
        out = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise SpecError(f"--tp {text!r}: give degrees separated by commas, e.g. 1,2,4,8") \
            from None
    bad = [t for t in out if t < 1 or cluster.scale_up % t]
    if bad:
        raise SpecError(f"--tp {text}: {', '.join(map(str, bad))} does not divide "
                        f"{cluster.domain_words()} (tensor parallelism stays inside a node or "
                        "NVLink domain)")
    return out


def _forward(graph: LayerGraph) -> Any:
    """The forward ops of ``graph`` (a networkx view)."""
    return graph.graph.subgraph(i for i in graph.graph.nodes if not graph.node(i).backward)


def _placed(costs: LayerCosts, tp: int) -> dict[int, tuple[str, str]]:
    """Node id -> (strategy, output layout) at degree ``tp``."""
    return {v: (label, out) for v, _module, _op, label, out in costs.layouts.get(tp, ())}


def to_dot(graph: LayerGraph, costs: LayerCosts, tp: int) -> str:
    """The forward graph as Graphviz DOT: one cluster per layer, each op labelled with its
    aten op, output shape and, where the ILP placed it at degree ``tp``, its strategy and
    output layout (``S(d)`` split along dim d, ``R`` replicated, ``P`` partial)."""
    placed = _placed(costs, tp)
    fw = _forward(graph)
    name = _dot_text(graph.name)
    lines = [f'digraph "{name}" {{', "  rankdir=TB;",
             '  node [shape=box, fontname="Helvetica", fontsize=9];',
             f'  label="{name}: layouts at tp={tp}"; labelloc=t;']
    for k, layer in enumerate(graph.layers):
        members = [i for i in layer.nodes if i in fw]
        if not members:
            continue
        title = _dot_text(layer.name) + (f" x{layer.repeat}" if layer.repeat > 1 else "")
        lines.append(f'  subgraph cluster_{k} {{ label="{title}"; style=rounded;')
        for i in members:
            n = graph.node(i)
            op = n.aten
            extra = "\\n{} -> {}".format(*placed[i]) if i in placed else ""
            style = "" if i in placed else ", style=dashed"
            lines.append(f'    n{i} [label="{op} {list(n.shape)}{extra}"{style}];')
        lines.append("  }")
    lines += [f"  n{a} -> n{b};" for a, b in fw.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    """``text`` inside a DOT double-quoted string: quotes and backslashes escaped, control
    characters written as escapes (a module's name or path is the user's)."""
    return printable(text).replace("\\", "\\\\").replace('"', '\\"')


def _write(path: str, text: str) -> None:
    if path == "-":
        print(text, end="")
        return
    write_text(path, text, "DOT file")


def _write_graphml(path: str, graph: LayerGraph, costs: LayerCosts, tp: int) -> None:
    """The forward graph as GraphML (networkx's writer), attributes as strings."""
    import networkx as nx

    placed = _placed(costs, tp)
    out = nx.DiGraph(name=graph.name, tp=tp)
    for i in _forward(graph).nodes:
        n = graph.node(i)
        label, layout = placed.get(i, ("", ""))
        out.add_node(i, op=n.op, family=n.family, layer=n.layer, module=n.module,
                     shape="x".join(map(str, n.shape)), flops=n.model_flops,
                     saved_bytes=n.saved_bytes, strategy=label, layout=layout)
    out.add_edges_from(_forward(graph).edges)
    try:
        nx.write_graphml(out, path)
    except OSError as e:
        raise SpecError(f"cannot write {path}: {e.strerror}") from None


def _graph_dict(graph: LayerGraph) -> dict[str, Any]:
    """The traced graph's layers as JSON values."""
    return {"name": graph.name, "num_params": graph.num_params(),
            "ops": graph.graph.number_of_nodes(), "inputs": [list(s) for s in graph.inputs],
            "layers": [{"name": x.name, "module_type": x.module_type, "repeat": x.repeat,
                        "params": x.params, "forward_flops": x.forward_flops,
                        "backward_flops": x.backward_flops, "saved_bytes": x.saved_bytes}
                       for x in graph.layers],
            "unsupported": [list(u) for u in graph.unsupported]}


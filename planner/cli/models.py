"""``planner models``, and the listings beside it, ``planner gpus`` and ``planner clusters``:
the shipped model presets, GPU profiles and cluster presets."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hardware_profiles
from costmodel import ModelSpec
from costmodel.hardware import GPU
from costmodel.units import GIB
from planner.cli.common import add_command, print_json

if TYPE_CHECKING:
    from planner.cli.common import Subparsers


def add_parser(sub: Subparsers) -> None:
    """Add ``planner models``, ``gpus`` and ``clusters`` to ``sub``."""
    commands: tuple[tuple[str, Callable[[argparse.Namespace], int], str], ...] = (
        ("models", cmd_models, "list model presets"),
        ("gpus", cmd_gpus, "list GPU profiles"),
        ("clusters", cmd_clusters, "list cluster presets"))
    for name, func, text in commands:
        p = add_command(sub, name, help=text, description=text,
                        epilog=f"example:\n  planner {name} --json")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "gpus":
            p.add_argument("--provenance", action="store_true",
                           help="per GPU, which kernel and link efficiencies were measured on "
                           "it and which are assumed from another, and the published runs "
                           "behind its generation's fit")
        p.set_defaults(func=func)


def cmd_models(args: argparse.Namespace) -> int:
    """``planner models``: the model presets with their sizes."""
    rows: list[dict[str, Any]] = []
    for name in ModelSpec.preset_names():
        m = ModelSpec.preset(name)
        rows.append({"name": name, "num_params": m.num_params(),
                     "num_active_params": m.num_active_params(), "mtp_params": m.mtp_params(),
                     "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                     "source": m.source})
    if args.json:
        print_json(rows)
        return 0
    print(f"{'model':<18s} {'params':>10s} {'active':>10s} {'layers':>6s} {'hidden':>6s} "
          f"{'of them MTP':>11s}")
    for r in rows:
        total, active = r["num_params"] / 1e9, r["num_active_params"] / 1e9
        mtp = f"{r['mtp_params'] / 1e9:.2f}B" if r["mtp_params"] else "-"
        print(f"{r['name']:<18s} {total:>9.2f}B {active:>9.2f}B"
              f" {r['num_layers']:>6d} {r['hidden_size']:>6d} {mtp:>11s}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    """``planner gpus``: the GPU profiles with memory and dense peaks (``--provenance``: what
    backs each profile's efficiencies)."""
    if args.provenance:
        return _provenance(args)
    rows: list[dict[str, Any]] = []
    for name in hardware_profiles.names("gpus"):
        g = GPU.preset(name)
        rows.append({"name": name, "memory_gib": g.memory_bytes / GIB,
                     "memory_bandwidth_gb_per_s": g.memory_bandwidth_bytes_per_s / 1e9,
                     "peak_tflops": {d: f / 1e12 for d, f in g.peak_flops_by_dtype},
                     "description": g.description})
    if args.json:
        print_json(rows)
        return 0
    width = max(len("gpu"), *(len(r["name"]) for r in rows))
    print(f"{'gpu':<{width}s} {'memory':>8s} {'HBM GB/s':>9s} {'bf16':>7s} {'fp16':>7s} "
          f"{'fp8':>7s}  (dense TFLOP/s)")
    for r in rows:
        pk = r["peak_tflops"]
        cells = " ".join(f"{pk[d]:>7.0f}" if d in pk else f"{'-':>7s}" for d in
                         ("bf16", "fp16", "fp8"))
        print(f"{r['name']:<{width}s} {r['memory_gib']:>4.0f} GiB "
              f"{r['memory_bandwidth_gb_per_s']:>9.0f} {cells}")
    return 0


#: The efficiencies ``--provenance`` shows, by their ``[efficiency]`` key.
SHOWN = (("gemm", "matmul"), ("gemm_fp8", "fp8 matmul"), ("gemm_fp4", "fp4 matmul"),
         ("memory", "memory"), ("attention", "attention"))


def _shown(eff: dict[str, str], key: str) -> str:
    """A ``--provenance`` cell: the efficiency's status, "-" where the profile has none; the
    attention column covers every fused-attention kernel the profile gives (FlashAttention-2,
    the vendor's, AOTriton): "partly" where some are measured and some assumed."""
    if key != "attention":
        return eff.get(key, "-")
    states = {v for k, v in eff.items() if k.startswith("attention")}
    return "-" if not states else states.pop() if len(states) == 1 else "partly"


def _provenance(args: argparse.Namespace) -> int:
    """``planner gpus --provenance``: measured or assumed, per GPU and efficiency."""
    rows = [hardware_profiles.provenance(n) for n in hardware_profiles.names("gpus")]
    if args.json:
        print_json(rows)
        return 0
    width = max(len("gpu"), *(len(r["name"]) for r in rows))
    head = " ".join(f"{label:>10s}" for _, label in SHOWN)
    print(f"{'gpu':<{width}s} {head}  {'scale-up link':<32s} published runs of its generation")
    for r in rows:
        cells = " ".join(f"{_shown(r['efficiency'], k):>10s}" for k, _ in SHOWN)
        link = f"{r['link']} {r['link_efficiency']}"
        arch = r["architecture"] or "no architecture"
        runs = (f"none ({arch}): bands extrapolated" if not r["runs"] else
                f"{r['runs']} ({arch})" if r["fitted_runs"] == r["runs"] else
                f"{r['runs']} ({arch}), {r['fitted_runs']} fitted on" if r["fitted_runs"] else
                f"{r['runs']} ({arch}), none fitted on (one source per trainer): "
                "bands extrapolated")
        print(f"{r['name']:<{width}s} {cells}  {link:<32s} {runs}")
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:
    """``planner clusters``: the cluster presets."""
    rows = [hardware_profiles.load("clusters", n) for n in hardware_profiles.names("clusters")]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        domain = (f" ({r['gpus_per_domain']} per {r['intra_node_link']} domain)"
                  if r.get("gpus_per_domain", r["gpus_per_node"]) != r["gpus_per_node"] else "")
        print(f"{r['name']:<11s} {r['gpus_per_node']} x {r['gpu']} per node{domain}, "
              f"{r['intra_node_link']} + {r['nics_per_node']} x {r['inter_node_link']}: "
              f"{r['description']}")
    return 0

"""``planner profile``: measure this GPU (or the CPU) and its links with torch, fit the cost
model's parameters to the times, and write a GPU profile TOML that ``--profile`` plans
with."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel import SpecError
from costmodel.errors import install_hint
from hardware_profiles.files import write_text
from planner.cli.common import add_command, positive_int, print_json
from planner.progress import Progress

if TYPE_CHECKING:
    from costmodel.fitting.measured import Measurements
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner profile -o h100.toml                  # every GPU of this node
  planner profile --device cpu --procs 2 --quick -o cpu.toml
  planner profile --full --gpu h100-sxm -o h100-full.toml
  planner plan --model llama-3-8b --gpus 8 --global-batch-size 256 --seq-len 8192 \
--profile h100.toml"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner profile`` to ``sub``."""
    prof = add_command(
        sub, "profile",
        help="measure this GPU (or CPU) and its links; write a profile to plan with",
        description="Measure, with torch, matmul throughput over a grid of shapes per dtype, "
        "fused attention against sequence length and head dimension, memory bandwidth, "
        "pinned host-device bandwidth and, with more than one process, all-reduce, "
        "all-gather, reduce-scatter, all-to-all and send/recv against message size (NCCL on "
        "GPUs, gloo on the CPU). Fit the cost model's parameters to the times and write a GPU "
        "profile TOML (the hardware_profiles/gpus format, marked as measured, with the date "
        "and the torch and driver versions) that --profile FILE plans with. A sweep "
        "predicted to take over two minutes needs --full.", epilog=EPILOG)
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


def cmd_profile(args: argparse.Namespace) -> int:
    """``planner profile``: measure this machine and write a GPU profile TOML."""
    from costmodel.fitting.measured import fit_profile, profile_toml
    from planner.profile import profile

    if importlib.util.find_spec("torch") is None:
        raise SpecError("planner profile measures with torch, which is not installed: "
                        f"{install_hint('torch')}")
    sweep = "quick" if args.quick else "full" if args.full else "standard"
    with Progress("profiling") as bar:
        meas = profile(args.device, sweep=sweep, processes=args.procs, gpu=args.gpu,
                       full=args.full, progress=bar)
    table = fit_profile(meas)
    name = str(table["name"])
    out = Path(args.output or f"{name}-{datetime.date.today().isoformat()}.toml")
    write_text(out, profile_toml(meas, table), "profile")
    if args.json:
        summary = {k: v for k, v in table.items() if k != "measured"}
        print_json({"written": str(out), "duration_s": meas.duration_s, "profile": summary,
                    "fit": table["measured"]["fit"]})
        return 0
    _print_profile(meas, table, sweep)
    print(f"written to {out}; plan with it: planner plan ... --profile {out}")
    return 0


def _print_profile(meas: Measurements, table: dict[str, Any], sweep: str) -> None:
    """What was measured and fitted: matmuls, attention, memory and the links."""
    fit = table["measured"]["fit"]
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

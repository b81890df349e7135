"""Collectives on scale-up domains and across them: the model against published bus bandwidths.

    python benchmarks/scale_up_collectives.py [--data benchmarks/data/collectives-scale-up.json]

For every published point (rccl-tests / nccl-tests and their equivalents on 8 MI300X, a pair
of MI300X, 2 x 8 MI300X, 4 x 8 B200, 8 B200, 8 H100) prints the bus bandwidth measured and the
bus bandwidth ``costmodel.formulas.comm.Topology`` gives the same group on the shipped link
profiles, and their ratio. The mesh rule (a group of k MI300X drives k - 1 of its 7 xGMI links)
shows in the pair's single link; the NVSwitch-reduction (NVLS) rows show what the ring/tree
model leaves out inside one NVLink node.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.fitting.measured import bus_bandwidth  # noqa: E402
from costmodel.formulas.comm import Topology  # noqa: E402
from costmodel.hardware import Cluster  # noqa: E402


def predicted_bus_gb_per_s(series: dict, nbytes: int) -> float:
    """The model's bus bandwidth (GB/s) for one point of ``series``."""
    topo = Topology.of(Cluster(**series["cluster"]))
    n = int(series["ranks"])
    if series["op"] == "send_recv":
        seconds = float(topo.p2p(float(nbytes), np.array(1.0)))
    else:
        seconds = float(getattr(topo, series["op"])(float(nbytes), float(n), 1.0))
    return bus_bandwidth(series["op"], nbytes, n, seconds) / 1e9


def print_series(series: list[dict], width: int = 24) -> None:
    """Each published point of ``series`` beside the model's bus bandwidth, a line each."""
    print(f"{'series':<{width}s} {'bytes':>12s} {'measured GB/s':>14s} {'model GB/s':>11s} "
          f"{'model/measured':>15s}")
    for s in series:
        for nbytes, measured in s["points"]:
            model = predicted_bus_gb_per_s(s, int(nbytes))
            print(f"{s['id']:<{width}s} {int(nbytes):>12d} {measured:>14.2f} {model:>11.2f} "
                  f"{model / measured:>15.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks/data/collectives-scale-up.json"))
    args = ap.parse_args(argv)
    print_series(json.loads(Path(args.data).read_text())["series"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

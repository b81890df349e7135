"""Collective times against published nccl-tests curves, and the fit of a link's latencies.

    python benchmarks/nccl_curves.py [--data benchmarks/data/nccl-tests-a100-8gpu.json]
                                     [--min-bytes 16777216]

Prints, per message size of each published series, the measured time and what the link
profile the file names predicts (``costmodel.formulas.comm.Topology``, a group of the file's ranks
inside
one node), then fits the link's Simple-protocol per-hop latency to the points of at least
``--min-bytes`` (``costmodel.fitting.measured.fit_link``), holding its achieved bandwidth and its LL
latency (NCCL's): the value ``hardware_profiles/links/<link>.toml`` carries as
``simple_latency_us``. Small messages are left out of the fit: the sweeps time them with the
host's launch cost in them (a 32 KiB all-reduce takes 44 us), which a captured or overlapped
training step does not pay per call.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel.fitting.measured import (  # noqa: E402
    CollectivePoint,
    _predict_collectives,
    bus_bandwidth,
    fit_link,
)
from costmodel.formulas.comm import Topology  # noqa: E402
from costmodel.hardware import Cluster, Link  # noqa: E402


def points(data: dict) -> list[tuple[str, CollectivePoint]]:
    """(series id, point) for every published point: times as given, or from bus bandwidth."""
    op, ranks = data["op"], int(data["ranks"])
    out = []
    for series in data["series"]:
        for p in series["points"]:
            n = int(p["nbytes"])
            if "time_us" in p:
                seconds = float(p["time_us"]) * 1e-6
            else:  # bus bandwidth = nbytes / seconds * factor (nccl-tests PERFORMANCE.md)
                seconds = bus_bandwidth(op, n, ranks, 1.0) / (float(p["bus_gb_per_s"]) * 1e9)
            out.append((series["id"], CollectivePoint(op, ranks, n, seconds)))
    return out


def predict(link: Link, pts: list[CollectivePoint]) -> np.ndarray:
    """Seconds the cost model gives each point, on a node of ``ranks`` GPUs joined by ``link``."""
    ranks = max(p.ranks for p in pts)
    cluster = Cluster(gpu="a100-80gb", num_nodes=1, gpus_per_node=ranks, intra_node_link=link)
    return _predict_collectives(Topology.of(cluster), pts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks/data/nccl-tests-a100-8gpu.json"))
    ap.add_argument("--min-bytes", type=int, default=2**24,
                    help="fit the points of at least this many bytes (default 16 MiB)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    tagged = points(data)
    pts = [p for _, p in tagged]
    link = Link.preset(data["link"])
    fit_pts = [p for p in pts if p.nbytes >= args.min_bytes]
    bw, ll, simple, err = fit_link(fit_pts, bandwidth=link.achieved_bytes_per_s,
                                   ll_latency=link.latency_s)
    fitted = replace(link, latency_s=ll, simple_latency_s=simple)
    shipped = predict(link, pts)
    ours = predict(fitted, pts)
    t = np.array([p.seconds for p in pts])
    print(f"{data['op']} over {data['ranks']} ranks on {link.name} "
          f"({bw / 1e9:.1f} GB/s achieved, held)")
    print(f"{'series':<26s} {'bytes':>12s} {'measured us':>12s} {'profile us':>11s} {'error':>7s}"
          f" {'fit us':>9s} {'error':>7s}")
    for (sid, p), a, b, m in zip(tagged, shipped, ours, t, strict=True):
        print(f"{sid:<26s} {p.nbytes:>12d} {m * 1e6:>12.1f} {a * 1e6:>11.1f} "
              f"{100 * (a / m - 1):>+6.1f}% {b * 1e6:>9.1f} {100 * (b / m - 1):>+6.1f}%")
    sel = np.array([p.nbytes >= args.min_bytes for p in pts])
    for name, pred in (("profile", shipped), ("fit", ours)):
        e = np.abs(pred[sel] / t[sel] - 1)
        print(f"{name:<8s} points >= {args.min_bytes} bytes: mean |error| {100 * e.mean():.1f}%, "
              f"max {100 * e.max():.1f}%")
    print(f"fit: simple_latency_us = {simple * 1e6:.2f} with latency_us = {ll * 1e6:.2f} (LL) "
          f"held (mean |log error| {100 * err:.1f}%)")
    print(f"profile: latency_us = {link.latency_s * 1e6:.2f}, simple_latency_us = "
          f"{(link.simple_latency_s or link.latency_s) * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""MoE token dispatch on real topologies: the model against published all-to-all and DeepEP
measurements.

    python benchmarks/moe_dispatch.py [--data benchmarks/data/moe-dispatch.json]

Two tables. First, nccl-tests ``alltoall_perf`` bus bandwidths on GB200 NVL72, GB300 NVL72
and B300 (inside a host, inside an NVLink domain of 8 and 64 GPUs, and across racks) beside
the bus bandwidth ``costmodel.formulas.comm.Topology.all_to_all`` gives the same group on the
shipped profiles: the ``alltoall`` dispatcher's cost. Second, DeepEP's normal kernels on
H800 (``deepep``): the bottleneck link's bandwidth DeepEP's test prints (NVLink inside a
node, RDMA across) beside the achieved bandwidth of the link the model sends those bytes
over (``costmodel.formulas.moe.dispatch_combine``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale_up_collectives import print_series  # noqa: E402

from costmodel.formulas.comm import Topology  # noqa: E402
from costmodel.hardware import Cluster  # noqa: E402


def deepep_link_gb_per_s(row: dict) -> float:
    """The achieved bandwidth (GB/s per GPU) of the link the model sends a DeepEP row's
    bytes over: the scale-up link among the node's ranks, or the GPU's share of its
    node's NICs."""
    topo = Topology.of(Cluster(**row["cluster"]))
    if row["link"] == "nvlink":
        k = min(int(row["ranks"]), topo.gpus_per_domain)
        return float(topo.intra(float(k))) / 1e9
    return topo.nic_bw_per_gpu / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks/data/moe-dispatch.json"))
    args = ap.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    print("nccl-tests all-to-all, bus bandwidth")
    print_series(data["alltoall"], width=22)
    print("\nDeepEP normal kernels, bottleneck link bandwidth")
    print(f"{'row':<26s} {'link':>6s} {'measured GB/s':>14s} {'model GB/s':>11s} "
          f"{'model/measured':>15s}")
    for r in data["deepep"]:
        model = deepep_link_gb_per_s(r)
        print(f"{r['id']:<26s} {r['link']:>6s} {r['measured_gb_per_s']:>14.2f} {model:>11.2f} "
              f"{model / r['measured_gb_per_s']:>15.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

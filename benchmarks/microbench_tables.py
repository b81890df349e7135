"""The published microbenchmarks behind the newer GPU profiles' efficiencies, beside what the
profiles carry.

    python benchmarks/microbench_tables.py [--data benchmarks/data/microbench-frontier.json]

Each row: the GPU, the ``[efficiency]`` key, the measured figure over the datasheet peak it is
divided by, that fraction, the profile's value (the two agree: tests/test_scale_up.py), and
the source. Then the assumed efficiencies taken from a sibling GPU of the same die times a
ratio measured on both in one harness (``same_die``), and, per GPU, the efficiencies the
profile still assumes (``planner gpus --provenance``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hardware_profiles  # noqa: E402


def fraction(row: dict) -> float:
    """A row's efficiency: measured / peak, and for a fused-attention row measured at ``keys``
    key tokens, times ``1 + fixed_keys / keys``: the long-sequence fraction the cost model's
    attention shape takes (``costmodel.formulas.roofline.flash_attention_time``)."""
    frac = row["measured"] / row["peak"]
    if "keys" not in row:
        return frac
    shape = hardware_profiles.load_software()["fused_attention"]
    fixed = shape["backward_fixed_keys" if row["key"].endswith("backward")
                  else "forward_fixed_keys"]
    return frac * (1.0 + float(fixed) / float(row["keys"]))


def same_die_ratio(entry: dict) -> float:
    """How much faster ``entry["gpu"]`` ran than its same-die sibling ``entry["of"]`` in one
    harness: the sum of its measured figures over the sibling's."""
    m = entry["measured"]
    return sum(m[entry["gpu"]]) / sum(m[entry["of"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks/data/microbench-frontier.json"))
    args = ap.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    rows = data["rows"]
    print(f"{'gpu':<8s} {'efficiency':<24s} {'measured':>18s} {'fraction':>9s} {'profile':>8s}"
          "  source")
    for r in rows:
        prof = hardware_profiles.load("gpus", r["gpu"], calibrated=False)["efficiency"][r["key"]]
        got = f"{r['measured']:g} / {r['peak']:g}"
        print(f"{r['gpu']:<8s} {r['key']:<24s} {got:>18s} {fraction(r):>9.3f} "
              f"{prof:>8.3f}  {r['source'][:100]}")
    scaled = data.get("same_die", [])
    if scaled:
        print("\nassumed from a sibling of the same die, times a ratio measured on both:")
    for e in scaled:
        ratio = same_die_ratio(e)
        theirs = hardware_profiles.load("gpus", e["of"], calibrated=False)["efficiency"]
        ours = hardware_profiles.load("gpus", e["gpu"], calibrated=False)["efficiency"]
        for key in e["keys"]:
            print(f"{e['gpu']:<8s} {key:<24s} {e['of']} {theirs[key]:.4f} x {ratio:.4f} = "
                  f"{theirs[key] * ratio:.4f}, profile {ours[key]:.4f}  {e['source'][:80]}")
    print()
    for gpu in sorted({r["gpu"] for r in rows}):
        p = hardware_profiles.provenance(gpu)
        assumed = [k for k, v in p["efficiency"].items() if v == "assumed"]
        print(f"{gpu}: still assumed: {', '.join(assumed) or 'none'}; {p['link']} efficiency "
              f"{p['link_efficiency']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

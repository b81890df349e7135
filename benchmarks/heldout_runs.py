"""Published runs held out of the fit altogether, predicted with the shipped fit.

    python benchmarks/heldout_runs.py [--data benchmarks/data/mlperf-training-blackwell.json]

Prints ``planner validate --runs FILE --summary`` for the file: its runs' error under a fit
that never saw their source (MLPerf Training v5.0/v5.1 Llama 3.1 runs of NVIDIA's code on
B200, B300, GB200 and GB300 by default), and the table per GPU generation and trainer.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks/data/mlperf-training-blackwell.json"))
    args = ap.parse_args(argv)
    return subprocess.run([sys.executable, "-m", "planner", "validate", "--runs",
                           str(Path(args.data).resolve()), "--summary"], cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())

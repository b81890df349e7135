"""Configurations per second that the vectorized cost model (memory + step time) evaluates.

Builds the configuration table of a realistic search directly as numpy columns (Llama-3-70B on
1,024 H100s: every tp, pp, cp, dp, ZeRO stage, sequence parallel, micro-batch, schedule,
virtual stages and recompute mode that the divisibility rules allow), repeated to about a
million rows, and times ``costmodel.formulas.tables.evaluate`` (``memory_table`` + ``time_table``)
on it.

    python benchmarks/costmodel_throughput.py [--rows N]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from costmodel import Cluster, Job, ModelSpec
from costmodel.formulas.memory import SCHEDULE_CODES, ConfigArrays
from costmodel.formulas.tables import evaluate


def grid(model: ModelSpec, gpus: int, job: Job) -> ConfigArrays:
    """Every configuration of the space that the divisibility rules allow, as columns."""
    rows = []
    for tp, pp, cp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4)):
        if gpus % (tp * pp * cp) or model.num_heads % tp or model.num_kv_heads % tp:
            continue
        dp = gpus // (tp * pp * cp)
        for zero, sp, mbs, rec in itertools.product((0, 1, 2, 3), (0, 1), (1, 2, 4, 8),
                                                     (0, 1, 2)):
            if (sp and tp == 1) or job.global_batch_size % (dp * mbs):
                continue
            for sched, v in ((0, 1), (1, 2), (1, 4), (2, 1), (3, 1)):
                if pp == 1 and (sched or v > 1):
                    continue
                if model.num_layers % (pp * v):
                    continue
                rows.append((dp, tp, pp, cp, zero, sp, mbs, sched, v, rec))
    t = np.array(rows, dtype=np.int64)
    index, count, layers, start = ConfigArrays.uniform_stages(model.num_layers, t[:, 2])
    return ConfigArrays(
        dp=t[:, 0], tp=t[:, 1], pp=t[:, 2], cp=t[:, 3], ep=np.ones(len(t), dtype=np.int64),
        zero=t[:, 4], shard=np.where(t[:, 4] > 0, t[:, 0] * t[:, 3], 1), sp=t[:, 5],
        mbs=t[:, 6], schedule=t[:, 7], v=t[:, 8], recompute=t[:, 9],
        recompute_layers=np.zeros(len(t), dtype=np.int64),
        offload=np.zeros(len(t), dtype=np.int64), stage_layers=layers, stage_index=index,
        stage_count=count, stage_start=start,
    )


def tile(a: ConfigArrays, rows: int) -> ConfigArrays:
    """``a`` repeated until it has at least ``rows`` rows."""
    reps = -(-rows // a.rows)
    return ConfigArrays(**{k: np.concatenate([getattr(a, k)] * reps)
                           for k in a.__dataclass_fields__ if getattr(a, k) is not None})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = ModelSpec.preset("llama-3-70b")
    cluster = Cluster.preset("dgx-h100", num_nodes=128)
    job = Job(global_batch_size=1024, seq_len=8192, framework="megatron")
    base = grid(model, cluster.num_gpus, job)
    a = tile(base, args.rows)
    assert set(SCHEDULE_CODES.values()) >= set(np.unique(a.schedule).tolist())
    print(f"space: {base.rows} distinct configurations of llama-3-70b on {cluster.num_gpus} "
          f"GPUs, tiled to {a.rows} rows (pipeline width {a.stage_layers.shape[1]})")
    # The search's pass over the whole space times each pipeline by its lower bound (exact for
    # equal stages) and plays the schedule out only for the rows that can still win
    # (planner.search); the second figure plays out every row's schedule.
    for label, exact_below in (("pipeline bound, the search's pass", -np.inf),
                               ("every schedule played out", np.inf)):
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            table = evaluate(model, cluster, job, a, exact_below=exact_below)
            best = min(best, time.perf_counter() - t0)
        print(f"memory + step time ({label}) for {a.rows} rows: {best:.3f} s "
              f"= {a.rows / best:,.0f} configurations per second (best of {args.repeat})")
    fits = int((table.peak_memory <= cluster.gpu.memory_bytes).sum())
    print(f"fastest step {table.step_time.min():.2f} s; {fits} rows fit in memory")


if __name__ == "__main__":
    main()

"""The cost model over a whole table of configurations, per row: what the search reads.

``evaluate`` runs ``memory_table`` and ``time_table`` (the same code ``estimate()`` runs on a
table of one) in chunks of rows that fit in cache; with the representative stage columns of
``ConfigArrays.uniform_stages`` the per-stage arrays are at most four wide whatever the
pipeline degree.

The tables' temporaries are arrays of a chunk's rows (a few hundred kB each), above glibc's
default threshold (128 kB) for serving an allocation by a fresh ``mmap``: every temporary would
then be mapped, page-faulted in and unmapped again, which costs more than the arithmetic on it.
``evaluate`` raises that threshold once per process (``_keep_chunks_in_heap``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

import numpy as np

from costmodel.config import Job
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import ConfigArrays, MemoryTable, memory_table
from costmodel.formulas.steptime import TIME_TERMS, model_flops_per_token, time_table
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec

__all__ = ["CostTable", "evaluate", "take"]

CHUNK_ROWS = 32768


@dataclass(frozen=True)
class CostTable:
    """Per-row results: peak memory per GPU (bytes) and its stage, step time (s) and its terms
    (``terms[name]``, seconds, summing to ``step_time``), model FLOPs of a step (all GPUs),
    ``cpu_memory``, what offload keeps in host memory per GPU (bytes), and ``floor``, a lower
    bound on the step time (``costmodel.formulas.steptime.TimeTable.floor``).
    Rows over the memory capacity given to ``evaluate`` have ``inf`` times and ``nan`` terms.
    ``exact``: whether the row's step time is its schedule played out; where not (a row whose
    lower bound exceeded ``evaluate``'s ``exact_below``) it is that lower bound.
    """

    peak_memory: np.ndarray
    peak_stage: np.ndarray
    step_time: np.ndarray
    terms: dict[str, np.ndarray]
    model_flops: float
    floor: np.ndarray
    cpu_memory: np.ndarray
    exact: np.ndarray


def take(a: ConfigArrays, rows: np.ndarray, width: int | None = None) -> ConfigArrays:
    """The sub-table of ``rows``, its stage columns cut to the first ``width``
    (``ConfigArrays.take``)."""
    return a.take(rows, width)


def _take_memory(mem: MemoryTable, rows: np.ndarray) -> MemoryTable:
    """The rows ``rows`` of a memory table (the last axis of its stage-major arrays)."""
    arrays: dict[str, np.ndarray] = {f.name: np.take(getattr(mem, f.name), rows, axis=-1)
                                     for f in fields(mem) if f.name != "terms"}
    return MemoryTable(terms={k: np.take(v, rows, axis=-1) for k, v in mem.terms.items()},
                       **arrays)


def _chunks(width: np.ndarray, chunk_rows: int) -> list[tuple[int, np.ndarray]]:
    """Row chunks of at most ``chunk_rows`` rows sharing a stage-column width."""
    out = []
    # The widths present (a bincount: np.unique sorts or hashes every row).
    for w in np.flatnonzero(np.bincount(width)):
        idx = np.flatnonzero(width == w)
        out += [(int(w), idx[i:i + chunk_rows]) for i in range(0, len(idx), chunk_rows)]
    return out


@functools.cache
def _keep_chunks_in_heap() -> bool:
    """Let glibc's malloc serve allocations up to 32 MiB from its heap and keep up to 64 MiB
    of freed heap (its ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``, mallopt(3)), so that the
    chunks' temporaries reuse memory instead of each being mapped by ``mmap`` and faulted in
    page by page. Measured on Llama-3-70B's space (``benchmarks/costmodel_throughput.py``):
    1.7-1.9x the configurations per second. Once per process; a no-op (False) off Linux or
    where the C library has no ``mallopt`` (musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) & bool(mallopt(m_trim_threshold, 64 << 20))


def evaluate(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, a: ConfigArrays,
             chunk_rows: int = CHUNK_ROWS, threads: int | None = None,
             capacity: float | None = None, host_capacity: float = np.inf,
             exact_below: float = np.inf) -> CostTable:
    """Memory and step time of every row of ``a`` (rows assumed valid).

    ``threads``: worker threads over the chunks (default: one per CPU core). ``capacity``
    (bytes per GPU): rows whose peak memory exceeds it, or whose offloaded states exceed
    ``host_capacity`` (host bytes per GPU), are not timed. ``exact_below`` (s): rows whose
    lower bound on the step time exceeds it keep that bound instead of their pipeline schedule
    played out (``costmodel.formulas.steptime.time_table``); ``-inf``: bounds only.
    """
    _keep_chunks_in_heap()
    n = a.rows
    peak = np.empty(n)
    peak_stage = np.empty(n, dtype=np.int64)
    cpu = np.empty(n)
    step = np.full(n, np.inf)
    floor = np.full(n, np.inf)
    exact = np.ones(n, dtype=bool)
    terms = {t: np.full(n, np.nan) for t in TIME_TERMS}
    width = (a.stage_count > 0).sum(axis=1)

    def run(chunk: tuple[int, np.ndarray]) -> None:
        w, rows = chunk
        sub = take(a, rows, w)
        mem = memory_table(model, cluster, job, sub)
        # Each chunk writes its own rows of the outputs.
        peak[rows] = mem.peak
        cpu[rows] = mem.cpu.max(axis=0)
        # The peak stage's index, taken from the stage-major columns at flat positions.
        peak_stage[rows] = np.take(sub.stage_major.index.ravel(),
                                   mem.peak_stage * len(rows) + np.arange(len(rows)))
        if capacity is not None:
            fit = (mem.peak <= capacity) & (cpu[rows] <= host_capacity)
            if not fit.any():
                return
            if not fit.all():
                keep = np.flatnonzero(fit)
                rows, sub, mem = rows[keep], take(sub, keep), _take_memory(mem, keep)
        tt = time_table(model, cluster, job, sub, mem, detail=False, exact_below=exact_below)
        step[rows] = tt.step_time
        exact[rows] = tt.exact
        floor[rows] = tt.floor
        for t in TIME_TERMS:
            terms[t][rows] = tt.terms[t]

    chunks = _chunks(width, chunk_rows)
    workers = min(len(chunks), max(1, threads if threads is not None else os.cpu_count() or 1))
    if workers > 1:
        # numpy releases the GIL inside its loops, so chunks run in parallel on threads.
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, chunks))
    else:
        for c in chunks:
            run(c)
    return CostTable(peak_memory=peak, peak_stage=peak_stage, step_time=step, terms=terms,
                     model_flops=model_flops_per_token(model, job.seq_len) * job.tokens_per_step,
                     floor=floor, cpu_memory=cpu, exact=exact)

"""The pipeline's time of every row of a table of configurations at once: a cheap lower
bound (``pipeline_bound``, exact for equal stages) that lets a search time only the rows that
can win, the overlapped pairs each rank runs (``pairs``), and the exact longest path of the
rows that need it (``table_makespan``: ``costmodel.formulas.pipeline.makespan`` grouped by
shape). ``tests/test_pipeline.py`` checks the bound below the event simulation.

Stage columns as ``costmodel.formulas.arrays.ConfigArrays`` has them, stage-major ``[W,
rows]``: column ``c`` stands for ranks ``index[c] .. index[c] + count[c] - 1`` (count 0:
padding), in ascending order of ``index``.
"""

from __future__ import annotations

import numpy as np

from costmodel.formulas.arrays import SCHEDULE_CODES, is_v, stage_cumsum
from costmodel.formulas.pipeline import makespan


def _before(x: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per column, ``x`` summed over every rank before the column's last rank."""
    return stage_cumsum(count * x) - np.where(count > 0, x, 0.0)


def pipeline_bound(t: np.ndarray, f: np.ndarray | None, count: np.ndarray, m: np.ndarray,
                   v: np.ndarray, schedule: np.ndarray, hidden: np.ndarray | None = None
                   ) -> np.ndarray:
    """A lower bound (s) on the pipeline's time of each row, exact for GPipe and for equal
    stages under every schedule but the V-shaped ones (interleaved: for one micro-batch or
    at least ``p``). ``t`` ``[W, rows]``: each stage's seconds per micro-batch; ``f``: its
    forward part (``None``: unknown); ``schedule``: ``SCHEDULE_CODES`` of
    ``costmodel.formulas.memory``; ``hidden``: what an overlapped pair saves per micro-batch
    (``simulate``; ``None``: nothing), taken off each rank's work for its pairs
    (``_pairs``; exact without a pipeline, where combined 1F1B's bound is its time).

    Rank ``r`` starts once micro-batch 0's first chunk has passed the ranks before it, then
    works ``m t_r``; under 1F1B, interleaved 1F1B and GPipe its last op is a backward of chunk
    0, which the ranks before it then run in turn: ``max_r (m t_r + sum_{k<r} t_k / v)``. Zero
    bubble ends rank r with ``min(r + 1, m)`` weight gradients ``W_r`` after its last input
    gradient, which the ranks before it then run, and rank 0 its weight gradient:
    ``max_r (m t_r + sum_{k<r} F_k + max(0, sum_{k<r} B_k - min(r + 1, m) W_r + W_0))``, with
    ``B = W`` half the backward (``rank_orders``). And every micro-batch goes through every
    stage and back. GPipe (``makespan``) in closed form. ``f`` unknown (a bound for a family
    of configurations): zero bubble counts ``m t_r`` only."""
    on = count > 0
    zb = schedule == 3
    vf = v.astype(float)
    head = _before(t, count) / vf
    # Every micro-batch runs forward through all stages and back: the sum of their times (zero
    # bubble: the input gradients, and rank 0's weight gradient after its own).
    path = (count * t).sum(axis=0)
    if f is not None:
        # Zero bubble's rows alone (a few of a search's), written into theirs.
        rows = np.flatnonzero(zb)
        if rows.size:
            def of(x: np.ndarray) -> np.ndarray:
                return x if np.ndim(x) == 0 else np.take(x, rows, axis=-1)
            t_z, f_z, c_z = of(t), of(f), of(count)
            half = (t_z - f_z) / 2  # zero bubble's B and W
            # Rank r's last input gradient (micro-batch m - 1) is followed by min(r + 1, m)
            # weight gradients of its own, and the ranks before it then run that input
            # gradient in turn and rank 0 its weight gradient.
            r = stage_cumsum(c_z) - 1
            tail = _before(half, c_z) - np.minimum(r + 1, of(m)) * half \
                + np.where(r > 0, half[0], 0)
            head[:, rows] = _before(f_z, c_z) + np.maximum(tail, 0.0)
            path[rows] = (c_z * (f_z + half)).sum(axis=0) + half[0]
    else:
        head = np.where(zb, 0.0, head)
        path = np.where(zb, 0.0, path)
    vee = is_v(schedule)
    if vee.any():
        # V-shaped rows: rank r starts after micro-batch 0's chunk-0 forwards on the ranks
        # before it, then works m t_r less what its overlapped pairs save (``hidden``, all
        # of them at most one per micro-batch); no path term (a weight gradient may end
        # the step anywhere).
        start = 0.0 if f is None else _before(f, count) / vf
        head = np.where(vee, start, head)
        path = np.where(vee, 0.0, path)
    work = m * t
    if hidden is not None:
        work = work - pairs(count, m, v, schedule) * hidden / vf
    comb = schedule == SCHEDULE_CODES["combined-1f1b"]
    path = np.where(comb, 0.0, path)  # a pair may carry a micro-batch faster than alone
    out = np.maximum(np.where(on, work + head, -np.inf).max(axis=0), path)
    if f is not None and (schedule == 2).any():
        b = t - f
        gp = ((count * t).sum(axis=0)
              + (m - 1) * (np.where(on, f, 0).max(axis=0) + np.where(on, b, 0).max(axis=0)))
        out = np.where(schedule == 2, gp, out)
    return out


def pairs(count: np.ndarray, m: np.ndarray, v: np.ndarray, schedule: np.ndarray
           ) -> np.ndarray:
    """Per stage column, the most overlapped pairs a rank of it runs (its last rank's): under
    DualPipeV ``2 m - 3 p + 1 + min(r, p - 2)`` (counted from torch's op order,
    ``vschedules._dualpipev``, for every p and m it takes; ZB-V pairs nothing), and under
    combined 1F1B every chunk-micro-batch past the warm-up (``_combined_order``): ``m v -
    min((v - 1) k + 2 (p - r - 1) + 1, m v)``, ``m - 1`` without a pipeline."""
    r = stage_cumsum(count) - 1
    p = count.sum(axis=0)
    k = m // np.maximum(1, m // p)
    warm = np.where(v > 1, (v - 1) * k + 2 * (p - r - 1), 0) + 1
    comb = np.maximum(m * v - np.minimum(warm, m * v), 0)
    dual = np.clip(2 * m - 3 * p + 1 + np.minimum(r, p - 2), 0, m * v)
    return np.where(schedule == SCHEDULE_CODES["combined-1f1b"], comb,
                    np.where(schedule == SCHEDULE_CODES["dualpipev"], dual, 0)).astype(float)


_NAMES = {code: name for name, code in SCHEDULE_CODES.items()}


def table_makespan(f: np.ndarray, b: np.ndarray, index: np.ndarray, count: np.ndarray,
                   pp: np.ndarray, m: np.ndarray, v: np.ndarray, schedule: np.ndarray,
                   rows: np.ndarray, hidden: np.ndarray | None = None) -> np.ndarray:
    """``makespan`` of the rows ``rows`` of a table (stage columns ``[W, rows]``, forward and
    backward seconds per micro-batch, and what an overlapped pair saves), grouped by shape;
    returns one value per entry of ``rows``."""
    out = np.empty(len(rows))
    if not len(rows):
        return out
    shapes = np.stack([pp[rows], m[rows], v[rows], schedule[rows]], axis=1).astype(np.int64)
    uniq, inv = np.unique(shapes, axis=0, return_inverse=True)
    for g, (p, mm, vv, s) in enumerate(uniq):
        sel = np.flatnonzero(inv.ravel() == g)
        r = rows[sel]
        ranks = np.arange(p)[:, None]
        col = np.zeros((p, len(r)), dtype=np.int64)
        for c in range(index.shape[0]):
            lo, n = index[c, r], count[c, r]
            col = np.where((ranks >= lo) & (ranks < lo + n), c, col)
        fr = np.take_along_axis(f[:, r], col, axis=0)
        br = np.take_along_axis(b[:, r], col, axis=0)
        parts = [fr, br]
        if hidden is not None:
            parts.append(np.take_along_axis(hidden[:, r], col, axis=0))
        # Configurations that differ only after the last backward share their stage times.
        w, back = np.unique(np.concatenate(parts, axis=0), axis=1, return_inverse=True)
        h = w[2 * p:] if hidden is not None else None
        out[sel] = makespan(w[:p], w[p:2 * p], int(mm), _NAMES[int(s)], int(vv),
                            h)[back.ravel()]
    return out

"""Brute force for the search oracles: ``estimate()`` of every row of a space."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from costmodel import Cluster, Job, estimate
from planner.space import Space, row_config


def fastest_that_fits(model: Any, cluster: Cluster, job: Job, space: Space
                      ) -> tuple[float, float, tuple[int, ...]] | None:
    """(step seconds, peak bytes, row) of the fastest row of ``space`` that fits within
    the job's memory reserve, ties by memory then the row; ``None`` when none fits."""
    best = None
    for r in space.table:
        e = estimate(model, cluster, job, row_config(np.asarray(r), model))
        if e.fits and e.within_reserve:  # what a plan keeps free (Job.memory_reserve)
            assert e.step_time_s is not None
            k = (e.step_time_s, e.peak_memory_bytes, tuple(int(x) for x in r))
            best = k if best is None or k < best else best
    return best


def half_fitting(model: Any, cluster: Cluster, job: Job, space: Space) -> Cluster:
    """``cluster`` with GPUs whose memory is the median peak of ``space``'s rows: about half
    of the space fits, so the search's memory pruning is exercised."""
    from costmodel.formulas.tables import evaluate
    from costmodel.hardware import GPU
    from planner.space import arrays

    peaks = evaluate(model, cluster, job, arrays(model, space.table)).peak_memory
    gpu = dataclasses.replace(GPU.preset(cluster.gpu.name), memory_bytes=float(np.median(peaks)))
    return dataclasses.replace(cluster, gpu=gpu)


def search_equals_brute_force(model: Any, cluster: Cluster, job: Job, cons: Any) -> Space:
    """On GPUs with memory for about half of ``cons``' space (``half_fitting``), the plan
    ``planner.plan`` finds (without the stage DP) is the fastest row that fits by
    ``estimate()`` (``fastest_that_fits``), step time and configuration; returns the space."""
    import planner
    from planner.space import build_space

    space = build_space(model, cluster, job, cons)
    small = half_fitting(model, cluster, job, space)
    best = fastest_that_fits(model, small, job, space)
    p = planner.plan(model, small, job, constraints=cons, partition=False)
    assert best is not None
    assert p.estimate.step_time_s == best[0]
    assert p.config == row_config(np.asarray(best[2]), model)
    return space

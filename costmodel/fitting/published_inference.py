"""Published serving measurements and what the inference cost model predicts for them.

``costmodel/data/inference_runs.json`` holds each run's source, quoted row, model, GPU,
``InferenceJob`` and ``InferenceConfig`` fields and one measured metric. Nothing is fitted to
them: ``benchmarks/inference_accuracy.py`` prints prediction against measurement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from costmodel.errors import SpecError
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import (
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    estimate_inference,
)

__all__ = ["METRICS", "InferenceComparison", "InferenceRun", "compare_inference",
           "load_inference_runs"]

#: Metric name -> (unit, how it is read from an estimate).
METRICS = {
    "tokens_per_s": ("tokens/s", lambda e: e.tokens_per_s),
    "tpot_ms": ("ms", lambda e: 1e3 * e.tpot_s),
    "ttft_ms": ("ms", lambda e: 1e3 * e.ttft_s),
    "latency_ms": ("ms", lambda e: 1e3 * e.latency_s),
}


@dataclass(frozen=True)
class InferenceRun:
    """One published measurement: ``published`` in the unit of ``metric``."""

    id: str
    source: str
    quote: str
    model: ModelSpec
    cluster: Cluster
    job: InferenceJob
    config: InferenceConfig
    metric: str
    published: float
    note: str = ""


@dataclass(frozen=True)
class InferenceComparison:
    """A run, the estimate for it and the prediction of its metric; ``error`` is
    ``predicted / published - 1``."""

    run: InferenceRun
    estimate: InferenceEstimate
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.run.published - 1.0


def _run(d: dict[str, Any]) -> InferenceRun:
    model = d["model"]
    spec = ModelSpec.preset(model) if isinstance(model, str) else ModelSpec(**model)
    cfg = InferenceConfig(**d["config"])
    if d["metric"] not in METRICS:
        raise SpecError(f"run {d['id']}: unknown metric {d['metric']!r}")
    cluster = Cluster(gpu=d["gpu"], gpus_per_node=8,
                      num_nodes=max(1, -(-cfg.world_size // 8)))
    return InferenceRun(id=d["id"], source=d["source"], quote=d["quote"], model=spec,
                        cluster=cluster, job=InferenceJob(**d["job"]), config=cfg,
                        metric=d["metric"], published=float(d["published"]),
                        note=d.get("note", ""))


def load_inference_runs() -> list[InferenceRun]:
    """The shipped runs."""
    path = resources.files("costmodel").joinpath("data/inference_runs.json")
    return [_run(d) for d in json.loads(path.read_text())["runs"]]


def compare_inference(runs: list[InferenceRun]) -> list[InferenceComparison]:
    """Each run's prediction under the shipped hardware profiles."""
    out = []
    for r in runs:
        est = estimate_inference(r.model, r.cluster, r.job, r.config)
        out.append(InferenceComparison(run=r, estimate=est,
                                       predicted=float(METRICS[r.metric][1](est))))
    return out

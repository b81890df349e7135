"""Published figures the cost model is checked against, and how a prediction is read off.

The cases live in ``costmodel/data/memory_golden.toml``, each with its source and tolerance.
``benchmarks/memory_accuracy.py`` prints them; the tests assert them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.formulas.estimate import estimate
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.units import UNITS

__all__ = ["GoldenCase", "evaluate", "memory_cases"]



@dataclass(frozen=True, kw_only=True)
class GoldenCase:
    """One published figure: inputs, the quantity compared, its value, unit and tolerance."""

    id: str
    source: str
    model: ModelSpec
    cluster: Cluster
    job: Job
    config: ParallelConfig
    quantity: str
    published: float
    unit: str
    tolerance: float


def _model(spec: dict[str, Any]) -> ModelSpec:
    if "preset" in spec:
        return ModelSpec.preset(spec["preset"])
    return ModelSpec(**spec)


def _cluster(spec: dict[str, Any]) -> Cluster:
    if "preset" in spec:
        rest = {k: v for k, v in spec.items() if k != "preset"}
        return Cluster.preset(spec["preset"], **rest)
    return Cluster(**spec)


def memory_cases() -> list[GoldenCase]:
    """All memory golden cases, in file order."""
    path = resources.files("costmodel").joinpath("data/memory_golden.toml")
    with path.open("rb") as f:
        raw = tomllib.load(f)["case"]
    cluster_gpus: dict[str, int] = {}
    cases = []
    for c in raw:
        cluster = _cluster(c["cluster"])
        cfg = dict(c["config"])
        denom = cfg.get("tp", 1) * cfg.get("pp", 1) * cfg.get("cp", 1)
        cfg.setdefault("dp", cluster.num_gpus // denom)
        cluster_gpus[c["id"]] = cluster.num_gpus
        cases.append(GoldenCase(
            id=c["id"], source=c["source"], model=_model(c["model"]), cluster=cluster,
            job=Job(**c["job"]), config=ParallelConfig(**cfg), quantity=c["quantity"],
            published=float(c["published"]), unit=c["unit"], tolerance=float(c["tolerance"]),
        ))
    return cases


def evaluate(case: GoldenCase) -> float:
    """The estimator's value of ``case.quantity``, in ``case.unit``."""
    est = estimate(case.model, case.cluster, case.job, case.config)
    scale = UNITS[case.unit]
    if case.quantity == "model_states":
        return est.memory.model_states_bytes / scale
    first = est.stages[0]
    if case.quantity == "activations":
        return first.memory.activations_bytes / scale
    if case.quantity == "layer_activations":
        return first.layer_activations_bytes / scale
    if case.quantity == "layer_model_states":
        # Bytes per parameter are uniform for a dense model, so the layers' share of the model
        # states is their share of the parameters.
        share = first.layer_params / (first.layer_params + first.embedding_params)
        return first.memory.model_states_bytes * share / scale
    raise ValueError(f"unknown quantity {case.quantity!r} in case {case.id}")

"""Auto-parallel planner: how to split training of a large model across a cluster.

The public API. ``estimate(model, cluster, job, config)`` says what one configuration costs:
memory per GPU by term and pipeline stage, and step time by term, tokens/s, MFU and HFU.
``plan(model, cluster, job, constraints=..., top_k=5)`` searches every configuration and
returns the fastest that fits as a ``Plan`` (with the runners-up and why the rest lost).
torch is not imported here: ``import planner`` and the CLI work without it.
"""

from costmodel import (
    GPU,
    Cluster,
    Estimate,
    Infeasible,
    Job,
    Link,
    MemoryBreakdown,
    ModelSpec,
    ParallelConfig,
    SpecError,
    StageMemory,
    estimate,
)
from planner.plan import Alternative, Plan, plan
from planner.space import PRESETS, Constraints

__all__ = [
    "GPU",
    "PRESETS",
    "Alternative",
    "Cluster",
    "Constraints",
    "Estimate",
    "Infeasible",
    "Job",
    "Link",
    "MemoryBreakdown",
    "ModelSpec",
    "ParallelConfig",
    "Plan",
    "SpecError",
    "StageMemory",
    "estimate",
    "plan",
]
__version__ = "0.1.0"

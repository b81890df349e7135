"""Auto-parallel planner: how to split training of a large model across a cluster.

The public API. ``estimate(model, cluster, job, config)`` says what one configuration costs:
memory per GPU by term and pipeline stage, and step time by term, tokens/s, MFU and HFU.
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

__all__ = [
    "GPU",
    "Cluster",
    "Estimate",
    "Infeasible",
    "Job",
    "Link",
    "MemoryBreakdown",
    "ModelSpec",
    "ParallelConfig",
    "SpecError",
    "StageMemory",
    "estimate",
]
__version__ = "0.1.0"

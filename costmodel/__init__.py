"""What a configuration costs: model specs, hardware, memory and step-time terms.

Imports ``hardware_profiles``; never imports ``planner``.
"""

from costmodel.config import Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.checks import validate
from costmodel.formulas.estimate import Estimate, MemoryBreakdown, StageMemory, estimate
from costmodel.hardware import GPU, Cluster, Link
from costmodel.model import ModelSpec
from costmodel.serving.inference import (
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    estimate_inference,
)

__all__ = [
    "GPU",
    "Cluster",
    "Estimate",
    "Infeasible",
    "InferenceConfig",
    "InferenceEstimate",
    "InferenceJob",
    "Job",
    "Link",
    "MemoryBreakdown",
    "ModelSpec",
    "ParallelConfig",
    "SpecError",
    "StageMemory",
    "estimate",
    "estimate_inference",
    "validate",
]

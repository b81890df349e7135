"""What a configuration costs: model specs, hardware, memory and step-time terms.

Imports ``hardware_profiles``; never imports ``planner``.
"""

from costmodel.config import Job, ParallelConfig, validate
from costmodel.errors import Infeasible, SpecError
from costmodel.estimate import Estimate, MemoryBreakdown, StageMemory, estimate
from costmodel.hardware import GPU, Cluster, Link
from costmodel.inference import InferenceConfig, InferenceEstimate, InferenceJob, estimate_inference
from costmodel.model import ModelSpec

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

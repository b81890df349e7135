"""Auto-parallel planner: how to split training of a large model across a cluster.

The public API. ``estimate(model, cluster, job, config)`` says what one configuration costs:
memory per GPU by term and pipeline stage, and step time by term, tokens/s, MFU and HFU.
``plan(model, cluster, job, constraints=..., top_k=5)`` searches every configuration and
returns the fastest that fits as a ``Plan`` (with the runners-up and why the rest lost).
``explain(plan)`` says what every other value of each choice would cost; ``compare`` puts
configurations and clusters side by side; ``frontier`` times the whole space (throughput
against memory); ``sweep`` re-plans over the number of GPUs, the inter-node bandwidth or the
GPU; ``timeline`` plays out the pipeline schedule; ``load_model`` reads a preset, a Hugging
Face config.json or ``module:attr``. ``apply(plan, module)`` splits a torch model across the
processes of a torch.distributed job as the plan says (``planner run`` starts them;
``check(plan)`` names what the runtime cannot execute). A torch module of one's own is
planned by the same search: ``plan(module, cluster, job, example_inputs=...)`` traces it and
costs each of its blocks per tensor-parallel degree (``LayerCosts``). Serving:
``plan(model, cluster, InferenceJob(...))`` chooses tp, pp, replicas, weight format and batch;
``estimate_inference`` costs one ``InferenceConfig`` (latency, throughput, memory). Plots are
in ``planner.plots`` (matplotlib, the ``plots`` extra); the interactive SVG figures of the
explorer page (``planner serve``) in ``planner.figures``. torch is not imported here:
``import planner`` and the CLI work without it.
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
from costmodel.formulas.layercosts import LayerCosts
from costmodel.serving.inference import (
    InferenceConfig,
    InferenceEstimate,
    InferenceJob,
    InferenceMemory,
    estimate_inference,
)
from planner.alternatives import Choice, Option
from planner.compare import Candidate, Comparison, compare, parse_config
from planner.explain import Explanation, explain
from planner.explore import Frontier, SweepPoint, frontier, sweep
from planner.models import costs_from_graph, load_model
from planner.plan import Alternative, describe, plan
from planner.progress import Progress
from planner.result import Plan
from planner.runtime import apply
from planner.runtime.checks import check
from planner.space import PRESETS, Constraints
from planner.timeline import Op, Timeline, simulate, timeline
from planner.version import __version__ as __version__

__all__ = [
    "GPU",
    "PRESETS",
    "Alternative",
    "Candidate",
    "Choice",
    "Cluster",
    "Comparison",
    "Constraints",
    "Estimate",
    "Explanation",
    "Frontier",
    "Infeasible",
    "InferenceConfig",
    "InferenceEstimate",
    "InferenceJob",
    "InferenceMemory",
    "Job",
    "LayerCosts",
    "Link",
    "MemoryBreakdown",
    "ModelSpec",
    "Op",
    "Option",
    "ParallelConfig",
    "Plan",
    "Progress",
    "SpecError",
    "StageMemory",
    "SweepPoint",
    "Timeline",
    "apply",
    "check",
    "compare",
    "costs_from_graph",
    "describe",
    "estimate",
    "estimate_inference",
    "explain",
    "frontier",
    "load_model",
    "parse_config",
    "plan",
    "simulate",
    "sweep",
    "timeline",
]

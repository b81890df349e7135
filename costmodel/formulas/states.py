"""Bytes per parameter of the model states each trainer keeps (weights, gradients, optimizer
states with their fp32 master copies), by precision and optimizer: the one definition of
which states are held in fp32 that the memory model, the step time and the planner read.
"""

from __future__ import annotations

from typing import Protocol

import hardware_profiles
from costmodel.config import MASTER_DTYPES, STATE_DTYPES, Job


class Widths(Protocol):
    """What the state sizes read of a model: the width of its layers (a ``ModelSpec`` or
    ``LayerCosts``)."""

    @property
    def hidden_size(self) -> int: ...

__all__ = ["master_bytes", "megatron_grad_bytes", "optimizer_state_bytes", "state_bytes"]


def optimizer_state_bytes(job: Job, model: Widths) -> float:
    """Optimizer state bytes per parameter, without any fp32 master copy.

    Adam/AdamW: fp32 momentum and variance, 8 (Kingma & Ba 2015; ZeRO paper Sec. 3.1).
    8-bit Adam: two uint8 states plus one fp32 absmax per 256-element block per state
    (Dettmers et al. 2022; bitsandbytes/optim/optimizer.py). SGD with momentum: 4.
    Moments in ``Job.optimizer_state_dtype`` (Megatron-LM's precision-aware optimizer keeps
    them in bf16, fp16 or fp8: 2, 2 or 1 byte each; TransformerEngine's FusedAdam, which it
    calls, computes in fp32 and stores in the given dtype).
    Adafactor: no first moment by default and a factored second moment, one row and one column
    vector per matrix (Shazeer & Stern 2018, Alg. 4), at most ``2 / hidden_size`` fp32 values
    per parameter for the transformer's matrices (every dimension is >= hidden_size).
    """
    moment = STATE_DTYPES[job.optimizer_state_dtype]
    if job.optimizer in ("adam", "adamw"):
        return 2 * moment
    if job.optimizer == "adam8bit":
        bnb = hardware_profiles.load_software()["bitsandbytes"]
        return float(bnb["state_bytes_per_param"]) + 2 * 4.0 / float(bnb["block_size"])
    if job.optimizer == "sgd":
        return moment
    return 4.0 * 2.0 / model.hidden_size


def megatron_grad_bytes(job: Job) -> float:
    """Bytes per gradient element Megatron-LM keeps and reduces: fp32 ``main_grad`` with bf16
    and fp8 (megatron/training/arguments.py sets ``accumulate_allreduce_grads_in_fp32`` for
    ``--bf16``), the fp16 ones with fp16, 4 in fp32; ``Job.grad_reduce_in_fp32`` where it is
    set on a mixed-precision job."""
    if job.precision == "fp32":
        return 4.0
    if job.grad_reduce_in_fp32 is not None:
        return 4.0 if job.grad_reduce_in_fp32 else 2.0
    return 2.0 if job.precision == "fp16" else 4.0


def master_bytes(job: Job) -> float:
    """Bytes per parameter of the master weights the optimizer updates
    (``Job.master_weights_dtype``: 4 in fp32, 2 in fp16 with Megatron-LM's
    ``--main-params-dtype fp16``)."""
    return MASTER_DTYPES[job.master_weights_dtype]


def state_bytes(job: Job, model: Widths) -> tuple[float, float, float]:
    """Bytes per parameter of (weights, gradients, optimizer incl. master copies), unsharded.

    See ``costmodel.frameworks`` for the facts: Megatron 2 + 4 + (4 + 8) = 18 in bf16 and
    2 + 2 + (4 + 4 + 8) = 20 in fp16; DeepSpeed 2 + 2 + 12 = 16 (Rajbhandari et al. 2020,
    Fig. 1); torchtitan/FSDP2 4 + 4 + 8 = 16; Megatron's gradients as
    ``Job.grad_reduce_in_fp32`` says where it is set. fp8 keeps bf16 weights (Micikevicius et
    al. 2022) so its states equal bf16's; in fp32 there is no master copy.
    """
    states = optimizer_state_bytes(job, model)
    mixed = job.precision != "fp32"
    if job.framework == "megatron":
        weights = 2.0 if mixed else 4.0
        grads = megatron_grad_bytes(job)
        master = master_bytes(job) if mixed else 0.0
        optim = states + master + (4.0 if job.precision == "fp16" else 0.0)
        return weights, grads, optim
    if job.framework == "deepspeed":
        weights = 2.0 if mixed else 4.0
        return weights, weights, states + (4.0 if mixed else 0.0)
    return 4.0, 4.0, states

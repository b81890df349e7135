"""Roofline primitives: the time of a matmul, a fused attention and a memory-bound kernel on a GPU
(peak rate times the profile's achieved fraction, plus a fixed cost per kernel; Williams et
al. 2009), and the dtypes a job's matmuls run in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hardware_profiles
from costmodel.config import FP4_PRECISIONS, QUANTIZED_PRECISIONS, Job
from costmodel.formulas.states import megatron_grad_bytes
from costmodel.frameworks import framework
from costmodel.hardware import GPU
from costmodel.units import Num

BACKWARD_BYTES = 1.5  # elementwise backward: 3 tensors moved where forward moves 2


FLASH_BACKWARD_FLOPS = 2.5  # FlashAttention backward: 5 matmuls vs 2 forward (Dao 2023)
#: The head dimension the profiles' fused-attention fractions are quoted at, and from which
#: on a wider head runs no faster (software.toml [fused_attention] *_head_dim_exponent).
HEAD_DIM_FULL_RATE = 128.0


#: Bytes a matmul's leading dimensions must be a multiple of for cuBLAS's fast kernels
#: (NVIDIA, "Matrix Multiplication Background User's Guide", Tensor Core requirements).
ALIGN_BYTES = 16


#: Bytes of one element of a quantized matmul's operands, its block scales aside: the scales
#: are tensors of their own (MXFP8's E8M0 per 32 elements, NVFP4's E4M3 per 16), so cuBLAS's
#: alignment is on the elements alone (cuBLASLt's block-scaled FP8 and FP4 matmuls ask for
#: dimensions in multiples of 16 and 32 elements: 16 bytes).
ELEMENT_BYTES = {"fp8": 1.0, "nvfp4": 0.5, "mxfp4": 0.5}


def aligned(n: Num, k: Num, bytes_per_element: float) -> np.ndarray:
    """Whether ``[m, k] x [k, n]`` runs on cuBLAS's fast kernels (bool, per element): its
    leading dimensions k and n are multiples of ``ALIGN_BYTES`` (m never is one in these
    layouts; measured on an H100, hardware_profiles/software.toml [cublas])."""
    return (np.mod(np.asarray(n) * bytes_per_element, ALIGN_BYTES) == 0) \
        & (np.mod(np.asarray(k) * bytes_per_element, ALIGN_BYTES) == 0)


def gemm_time(gpu: GPU, dtype: str, m: Num, n: Num, k: Num, count: Num = 1.0,
              bytes_per_element: float = 2.0, weight_bytes_per_element: Num | None = None,
              grouped: bool = False) -> np.ndarray:
    """Seconds for ``count`` matmuls of shape ``[m, k] x [k, n]`` on ``gpu`` (roofline).

    Compute: ``2 m n k / (peak * gemm)``; memory: reading both operands and writing the
    result once, ``bytes_per_element * (m k + m n) + weight_bytes_per_element * k n`` over
    ``hbm * memory``; plus the fixed ``kernel_overhead_s`` per launch: one per matmul, or one
    for all ``count`` where ``grouped`` (a grouped GEMM, torch._grouped_mm).
    ``weight_bytes_per_element``: the bytes of one element of the ``[k, n]`` operand when it
    is stored narrower than the activations (a quantized weight, scales included); default
    ``bytes_per_element``.
    """
    eff = gpu.efficiency
    flops = 2.0 * m * n * k
    on_grid = aligned(n, k, ELEMENT_BYTES.get(dtype, bytes_per_element))
    frac = np.where(on_grid, eff.gemm_for(dtype),
                    eff.gemm_unaligned_for(dtype))
    compute = flops / (gpu.peak_flops(dtype) * frac)
    w = bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    traffic = bytes_per_element * (m * k + m * n) + w * k * n
    memory = traffic / (gpu.memory_bandwidth_bytes_per_s * eff.memory)
    launches = 1.0 if grouped else count
    return count * np.maximum(compute, memory) + launches * eff.kernel_overhead_s


def weight_grad_bytes(job: Job) -> float:
    """Bytes per weight element that a linear's weight-gradient matmul moves beside its two
    activation operands. With Megatron-LM's gradient-accumulation fusion
    (``Job.fuse_grad_accumulation``, on by default) the matmul adds into the ``main_grad``
    buffer itself: its epilogue reads and writes each gradient element in that buffer's dtype
    (``states.megatron_grad_bytes``: fp32 with bf16 and fp8) on every micro-batch
    (Transformer Engine's ``fuse_wgrad_accumulation``, cuBLASLt with beta = 1;
    fused_weight_gradient_mlp_cuda before it). Other trainers' matmuls write a fresh
    gradient in the activations' dtype, and the add into the accumulated one is a kernel of
    its own (``stepterms.accumulation_time``). The weight-gradient matmul reduces over the
    micro-batch's tokens, so with few of them (a routed expert's share at high expert
    parallelism, a context-parallel chunk) this traffic, not its FLOPs, sets its time."""
    if framework(job.framework).name == "megatron" and job.fuse_grad_accumulation:
        return 2.0 * megatron_grad_bytes(job)
    return _dtypes(job)[1]


#: What each fused attention kernel (``costmodel.config.ATTENTION_KERNELS``) is called; on AMD
#: Instinct GPUs ``"cudnn"`` is AMD's own fused attention (``attention_name``).
ATTENTION_NAMES = {"flash": "FlashAttention-2", "cudnn": "cuDNN attention",
                   "aotriton": "AOTriton (PyTorch SDPA on ROCm)"}


def attention_name(kernel: str, gpu: GPU) -> str:
    """How an estimate names fused attention ``kernel`` on ``gpu`` (its vendor's library for
    ``"cudnn"``: cuDNN on NVIDIA, aiter's v3 kernels on AMD's CDNA architectures)."""
    if kernel == "cudnn" and gpu.amd:
        return "AMD aiter v3 attention"
    return ATTENTION_NAMES[kernel]


def attention_kernel(job: Job, gpu: GPU) -> str:
    """The fused attention kernel the job runs on ``gpu`` (``costmodel.config.
    ATTENTION_KERNELS``): ``Job.attention_kernel`` where set, else the trainer's own choice,
    cuDNN's on the architectures of ``Framework.cudnn_attention_archs``, on AMD Instinct GPUs
    ``Framework.rocm_attention``, FlashAttention-2 elsewhere."""
    if job.attention_kernel is not None:
        return job.attention_kernel
    fw = framework(job.framework)
    if gpu.amd:
        return fw.rocm_attention
    return "cudnn" if gpu.architecture in fw.cudnn_attention_archs else "flash"


def flash_attention_time(gpu: GPU, dtype: str, flops: Num, keys: Num | None = None,
                         kernel: str = "flash", head_dim: Num | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of a fused (flash) attention ``kernel`` (``"flash"`` or
    ``"cudnn"``: ``KernelEfficiency.attention_for``) doing ``flops`` in its forward pass over
    ``keys`` key tokens per query (the sequence, or a context-parallel chunk of it):
    ``flops * (1 + fixed_keys / keys) / (peak * attention) + kernel_overhead``, where each
    query block's fixed work (``hardware_profiles/software.toml [fused_attention]``, fitted
    to measured sweeps) weighs most on short sequences; ``keys=None`` leaves it out. The
    backward does ``FLASH_BACKWARD_FLOPS`` times the FLOPs at the ``attention_backward``
    fraction with its own fixed work (Dao 2023, Sec. 3). ``head_dim``: the query-key head
    dimension, under 128 a fraction ``(head_dim / 128) ** exponent`` of the head-dim-128
    rate the profiles quote (``[fused_attention]`` ``*_head_dim_exponent``); None: 128. fp8,
    nvfp4 and tf32 jobs run attention in bf16 (FlashAttention has no tf32 or fp8 training
    kernel), so the peak is the bf16 one."""
    peak = gpu.peak_flops("bf16" if dtype == "tf32" else high_precision(dtype))
    eff = gpu.efficiency
    frac_f, frac_b = eff.attention_for(kernel)
    flops = np.asarray(flops, dtype=float)
    grow_f: Num = 1.0
    grow_b: Num = 1.0
    shape = hardware_profiles.load_software()["fused_attention"]
    if keys is not None:
        k = np.asarray(keys, dtype=float)
        grow_f = 1.0 + float(shape["forward_fixed_keys"]) / k
        grow_b = 1.0 + float(shape["backward_fixed_keys"]) / k
    if head_dim is not None:
        narrow = np.minimum(np.asarray(head_dim, dtype=float), HEAD_DIM_FULL_RATE) \
            / HEAD_DIM_FULL_RATE
        grow_f = grow_f / narrow ** float(shape["forward_head_dim_exponent"])
        grow_b = grow_b / narrow ** float(shape["backward_head_dim_exponent"])
    forward = flops * grow_f / (peak * frac_f) + eff.kernel_overhead_s
    backward = FLASH_BACKWARD_FLOPS * flops * grow_b / (peak * frac_b) + eff.kernel_overhead_s
    return forward, backward


def memory_time(gpu: GPU, num_bytes: Num, kernels: Num) -> np.ndarray:
    """Seconds for memory-bound kernels moving ``num_bytes`` in all, ``kernels`` launches."""
    eff = gpu.efficiency
    return (np.asarray(num_bytes, dtype=float)
            / (gpu.memory_bandwidth_bytes_per_s * eff.memory) + kernels * eff.kernel_overhead_s)


@dataclass(frozen=True)
class LayerCompute:
    """Compute of one layer (or the head) for one micro-batch on one GPU, per row, seconds
    and FLOPs. ``forward`` / ``backward``: time of the pass; ``selective``: what selective
    recompute re-runs in backward (the attention core when it is not fused); ``flops``: the
    FLOPs the GPU executes in forward + backward, without any recompute; ``forward_flops``
    those of the forward pass (what full recompute repeats); ``core_forward`` /
    ``core_backward``: the attention core's part of the times (what context-parallel ring
    exchanges overlap with); ``qkv_gemm`` / ``up_gemm``: one matmul of the column-parallel
    QKV and MLP input projections (their input- and weight-gradient matmuls each take as long;
    what Megatron-LM overlaps the backward tensor-parallel collectives with; ``up_gemm`` is
    zero for MoE layers, whose tensor-parallel exchange belongs to the token dispatcher);
    ``proj_gemm`` / ``down_gemm``: the same of the row-parallel attention output and MLP output
    projections (``down_gemm`` zero for MoE layers). ``routed_forward``: the routed experts'
    matmuls' part of ``forward`` (zero for a dense layer; their backward is taken as twice
    it, an input- and a weight-gradient matmul each): what an overlapped pair's phases run
    beside the other micro-batch's dispatch (``steptime.pair_saving``)."""

    forward: np.ndarray
    backward: np.ndarray
    selective: np.ndarray
    flops: np.ndarray
    selective_flops: np.ndarray
    forward_flops: np.ndarray
    core_forward: np.ndarray
    core_backward: np.ndarray
    qkv_gemm: np.ndarray
    up_gemm: np.ndarray
    proj_gemm: np.ndarray
    down_gemm: np.ndarray
    routed_forward: np.ndarray


#: Bytes per element of a quantized matmul operand, its block scales included, by recipe
#: (``Job.float8_recipe``, or ``nvfp4`` for that precision): (activation or gradient,
#: weight). NVFP4: E2M1 values two to a byte with one E4M3 scale per 16 (NVIDIA technical
#: blog "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025), the
#: weights with one scale per 16x16 block (NVIDIA, "Pretraining Large Language Models with
#: NVFP4", arXiv 2509.25149, Sec. 4.3: 2D weight scaling); MXFP8: one E8M0 scale per 32
#: elements (OCP Microscaling Formats MX v1.0, Sec. 5.2); block-wise fp8: one fp32 scale per
#: 1x128 activation tile and per 128x128 weight block (DeepSeek-V3 technical report,
#: arXiv 2412.19437, Sec. 3.3.1); per-tensor and per-row fp8: one byte (a scale per tensor or
#: per row is a few bytes in millions); MXFP4: E2M1 values two to a byte with one E8M0 scale
#: per 32 elements along the reduction axis, weights and activations alike (OCP Microscaling
#: Formats MX v1.0, Sec. 5.2; AMD's recipe keeps 1x32 blocks for both, Primus
#: ``MXFP4_SCALING_BLOCK_SIZE``). Per-tensor fp32 scales are left out.
QUANTIZED_BYTES = {
    "tensorwise": (1.0, 1.0),
    "rowwise": (1.0, 1.0),
    "mxfp8": (1.0 + 1.0 / 32, 1.0 + 1.0 / 32),
    "blockwise": (1.0 + 4.0 / 128, 1.0 + 4.0 / (128 * 128)),
    "nvfp4": (0.5 + 1.0 / 16, 0.5 + 1.0 / 256),
    "mxfp4": (0.5 + 1.0 / 32, 0.5 + 1.0 / 32),
}


def quantized_bytes(job: Job, weight: bool = False) -> float:
    """Bytes per element of the job's quantized matmul operands (``QUANTIZED_BYTES``): an
    activation's or gradient's, or with ``weight`` a weight's. Only for fp8 and fp4 jobs."""
    recipe = job.precision if job.precision in FP4_PRECISIONS else job.float8_recipe
    return QUANTIZED_BYTES[recipe][1 if weight else 0]


def high_precision(dtype: str) -> str:
    """The dtype of what a job with matmul ``dtype`` keeps out of its quantized matmuls
    (attention, the output layer, MFU's peak): bf16 for fp8 and fp4 jobs."""
    return "bf16" if dtype in QUANTIZED_PRECISIONS else dtype


def _dtypes(job: Job) -> tuple[str, float, float]:
    """(matmul dtype, bytes per activation element, bytes per matmul input element)."""
    if job.precision == "fp32":
        return "tf32", 4.0, 4.0
    if job.precision in QUANTIZED_PRECISIONS:
        return job.precision, 2.0, quantized_bytes(job)  # MXFP8, block-wise at fp8's rate
    return job.precision, 2.0, 2.0


def matmul_dtype(job: Job) -> str:
    """The dtype the job's matmuls run in (``GPU.peak_flops``'s key): tf32 for fp32 jobs, fp8
    nvfp4 or mxfp4 for those (their attention runs in bf16: ``flash_attention_time``)."""
    return _dtypes(job)[0]

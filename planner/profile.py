"""``planner profile``: measure this machine's GPU (or CPU) and links with torch, and write a
hardware profile the cost model plans with (``--profile FILE``).

What is timed (each point: warm-up calls, then back-to-back calls for at least the sweep's
``min_time`` seconds, the mean per call):

- matmuls ``[M, K] x [K, N]`` over a grid of M, N and K, per dtype (bf16, fp16, tf32 or fp32,
  fp8 where the GPU has ``torch._scaled_mm``): the efficiency curve against the shape;
- causal fused attention (``scaled_dot_product_attention``), forward and backward, against
  sequence length and head dimension;
- device copies of growing size (HBM bandwidth), and pinned host-device copies (the offload
  link) on a GPU;
- with ``processes > 1``: all-reduce, all-gather, reduce-scatter, all-to-all and send/recv
  against message size with ``torch.distributed`` (NCCL on GPUs, gloo on the CPU), one process
  per GPU started here; the slowest rank's time counts.

``costmodel.fitting.measured`` fits the cost model's parameters to the times and writes the TOML.
A sweep predicted to take more than two minutes runs only with ``full=True`` (``--full``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.errors import SpecError
from costmodel.fitting.measured import (
    COLLECTIVES,
    AttentionPoint,
    CollectivePoint,
    CopyPoint,
    GemmPoint,
    Measurements,
    TransferPoint,
)

__all__ = ["LIMIT_S", "SWEEPS", "Sweep", "guess_gpu", "predicted_seconds", "profile",
           "sweep_for"]

#: A sweep predicted to run longer than this many seconds needs ``full=True`` (``--full``).
LIMIT_S = 120.0


@dataclass(frozen=True)
class Sweep:
    """What one profile run measures: matmul dims (every M x N x K of ``dims``), attention
    sequence lengths and head dims (about ``tokens`` tokens per call), copy, host-transfer
    and collective sizes in bytes, and the timing effort (``warmup`` calls, then at least
    ``min_time`` seconds of calls per point)."""

    name: str
    dims: tuple[int, ...]
    seq_lens: tuple[int, ...]
    head_dims: tuple[int, ...]
    heads: int
    tokens: int
    copy_bytes: tuple[int, ...]
    transfer_bytes: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    warmup: int
    min_time: float


def _pow2(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    return tuple(2 ** e for e in range(lo, hi + 1, step))


#: The sweeps by device kind: ``quick`` (seconds; a smoke run), ``standard`` (the default)
#: and ``full`` (every shape; may take many minutes).
SWEEPS: dict[str, dict[str, Sweep]] = {
    "cuda": {
        "quick": Sweep("quick", (256, 2048), (512, 2048), (128,), 16, 8192, _pow2(20, 26, 3),
                       _pow2(16, 24, 4), _pow2(10, 22, 4), 2, 0.005),
        "standard": Sweep("standard", (256, 1024, 4096, 8192), (512, 1024, 2048, 4096, 8192),
                          (64, 128), 16, 16384, _pow2(20, 30, 2), _pow2(16, 28, 2),
                          _pow2(10, 28, 2), 3, 0.02),
        "full": Sweep("full", _pow2(7, 14), _pow2(9, 15), (64, 128, 256), 16, 32768,
                      _pow2(16, 32, 2), _pow2(12, 30, 2), _pow2(8, 30), 5, 0.1),
    },
    "cpu": {
        "quick": Sweep("quick", (32, 128), (64, 128), (32,), 2, 256, _pow2(16, 20, 4),
                       (), _pow2(10, 16, 6), 1, 0.002),
        "standard": Sweep("standard", (64, 256, 1024), (128, 256, 512), (64,), 4, 1024,
                          _pow2(16, 26, 2), (), _pow2(10, 24, 2), 2, 0.02),
        "full": Sweep("full", _pow2(5, 11), _pow2(6, 11), (32, 64, 128), 8, 4096,
                      _pow2(12, 28, 2), (), _pow2(8, 26), 3, 0.1),
    },
}


def sweep_for(device: str, name: str) -> Sweep:
    """The sweep ``name`` (quick / standard / full) for ``device`` (cuda / cpu)."""
    try:
        return SWEEPS[device][name]
    except KeyError:
        raise SpecError(f"no {name!r} sweep for device {device!r}; devices: cuda, cpu; "
                        "sweeps: quick, standard, full") from None


# ---- the device ----------------------------------------------------------------------------

#: Substrings of ``torch.cuda.get_device_name`` and the shipped datasheet profile they are.
DEVICE_NAMES = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"),
                ("B200", "b200"), ("A100-SXM4-80GB", "a100-80gb"), ("A100 80GB", "a100-80gb"),
                ("A100", "a100-40gb"), ("L40S", "l40s"), ("V100", "v100-32gb"),
                ("MI300X", "mi300x"))


def guess_gpu(device_name: str) -> str | None:
    """The shipped GPU profile of a device torch names ``device_name``, or ``None``."""
    for part, name in DEVICE_NAMES:
        if part.lower() in device_name.lower():
            return name
    return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _driver() -> str:
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"


# ---- timing --------------------------------------------------------------------------------

def _timer(fn: Callable[[], Any], sync: Callable[[], None], sweep: Sweep,
           agree: Callable[[int], int] | None = None) -> float:
    """Mean seconds per call of ``fn``: warm-up calls, one call to size the run, then
    back-to-back calls for at least ``sweep.min_time`` seconds (as a training step issues
    its kernels), synchronized once at the end. ``agree``: makes the processes of a
    collective run the same number of calls (the most any of them wants)."""
    for _ in range(sweep.warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(10_000, math.ceil(sweep.min_time / once)))
    if agree is not None:
        reps = agree(reps)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


@dataclass(frozen=True)
class _Rates:
    """Rough rates to predict how long a sweep takes (FLOP/s per dtype, bytes/s)."""

    flops: dict[str, float]
    copy: float
    host: float
    link: float
    link_latency: float
    start: float  # seconds to start the collective processes


#: The timing effort of the quick probe that sizes a sweep on a device without a datasheet.
_PROBE = Sweep("probe", (), (), (), 1, 1, (), (), (), 1, 0.01)


def _rates(device: str, gpu: str | None) -> _Rates:
    """Datasheet rates at half efficiency for a known GPU; a quick probe otherwise."""
    import torch

    if device == "cuda" and gpu:
        from costmodel.hardware import GPU

        g = GPU.preset(gpu, calibrated=False)
        link = g.intra_link()
        return _Rates({d: f * 0.5 for d, f in g.peak_flops_by_dtype},
                      g.memory_bandwidth_bytes_per_s * 0.5, g.host().achieved_bytes_per_s * 0.5,
                      link.achieved_bytes_per_s * 0.5, 20e-6, 20.0)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    flops = {}
    n = 256
    for dtype, td in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device=dev, dtype=td)
        flops[dtype] = 2 * n ** 3 / _timer(functools.partial(torch.matmul, a, a), sync, _PROBE)
    flops["fp16"] = flops["tf32"] = flops["fp8"] = flops["fp32"]
    x = torch.empty(2 ** 22, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    copy = 2 * x.numel() / _timer(lambda: y.copy_(x), sync, _PROBE)
    return _Rates(flops, copy, 10e9, 1e9 if device == "cpu" else 20e9, 100e-6,
                  5.0 if device == "cpu" else 20.0)


def _dtypes(device: str) -> tuple[str, ...]:
    import torch

    if device == "cpu":
        return ("bf16", "fp32")
    out = ["bf16", "fp16", "tf32"]
    if torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm"):
        out.append("fp8")
    return tuple(out)


@contextlib.contextmanager
def _tf32(device: str) -> Iterator[None]:
    """fp32 matmuls in tf32 on a GPU while profiling, as trainers run them."""
    import torch

    m = torch.backends.cuda.matmul
    if device != "cuda":
        yield
        return
    if hasattr(m, "fp32_precision"):  # torch >= 2.9
        old, m.fp32_precision = m.fp32_precision, "tf32"
        try:
            yield
        finally:
            m.fp32_precision = old
        return
    old_flag, m.allow_tf32 = m.allow_tf32, True
    try:
        yield
    finally:
        m.allow_tf32 = old_flag


def _point_time(kernel_s: float, sweep: Sweep) -> float:
    """Predicted wall seconds of one measured point whose call takes ``kernel_s``."""
    return (sweep.warmup + 1) * kernel_s + max(sweep.min_time, kernel_s) + 1e-3


#: One point to measure: (kind, parameters, predicted seconds); kinds and parameters:
#: ``gemm`` (dtype, m, n, k), ``attention`` (dtype, batch, heads, seq_len, head_dim), ``copy``
#: bytes, ``transfer`` (direction, bytes), ``collective`` (op, bytes).
_Item = tuple[str, Any, float]


def _gemm_items(sweep: Sweep, rates: _Rates, dtypes: tuple[str, ...]) -> list[_Item]:
    """Every M x N x K matmul of the sweep's dims, per dtype."""
    items: list[_Item] = []
    for dtype in dtypes:
        for m in sweep.dims:
            for n in sweep.dims:
                for k in sweep.dims:
                    t = 2.0 * m * n * k / rates.flops[dtype] + 2.0 * (m * k + k * n + m * n) \
                        / rates.copy + 1e-5
                    items.append(("gemm", (dtype, m, n, k), _point_time(t, sweep)))
    return items


def _unaligned_gemm_items(sweep: Sweep, rates: _Rates, dtype: str) -> list[_Item]:
    """A few matmuls one element off the 16-byte grid (an odd vocabulary) in ``dtype``, the
    main one: the unaligned kernels' fraction (``efficiency.gemm_unaligned``)."""
    items: list[_Item] = []
    big = sweep.dims[-2:]
    for m in big:
        for n in big:
            for k in big:
                t = 2.0 * m * n * k / (0.2 * rates.flops[dtype]) + 1e-5
                items.append(("gemm", (dtype, m, n - 1, k), _point_time(t, sweep)))
    return items


def _attention_items(sweep: Sweep, rates: _Rates, dtype: str) -> list[_Item]:
    """Causal attention, forward and backward, per sequence length and head dim, about
    ``sweep.tokens`` tokens per call."""
    items: list[_Item] = []
    for s in sweep.seq_lens:
        for d in sweep.head_dims:
            b = max(1, sweep.tokens // s)
            t = 3.5 * 2.0 * b * s * s * sweep.heads * d / rates.flops[dtype] + 1e-4
            items.append(("attention", (dtype, b, sweep.heads, s, d),
                          _point_time(t, sweep) * 2))
    return items


def _copy_items(sweep: Sweep, rates: _Rates) -> list[_Item]:
    """Device copies of each size (HBM bandwidth)."""
    return [("copy", size, _point_time(2.0 * size / rates.copy + 1e-5, sweep))
            for size in sweep.copy_bytes]


def _transfer_items(device: str, sweep: Sweep, rates: _Rates) -> list[_Item]:
    """Pinned host-to-device and device-to-host copies of each size (on a GPU only)."""
    if device != "cuda":
        return []
    return [("transfer", (direction, size), _point_time(size / rates.host + 1e-5, sweep))
            for direction in ("h2d", "d2h") for size in sweep.transfer_bytes]


def _collective_items(sweep: Sweep, rates: _Rates, processes: int) -> list[_Item]:
    """Each collective of ``COLLECTIVES`` per size over ``processes`` (none for one)."""
    if processes <= 1:
        return []
    items: list[_Item] = []
    for op in COLLECTIVES:
        for size in sweep.collective_bytes:
            t = 2.0 * size / rates.link + processes * rates.link_latency
            items.append(("collective", (op, size), _point_time(t, sweep) + 2e-3))
    return items


def _plan(device: str, sweep: Sweep, rates: _Rates, dtypes: tuple[str, ...],
          processes: int) -> list[_Item]:
    """The points to measure, each as (kind, parameters, predicted seconds)."""
    return [*_gemm_items(sweep, rates, dtypes), *_unaligned_gemm_items(sweep, rates, dtypes[0]),
            *_attention_items(sweep, rates, dtypes[0]), *_copy_items(sweep, rates),
            *_transfer_items(device, sweep, rates), *_collective_items(sweep, rates, processes)]


def predicted_seconds(items: list[tuple[str, Any, float]], processes: int,
                      rates_start: float) -> float:
    """Predicted wall seconds of a whole run: its points, and starting the processes."""
    return sum(t for *_, t in items) + (rates_start if processes > 1 else 0.0)


# ---- the measurements ----------------------------------------------------------------------

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


def _gemm(device: str, dtype: str, m: int, n: int, k: int, sweep: Sweep,
          sync: Callable[[], None]) -> float:
    import torch

    dev = torch.device(device)
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=dev)
        return _timer(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                               out_dtype=torch.bfloat16), sync, sweep)
    td = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(m, k, device=dev, dtype=td)
    b = torch.randn(k, n, device=dev, dtype=td)
    out = torch.empty(m, n, device=dev, dtype=td)
    return _timer(lambda: torch.matmul(a, b, out=out), sync, sweep)


def _attention(device: str, dtype: str, b: int, heads: int, s: int, d: int, sweep: Sweep,
               sync: Callable[[], None]) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    td = getattr(torch, TORCH_DTYPES[dtype])
    q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=td, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(b, heads, s, d, device=device, dtype=td)

    def forward() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both() -> None:
        forward().backward(grad)
        q.grad = k.grad = v.grad = None

    fwd = _timer(forward, sync, sweep)
    total = _timer(both, sync, sweep)
    return fwd, max(total - fwd, 1e-9)


def _copy(device: str, nbytes: int, sweep: Sweep, sync: Callable[[], None]) -> float:
    import torch

    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return _timer(lambda: y.copy_(x), sync, sweep)


def _transfer(direction: str, nbytes: int, sweep: Sweep, sync: Callable[[], None]) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    if direction == "h2d":
        return _timer(lambda: dev.copy_(host, non_blocking=True), sync, sweep)
    return _timer(lambda: host.copy_(dev, non_blocking=True), sync, sweep)


def _collective_call(op: str, x: Any, part: Any, full: Any, rank: int, world: int) -> None:
    """One call of collective ``op`` (``COLLECTIVES``) on this rank's buffers: ``x`` and
    ``full`` hold the whole buffer, ``part`` this rank's 1/world of it."""
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(x)
    elif op == "all_gather":  # all_gather_single since torch 2.13, before: _into_tensor
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(full, part)
    elif op == "reduce_scatter":
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(part, x)
    elif op == "all_to_all":
        dist.all_to_all_single(full, x)
    else:  # a ring of simultaneous sends and receives, as nccl-tests' sendrecv runs
        reqs = [dist.isend(x, (rank + 1) % world), dist.irecv(full, (rank - 1) % world)]
        for r in reqs:
            assert r is not None  # None only for a rank outside the group: the world has all
            r.wait()


def _most(device: Any, reps: int) -> int:
    """The largest ``reps`` over the processes (an all-reduce of one number)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([reps], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _collective_worker(rank: int, world: int, device: str, init: str, sizes: list[int],
                       sweep: Sweep, out_path: str, progress_path: str) -> None:
    """One process of the collective sweep (started by ``torch.multiprocessing``)."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dev = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    sync = (lambda: torch.cuda.synchronize(dev)) if device == "cuda" else (lambda: None)
    rows = []
    total = len(COLLECTIVES) * len(sizes)
    try:
        for i, (op, size) in enumerate((o, s) for o in COLLECTIVES for s in sizes):
            elems = max(world, size // 4 // world * world)  # float32, divisible by world
            x = torch.ones(elems, device=dev)
            part = torch.empty(elems // world, device=dev)
            full = torch.empty(elems, device=dev)

            call = functools.partial(_collective_call, op, x, part, full, rank, world)
            dist.barrier()
            t = _timer(call, sync, sweep, agree=functools.partial(_most, dev))
            worst = torch.tensor([t], dtype=torch.float64, device=dev)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            rows.append({"op": op, "ranks": world, "nbytes": int(elems * 4),
                         "seconds": float(worst.item())})
            if rank == 0:
                Path(progress_path).write_text(f"{(i + 1) / total:.4f}")
        if rank == 0:
            Path(out_path).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _collectives(device: str, processes: int, sweep: Sweep,
                 progress: Callable[[float], None]) -> list[CollectivePoint]:
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory(prefix="planner-profile-") as tmp:
        out, prog = os.path.join(tmp, "out.json"), os.path.join(tmp, "progress")
        init = "file://" + os.path.join(tmp, "store")
        ctx = mp.start_processes(_collective_worker, args=(
            processes, device, init, list(sweep.collective_bytes), sweep, out, prog),
            nprocs=processes, join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=0.2):
                with contextlib.suppress(OSError, ValueError):
                    progress(float(Path(prog).read_text() or 0.0))
        except ProcessException as e:
            raise SpecError(f"the collective benchmark failed ({e}); its output is above. "
                            "Profile without collectives with --procs 1") from None
        rows = json.loads(Path(out).read_text())
    return [CollectivePoint(**r) for r in rows]


def _device(device: str | None) -> str:
    """The device to profile: ``device``, or cuda when torch sees a GPU, else cpu; refused
    when torch does not have it."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise SpecError(f"--device {device!r}: profile 'cuda' or 'cpu'")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda, but torch sees no CUDA GPU (torch "
                        f"{torch.__version__}); use --device cpu or a CUDA build of torch")
    return device


def _machine(device: str) -> tuple[str, float, int]:
    """The device's name, its memory in bytes (the host's on the CPU), and how many
    processes it can run a collective over (GPUs, or CPU cores)."""
    import torch

    if device == "cuda":
        return (torch.cuda.get_device_name(0),
                float(torch.cuda.get_device_properties(0).total_memory),
                torch.cuda.device_count())
    return (f"{_cpu_name()} ({torch.get_num_threads()} threads)",
            float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
            os.cpu_count() or 1)


def _processes(processes: int | None, device: str, have: int) -> int:
    """The processes of the collectives: ``processes``, or every GPU on cuda and 1 on the
    CPU; refused outside 1 to ``have``."""
    processes = processes if processes is not None else (have if device == "cuda" else 1)
    if processes < 1 or processes > have:
        raise SpecError(f"--procs {processes}: this machine has {have} "
                        f"{'GPUs' if device == 'cuda' else 'cores'}; give 1 to {have}")
    return processes


def _datasheet(gpu: str | None, device: str, name: str) -> str | None:
    """The shipped GPU profile the measurements go with: ``gpu`` (checked against the
    shipped ones; ``"none"`` for none), or guessed from the device ``name`` on cuda."""
    if gpu is not None and device == "cpu" and gpu.lower() != "none":
        raise SpecError(f"--gpu {gpu}: a CPU profile has no GPU datasheet; drop --gpu, or "
                        "profile the GPU with --device cuda")
    if gpu is None:
        return guess_gpu(name) if device == "cuda" else None
    if gpu.lower() == "none":
        return None
    import hardware_profiles

    if gpu not in hardware_profiles.names("gpus"):
        raise hardware_profiles.unknown_name("gpu", gpu, hardware_profiles.names("gpus"))
    return gpu


def _measure(kind: str, args: Any, device: str, sweep: Sweep, sync: Callable[[], None],
             meas: Measurements) -> None:
    """Time one point of ``_plan`` (not a collective) and add it to ``meas``."""
    if kind == "gemm":
        dtype, m, n, k = args
        meas.gemm.append(GemmPoint(dtype, m, n, k, _gemm(device, dtype, m, n, k, sweep, sync)))
    elif kind == "attention":
        dtype, b, heads, s, d = args
        f, bwd = _attention(device, dtype, b, heads, s, d, sweep, sync)
        meas.attention.append(AttentionPoint(dtype, b, heads, s, d, f, bwd))
    elif kind == "copy":
        meas.copy.append(CopyPoint(args, _copy(device, args, sweep, sync)))
    else:
        direction, nbytes = args
        meas.transfer.append(TransferPoint(direction, nbytes,
                                           _transfer(direction, nbytes, sweep, sync)))


def _measure_kernels(items: list[_Item], device: str, sweep: Sweep, sync: Callable[[], None],
                     meas: Measurements, report: Callable[[float], None], total: float) -> float:
    """Time the points of ``items`` other than the collectives into ``meas`` (in tf32 on a
    GPU; a point too big for the device is left out), reporting the fraction of ``total``
    predicted seconds done; returns the predicted seconds done."""
    import torch

    done = 0.0
    with _tf32(device):
        for kind, args, t in items:
            if kind == "collective":
                continue
            try:
                _measure(kind, args, device, sweep, sync, meas)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()  # a point too big for this device: left out
            done += t
            report(min(done / total, 0.99))
    return done


def profile(device: str | None = None, *, sweep: str = "standard", processes: int | None = None,
            gpu: str | None = None, full: bool = False,
            progress: Callable[[float], None] | None = None) -> Measurements:
    """Measure this machine: see the module docstring. Returns the ``Measurements``
    (``costmodel.fitting.measured.profile_toml`` turns them into a profile).

    ``device``: ``cuda`` or ``cpu`` (default: cuda when torch sees a GPU); ``sweep``:
    ``quick``, ``standard`` or ``full``; ``processes``: processes for the collectives
    (default: every GPU on cuda, 1 on the CPU; 1 measures none); ``gpu``: the shipped
    datasheet profile of this GPU (default: guessed from the device name; ``"none"`` for
    none); ``full``: allow a sweep predicted to take more than ``LIMIT_S`` seconds;
    ``progress``: called with the fraction done. Raises ``SpecError`` for a device torch
    does not have, too many processes, or a sweep over the limit without ``full``.
    """
    import torch

    device = _device(device)
    plan_sweep = sweep_for(device, sweep)
    name, memory, have = _machine(device)
    processes = _processes(processes, device, have)
    gpu = _datasheet(gpu, device, name)
    dtypes = _dtypes(device)
    rates = _rates(device, gpu)
    items = _plan(device, plan_sweep, rates, dtypes, processes)
    expected = predicted_seconds(items, processes, rates.start)
    if expected > LIMIT_S and not full:
        raise SpecError(f"a {sweep} profile of {name} would take about {expected / 60:.0f} "
                        f"min (over {LIMIT_S / 60:.0f} min); pass --full to allow a long "
                        "run, or --quick for a smoke run")
    report = progress or (lambda f: None)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    meas = Measurements(
        device=device, device_name=name, gpu=gpu, memory_bytes=memory,
        torch_version=torch.__version__,
        driver=(f"{_driver()} (CUDA {torch.version.cuda})" if device == "cuda"
                else f"none ({platform.system()} {platform.release()})"),
        date=datetime.date.today().isoformat(), host=platform.node(), sweep=sweep,
        backend=("nccl" if device == "cuda" else "gloo") if processes > 1 else None,
        processes=processes)
    start = time.perf_counter()
    total = expected
    done = _measure_kernels(items, device, plan_sweep, sync, meas, report, total)
    if processes > 1:
        rest = total - done
        meas.collectives = _collectives(
            device, processes, plan_sweep,
            lambda f: report(min((done + f * rest) / total, 0.99)))
    meas.duration_s = round(time.perf_counter() - start, 3)
    report(1.0)
    return meas

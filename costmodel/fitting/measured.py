"""Measured hardware profiles: what ``planner profile`` timed, the cost model's parameters fitted
to it, and the profile TOML that carries both.

The profiler (``planner.profile``, which needs torch) produces ``Measurements``; this module,
which needs only numpy and scipy, turns them into a GPU profile in the ``hardware_profiles/gpus``
format. Each parameter is fitted with the very function the cost model predicts with, so a
measured profile reproduces its own measurements as closely as the model's form allows:

- ``[efficiency] gemm``, ``memory`` and ``kernel_overhead_us``: least squares on the log of the
  times of the matmul sweep (``costmodel.formulas.compute.gemm_time``: roofline plus a fixed cost
  per
  kernel; Williams et al. 2009) and of the large copies (``memory_time``), jointly. This is the
  efficiency curve against M, N and K: the fitted roofline is what the cost model evaluates for
  every matmul shape. ``gemm_fp8`` alike on the fp8 points, with the overhead held.
- ``attention`` / ``attention_backward``: the same on the fused attention (SDPA) sweep with
  ``costmodel.formulas.compute.flash_attention_time`` (causal: half the ``4 b s^2 h d`` FLOPs; Dao
  2023;
  each query block's fixed work as ``software.toml [fused_attention]`` has it): the fractions
  of whichever kernel SDPA picked (cuDNN's on Hopper and Blackwell from torch 2.10 with
  cuDNN 9.15 or later, FlashAttention-2 before), which a measured profile then uses for
  either kernel.
- the host link: ``t = S / B + latency`` over pinned host-device copies (Hockney's alpha-beta
  model), ``B`` per direction.
- the link between the processes: bandwidth and per-hop latency fitted with
  ``costmodel.formulas.comm.Topology``'s own collective formulas to all-reduce, all-gather,
  reduce-scatter, all-to-all and send/recv times against message size.

With a datasheet profile of the same GPU (``gpu``), the peaks and the HBM and link wire rates
stay the datasheet's and the fits are fractions of them, exactly like the shipped profiles'
microbenchmark fractions. Without one (a CPU, or a GPU the project has no datasheet for), the
best measured rate of each kind becomes the profile's peak and the fractions are relative to it.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict, Unpack

import numpy as np
from scipy.optimize import least_squares, nnls

import hardware_profiles
from costmodel.errors import SpecError
from costmodel.formulas.comm import Topology
from costmodel.formulas.roofline import aligned, flash_attention_time, gemm_time, memory_time
from costmodel.hardware import DTYPES, GPU
from costmodel.units import GB, GIB, TFLOPS
from hardware_profiles.files import to_toml

__all__ = ["AttentionPoint", "CollectivePoint", "CopyPoint", "GemmPoint", "Measurements",
           "TransferPoint", "bus_bandwidth", "fit_link", "fit_profile", "profile_toml",
           "to_toml"]


#: Bytes of one matmul operand element per measured dtype.
ELEMENT_BYTES = {"fp64": 8.0, "fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
#: Collectives the profiler times, in ``Topology``'s convention for ``nbytes``: the buffer
#: for all-reduce, the full (gathered) buffer for all-gather and reduce-scatter, what each
#: rank holds for all-to-all, the message for send/recv.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


@dataclass(frozen=True)
class GemmPoint:
    """One timed matmul ``[m, k] x [k, n]`` in ``dtype``: mean ``seconds`` per call."""

    dtype: str
    m: int
    n: int
    k: int
    seconds: float

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s: ``2 m n k / seconds``."""
        return 2.0 * self.m * self.n * self.k / self.seconds / TFLOPS


@dataclass(frozen=True)
class AttentionPoint:
    """One timed causal fused attention (SDPA): ``batch`` x ``heads`` heads of ``head_dim``
    over ``seq_len`` tokens; mean seconds of the forward and of the backward pass."""

    dtype: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    forward_s: float
    backward_s: float

    @property
    def forward_flops(self) -> float:
        """FLOPs of the forward pass as the cost model counts them: ``4 b s^2 h d / 2``
        (scores and weighted sum; the causal mask skips half; Dao 2023, Sec. 3)."""
        return 2.0 * self.batch * self.seq_len ** 2 * self.heads * self.head_dim


@dataclass(frozen=True)
class CopyPoint:
    """One timed device copy of a ``nbytes`` tensor (read ``nbytes``, write ``nbytes``)."""

    nbytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        """Bytes moved (read + write) per second, GB/s."""
        return 2.0 * self.nbytes / self.seconds / GB


@dataclass(frozen=True)
class TransferPoint:
    """One timed copy between pinned host memory and the device: ``h2d`` or ``d2h``."""

    direction: str
    nbytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        """Bytes per second, GB/s."""
        return self.nbytes / self.seconds / GB


@dataclass(frozen=True)
class CollectivePoint:
    """One timed collective ``op`` over ``ranks`` processes, ``nbytes`` in ``COLLECTIVES``'
    convention; mean ``seconds`` per call on the slowest rank."""

    op: str
    ranks: int
    nbytes: int
    seconds: float

    @property
    def bus_gb_per_s(self) -> float:
        """nccl-tests' bus bandwidth, GB/s (``bus_bandwidth``)."""
        return bus_bandwidth(self.op, self.nbytes, self.ranks, self.seconds) / GB


def bus_bandwidth(op: str, nbytes: float, ranks: int, seconds: float) -> float:
    """Bus bandwidth in bytes/s as nccl-tests defines it (NVIDIA/nccl-tests doc/PERFORMANCE.md):
    ``nbytes / seconds`` times ``2 (n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather,
    reduce-scatter and all-to-all, 1 for send/recv: the rate each link runs at, comparable with
    its wire rate whatever the number of ranks."""
    n = float(ranks)
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
              "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n, "send_recv": 1.0}[op]
    return nbytes / seconds * factor


#: The kinds of points a run records, by the ``Measurements`` field that lists them.
POINTS: dict[str, type] = {"gemm": GemmPoint, "attention": AttentionPoint, "copy": CopyPoint,
                           "transfer": TransferPoint, "collectives": CollectivePoint}


@dataclass
class Measurements:
    """Everything one ``planner profile`` run timed, and what it ran on.

    ``device``: ``cuda`` or ``cpu``; ``device_name``: what torch calls it; ``gpu``: the
    shipped datasheet profile of the same GPU (``None`` for a CPU or an unknown GPU);
    ``memory_bytes``: the device's memory; ``backend``: the ``torch.distributed`` backend of
    the collectives (``nccl`` / ``gloo``), ``None`` when one process ran; ``sweep``:
    ``quick`` / ``standard`` / ``full``; ``duration_s``: wall seconds the run took.
    """

    device: str
    device_name: str
    gpu: str | None
    memory_bytes: float
    torch_version: str
    driver: str
    date: str
    host: str
    sweep: str
    backend: str | None = None
    processes: int = 1
    duration_s: float = 0.0
    gemm: list[GemmPoint] = field(default_factory=list)
    attention: list[AttentionPoint] = field(default_factory=list)
    copy: list[CopyPoint] = field(default_factory=list)
    transfer: list[TransferPoint] = field(default_factory=list)
    collectives: list[CollectivePoint] = field(default_factory=list)

    def best_tflops(self) -> dict[str, float]:
        """The best achieved matmul TFLOP/s of each measured dtype."""
        best: dict[str, float] = {}
        for p in self.gemm:
            best[p.dtype] = max(best.get(p.dtype, 0.0), p.tflops)
        return best

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable: the header fields and the lists of points."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurements:
        """The inverse of ``to_dict`` (also reads a profile's ``[measured]`` table back)."""
        try:
            head = {f.name: data[f.name] for f in fields(cls)
                    if f.name in data and f.name not in POINTS}
            head.setdefault("gpu", None)  # a profile leaves out what is None

            def points(key: str) -> list[Any]:
                kind = POINTS[key]
                return [kind(**{f.name: p[f.name] for f in fields(kind)})
                        for p in data.get(key, [])]

            return cls(**head, gemm=points("gemm"), attention=points("attention"),
                       copy=points("copy"), transfer=points("transfer"),
                       collectives=points("collectives"))
        except (KeyError, TypeError) as e:
            raise SpecError(f"measurements are malformed ({e!r}); write them with "
                            "'planner profile'") from None


# ---- fitting -------------------------------------------------------------------------------

def _log_fit(residuals: Any, x0: list[float], lower: list[float], upper: list[float]
             ) -> np.ndarray:
    """Least squares (scipy, trust region reflective) of ``residuals(x)`` within bounds."""
    x0 = np.clip(np.asarray(x0, dtype=float), lower, upper)
    return least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x


class _EfficiencyChanges(TypedDict, total=False):
    """The numeric fields of ``KernelEfficiency`` a fit sets (``_with_eff``)."""

    gemm: float
    memory: float
    kernel_overhead_s: float
    attention: float
    attention_backward: float
    gemm_fp8: float
    gemm_unaligned: float
    comm_slowdown: float


def _with_eff(gpu: GPU, **changes: Unpack[_EfficiencyChanges]) -> GPU:
    return replace(gpu, efficiency=replace(gpu.efficiency, **changes))


def _gemm_arrays(points: list[GemmPoint]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([getattr(p, k) for p in points], dtype=float)
                 for k in ("m", "n", "k", "seconds"))


def _predict_gemms(gpu: GPU, points: list[GemmPoint]) -> np.ndarray:
    out = np.empty(len(points))
    for dtype in sorted({p.dtype for p in points}):
        idx = [i for i, p in enumerate(points) if p.dtype == dtype]
        m, n, k, _ = _gemm_arrays([points[i] for i in idx])
        out[idx] = gemm_time(gpu, dtype, m, n, k,
                             bytes_per_element=ELEMENT_BYTES[dtype])
    return out


def _predict_copies(gpu: GPU, points: list[CopyPoint]) -> np.ndarray:
    nbytes = np.array([2.0 * p.nbytes for p in points])
    return memory_time(gpu, nbytes, 1.0)


def _log_error(pred: np.ndarray, seconds: np.ndarray) -> float:
    """Mean |relative error| of predictions, in the log sense (exp(|log ratio|) - 1)."""
    return float(np.mean(np.expm1(np.abs(np.log(pred / seconds))))) if len(pred) else 0.0


def _fit_compute(gpu: GPU, meas: Measurements, main: str) -> tuple[GPU, dict[str, Any]]:
    """Fit gemm (on the ``main`` dtype's matmuls), memory and the per-kernel overhead jointly,
    then the other dtypes' matmul fractions and fp8, then fused attention."""
    report: dict[str, Any] = {}
    main_gemms = [p for p in meas.gemm if p.dtype == main]
    fast = [bool(aligned(p.n, p.k, ELEMENT_BYTES[main])) for p in main_gemms]
    gemms = [p for p, f in zip(main_gemms, fast, strict=True) if f]
    unaligned = [p for p, f in zip(main_gemms, fast, strict=True) if not f]
    copies = meas.copy
    g_sec = np.array([p.seconds for p in gemms])
    c_sec = np.array([p.seconds for p in copies])

    def resid(x: np.ndarray) -> np.ndarray:
        cand = _with_eff(gpu, gemm=x[0], memory=x[1], kernel_overhead_s=x[2] * 1e-6)
        r = [np.log(_predict_gemms(cand, gemms) / g_sec)]
        if copies:
            r.append(np.log(_predict_copies(cand, copies) / c_sec))
        return np.concatenate(r)

    eff = gpu.efficiency
    if gemms:
        x = _log_fit(resid, [0.7, eff.memory, 5.0], [1e-3, 1e-3, 0.0], [1.0, 1.0, 1e4])
        gpu = _with_eff(gpu, gemm=float(x[0]), memory=float(x[1]),
                        kernel_overhead_s=float(x[2]) * 1e-6)
    elif copies:
        x = _log_fit(lambda x: np.log(_predict_copies(_with_eff(gpu, memory=x[0]), copies)
                                      / c_sec), [eff.memory], [1e-3], [1.0])
        gpu = _with_eff(gpu, memory=float(x[0]))
    report["gemm_error"] = _log_error(_predict_gemms(gpu, gemms), g_sec)
    if unaligned:
        # Matmuls with a dimension off the 16-byte grid run on cuBLAS's unaligned kernels:
        # their own fraction, the overhead and memory held (compute.gemm_time).
        u_sec = np.array([p.seconds for p in unaligned])
        x = _log_fit(lambda x: np.log(_predict_gemms(_with_eff(gpu, gemm_unaligned=x[0]),
                                                     unaligned) / u_sec), [0.2], [1e-3], [1.0])
        gpu = _with_eff(gpu, gemm_unaligned=float(x[0]))
        report["gemm_unaligned_error"] = _log_error(_predict_gemms(gpu, unaligned), u_sec)
    report["copy_error"] = _log_error(_predict_copies(gpu, copies), c_sec) if copies else 0.0

    # Every dtype's own matmul fraction (overhead and memory held): the record of how each
    # math unit fares; fp8's becomes gemm_fp8, which the cost model uses for fp8 jobs.
    by_dtype: dict[str, float] = {}
    for dtype in sorted({p.dtype for p in meas.gemm}):
        pts = [p for p in meas.gemm if p.dtype == dtype]
        if dtype == main:
            by_dtype[dtype] = gpu.efficiency.gemm
            continue
        if not gpu.supports(dtype):
            continue
        sec = np.array([p.seconds for p in pts])
        key = "gemm_fp8" if dtype == "fp8" else "gemm"
        x = _log_fit(lambda x, g=gpu, pts=pts, sec=sec, key=key: np.log(
            _predict_gemms(_with_eff(g, **{key: x[0]}), pts) / sec), [0.7], [1e-3], [1.0])
        by_dtype[dtype] = float(x[0])
        if dtype == "fp8":
            gpu = _with_eff(gpu, gemm_fp8=float(x[0]))
    report["gemm_efficiency_by_dtype"] = by_dtype

    att = [p for p in meas.attention if gpu.supports(p.dtype)]
    if att:
        flops = np.array([p.forward_flops for p in att])
        keys = np.array([float(p.seq_len) for p in att])
        head_dims = np.array([float(p.head_dim) for p in att])  # fitted at head dim 128
        fwd = np.array([p.forward_s for p in att])
        bwd = np.array([p.backward_s for p in att])
        dtype = att[0].dtype

        def att_resid(x: np.ndarray, which: int, sec: np.ndarray) -> np.ndarray:
            key = ("attention", "attention_backward")[which]
            return np.log(flash_attention_time(_with_eff(gpu, **{key: x[0]}), dtype,
                                               flops, keys, head_dim=head_dims)[which] / sec)

        a = _log_fit(lambda x: att_resid(x, 0, fwd), [0.5], [1e-3], [1.0])
        b = _log_fit(lambda x: att_resid(x, 1, bwd), [0.5], [1e-3], [1.0])
        gpu = _with_eff(gpu, attention=float(a[0]), attention_backward=float(b[0]))
        f_pred, b_pred = flash_attention_time(gpu, dtype, flops, keys, head_dim=head_dims)
        report["attention_error"] = _log_error(f_pred, fwd)
        report["attention_backward_error"] = _log_error(b_pred, bwd)
    return gpu, report


def _fit_host(points: list[TransferPoint]) -> tuple[float, float, float]:
    """(bytes/s, latency s, mean relative error) of ``t = S / B + L`` over host copies, by
    non-negative least squares on the relative residual ``(S/B + L) / t - 1``."""
    s = np.array([p.nbytes for p in points], dtype=float)
    t = np.array([p.seconds for p in points], dtype=float)
    coef, _ = nnls(np.stack([s / t, 1.0 / t], axis=1), np.ones_like(t))
    inv_bw = coef[0] if coef[0] > 0 else float(np.max(t / s))
    pred = s * inv_bw + coef[1]
    return 1.0 / inv_bw, float(coef[1]), _log_error(pred, t)


def _predict_collectives(topo: Topology, points: list[CollectivePoint]) -> np.ndarray:
    out = []
    for p in points:
        n, s = np.array(float(p.ranks)), np.array(float(p.nbytes))
        if p.op == "send_recv":
            out.append(topo.p2p(s, np.array(1.0)))
        else:
            out.append(getattr(topo, p.op)(s, n, np.array(1.0)))
    return np.array(out, dtype=float)


def fit_link(points: list[CollectivePoint], bandwidth: float | None = None,
             ll_latency: float | None = None) -> tuple[float, float, float, float]:
    """(bytes/s, LL per-hop latency s, Simple per-hop latency s, mean relative error) of the
    link between the processes: ``Topology``'s formulas for a group inside one node, with
    NCCL's base latencies and LL bandwidth share (``software.toml`` ``[nccl]``). Least squares
    on log time. ``bandwidth`` (bytes/s) and ``ll_latency`` (s) hold those instead of fitting
    them: published sweeps time small messages with the host's launch cost in them."""
    n = max(p.ranks for p in points)
    t = np.array([p.seconds for p in points])
    nccl = hardware_profiles.load_software()["nccl"]

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        bw = bandwidth if bandwidth is not None else math.exp(x[0])
        ll = ll_latency if ll_latency is not None else x[1] * 1e-6
        return bw, ll, x[2] * 1e-6

    def topo(x: np.ndarray) -> Topology:
        bw, ll, simple = unpack(x)
        return Topology(gpus_per_domain=n, base_lat=float(nccl["base_latency_us"]) * 1e-6,
                        intra_bw=bw, intra_lat=ll, nic_bw_per_gpu=bw, inter_lat=ll,
                        base_lat_simple=float(nccl["base_latency_simple_us"]) * 1e-6,
                        intra_lat_simple=simple, inter_lat_simple=simple,
                        ll_share=float(nccl["ll_bandwidth_share"]))

    # The link is at least as fast as the best bus bandwidth seen, and (latency aside) not
    # much faster: the cap keeps a sweep of only small, latency-bound messages from
    # inventing an unbounded bandwidth.
    best = max(bus_bandwidth(p.op, p.nbytes, p.ranks, p.seconds) for p in points)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(_predict_collectives(topo(x), points) / t)

    # The time is the smaller of two protocols' lines, so the fit starts from a few points
    # and keeps the best (one bandwidth start when the bandwidth is held).
    factors = (1.05, 2.0) if bandwidth is None else (1.05,)
    starts = [[math.log(f * best), 1.0, lat] for f in factors for lat in (3.0, 30.0)]
    fits = [_log_fit(residuals, x0, [math.log(best), 0.0, 0.0], [math.log(10 * best), 1e6, 1e6])
            for x0 in starts]
    x = min(fits, key=lambda x: float(np.sum(residuals(x) ** 2)))
    bw, ll, simple = unpack(x)
    return bw, ll, simple, _log_error(_predict_collectives(topo(x), points), t)


def _link_table(base: dict[str, Any] | None, name: str, scope: str, bw: float, lat: float,
                what: str, err: float, simple_lat: float | None = None) -> dict[str, Any]:
    """A link profile (``hardware_profiles/links`` format) of a fitted bandwidth: the wire rate
    of the datasheet link with ``efficiency`` = achieved / wire, or the achieved rate itself."""
    wire = float(base["bandwidth_gb_per_s"]) * GB if base else bw
    wire = max(wire, bw)
    return {"name": base.get("name", name) if base else name,
            "description": f"measured: {what}",
            "scope": scope, "bandwidth_gb_per_s": round(wire / GB, 4),
            "latency_us": round(lat * 1e6, 4),
            **({"simple_latency_us": round(simple_lat * 1e6, 4)} if simple_lat is not None
               else {}),
            "efficiency": round(float(min(1.0, bw / wire)), 4),
            "source": {"document": f"planner profile: {what}; fitted with mean |error| "
                       f"{100 * err:.1f}%" + ("; wire rate from hardware_profiles/links/"
                                              f"{base['name']}.toml" if base else "")}}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def fit_profile(meas: Measurements) -> dict[str, Any]:
    """The GPU profile table (``hardware_profiles/gpus`` format plus a ``[measured]`` table)
    that ``meas`` supports; raises ``SpecError`` when it holds no matmul or copy times."""
    if not meas.gemm and not meas.copy:
        raise SpecError("the measurements hold no matmul or copy times to fit a profile to")
    main = next((d for d in ("bf16", "fp16", "fp32") if any(p.dtype == d for p in meas.gemm)),
                "bf16")
    base = hardware_profiles.load("gpus", meas.gpu, calibrated=False) if meas.gpu else None
    if base is not None:
        table = {k: v for k, v in base.items() if k not in ("efficiency", "source")}
        table["efficiency"] = dict(base["efficiency"])
        basis = (f"peaks, HBM bandwidth and link wire rates: the datasheet profile "
                 f"hardware_profiles/gpus/{meas.gpu}.toml")
    else:
        peaks = meas.best_tflops()
        if "fp32" in peaks:
            peaks.setdefault("tf32", peaks["fp32"])  # no tf32 units: fp32 jobs run fp32 math
        copy_bw = max((p.gb_per_s for p in meas.copy), default=1.0)
        table = {"name": "cpu" if meas.device == "cpu" else _slug(meas.device_name),
                 "vendor": "measured", "memory_bandwidth_gb_per_s": round(copy_bw, 4),
                 "peak_tflops": {d: round(v, 6) for d, v in peaks.items() if d in DTYPES},
                 "efficiency": {"gemm": 1.0, "memory": 1.0, "attention": 0.5,
                                "attention_backward": 0.5, "kernel_overhead_us": 5.0}}
        basis = ("no datasheet profile of this device: peaks are the best measured matmul "
                 "rates and the HBM bandwidth the best measured copy")
    table["description"] = f"{meas.device_name}, measured by planner profile on {meas.date}"
    if meas.memory_bytes > 0:
        # What CUDA reported: the capacity itself, not the datasheet's figure.
        table["memory_gib"] = round(meas.memory_bytes / GIB, 3)
        table.pop("usable_memory_gib", None)
    table.setdefault("memory_gib", 1.0)
    eff = dict(table["efficiency"])
    eff["kernel_overhead_us"] = eff.get("kernel_overhead_us", 5.0)
    eff.pop("source", None)
    gpu = GPU.from_profile({**table, "efficiency": eff, "intra_node_link": "pcie5",
                            "host_link": "pcie5"})
    gpu, report = _fit_compute(gpu, meas, main)
    e = gpu.efficiency
    table["efficiency"] = {
        "gemm": round(e.gemm, 4), "memory": round(e.memory, 4),
        "attention": round(e.attention, 4), "attention_backward": round(e.attention_backward, 4),
        "kernel_overhead_us": round(e.kernel_overhead_s * 1e6, 4),
        **({"gemm_fp8": round(e.gemm_fp8, 4)} if e.gemm_fp8 is not None else {}),
        **({"gemm_unaligned": round(e.gemm_unaligned, 4)} if e.gemm_unaligned is not None
           else {}),
        "source": (f"planner profile on {meas.date} ({meas.device_name}, torch "
                   f"{meas.torch_version}, driver {meas.driver}): least squares on log time "
                   f"of {len(meas.gemm)} matmuls ({main} for gemm), {len(meas.copy)} copies "
                   f"and {len(meas.attention)} fused attentions with the cost model's own "
                   f"roofline; {basis}"),
    }
    if meas.transfer:
        bw, lat, err = _fit_host(meas.transfer)
        link = hardware_profiles.load("links", str(base["host_link"])) if base else None
        table.pop("host_link", None)  # a measured link is a table: after the scalars
        table["host_link"] = _link_table(link, "host", "host", bw, lat,
                                         "pinned host-device copies", err)
        report["host_link_error"] = err
    if meas.collectives:
        bw, lat, simple, err = fit_link(meas.collectives)
        link = (hardware_profiles.load("links", str(base["intra_node_link"]))
                if base else None)
        table.pop("intra_node_link", None)
        table["intra_node_link"] = _link_table(
            link, meas.backend or "measured", "intra-node", bw, lat,
            f"{meas.backend} collectives among {meas.processes} processes", err, simple)
        report["intra_node_link_error"] = err
    table["source"] = {"document": f"measured with planner profile ({meas.sweep} sweep) on "
                       f"{meas.date}", "notes": basis}
    table["measured"] = {
        "tool": "planner profile", **{k: v for k, v in meas.to_dict().items()
                                      if k not in POINTS and v is not None},
        "fit": report,
        **{k: [asdict(p) for p in getattr(meas, k)] for k in POINTS},
    }
    return table


# ---- TOML ----------------------------------------------------------------------------------

def profile_toml(meas: Measurements, table: dict[str, Any] | None = None) -> str:
    """The measured profile's TOML text: ``table`` (default ``fit_profile(meas)``) with a
    header saying how it was made."""
    table = fit_profile(meas) if table is None else table
    header = (f"Written by `planner profile` on {meas.date}: measured on {meas.device_name}, "
              "not a datasheet.\nPlan with it: --profile FILE (Python: GPU.from_file); re-run "
              "the command to refresh it.")
    return to_toml(table, header)

"""GPU, Link and Cluster: hardware profiles turned into SI-unit values.

Profiles hold human units (GB/s, TFLOP/s, GiB) with their sources; these types hold bytes,
bytes/s, FLOP/s and seconds. GB here is decimal (1e9) for bandwidths, GiB binary for capacity.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.efficiency import KernelEfficiency
from costmodel.errors import SpecError
from costmodel.units import GB, GIB, TFLOPS
from hardware_profiles.numbers import real

__all__ = ["GPU", "Cluster", "KernelEfficiency", "Link", "mesh_share"]

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4", "mxfp4")


#: Sanity bounds of the physical quantities a profile gives, each far beyond any device
#: built (so a typo, an infinity or a unit slip is an error, not a plan; a kernel's fixed
#: overhead: ``costmodel.efficiency.MAX_KERNEL_OVERHEAD_S``): a GPU's memory (bytes) and
#: HBM bandwidth (bytes/s), a dense peak (FLOP/s), a link's bandwidth (bytes/s) and latency
#: (s), a GPU-hour's price (US dollars), a node's CPU memory (GiB).
MAX_MEMORY_BYTES = 2.0**44
MAX_MEMORY_BANDWIDTH = 1e15
MAX_PEAK_FLOPS = 1e18
MAX_LINK_BANDWIDTH = 1e14
MAX_LATENCY_S = 1.0
MAX_USD_PER_GPU_HOUR = 1e4
MAX_HOST_MEMORY_GIB = 2.0**20
MAX_POWER_W = 1e5


def _price(table: Any, name: str) -> float | None:
    """``[price] usd_per_gpu_hour`` of a GPU profile, or ``None`` when it has none."""
    if table is None:
        return None
    value = table.get("usd_per_gpu_hour") if isinstance(table, dict) else None
    return real(value, f"GPU profile {name!r}: [price] usd_per_gpu_hour (US dollars per "
                "GPU-hour)", lo=0.0, lo_open=True, hi=MAX_USD_PER_GPU_HOUR)


def _usable_memory(data: dict[str, Any], name: str) -> float:
    """GiB a process can allocate: ``usable_memory_gib`` where the profile has it (CUDA's
    total, below the datasheet's ``memory_gib``), else ``memory_gib``."""
    nominal = real(data["memory_gib"], f"GPU profile {name!r}: memory_gib", lo=0.0,
                   lo_open=True, hi=MAX_MEMORY_BYTES / GIB)
    if "usable_memory_gib" not in data:
        return nominal
    return real(data["usable_memory_gib"], f"GPU profile {name!r}: usable_memory_gib",
                lo=0.0, lo_open=True, hi=nominal)


def _peaks(table: Any, name: str) -> tuple[tuple[str, float], ...]:
    """``[peak_tflops]`` as (dtype, FLOP/s) pairs; a table of numbers by dtype."""
    if not isinstance(table, dict):
        raise SpecError(f"GPU profile {name!r}: peak_tflops must be a table of dense peaks "
                        f"by dtype ([peak_tflops] bf16 = 989), got {str(table)[:60]!r}")
    return tuple((k, real(v, f"GPU profile {name!r}: peak_tflops.{k}", lo=0.0, lo_open=True,
                          hi=MAX_PEAK_FLOPS / TFLOPS) * TFLOPS)
                 for k, v in table.items() if k in DTYPES)


def _document(data: dict[str, Any]) -> str:
    """The ``[source] document`` of a profile ("" without one; a ``source`` that is not a
    table is refused)."""
    src = data.get("source", {})
    if not isinstance(src, dict):
        raise SpecError(f"profile {str(data.get('name', '?'))!r}: source must be a table "
                        f"([source] document = \"...\"), got {str(src)[:60]!r}")
    return str(src.get("document", ""))


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One accelerator: memory capacity (bytes), HBM bandwidth (bytes/s), dense peak FLOP/s,
    the kernel efficiencies the step-time model uses, its default link to the other GPUs of
    a node and its host link (for offload): link profile names, or ``Link`` objects where a
    measured profile carries its own (``planner profile``).

    ``memory_bytes`` is what a process can allocate: the device memory CUDA reports
    (``torch.cuda.get_device_properties().total_memory``), less than the datasheet's, whose
    rest the driver keeps. A profile gives it as ``usable_memory_gib`` (else its datasheet
    ``memory_gib`` is used); a measured profile's ``memory_gib`` is that figure already."""

    name: str
    description: str = ""
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops_by_dtype: tuple[tuple[str, float], ...]
    efficiency: KernelEfficiency
    intra_node_link: str | Link = "pcie5"
    host_link: str | Link = "pcie5"
    source: str = ""
    #: On-demand rental price of one GPU (US dollars per hour), when the profile has one:
    #: what ``Estimate.usd_per_million_tokens`` and ``planner compare --rank-by cost`` use.
    usd_per_gpu_hour: float | None = None
    #: GPU generation ("ampere", "hopper", ...): the in-training efficiency ratios that
    #: ``planner calibrate`` fits are per architecture (``hardware_profiles/calibrated/
    #: transfer.toml``); "" takes the pooled ratio.
    architecture: str = ""
    #: Thermal design power (W) of the datasheet; ``None`` where the profile gives none.
    tdp_w: float | None = None
    #: The power limit (W) this GPU's efficiencies are scaled to (``power_limited``);
    #: ``None``: its TDP.
    power_limit_w: float | None = None
    #: The efficiencies the profile takes from another GPU or a paper rather than a
    #: measurement on this one (its ``[efficiency] assumed`` list): an estimate on a GPU with
    #: any, and no published run of its own behind the fit, carries a widened band.
    assumed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        who = f"GPU {self.name!r}"
        object.__setattr__(self, "assumed", tuple(str(a) for a in self.assumed))
        if self.tdp_w is not None:
            object.__setattr__(self, "tdp_w", real(self.tdp_w, f"{who}: tdp_w (W)", lo=0.0,
                                                   lo_open=True, hi=MAX_POWER_W))
        if self.usd_per_gpu_hour is not None:
            object.__setattr__(self, "usd_per_gpu_hour", real(
                self.usd_per_gpu_hour, f"{who}: usd_per_gpu_hour", lo=0.0, lo_open=True,
                hi=MAX_USD_PER_GPU_HOUR))
        object.__setattr__(self, "memory_bytes", real(
            self.memory_bytes, f"{who}: memory_bytes", lo=0.0, lo_open=True,
            hi=MAX_MEMORY_BYTES))
        object.__setattr__(self, "memory_bandwidth_bytes_per_s", real(
            self.memory_bandwidth_bytes_per_s, f"{who}: memory_bandwidth_bytes_per_s", lo=0.0,
            lo_open=True, hi=MAX_MEMORY_BANDWIDTH))
        for dtype, flops in self.peak_flops_by_dtype:
            if dtype not in DTYPES:
                raise SpecError(f"{who}: bad peak entry {dtype}={flops}; dtypes are "
                                f"{', '.join(DTYPES)}")
            real(flops, f"{who}: peak FLOP/s of {dtype}", lo=0.0, lo_open=True,
                 hi=MAX_PEAK_FLOPS)
        if not isinstance(self.efficiency, KernelEfficiency):
            raise SpecError(f"{who}: efficiency must be a KernelEfficiency, got "
                            f"{type(self.efficiency).__name__}")

    @classmethod
    def from_profile(cls, data: dict[str, Any]) -> GPU:
        """Build from a parsed ``hardware_profiles/gpus/*.toml`` table (human units)."""
        name = str(data.get("name", "?"))
        try:
            return cls(
                name=name,
                description=str(data.get("description", "")),
                memory_bytes=_usable_memory(data, name) * GIB,
                memory_bandwidth_bytes_per_s=real(
                    data["memory_bandwidth_gb_per_s"],
                    f"GPU profile {name!r}: memory_bandwidth_gb_per_s", lo=0.0, lo_open=True,
                    hi=MAX_MEMORY_BANDWIDTH / GB) * GB,
                peak_flops_by_dtype=_peaks(data["peak_tflops"], name),
                efficiency=KernelEfficiency.from_profile(data["efficiency"], f"GPU {name!r}"),
                intra_node_link=_link_entry(data.get("intra_node_link", "pcie5")),
                host_link=_link_entry(data.get("host_link", "pcie5")),
                source=_document(data),
                usd_per_gpu_hour=_price(data.get("price"), name),
                architecture=str(data.get("architecture", "")),
                tdp_w=data.get("tdp_w"),
                assumed=tuple(data["efficiency"].get("assumed", ())),
            )
        except KeyError as e:
            raise SpecError(f"GPU profile {name!r} lacks the key {e.args[0]!r}") from None

    def power_limited(self, limit_w: float) -> GPU:
        """This GPU held at ``limit_w`` watts: its compute-bound fractions (matmul, fused
        attention) times ``(limit / TDP) ** compute_exponent`` (``software.toml`` ``[power]``,
        fitted to NVIDIA's MLPerf MaxQ/MaxP pairs on H100), its memory-bound ones unchanged.
        The GPU itself at or above its TDP, or without one."""
        if self.tdp_w is None:
            return self
        alpha = float(hardware_profiles.load_software()["power"]["compute_exponent"])
        now = min(self.power_limit_w or self.tdp_w, self.tdp_w)
        new = min(limit_w, self.tdp_w)
        if new == now:
            return self
        f = (new / now) ** alpha
        e = self.efficiency
        # Every fraction of a datasheet peak the profile gives (hardware_profiles.FRACTIONS),
        # but the memory-bound one.
        scaled = {k: getattr(e, k) * f for k in hardware_profiles.FRACTIONS
                  if k != "memory" and getattr(e, k) is not None}
        return replace(self, efficiency=replace(e, **scaled), power_limit_w=new)

    @property
    def amd(self) -> bool:
        """An AMD Instinct GPU (a CDNA architecture): its ``"cudnn"`` attention kernel is AMD's
        own v3 kernels, which only Transformer Engine on ROCm runs."""
        return self.architecture.startswith("cdna")

    @property
    def usd_per_gpu_second(self) -> float | None:
        """The rental price per GPU-second (US dollars), or ``None`` without a price."""
        return None if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour / 3600.0

    @classmethod
    def from_file(cls, path: str | Path) -> GPU:
        """A GPU profile TOML outside the shipped set: one ``planner profile`` measured (it
        has a ``[measured]`` table) or one written by hand in the ``hardware_profiles/gpus``
        format. Its microbenchmark fractions become in-training ones as a shipped profile's
        do (``hardware_profiles.transfer_efficiency``); a measured profile keeps its own
        per-kernel overhead."""
        data = hardware_profiles.load_file(path)
        data.setdefault("name", Path(path).stem)
        if not isinstance(data.get("efficiency"), dict):
            raise SpecError(f"profile file {str(path)!r} has no [efficiency] table; write one "
                            "with 'planner profile -o FILE' or copy a hardware_profiles/gpus "
                            "file")
        try:
            eff = hardware_profiles.check_efficiency(data["efficiency"])
        except SpecError as e:
            raise SpecError(f"profile file {str(path)!r}: {e}") from None
        data["efficiency"] = hardware_profiles.transfer_efficiency(
            eff, overhead="measured" not in data, architecture=str(data.get("architecture", "")))
        try:
            return cls.from_profile(data)
        except (SpecError, TypeError, ValueError) as e:
            raise SpecError(f"profile file {str(path)!r}: {e}") from None

    @classmethod
    def preset(cls, name: str, *, calibrated: bool = True) -> GPU:
        """A shipped GPU profile by name (``h100-sxm``, ``a100-80gb``, ...); ``calibrated``
        applies what ``planner calibrate`` fitted (see ``hardware_profiles.load``)."""
        return cls.from_profile(hardware_profiles.load("gpus", name, calibrated=calibrated))

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; SpecError if the chip has no such math units."""
        for d, f in self.peak_flops_by_dtype:
            if d == dtype:
                return f
        have = ", ".join(d for d, _ in self.peak_flops_by_dtype)
        raise SpecError(f"GPU {self.name!r} has no {dtype} peak in its profile (it has: {have})")

    def supports(self, dtype: str) -> bool:
        """Whether the profile lists a peak for ``dtype``."""
        return any(d == dtype for d, _ in self.peak_flops_by_dtype)

    def intra_link(self) -> Link:
        """The GPU's default link to the other GPUs of its node: a shipped link profile by
        name, or the link a measured profile carries (``planner profile``)."""
        link = self.intra_node_link
        return link if isinstance(link, Link) else Link.preset(link)

    def host(self) -> Link:
        """The GPU-to-host link offload crosses: a shipped link profile by name, or the
        link a measured profile carries (``planner profile``)."""
        return self._host

    @cached_property
    def _host(self) -> Link:
        # Read once per GPU: the cost model asks for every chunk of a search's table.
        return self.host_link if isinstance(self.host_link, Link) else Link.preset(self.host_link)


@dataclass(frozen=True, kw_only=True)
class Link:
    """One interconnect: per-direction bandwidth (bytes/s), one-way latency per hop (s) of
    NCCL's LL protocol and of its Simple protocol (``simple_latency_s``; ``None``: the same),
    and ``efficiency``, the fraction of the bandwidth a large NCCL transfer achieves (bus
    bandwidth measured by nccl-tests over the wire rate).

    ``mesh_peers``: 0 for a switched link (NVLink through NVSwitch, a NIC into a fabric),
    where any group of GPUs gets the whole ``bandwidth_bytes_per_s`` of each; otherwise the
    number of direct point-to-point links of a GPU in a fully connected mesh (AMD Infinity
    Fabric: 7 in an 8-GPU platform), ``bandwidth_bytes_per_s`` being their sum. A collective
    among ``k`` GPUs of the mesh then drives only the ``k - 1`` links that join them
    (``share``): RCCL builds its rings and all-to-all sends on direct links.
    """

    name: str
    description: str = ""
    scope: str = "intra-node"
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0
    source: str = ""
    simple_latency_s: float | None = None
    mesh_peers: int = 0

    def __post_init__(self) -> None:
        who = f"link {self.name!r}"
        if not isinstance(self.mesh_peers, int) or isinstance(self.mesh_peers, bool) \
                or not 0 <= self.mesh_peers <= 1024:
            raise SpecError(f"{who}: mesh_peers must be a whole number from 0 (a switch) to "
                            f"1024 (direct links of a GPU), got {self.mesh_peers!r}")
        if self.simple_latency_s is not None:
            object.__setattr__(self, "simple_latency_s", real(
                self.simple_latency_s, f"{who}: simple_latency_s", lo=0.0, hi=MAX_LATENCY_S))
        object.__setattr__(self, "bandwidth_bytes_per_s", real(
            self.bandwidth_bytes_per_s, f"{who}: bandwidth_bytes_per_s", lo=0.0, lo_open=True,
            hi=MAX_LINK_BANDWIDTH))
        object.__setattr__(self, "latency_s", real(self.latency_s, f"{who}: latency_s", lo=0.0,
                                                   hi=MAX_LATENCY_S))
        object.__setattr__(self, "efficiency", real(self.efficiency, f"{who}: efficiency",
                                                    lo=0.0, lo_open=True, hi=1.0))

    @property
    def achieved_bytes_per_s(self) -> float:
        """Bandwidth a large transfer achieves: ``bandwidth * efficiency``."""
        return self.bandwidth_bytes_per_s * self.efficiency

    def share(self, ranks: float) -> float:
        """Fraction of the bandwidth a collective among ``ranks`` GPUs of this link's domain
        can use (``mesh_share``)."""
        return float(mesh_share(ranks, self.mesh_peers))

    @classmethod
    def from_profile(cls, data: dict[str, Any]) -> Link:
        """Build from a parsed ``hardware_profiles/links/*.toml`` table (GB/s, microseconds)."""
        name = str(data.get("name", "?"))
        who = f"link profile {name!r}"

        def number(key: str, scale: float, hi: float, lo_open: bool = False) -> float:
            return real(data[key], f"{who}: {key}", lo=0.0, lo_open=lo_open,
                        hi=hi / scale) * scale

        try:
            return cls(
                name=name,
                description=str(data.get("description", "")),
                scope=str(data.get("scope", "intra-node")),
                bandwidth_bytes_per_s=number("bandwidth_gb_per_s", GB, MAX_LINK_BANDWIDTH,
                                             lo_open=True),
                latency_s=number("latency_us", 1e-6, MAX_LATENCY_S),
                efficiency=data["efficiency"],
                source=_document(data),
                simple_latency_s=(number("simple_latency_us", 1e-6, MAX_LATENCY_S)
                                  if "simple_latency_us" in data else None),
                mesh_peers=data.get("mesh_peers", 0),
            )
        except KeyError as e:
            raise SpecError(f"link profile {name!r} lacks the key {e.args[0]!r}") from None

    @classmethod
    def preset(cls, name: str) -> Link:
        """A shipped link profile by name (``nvlink4``, ``ib-ndr``, ...)."""
        return cls.from_profile(hardware_profiles.load("links", name))


def mesh_share(ranks: Any, mesh_peers: int) -> Any:
    """Fraction of a scale-up link's bandwidth a collective among ``ranks`` GPUs of its
    domain can use (``ranks`` a number or an array): all of it through a switch
    (``mesh_peers`` 0); ``(ranks - 1) / mesh_peers`` of a full mesh, the direct links between
    them (one link for a send between two GPUs)."""
    ranks = np.asarray(ranks, dtype=float)
    if not mesh_peers:
        return np.ones_like(ranks)
    return np.minimum(1.0, np.maximum(ranks - 1.0, 1.0) / mesh_peers)


def _link_entry(value: Any) -> str | Link:
    """A GPU profile's ``intra_node_link`` / ``host_link``: a link profile's name, or an
    inline link table (what ``planner profile`` writes when it measured the link)."""
    return Link.from_profile(value) if isinstance(value, dict) else str(value)


def _as_gpu(value: GPU | str) -> GPU:
    if isinstance(value, GPU):
        return value
    if hardware_profiles.is_path(str(value)):
        return GPU.from_file(value)
    return GPU.preset(value)


def _as_link(value: Link | str) -> Link:
    return value if isinstance(value, Link) else Link.preset(value)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """``num_nodes`` nodes of ``gpus_per_node`` GPUs; one scale-up link joins the GPUs of a
    domain of ``gpus_per_domain`` GPUs (one node, or several: an NVL72 rack's NVLink joins 18
    trays of 4), NICs join the domains.

    ``gpus_per_domain`` defaults to ``gpus_per_node`` (a DGX/HGX box, whose NVLink ends at
    the box); it must be a multiple of it, and the cluster holds whole domains (or fewer GPUs
    than one). A node is what one host holds: its CPU memory, the NICs it drives
    (``nics_per_node``, one per GPU on rail-optimized systems), the processes one launcher
    starts. Every collective is costed by the level its group spans: the scale-up link
    inside a domain, the NICs between domains (``costmodel.formulas.comm``).

    ``power_limit_w``: the power limit each GPU is held at (W; ``nvidia-smi -pl``), at most
    its profile's ``tdp_w`` (above it: an error): the compute-bound efficiencies scale down
    (``GPU.power_limited``).

    ``gpu`` and the links accept a profile name or an object; ``gpu`` also a GPU profile TOML
    file (``planner profile`` writes one). ``intra_node_link`` defaults to the GPU's own
    (NVLink generation or PCIe, or the link a measured profile measured),
    ``inter_node_link`` to 400 Gb/s NDR InfiniBand, and ``nics_per_node`` to one NIC per GPU.
    ``host_memory_gib``: CPU memory per node, what offload may fill (default ``[host]
    memory_gib_per_node`` of ``software.toml``).
    """

    gpu: GPU
    num_nodes: int = 1
    gpus_per_node: int = 8
    intra_node_link: Link | str | None = None
    inter_node_link: Link | str | None = None
    nics_per_node: int | None = None
    host_memory_gib: float | None = None
    name: str = "custom"
    gpus_per_domain: int | None = None
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        for key in ("num_nodes", "gpus_per_node"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(f"Cluster.{key} must be a positive integer, got {v!r}")
        self._check_domain()
        # Sanity bound: the largest clusters built hold ~10^5 GPUs; 2^20 catches typos.
        if self.num_nodes * self.gpus_per_node > 2**20:
            raise SpecError(f"Cluster: {self.num_nodes * self.gpus_per_node:,} GPUs is beyond "
                            "any cluster (at most 1,048,576); check --gpus / --num-nodes")
        gpu = _as_gpu(self.gpu)
        if self.power_limit_w is not None:
            limit = real(self.power_limit_w, "Cluster.power_limit_w (W per GPU)", lo=0.0,
                         lo_open=True, hi=MAX_POWER_W)
            object.__setattr__(self, "power_limit_w", limit)
            if gpu.tdp_w is None:
                raise SpecError(f"Cluster.power_limit_w={limit:g}: GPU profile {gpu.name!r} "
                                "gives no tdp_w to scale from; add it to the profile")
            if limit > gpu.tdp_w:
                # A limit above the TDP would bind nothing; far above it, it is a typo.
                raise SpecError(f"Cluster.power_limit_w={limit:g} W is above {gpu.name}'s "
                                f"TDP ({gpu.tdp_w:g} W), the most it is configured to draw: "
                                f"give a limit of at most {gpu.tdp_w:g} W, or none")
            gpu = gpu.power_limited(limit)
        object.__setattr__(self, "gpu", gpu)
        intra = self.intra_node_link if self.intra_node_link is not None else gpu.intra_node_link
        object.__setattr__(self, "intra_node_link", _as_link(intra))
        inter = self.inter_node_link if self.inter_node_link is not None else "ib-ndr"
        object.__setattr__(self, "inter_node_link", _as_link(inter))
        nics = self.nics_per_node if self.nics_per_node is not None else self.gpus_per_node
        if not isinstance(nics, int) or nics < 1:
            raise SpecError(f"Cluster.nics_per_node must be a positive integer, got {nics!r}")
        object.__setattr__(self, "nics_per_node", nics)
        host = self.host_memory_gib
        if host is None:
            host = float(hardware_profiles.load_software()["host"]["memory_gib_per_node"])
        object.__setattr__(self, "host_memory_gib", real(
            host, "Cluster.host_memory_gib (CPU memory per node, GiB)", lo=0.0, lo_open=True,
            hi=MAX_HOST_MEMORY_GIB))

    def _check_domain(self) -> None:
        """Fill ``gpus_per_domain`` (default: a node) and check that domains hold whole
        nodes and the cluster whole domains."""
        g, d = self.gpus_per_node, self.gpus_per_domain
        if d is None:
            object.__setattr__(self, "gpus_per_domain", g)
            return
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            raise SpecError(f"Cluster.gpus_per_domain must be a positive integer, got {d!r}")
        if d % g:
            raise SpecError(f"gpus_per_domain={d} is not a multiple of gpus_per_node={g}: a "
                            "scale-up domain (NVLink / Infinity Fabric) holds whole nodes")
        n = self.num_nodes * g
        if n > d and n % d:
            # The job's nodes may instead split into equal domain parts, as Slurm's
            # --segment places them on NVL72 racks (Megatron-Bridge's launcher: all nodes when
            # they fit one rack, else the largest divisor of the node count that does,
            # scripts/performance/utils/executors.py @c0b9a000).
            k = max(nodes for nodes in range(1, d // g + 1) if self.num_nodes % nodes == 0)
            split = (f", or say how the job's nodes split into domains: gpus_per_domain="
                     f"{k * g} (--gpus-per-domain {k * g}: {self.num_nodes // k} domains of {k} "
                     f"nodes, as Slurm's --segment {k} places them)") if k > 1 else ""
            raise SpecError(
                f"{n} GPUs do not fill whole scale-up domains of {d}; use a multiple of {d} "
                f"GPUs ({d // g} nodes of {g}), or at most {d}{split}")

    @property
    def scale_up(self) -> int:
        """GPUs the scale-up link joins (``gpus_per_domain``, at most the cluster)."""
        d = self.gpus_per_domain
        assert d is not None, "Cluster.__post_init__ fills gpus_per_domain"
        return min(d, self.num_gpus)

    def whole_domains(self, nodes: int) -> int:
        """``nodes`` rounded up to whole scale-up domains once they fill more than one (the
        node counts a cluster of this kind can have: 36 trays of an NVL72 rack, not 32)."""
        per = int(self.gpus_per_domain or self.gpus_per_node) // self.gpus_per_node
        return nodes if nodes <= per else -(-nodes // per) * per

    def domain_words(self) -> str:
        """The scale-up domain in words: "the 8 GPUs of a node", "the 72 GPUs of an nvlink5
        domain (18 nodes of 4)"."""
        if self.scale_up <= self.gpus_per_node:
            return f"the {self.scale_up} GPUs of a node"
        return (f"the {self.scale_up} GPUs of an {self.intra_link.name} domain "
                f"({self.scale_up // self.gpus_per_node} nodes of {self.gpus_per_node})")

    @property
    def host_memory_bytes_per_gpu(self) -> float:
        """CPU memory each GPU's share of its node holds, bytes."""
        return float(self.host_memory_gib) * GIB / self.gpus_per_node  # type: ignore[arg-type]

    @property
    def num_gpus(self) -> int:
        """Total GPUs: ``num_nodes * gpus_per_node``."""
        return self.num_nodes * self.gpus_per_node

    @property
    def intra_link(self) -> Link:
        """The link between the GPUs of a node, as ``__post_init__`` resolved
        ``intra_node_link`` (a name or ``None`` becomes a ``Link``)."""
        link = self.intra_node_link
        assert isinstance(link, Link), "Cluster.__post_init__ resolves intra_node_link"
        return link

    @property
    def inter_link(self) -> Link:
        """The link between nodes (one NIC of ``nics_per_node``), as ``__post_init__``
        resolved ``inter_node_link`` (a name or ``None`` becomes a ``Link``)."""
        link = self.inter_node_link
        assert isinstance(link, Link), "Cluster.__post_init__ resolves inter_node_link"
        return link

    def to_dict(self) -> dict[str, Any]:
        """Everything, the GPU and link profiles included (JSON-serializable), so a saved plan
        re-estimates on the same numbers even after the shipped profiles change."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        """The inverse of ``to_dict``."""
        try:
            gpu = dict(data["gpu"])
            gpu["efficiency"] = KernelEfficiency(**gpu["efficiency"])
            gpu["peak_flops_by_dtype"] = tuple((str(d), float(f)) for d, f in
                                               gpu["peak_flops_by_dtype"])
            for key in ("intra_node_link", "host_link"):
                if isinstance(gpu.get(key), dict):
                    gpu[key] = Link(**gpu[key])
            return cls(**{**data, "gpu": GPU(**gpu),
                          "intra_node_link": Link(**data["intra_node_link"]),
                          "inter_node_link": Link(**data["inter_node_link"])})
        except (KeyError, TypeError) as e:
            raise SpecError(f"cluster record is malformed ({e}); save it with "
                            "Cluster.to_dict()") from e

    @classmethod
    def preset(
        cls,
        name: str,
        *,
        num_nodes: int | None = None,
        gpu: GPU | str | None = None,
        gpus_per_node: int | None = None,
        gpus_per_domain: int | None = None,
    ) -> Cluster:
        """A shipped cluster (``planner clusters`` lists them: ``dgx-h100``,
        ``gb200-nvl72``, ...).

        ``num_nodes`` defaults to the preset's own; ``gpu`` and ``gpus_per_node`` override it
        (another node size ends the preset's multi-node domain: the domain is the node);
        ``gpus_per_domain`` overrides the domain (a job whose nodes split into parts of a
        rack, as Slurm's ``--segment`` places them).
        """
        data = hardware_profiles.load("clusters", name)
        preset_name = str(data["name"])
        # A GPU, or a profile name (or file) that ``__post_init__`` resolves once it has
        # checked the sizes; the ``gpu`` field is typed as what it holds after that.
        gpu_spec: Any = gpu if gpu is not None else data["gpu"]
        return cls(
            name=preset_name,
            gpu=gpu_spec,
            num_nodes=num_nodes if num_nodes is not None else int(data.get("num_nodes", 1)),
            gpus_per_node=(
                gpus_per_node if gpus_per_node is not None else int(data["gpus_per_node"])
            ),
            # Another GPU brings its own link (NVLink generation or PCIe) into the preset.
            intra_node_link=data.get("intra_node_link") if gpu is None else None,
            inter_node_link=data.get("inter_node_link"),
            nics_per_node=int(data["nics_per_node"]) if "nics_per_node" in data else None,
            host_memory_gib=data.get("host_memory_gib"),
            gpus_per_domain=(gpus_per_domain if gpus_per_domain is not None
                             else int(data["gpus_per_domain"]) if "gpus_per_domain" in data
                             and gpus_per_node is None else None),
        )

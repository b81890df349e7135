"""Collective communication time on a two-level topology, for a table of configurations.

The two levels are the scale-up domain and the scale-out network. A domain of
``gpus_per_domain`` GPUs is joined by one scale-up link (NVLink through NVSwitch, AMD's
Infinity Fabric mesh, PCIe): one node of a DGX/HGX box, or 18 trays of 4 in a GB200/GB300
NVL72 rack, whose NVLink switch trays join all 72 GPUs (NVIDIA GB200 NVL72 product page).
Each GPU has its share of its node's ``nics_per_node`` NICs of the scale-out link
(InfiniBand, RoCE), which join the domains. "Node" below means a domain. Bandwidths are per
direction and derated by each link's ``efficiency`` (nccl-tests bus bandwidth over wire rate).

A switched scale-up link gives any group its full per-GPU bandwidth. A full mesh (AMD
Infinity Fabric: 7 direct links per GPU in an 8-GPU platform, ROCm "MI300 series
microarchitecture") gives a group of ``k`` GPUs of one domain only the ``k - 1`` links
between them, and a send between two GPUs one link (``costmodel.hardware.mesh_share``):
RCCL lays its rings and its all-to-all sends on direct xGMI links.

Placement (Megatron-LM ``RankGenerator`` order tp-cp-ep-dp-pp, torchtitan's mesh
[pp, dp_replicate, dp_shard, cp, tp]): tensor parallel is innermost (stride 1), then context
parallel, then data parallel (expert parallel is carved out of its innermost ranks), pipeline
parallel outermost. A group of ``n`` ranks with stride ``d`` on nodes of ``g`` GPUs has
``k = min(n, g / d)`` ranks per node (1 when ``d >= g``) on ``n / k`` nodes; where the group
does not tile the nodes (16 ranks on 72-GPU domains), its worst instance, the one cut by a
domain boundary, has ``gcd(n d, g) / d`` ranks on each side and sets the pace.

Cost of a collective over ``S`` bytes on ``n`` ranks (alpha-beta model; Thakur et al. 2005;
Patarasuk & Yuan 2009 for the ring; NCCL's double binary tree, Sanders et al. 2009):

- ring all-reduce ``2 (n-1)/n S / B + 2 (n-1) alpha``; tree all-reduce ``2 S / B +
  2 ceil(log2(nodes)) alpha`` (a chain inside each node); hierarchical (reduce-scatter in
  the node, all-reduce of S/k across nodes, all-gather in the node). NCCL picks the
  fastest; so does this model.
- all-gather and reduce-scatter ``(n-1)/n S / B + (n-1) alpha`` (S is the full buffer).
- all-to-all: each rank keeps 1/n of its S bytes and sends the rest, (k-1)/n over the
  intra-node link and (n-k)/n through its share of the NICs, all messages at once (one
  hop's latency).
- point-to-point ``S / B + alpha``.

Every call also pays NCCL's fixed base latency (``software.toml`` ``[nccl]``), and runs the
faster of NCCL's two protocols (NCCL src/graph/tuning.cc, which models each the same way): LL,
whose per-hop latency is the link's ``latency_us`` but which carries data at half the bandwidth
(a 4-byte flag beside every 4 bytes of data: ``ncclLLFifoLine``, src/include/device.h; the
tuner's ring LL bandwidth is 0.5 of Simple's), and Simple, at the full bandwidth but with the
larger per-hop latency ``simple_latency_us`` and base latency. Large messages (tensor-parallel
activations, gradient buckets) therefore pay the Simple protocol's latency: nccl-tests on
8 A100s reach 64 MiB all-reduces at 0.72-0.74 of their 8 GiB bus bandwidth, not 0.97 as with
the LL latencies (``hardware_profiles/links/nvlink3.toml``).

``B`` for a group inside one node is the intra-node bandwidth; a ring that crosses nodes is
limited by the slower of the intra-node link and the NIC bandwidth its k ranks of a node
share, ``k * nics_per_node * B_nic / g`` (each GPU drives its own NIC rail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

import hardware_profiles
from costmodel.formulas.arrays import Distinct
from costmodel.hardware import Cluster, mesh_share
from costmodel.units import Num

__all__ = ["Group", "Topology"]

#: Groups whose size and stride arrays have fewer elements are computed afresh (a scalar
#: collective of the sharding ILP or the inference model).
_CACHE_MIN = 64
#: Distinct groups a ``Topology`` keeps (a table has a handful).
_CACHE_GROUPS = 64


@dataclass(frozen=True)
class _Lines:
    """One algorithm's cost ``nbytes -> min(ll + wire / ll_share, simple + wire)`` with
    ``wire = beta * nbytes`` (s): the faster of NCCL's LL and Simple protocols, ``ll`` and
    ``simple`` their latencies (s), ``beta`` the seconds per byte at the full bandwidth."""

    ll: np.ndarray
    simple: np.ndarray
    beta: np.ndarray
    ll_share: float

    def __call__(self, nbytes: Num) -> np.ndarray:
        wire = self.beta * nbytes
        return np.minimum(self.ll + wire / self.ll_share, self.simple + wire)

    def spread(self, rows: Distinct | None) -> _Lines:
        """These lines of per-group coefficients, per row of ``rows`` (as they are: None)."""
        if rows is None:
            return self
        return _Lines(rows.spread(self.ll), rows.spread(self.simple), rows.spread(self.beta),
                      self.ll_share)


@dataclass(frozen=True)
class Topology:
    """Link parameters of a cluster in SI units, and the collective cost functions.

    All functions take arrays (or scalars) of the same broadcastable shape: ``size`` (ranks in
    the group), ``stride`` (rank distance between consecutive members) and ``nbytes``.
    """

    gpus_per_domain: int
    base_lat: float
    intra_bw: float
    intra_lat: float
    nic_bw_per_gpu: float
    inter_lat: float
    #: NCCL's Simple protocol: base and per-hop latencies (s; ``None``: as LL's), and the
    #: share of the bandwidth the LL protocol carries (1.0: LL alone, as fast as Simple).
    base_lat_simple: float | None = None
    intra_lat_simple: float | None = None
    inter_lat_simple: float | None = None
    ll_share: float = 1.0
    #: Direct links per GPU of a full-mesh scale-up link (``Link.mesh_peers``; 0: switched).
    intra_mesh: int = 0
    #: A table's rows grouped so that every communicator it forms is the same within a group
    #: (``ConfigArrays.mesh_groups``): ``group`` computes a new communicator's coefficients
    #: once per group, after checking that its ranks and stride are.
    rows: Distinct | None = field(default=None, compare=False, repr=False)
    #: ``group``'s cache (per instance: a table builds its own ``Topology``).
    _groups: dict[tuple[Any, ...], list[Group]] = field(
        default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def of(cls, cluster: Cluster, rows: Distinct | None = None) -> Topology:
        """The topology of ``cluster`` (achieved bandwidths, per-hop latencies); ``rows``:
        see the field."""
        intra = cluster.intra_link
        inter = cluster.inter_link
        nics = cluster.nics_per_node
        assert nics is not None, "Cluster.__post_init__ fills nics_per_node"
        nccl = hardware_profiles.load_software()["nccl"]
        return cls(
            gpus_per_domain=cluster.scale_up,
            base_lat=float(nccl["base_latency_us"]) * 1e-6,
            intra_bw=intra.achieved_bytes_per_s,
            intra_lat=intra.latency_s,
            nic_bw_per_gpu=inter.achieved_bytes_per_s * nics / cluster.gpus_per_node,
            inter_lat=inter.latency_s,
            base_lat_simple=float(nccl["base_latency_simple_us"]) * 1e-6,
            intra_lat_simple=intra.simple_latency_s,
            inter_lat_simple=inter.simple_latency_s,
            ll_share=float(nccl["ll_bandwidth_share"]),
            intra_mesh=intra.mesh_peers,
            rows=rows,
        )

    def _hops(self, intra: np.ndarray | float, inter: np.ndarray | float, simple: bool
              ) -> np.ndarray:
        """Latency of ``intra`` intra-node and ``inter`` inter-node hops in one protocol."""
        a = self.intra_lat_simple if simple and self.intra_lat_simple is not None \
            else self.intra_lat
        b = self.inter_lat_simple if simple and self.inter_lat_simple is not None \
            else self.inter_lat
        return np.asarray(intra) * a + np.asarray(inter) * b

    def _latencies(self, intra: np.ndarray | float, inter: np.ndarray | float
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(LL, Simple) latency of a transfer over ``intra`` + ``inter`` sequential hops,
        NCCL's base latency included."""
        base = self.base_lat if self.base_lat_simple is None else self.base_lat_simple
        return (self.base_lat + self._hops(intra, inter, False),
                base + self._hops(intra, inter, True))

    def _lines(self, intra: np.ndarray | float, inter: np.ndarray | float,
               beta: np.ndarray, live: np.ndarray) -> _Lines:
        """The transfer of ``beta * nbytes`` seconds at the full achieved bandwidth over
        ``intra`` + ``inter`` sequential hops in each of NCCL's LL and Simple protocols (base
        latency included); free where not ``live`` (a group of one rank)."""
        ll, simple = self._latencies(intra, inter)
        return _Lines(np.where(live, ll, 0.0), np.where(live, simple, 0.0),
                      np.where(live, beta, 0.0), self.ll_share)

    def _fastest(self, intra: np.ndarray | float, inter: np.ndarray | float,
                 wire: np.ndarray) -> np.ndarray:
        """Seconds of a transfer of ``wire`` seconds at the full achieved bandwidth over
        ``intra`` + ``inter`` sequential hops, in the faster of NCCL's LL and Simple protocols
        (base latency included)."""
        ll, simple = self._latencies(intra, inter)
        return np.minimum(ll + wire / self.ll_share, simple + wire)

    def place(self, size: Num, stride: Num) -> tuple[np.ndarray, np.ndarray]:
        """(ranks per domain, domains) of a group of ``size`` ranks ``stride`` apart: of its
        worst instance, where a domain boundary cuts it (the module docstring)."""
        size = np.asarray(size, dtype=float)
        stride = np.asarray(stride, dtype=float)
        g = self.gpus_per_domain
        span = np.gcd(np.rint(size * stride).astype(np.int64), g).astype(float)
        k = np.where(stride >= g, 1.0,
                     np.minimum(size, np.maximum(np.floor(span / stride), 1.0)))
        return k, np.ceil(size / k)

    def intra(self, k: Num) -> np.ndarray:
        """Scale-up bandwidth (bytes/s per direction) a collective among ``k`` GPUs of one
        domain drives: all of it through a switch, ``k - 1`` of a mesh's direct links
        (``mesh_share``)."""
        return self.intra_bw * mesh_share(k, self.intra_mesh)

    def _ring_bw(self, k: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        return np.where(nodes > 1, np.minimum(self.intra(k), k * self.nic_bw_per_gpu),
                        self.intra(k))

    def _ring_hops(self, n: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(intra-node, inter-node) hops of the n - 1 steps of a ring, each as slow as the
        ring's slowest hop."""
        steps = n - 1
        multi = nodes > 1
        return np.where(multi, 0.0, steps), np.where(multi, steps, 0.0)

    def group(self, size: Num, stride: Num) -> Group:
        """The communicator of ``size`` ranks ``stride`` apart, its collectives' coefficients
        computed once: a table of configurations issues several collectives over each of its
        few groups (tensor-parallel, data-parallel, shard, replica), and the coefficients
        depend on the group alone. Arrays of at least ``_CACHE_MIN`` elements are cached on
        this instance by value."""
        size = np.asarray(size, dtype=float)
        stride = np.asarray(stride, dtype=float)
        if size.size + stride.size < _CACHE_MIN:
            return Group(self, size, stride)
        # A cheap key, every hit confirmed element by element.
        key = (size.shape, stride.shape, float(size.sum()), float(stride.sum()))
        cache = self._groups
        for g in cache.get(key, ()):
            if np.array_equal(g.size, size) and np.array_equal(g.stride, stride):
                return g
        g = self._new_group(size, stride)
        if len(cache) >= _CACHE_GROUPS:  # a long-lived topology: forget the old groups
            cache.clear()
        cache.setdefault(key, []).append(g)
        return g

    def _new_group(self, size: np.ndarray, stride: np.ndarray) -> Group:
        """A ``Group`` of per-row ``size`` and ``stride``, its coefficients computed once per
        group of ``rows`` where both are the same throughout each group."""
        rows = self.rows
        if rows is None or size.shape != rows.inverse.shape \
                or stride.shape not in (size.shape, ()):
            return Group(self, size, stride)
        for x in (size, stride):
            if x.ndim and not np.array_equal(rows.spread(np.take(x, rows.first)), x):
                return Group(self, size, stride)
        return Group(self, size, stride, rows)

    def all_reduce(self, nbytes: Num, size: Num, stride: Num) -> np.ndarray:
        """Seconds to all-reduce ``nbytes`` over the group (``Group.all_reduce``)."""
        return self.group(size, stride).all_reduce(nbytes)

    def all_gather(self, nbytes: Num, size: Num, stride: Num) -> np.ndarray:
        """Seconds to all-gather a buffer of ``nbytes`` in all (ring); reduce-scatter alike."""
        return self.group(size, stride).all_gather(nbytes)

    reduce_scatter = all_gather

    def all_to_all(self, nbytes: Num, size: Num, stride: Num) -> np.ndarray:
        """Seconds for an all-to-all in which each rank holds ``nbytes`` before and after.

        NCCL runs it as one group of sends and receives to every peer (ncclGroupStart/End of
        ncclSend/ncclRecv), which progress at once: one hop's latency, the slowest, and the
        busier of the rank's NVLink and NIC shares."""
        n = np.asarray(size, dtype=float)
        k, nodes = self.place(n, stride)
        intra = (k - 1) / n * nbytes / self.intra(k)
        inter = (n - k) / n * nbytes / self.nic_bw_per_gpu
        t = self.one_hop(nodes > 1, np.maximum(intra, inter))
        return np.where(n > 1, t, 0.0)

    def ring_step(self, nbytes: Num, size: Num, stride: Num) -> np.ndarray:
        """Seconds of one step of a ring of ``size`` ranks ``stride`` apart in which every
        rank sends ``nbytes`` to the next at once (context-parallel ring attention's KV
        exchange): as slow as its slowest hop, which leaves the node through the sender's NIC
        when the ring spans more than one node."""
        _, nodes = self.place(size, stride)
        return self._send(nbytes, nodes > 1)

    def p2p(self, nbytes: Num, stride: Num) -> np.ndarray:
        """Seconds to send ``nbytes`` to the rank ``stride`` away (same node if stride < g)."""
        return self._send(nbytes, np.asarray(stride, dtype=float) >= self.gpus_per_domain)

    def _send(self, nbytes: Num, across: np.ndarray) -> np.ndarray:
        """Seconds of one send of ``nbytes``: inside the node, or through the sender's NIC
        where ``across`` (bool per element)."""
        wire = np.where(across, nbytes / self.nic_bw_per_gpu, nbytes / self.intra(2.0))
        return self.one_hop(across, wire)

    def one_hop(self, across: np.ndarray, wire: np.ndarray) -> np.ndarray:
        """``_fastest`` of a transfer over one hop, between nodes where ``across``."""
        across = np.asarray(across)
        return self._fastest(np.where(across, 0.0, 1.0), np.where(across, 1.0, 0.0), wire)


class Group:
    """A communicator of ``size`` ranks ``stride`` apart on a ``Topology`` (arrays of the same
    broadcastable shape), with the coefficients of its collectives (``Topology.group``).
    ``rows``: ``size`` and ``stride`` (per row) are the same throughout each group of these
    rows, so the coefficients are computed once per group and spread over the rows."""

    def __init__(self, topo: Topology, size: np.ndarray, stride: np.ndarray,
                 rows: Distinct | None = None) -> None:
        self.topo, self.size, self.stride, self.rows = topo, size, stride, rows
        if rows is not None:
            size = np.take(size, rows.first)
            stride = stride if stride.ndim == 0 else np.take(stride, rows.first)
        self._size = size
        self.k, self.nodes = topo.place(size, stride)

    @cached_property
    def _all_reduce(self) -> tuple[_Lines, _Lines, _Lines]:
        """Ring, tree and two-level all-reduce (the module docstring's formulas)."""
        topo, n, k, nodes = self.topo, self._size, self.k, self.nodes
        live = n > 1
        bw = topo._ring_bw(k, nodes)
        ri, rx = topo._ring_hops(n, nodes)
        ring = topo._lines(2 * ri, 2 * rx, 2 * (n - 1) / n / bw, live)
        # Tree depth ceil(log2(nodes)), exactly: the binary exponent of nodes - 1.
        depth = np.frexp(np.maximum(nodes - 1.0, 0.0))[1].astype(float)
        tree = topo._lines(2 * (k - 1), 2 * depth, 2 / bw, live)
        # Two-level: only across nodes (infinite latency within one).
        multi = nodes > 1
        b_two = 2 * (nodes - 1) / nodes / (k * topo.nic_bw_per_gpu) \
            + 2 * (k - 1) / k / topo.intra(k)
        two = topo._lines(2 * (k - 1), 2 * (nodes - 1), b_two, live)
        two = _Lines(np.where(multi | ~live, two.ll, np.inf),
                     np.where(multi | ~live, two.simple, np.inf), two.beta, two.ll_share)
        return ring.spread(self.rows), tree.spread(self.rows), two.spread(self.rows)

    @cached_property
    def _ring(self) -> _Lines:
        """All-gather (reduce-scatter) over a ring."""
        n = self._size
        return self.topo._lines(*self.topo._ring_hops(n, self.nodes),
                                (n - 1) / n / self.topo._ring_bw(self.k, self.nodes),
                                n > 1).spread(self.rows)

    def all_reduce(self, nbytes: Num) -> np.ndarray:
        """Seconds to all-reduce ``nbytes`` over the group (fastest of ring, tree, 2-level,
        each in the faster protocol; 0 for one rank). Each algorithm costs ``alpha + beta *
        nbytes``; the coefficients are the group's (usually per row), applied to the (usually
        per-stage) bytes."""
        ring, tree, two = self._all_reduce
        return np.minimum(np.minimum(ring(nbytes), tree(nbytes)), two(nbytes))

    def all_gather(self, nbytes: Num) -> np.ndarray:
        """Seconds to all-gather a buffer of ``nbytes`` in all (ring; 0 for one rank);
        reduce-scatter alike."""
        return self._ring(nbytes)

    reduce_scatter = all_gather

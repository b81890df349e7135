"""Collective communication time on a two-level topology, for a table of configurations.

A node has ``gpus_per_node`` GPUs joined by the intra-node link (NVLink/NVSwitch, PCIe) and
``nics_per_node`` NICs of the inter-node link (InfiniBand, RoCE). Bandwidths are per direction
and derated by each link's ``efficiency`` (nccl-tests bus bandwidth over wire rate).

Placement (Megatron-LM ``RankGenerator`` order tp-cp-ep-dp-pp, torchtitan's mesh
[pp, dp_replicate, dp_shard, cp, tp]): tensor parallel is innermost (stride 1), then context
parallel, then data parallel (expert parallel is carved out of its innermost ranks), pipeline
parallel outermost. A group of ``n`` ranks with stride ``d`` on nodes of ``g`` GPUs has
``k = min(n, g / d)`` ranks per node (1 when ``d >= g``) on ``n / k`` nodes.

Cost of a collective over ``S`` bytes on ``n`` ranks (alpha-beta model; Thakur et al. 2005;
Patarasuk & Yuan 2009 for the ring; NCCL's double binary tree, Sanders et al. 2009):

- ring all-reduce ``2 (n-1)/n S / B + 2 (n-1) alpha``; tree all-reduce ``2 S / B +
  2 ceil(log2(nodes)) alpha`` (a chain inside each node); hierarchical (reduce-scatter in
  the node, all-reduce of S/k across nodes, all-gather in the node). NCCL picks the
  fastest; so does this model.
- all-gather and reduce-scatter ``(n-1)/n S / B + (n-1) alpha`` (S is the full buffer).
- all-to-all: each rank keeps 1/n of its S bytes and sends the rest, (k-1)/n over the
  intra-node link and (n-k)/n through its share of the NICs, with n-1 messages.
- point-to-point ``S / B + alpha``.

Every call also pays NCCL's fixed base latency (``software.toml`` ``[nccl]``).

``B`` for a group inside one node is the intra-node bandwidth; a ring that crosses nodes is
limited by the slower of the intra-node link and the NIC bandwidth its k ranks of a node
share, ``k * nics_per_node * B_nic / g`` (each GPU drives its own NIC rail).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hardware_profiles
from costmodel.hardware import Cluster

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """Link parameters of a cluster in SI units, and the collective cost functions.

    All functions take arrays (or scalars) of the same broadcastable shape: ``size`` (ranks in
    the group), ``stride`` (rank distance between consecutive members) and ``nbytes``.
    """

    gpus_per_node: int
    base_lat: float
    intra_bw: float
    intra_lat: float
    nic_bw_per_gpu: float
    inter_lat: float

    @classmethod
    def of(cls, cluster: Cluster) -> Topology:
        """The topology of ``cluster`` (achieved bandwidths, per-hop latencies)."""
        intra = cluster.intra_node_link
        inter = cluster.inter_node_link
        g = cluster.gpus_per_node
        nccl = hardware_profiles.load_software()["nccl"]
        return cls(
            gpus_per_node=g,
            base_lat=float(nccl["base_latency_us"]) * 1e-6,
            intra_bw=intra.achieved_bytes_per_s,
            intra_lat=intra.latency_s,
            nic_bw_per_gpu=inter.achieved_bytes_per_s * cluster.nics_per_node / g,
            inter_lat=inter.latency_s,
        )

    def place(self, size: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ranks per node, nodes) of a group of ``size`` ranks ``stride`` apart."""
        size = np.asarray(size, dtype=float)
        stride = np.asarray(stride, dtype=float)
        g = float(self.gpus_per_node)
        k = np.where(stride >= g, 1.0, np.minimum(size, np.maximum(np.floor(g / stride), 1.0)))
        return k, np.ceil(size / k)

    def _ring_bw(self, k: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        return np.where(nodes > 1, np.minimum(self.intra_bw, k * self.nic_bw_per_gpu),
                        self.intra_bw)

    def _ring_lat(self, n: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        # n - 1 steps, each as slow as the slowest hop of the ring.
        return (n - 1) * np.where(nodes > 1, self.inter_lat, self.intra_lat)

    def all_reduce(self, nbytes: np.ndarray, size: np.ndarray, stride: np.ndarray
                   ) -> np.ndarray:
        """Seconds to all-reduce ``nbytes`` over the group (fastest of ring, tree, 2-level).

        Each algorithm costs ``alpha + beta * nbytes``; the coefficients are computed on the
        group's (usually per-row) shape and applied to the (usually per-stage) bytes.
        """
        n = np.asarray(size, dtype=float)
        k, nodes = self.place(n, stride)
        bw = self._ring_bw(k, nodes)
        a_ring = 2 * self._ring_lat(n, nodes)
        b_ring = 2 * (n - 1) / n / bw
        # Tree depth ceil(log2(nodes)), exactly: the binary exponent of nodes - 1.
        depth = np.frexp(np.maximum(nodes - 1.0, 0.0))[1].astype(float)
        a_tree = 2 * (depth * self.inter_lat + (k - 1) * self.intra_lat)
        b_tree = 2 / bw
        multi = nodes > 1
        a_two = np.where(multi, 2 * (nodes - 1) * self.inter_lat + 2 * (k - 1) * self.intra_lat,
                         np.inf)
        b_two = 2 * (nodes - 1) / nodes / (k * self.nic_bw_per_gpu) \
            + 2 * (k - 1) / k / self.intra_bw
        best = np.minimum(np.minimum(a_ring + b_ring * nbytes, a_tree + b_tree * nbytes),
                          a_two + b_two * nbytes)
        return np.where(n > 1, best + self.base_lat, 0.0)

    def all_gather(self, nbytes: np.ndarray, size: np.ndarray, stride: np.ndarray
                   ) -> np.ndarray:
        """Seconds to all-gather a buffer of ``nbytes`` in all (ring); reduce-scatter alike."""
        n = np.asarray(size, dtype=float)
        k, nodes = self.place(n, stride)
        t = (n - 1) / n * nbytes / self._ring_bw(k, nodes) + self._ring_lat(n, nodes)
        return np.where(n > 1, t + self.base_lat, 0.0)

    reduce_scatter = all_gather

    def all_to_all(self, nbytes: np.ndarray, size: np.ndarray, stride: np.ndarray
                   ) -> np.ndarray:
        """Seconds for an all-to-all in which each rank holds ``nbytes`` before and after."""
        n = np.asarray(size, dtype=float)
        k, nodes = self.place(n, stride)
        intra = (k - 1) / n * nbytes / self.intra_bw
        inter = (n - k) / n * nbytes / self.nic_bw_per_gpu
        lat = (n - 1) * np.where(nodes > 1, self.inter_lat, self.intra_lat)
        return np.where(n > 1, np.maximum(intra, inter) + lat + self.base_lat, 0.0)

    def ring_step(self, nbytes: np.ndarray, size: np.ndarray, stride: np.ndarray
                  ) -> np.ndarray:
        """Seconds of one step of a ring of ``size`` ranks ``stride`` apart in which every
        rank sends ``nbytes`` to the next at once (context-parallel ring attention's KV
        exchange): as slow as its slowest hop, which leaves the node through the sender's NIC
        when the ring spans more than one node."""
        _, nodes = self.place(size, stride)
        return self._send(nbytes, nodes > 1)

    def p2p(self, nbytes: np.ndarray, stride: np.ndarray) -> np.ndarray:
        """Seconds to send ``nbytes`` to the rank ``stride`` away (same node if stride < g)."""
        return self._send(nbytes, np.asarray(stride, dtype=float) >= self.gpus_per_node)

    def _send(self, nbytes: np.ndarray, across: np.ndarray) -> np.ndarray:
        """Seconds of one send of ``nbytes``: inside the node, or through the sender's NIC
        where ``across`` (bool per element)."""
        return self.base_lat + np.where(across, nbytes / self.nic_bw_per_gpu + self.inter_lat,
                                        nbytes / self.intra_bw + self.intra_lat)

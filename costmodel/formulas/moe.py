"""Mixture-of-experts token routing: how unevenly the routed tokens land on the
expert-parallel ranks (``routed_load``), and what the dispatch and combine of each token
dispatcher (``Job.moe_dispatcher``) move over the topology (``dispatch_combine``)."""

from __future__ import annotations

import numpy as np
from scipy.special import comb

import hardware_profiles
from costmodel.config import Job
from costmodel.formulas.comm import Topology
from costmodel.units import Num

__all__ = ["deepep_buffer_bytes", "dispatch_combine", "remote_domains", "routed_load",
           "routing_words", "units_hit"]


def routed_load(job: Job) -> float:
    """Routed tokens on the busiest expert-parallel rank, as a multiple of the even share:
    what sets the pace of the experts' matmuls and of the all-to-all each step, since every
    rank waits for the busiest at the combine.

    With a capacity factor (``Job.moe_capacity_factor``) no expert takes more than that
    multiple, and the estimate takes the busiest rank at capacity. Dropless routing takes
    ``Job.moe_load_imbalance`` where the job says it (1.0: the forced even routing that
    NVIDIA's performance tables benchmark with), else the imbalance published for
    auxiliary-loss and bias balancing (``hardware_profiles/software.toml [moe]``)."""
    return _load(job)[0]


def _load(job: Job) -> tuple[float, str]:
    """``routed_load`` and where it comes from, in words (``routing_words``)."""
    if job.moe_capacity_factor is not None:
        return float(job.moe_capacity_factor), "the capacity factor"
    if job.moe_load_imbalance is not None:
        return float(job.moe_load_imbalance), "as the job gives it"
    moe = hardware_profiles.load_software()["moe"]
    return float(moe["load_imbalance"]), str(moe["load_imbalance_basis"])


#: DeepEP's normal-mode dispatch and combine configurations by group size (ranks: max
#: receive chunk of the NVLink buffer, RDMA send and receive chunks), deepseek-ai/DeepEP@dd758caf
#: deep_ep/buffers/legacy.py L246-257, L276-287 (the 32- and 64-rank tables since c939644,
#: September 2025): (nvl_recv, rdma_send, rdma_recv) of dispatch, then of combine. Groups of
#: up to 8 ranks use the 8-rank entry, others the next larger (128 and up: the 64-rank RDMA
#: chunks with the 128-rank NVLink one, ASSUMED).
_DEEPEP = {8: ((256, 6, 128), (256, 6, 128)), 16: ((288, 20, 128), (288, 12, 128)),
           32: ((288, 8, 128), (288, 8, 128)), 64: ((288, 8, 128), (288, 8, 128)),
           128: ((560, 8, 128), (560, 8, 128))}
#: The SMs DeepEP's kernels run on under Megatron-LM (set_deepep_num_sms(20),
#: megatron/core/transformer/moe/token_dispatcher.py; DeepEP's Buffer.num_sms default), and
#: the workspace DeepEP allocates beside its buffers (NUM_WORKSPACE_BYTES, 32 MiB).
_DEEPEP_SMS = 20
_DEEPEP_WORKSPACE = 32 * 2**20


def deepep_buffer_bytes(hidden: int, group: Num) -> np.ndarray:
    """Bytes of the one communication buffer DeepEP holds per GPU for Megatron-LM's flex
    dispatcher (megatron/core/transformer/moe/fused_a2a.py get_buffer: the larger of the
    dispatch and combine configurations' size hints for hidden-size rows of 2 bytes, over the
    experts' TP x EP group of ``group`` ranks), plus its workspace. The hints
    (deepseek-ai/DeepEP csrc/legacy/config.hpp, get_nvl_buffer_size_hint and
    get_rdma_buffer_size_hint), with C = SMs / 2 channels, Nn = min(n, 8) NVLink peers and
    Nr = max(n / 8, 1) nodes: NVLink ``C Nn (2 Nr + 3) 4 + C Nn R_nvl (Hb + 2056)``; RDMA
    (n > 8 only) ``C Nr 144 + 2 C Nr R_rdma (Hb + 2072)``, ``R_rdma`` the receive chunk
    rounded up to the send chunk; each rounded up to 128 bytes. DeepSeek-V3's hidden 7168
    over 8 ranks: 320 MiB, over 32: 520 MiB."""
    n = np.asarray(group, dtype=float)
    hb = 2.0 * hidden
    c = _DEEPEP_SMS // 2
    keys = np.array(sorted(_DEEPEP))
    key = keys[np.minimum(np.searchsorted(keys, np.maximum(n, 8)), len(keys) - 1)]
    nn, nr = np.minimum(n, 8), np.maximum(np.floor(n / 8), 1)
    out = np.zeros_like(n)
    for k in keys:
        best = 0.0 * n
        for nvl_recv, send, recv in _DEEPEP[int(k)]:
            nvl = c * nn * (2 * nr + 3) * 4 + c * nn * nvl_recv * (hb + 2056)
            r_rdma = -(-recv // send) * send
            rdma = np.where(n > 8, c * nr * 144 + 2 * c * nr * r_rdma * (hb + 2072), 0.0)
            best = np.maximum(best, np.ceil(nvl / 128) * 128 + np.ceil(rdma / 128) * 128)
        out = np.where(key == k, best, out)
    return np.where(n > 1, out + _DEEPEP_WORKSPACE, 0.0)


def units_hit(top_k: int, size: Num, per_unit: Num, groups: int = 0, limit: int = 0,
              num_experts: int = 0) -> np.ndarray:
    """Expected number of units (ranks, or scale-up domains) that hold at least one of a
    token's ``top_k`` experts, for an expert-parallel group of ``size`` ranks in units of
    ``per_unit`` ranks, the ``num_experts`` experts spread evenly over the ranks in order.

    Uniform routing: a unit holds a share ``per_unit / size`` of the experts and misses all
    of a token's ``top_k`` (distinct experts) with the hypergeometric probability
    ``C(E - E share, k) / C(E, k)``; without ``num_experts``, with ``(1 - share) ** top_k``
    (independent draws).

    Group-limited routing (``ModelSpec.expert_groups`` / ``expert_group_limit``: DeepSeek-V3's
    node-limited routing, report Sec. 2.1.2) draws a token's ``top_k`` experts from the
    experts of ``limit`` of ``groups`` contiguous groups, taken here as uniform draws of the
    groups and then of the experts among theirs. Where each unit holds ``g`` whole groups,
    it holds ``j`` of the chosen ones with hypergeometric chance ``C(g, j) C(groups - g,
    limit - j) / C(groups, limit)`` and then misses the token's experts as above over the
    chosen groups' experts; where a group spans several units, the token's experts are drawn
    from the chosen groups' units alone. Without ``num_experts`` a unit holding a chosen
    group counts as hit, and the smaller of that and the uniform count is taken."""
    n = np.asarray(size, dtype=float)
    k = np.minimum(np.asarray(per_unit, dtype=float), n)
    units = n / k
    e = float(num_experts)

    def missed(pool: Num, held: Num) -> np.ndarray:
        """Chance that ``held`` of ``pool`` candidate experts hold none of the token's."""
        pool_a, held_a = np.asarray(pool, dtype=float), np.asarray(held, dtype=float)
        if e <= 0:
            return (1.0 - held_a / pool_a) ** float(top_k)
        return comb(pool_a - held_a, top_k) / comb(pool_a, top_k)

    total = e if e > 0 else 1.0  # experts, or shares of them
    uniform = units * (1.0 - missed(total, total / units))
    if not (groups and 0 < limit < groups):
        return uniform
    per_group = total / groups
    pool = per_group * limit  # the chosen groups' experts
    whole = np.mod(groups, units) == 0  # each unit holds groups / units whole groups
    g = np.where(whole, groups / units, 1.0)
    if e > 0:
        hit = 0.0 * g
        for j in range(1, limit + 1):
            chosen = comb(g, j) * comb(groups - g, limit - j) / comb(groups, limit)
            hit = hit + chosen * (1.0 - missed(pool, j * per_group))
    else:
        hit = 1.0 - comb(groups - g, limit) / comb(groups, limit)
    limited_whole = units * hit
    spans = np.mod(units, groups) == 0  # a group spans units / groups units
    cand = limit * units / groups  # the units the token's groups cover
    limited_span = cand * (1.0 - missed(pool, pool / np.maximum(cand, 1.0)))
    limited = np.where(whole, limited_whole, np.where(spans, limited_span, uniform))
    return limited if e > 0 else np.minimum(uniform, limited)


def remote_domains(top_k: int, size: Num, per_domain: Num, groups: int = 0,
                   limit: int = 0, num_experts: int = 0) -> np.ndarray:
    """Expected number of other scale-up domains a token's ``top_k`` experts are in, for an
    expert-parallel group of ``size`` ranks with ``per_domain`` of them in each domain: of
    the domains ``units_hit`` counts, each is the token's own with the same chance
    ``per_domain / size``."""
    n = np.asarray(size, dtype=float)
    k = np.minimum(np.asarray(per_domain, dtype=float), n)
    return units_hit(top_k, n, k, groups, limit, num_experts) * (1.0 - k / n)


def dispatch_combine(topo: Topology, dispatcher: str, token_bytes: Num, top_k: int,
                     load: float, size: Num, stride: Num, groups: int = 0,
                     limit: int = 0, num_experts: int = 0) -> np.ndarray:
    """Seconds of one dispatch and one combine of a MoE layer on each rank of an
    expert-parallel group of ``size`` ranks ``stride`` apart, each rank holding
    ``token_bytes`` of tokens (one copy of its micro-batch's hidden states) of which
    ``top_k`` copies are routed (to ``num_experts`` experts spread evenly over the group),
    ``load`` times the even share landing on the busiest rank.

    - ``alltoall`` (Megatron-LM's ``--moe-token-dispatcher-type alltoall``, torchtitan's
      default): an NCCL all-to-all of the routed copies each way (``Topology.all_to_all``),
      one per (token, expert) pair: the tokens are permuted by expert before it.
    - ``allgather`` (Megatron-LM's ``allgather``): every rank all-gathers the group's tokens
      and picks those its experts take, and the combine reduce-scatters the outputs back:
      independent of ``top_k``, growing with the group.
    - ``deepep`` (DeepEP's normal kernels: Megatron-LM's ``flex`` dispatcher with DeepEP or
      HybridEP, torchtitan's DeepEP backend): a token goes once to each rank that holds any
      of its experts (DeepEP's dispatch layout marks the ranks, ``is_token_in_rank``; the
      receiving rank feeds it to its own experts, and the combine returns one weighted sum
      per rank: deepseek-ai/DeepEP README, ``get_dispatch_layout``), so the scale-up link
      carries ``units_hit`` copies over ranks rather than ``top_k``. A token bound for
      another domain crosses the scale-out network once per domain its experts are in (to
      the rank of the same local index there) and is forwarded over the scale-up link inside
      that domain ("normal kernels with NVLink and RDMA forwarding"): the network carries
      ``remote_domains`` copies of each token (fewer under group-limited routing:
      ``groups``, ``limit``). The busier of the two links sets the time, as in the
      all-to-all."""
    b = np.asarray(token_bytes, dtype=float)
    if dispatcher == "allgather":
        gathered = b * np.asarray(size, dtype=float)
        return topo.all_gather(gathered, size, stride) + topo.reduce_scatter(gathered, size,
                                                                             stride)
    if dispatcher == "alltoall":
        return 2.0 * topo.all_to_all(b * top_k * load, size, stride)
    n = np.asarray(size, dtype=float)
    k, domains = topo.place(n, stride)
    copies = b * units_hit(top_k, n, 1.0, groups, limit, num_experts) * load
    # Copies for ranks of the own domain, and the remote copies forwarded to the other
    # ranks of the domain they arrive in.
    intra = ((k - 1.0) / n + (n - k) / n * (k - 1.0) / k) * copies / topo.intra(k)
    inter = remote_domains(top_k, n, k, groups, limit, num_experts) * b * load \
        / topo.nic_bw_per_gpu
    wire = np.where(domains > 1, np.maximum(intra, inter), intra)
    one = topo.one_hop(domains > 1, wire)
    return np.where(n > 1, 2.0 * one, 0.0)


def routing_words(job: Job) -> str:
    """What the estimate assumed about a MoE layer's routing, for its summary: the
    dispatcher and the busiest rank's load (``routed_load``) with where it comes from."""
    load, why = _load(job)
    return (f"{job.moe_dispatcher} dispatcher; the busiest expert-parallel rank takes "
            f"{load:.2f}x the even share of routed tokens ({why})")

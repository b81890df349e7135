"""Intra-op sharding of a traced ``LayerGraph`` on a 2-D device mesh, as an ILP (Alpa, Zheng et
al. 2022, Sec. 4), combined with a pipeline-stage DP over its layers (Sec. 5).

**The sharding graph.** The forward ops of the graph, with views contracted into the edges
(a view only renames dims: ``costmodel.trace.sharding.view_map``) and constant subgraphs (index
tables, rotary angles: nothing flows into them from the inputs or the parameters) dropped.
A run of identical blocks is one block with weight ``repeat``. Parameters, model inputs and
constants take whatever layout their consumer asks for, at no cost.

**Strategies.** Node ``v`` shards each mesh axis along one of its loops or replicates
(``costmodel.trace.sharding.op_loops``); a loop may take both axes when its size is divisible by
the whole mesh. A strategy ``k`` fixes the layout of the output and of every input, and has
a compute time ``c[v, k]`` (forward + backward: ``costmodel.formulas.compute`` gemm, flash-attention
and memory-bound costs on the local shard), a gradient-synchronisation time ``g[v, k]``
(converting the partial gradients of replicated parameters back: the data-parallel
all-reduce), a backward time ``b[v, k]`` it may overlap with, and memory ``m[v, k]``
(parameter + gradient + optimizer bytes of the shard, and the activations it saves times
the micro-batches in flight).

**Partial sums carried.** An op linear in some of its inputs (a gather, the first input of
a sum, either factor of a product, an add of partial sums) also has strategies that take a
partial sum on one axis and hand it on unreduced, or that take its output's gradient as a
partial sum and hand partial gradients back (``ShardingProblem._carries``), so one reduction
may serve several ops: a MoE layer's experts are reduced once after the weighted combine, as
Megatron-LM's row-parallel experts are, not once per routed copy.

**Resharding.** Where a producer's output layout differs from the layout a consumer needs,
the collective that converts it is inserted (``costmodel.trace.sharding.reshard_time``), forward,
and its gradient's conversion backward. Consumers that need the same layout of one tensor
share one conversion: for producer ``u`` and each distinct (layout, gradient layout) class
``c`` its consumers may need, ``r[u, k, c]`` is the cost of converting output layout ``k``.

**ILP** (OR-Tools with SCIP; times in microseconds, memory in MiB). Binary ``x[v, k]``: node
``v`` uses strategy ``k``; ``w[u, c]`` in [0, 1]: some consumer of ``u`` needs class ``c``;
``y[u, k, c]`` in [0, 1]: ``u`` uses ``k`` and converts to ``c``; ``e >= 0`` the exposed
gradient synchronisation (``w``, ``y`` are 0/1 at the optimum since ``x`` is).
With ``n_v`` the weight (repeat) of ``v``, ``M`` the micro-batches per step::

    (a) sum_k x[v, k] = 1                                   every node v
    (b) w[u, c] >= sum_{k in class c} x[v, k]               every consumer v of u, class c
    (c) sum_k y[u, k, c] = w[u, c],  y[u, k, c] <= x[u, k]  every u, k, c
    (d) sum_{v, k} n_v m[v, k] x[v, k] <= memory budget
    (f) x[v, j] = sum_{k: f_v(k) = j} x[u, k]               every follower v of leader u
    (e) e >= sum_{v, k} n_v (g[v, k] - b[v, k]) x[v, k]     (synchronisation overlapped with
                                                             the last backward, as DDP's buckets)
    minimise  M (sum_{v,k} n_v c[v, k] x[v, k] + sum_{u,k,c} n_u r[u, k, c] y[u, k, c]) + e

``brute_force`` enumerates every assignment of strategies and evaluates the same objective
with ``ShardingProblem.evaluate``; ``tests/test_autoshard.py`` checks they agree.

**Tensor-parallel mode** (``tensor_parallel=True``; ``costs_from_graph`` solves each
block on a 1 x t mesh per degree t): the devices see the same tokens, so no strategy splits
a loop that runs along the model inputs' dims (``ShardingProblem.token_dims``); every weight
matrix that meets the tokens is split; partial sums are only all-reduced, the residual
stream staying whole, unless ``sequence_parallel`` lets the memory-bound ops split the
sequence (they must then) with all-gathers and reduce-scatters between the regions
(Korthikanti et al. 2022, Sec. 4.2.2). ``tests/test_layercosts.py`` checks it against
brute force and against Megatron-LM's formulas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.formulas.comm import Topology
from costmodel.formulas.memory import state_bytes
from costmodel.formulas.roofline import high_precision
from costmodel.hardware import Cluster
from costmodel.trace.graph import LayerGraph
from costmodel.trace.layouts import (
    COPY_OPS,
    Layout,
    Mesh,
    Strategy,
    _Group,
    _Input,
    _scatters,
    _taking,
    _through_views,
)
from costmodel.trace.sharding import PARTIAL, REPLICATE, describe, reshard_time
from costmodel.trace.strategies import StrategyCosts
from costmodel.units import GIB

__all__ = ["ShardingProblem", "Solution", "brute_force", "solve"]


#: Seconds charged for a conversion ``tensor_parallel`` bars (a cost no layout approaches,
#: so the ILP never picks it while any other layout exists).
_BARRED_S = 1e3


class ShardingProblem(StrategyCosts):
    """The strategies of every node of ``graph``'s sharding graph on ``mesh`` of
    ``cluster``'s GPUs, for ``job`` (precision, optimizer), with ``micro_batches`` per step
    and ``in_flight`` micro-batches' activations held; ``budget`` bytes of memory for the
    whole graph (default: the mesh's GPUs).

    ``tensor_parallel``: the mesh's devices are one tensor-parallel group: they see the same
    tokens, so no op splits a loop that runs along the model inputs' dims (``token_dims``),
    and every weight of two or more dims is split over each axis of more than one device
    where the op can split it (Megatron-LM's column/row and vocabulary-parallel layers are
    the layouts that remain; Shoeybi et al. 2019, Sec. 3). ``sequence_parallel``: besides,
    the memory-bound ops (norms, elementwise, dropout) may split the tokens, with all-gathers
    and reduce-scatters between the regions (Korthikanti et al. 2022, Sec. 4.2.2)."""

    def __init__(self, graph: LayerGraph, mesh: Mesh, cluster: Cluster, job: Job, *,
                 micro_batches: int = 1, in_flight: int = 1, budget: float | None = None,
                 tensor_parallel: bool = False, sequence_parallel: bool = False) -> None:
        self.graph, self.mesh, self.cluster, self.job = graph, mesh, cluster, job
        self.micro_batches, self.in_flight = int(micro_batches), int(in_flight)
        self.budget = float(cluster.gpu.memory_bytes if budget is None else budget)
        self.topo = Topology.of(cluster)
        self.dtype = high_precision(job.precision)
        self.elem = 4.0 if job.precision == "fp32" else 2.0
        self.tensor_parallel = tensor_parallel
        self.sequence_parallel = sequence_parallel
        self.nodes, self.inputs, self.saved, self.saved_copies = self._contract()
        self.token_dims = self._token_dims()
        #: The token dims loops carry from the model's inputs (a routing op's output, whose
        #: every dim may hold tokens in ``token_dims``, has none): where attention scores,
        #: queries by keys, are told apart from a MoE layer's routed tokens [tokens x top-k,
        #: hidden] (``costmodel.trace.blockcosts``).
        self.score_dims = self._token_dims(certain=True)
        self.repeat = {x.name: x.repeat for x in graph.layers}
        self.layer = {v: graph.node(v).layer for v in self.nodes}
        self.weight = {v: self.repeat.get(self.layer[v], 1) for v in self.nodes}
        self.param_state = self._param_state()
        seen: set[str] = set()
        self.charged: dict[int, set[str]] = {}
        for v in self.nodes:
            mine = {i.param for i in self.inputs[v] if i.param and i.param not in seen}
            self.charged[v] = mine
            seen |= mine
        self.routers = self._routers()
        self.routing_topks = self._routing_topks()
        self.routed = self._routed()
        self.strategies = {v: self._strategies(v) for v in self.nodes}
        self.follow = self._followers()
        self.groups = self._groups()
        self._classes = [self._group_classes(g) for g in self.groups]

    # ---- building ----------------------------------------------------------------------

    def _contract(self) -> tuple[list[int], dict[int, list[_Input]],
                                 dict[int, list[tuple[int, float]]], dict[int, list[bool]]]:
        """The real forward nodes, their inputs traced through views, the tensors each
        saves for backward: (the real node that produced it, bytes), and whether each of
        those is a copy of that node's output (a dtype cast: an autocast linear's input)."""
        g = self.graph
        fw = [i for i in sorted(g.graph.nodes) if not g.node(i).backward]
        node = {i: g.node(i) for i in fw}
        constant: set[int] = set()
        for i in fw:
            n = node[i]
            if not any(r.param or r.source < 0 or r.source not in constant for r in n.inputs) \
                    and (n.inputs or n.family == "view") and n.family != "unknown":
                constant.add(i)
        real = [i for i in fw if i not in constant and node[i].family != "view"]

        def origin(i: int) -> int:
            """The real node a tensor produced by node ``i`` comes from (-1: none)."""
            while i >= 0 and i in node and i not in constant and node[i].family == "view":
                i = node[i].inputs[0].source if node[i].inputs else -1
            return i if i in node and i not in constant else -1

        def copied(i: int) -> bool:
            """Whether a tensor produced by node ``i`` is a copy of its real node's."""
            while i >= 0 and i in node and i not in constant and node[i].family == "view":
                if node[i].output_bytes and node[i].aten in COPY_OPS:
                    return True
                i = node[i].inputs[0].source if node[i].inputs else -1
            return False

        saved: dict[int, list[tuple[int, float]]] = {i: [] for i in real}
        copies: dict[int, list[bool]] = {i: [] for i in real}
        for i in fw:  # a view's saved tensors belong to the real node it views
            if i in constant or not node[i].saved_bytes:
                continue
            at = i if i in saved else origin(i)
            if at in saved:
                saved[at] += [(origin(src), nbytes) for src, nbytes in node[i].saved_from]
                copies[at] += [copied(src) for src, _ in node[i].saved_from]
        # An nn.MultiheadAttention's projections of its packed weight (``_through_views``).
        attention = set(g.multihead_attention)
        packed = frozenset(v for v in real if node[v].family == "matmul"
                           and node[v].module in attention
                           and any(r.param for r in node[v].inputs))
        inputs = {v: [_through_views(node, constant, r, packed) for r in node[v].inputs]
                  for v in real}
        if not real:
            raise SpecError(f"{g.name}: the graph has no forward ops to shard")
        return real, inputs, saved, copies

    def free_nodes(self) -> list[int]:
        """The nodes whose strategy is chosen (the others follow a leader)."""
        return [v for v in self.nodes if v not in self.follow]

    def complete(self, choice: dict[int, int]) -> dict[int, int]:
        """``choice`` of the free nodes extended to the followers."""
        full = dict(choice)
        for v in self.nodes:
            if v in self.follow:
                u, f = self.follow[v]
                full[v] = f[full[u]]
        return full

    def _param_state(self) -> float:
        """Bytes per parameter of weights, gradients and optimizer state."""

        return float(sum(state_bytes(self.job, self)))

    @property
    def hidden_size(self) -> int:
        """The widest parameter dim: the width Adafactor's factored state is divided by
        (``costmodel.formulas.states.Widths``)."""
        return max((max(r.shape) for v in self.nodes for r in self.graph.node(v).inputs
                    if r.param and r.shape), default=1)

    def _groups(self) -> list[_Group]:
        groups: dict[tuple[int, int, float], _Group] = {}
        for v in self.nodes:
            for slot, inp in enumerate(self.inputs[v]):
                u = inp.source
                if u < 0:
                    continue
                same = self.layer[u] == self.layer[v]
                w = self.weight[v] if same else 1
                nbytes = self._moved(v, slot, inp)
                key = (u, w, nbytes)
                if key not in groups:
                    groups[key] = _Group(u, w, nbytes, inp.grad)
                groups[key].consumers.append((v, slot))
        # The block after a repeated block reads its input from that block's output: one
        # pseudo-edge per entry into the block, charged repeat - 1 times.
        for lname, r in self.repeat.items():
            if r < 2:
                continue
            inside = [v for v in self.nodes if self.layer[v] == lname]
            leaving = [u for u in inside if any(
                i.source == u for v in self.nodes if self.layer[v] != lname
                for i in self.inputs[v])]
            for v in inside:
                for slot, inp in enumerate(self.inputs[v]):
                    if inp.source < 0 or self.layer[inp.source] == lname:
                        continue
                    shape = self.graph.node(inp.source).shape
                    for u in leaving:
                        if self.graph.node(u).shape == shape:
                            nbytes = self._moved(v, slot, inp)
                            key = (u, -(r - 1), nbytes)
                            if key not in groups:
                                groups[key] = _Group(u, r - 1, nbytes, inp.grad)
                            groups[key].consumers.append((v, slot))
                            break
        return list(groups.values())

    def _convert(self, src: Strategy, need: Layout, grad: Layout | None, nbytes: float
                 ) -> float:
        """Seconds to convert producer strategy ``src``'s output into the layout ``need``
        and, backward, the gradient from ``grad`` into the one ``src`` takes. A partial
        gradient may be taken from any layout at no cost (one rank keeps its part, the
        others add zeros); a partial forward input only from a partial output."""
        out = src.out
        if any(b == PARTIAL and a != PARTIAL for a, b in zip(out, need, strict=True)):
            return _BARRED_S
        back = None if grad is None else _taking(grad, src.grad_layout)
        if self.tensor_parallel and not self.sequence_parallel and (_scatters(out, need) or (
                grad is not None and back is not None and _scatters(grad, back))):
            # (tensor parallel without SP only all-reduces partial sums)
            return _BARRED_S
        m, s = self.mesh.shape, self.mesh.strides
        t = reshard_time(self.topo, m, s, out, need, nbytes)
        if grad is not None and back is not None:
            t += reshard_time(self.topo, m, s, grad, back, nbytes)
        return t

    def _group_classes(self, g: _Group) -> tuple[dict[tuple[Layout, Layout | None], int],
                                                 np.ndarray]:
        """The classes the consumers of ``g`` may need (class -> column) and the cost of
        converting each producer strategy's output (rows) into each."""
        classes: dict[tuple[Layout, Layout | None], int] = {}
        for v, slot in g.consumers:
            for st in self.strategies[v]:
                classes.setdefault(g.need(st, slot), len(classes))
        cost = np.array([[self._convert(st, need, grad, g.nbytes) for need, grad in classes]
                         for st in self.strategies[g.producer]])
        return classes, cost

    def conversions(self, choice: dict[int, int]
                    ) -> Iterator[tuple[_Group, int, int, float]]:
        """Under ``choice``: every conversion of a producer's output, as (group, the first
        consumer needing that class and its input slot, seconds per micro-batch, charged
        ``group.weight`` times); consumers needing the same class share it."""
        for g, (classes, cost) in zip(self.groups, self._classes, strict=True):
            seen: set[int] = set()
            for v, slot in g.consumers:
                c = classes[g.need(self.strategies[v][choice[v]], slot)]
                if c not in seen:
                    seen.add(c)
                    yield g, v, slot, float(cost[choice[g.producer], c])

    # ---- evaluating --------------------------------------------------------------------

    def evaluate(self, choice: dict[int, int]) -> tuple[float, float]:
        """(objective seconds per step, memory bytes) of strategy ``choice[v]`` per node."""
        m = self.micro_batches
        compute = sync = backward = mem = 0.0
        for v in self.nodes:
            st = self.strategies[v][choice[v]]
            w = self.weight[v]
            compute += w * st.compute_s
            sync += w * st.sync_s
            backward += w * st.backward_s
            mem += w * st.memory
        comm = sum(g.weight * t for g, _v, _slot, t in self.conversions(choice))
        return m * (compute + comm) + max(0.0, sync - backward), mem

    def size(self) -> int:
        """Number of assignments of the free nodes (what brute force enumerates)."""
        return math.prod(len(self.strategies[v]) for v in self.free_nodes())


@dataclass(frozen=True)
class Solution:
    """The chosen strategy index per node, the objective (seconds per step, as the ILP
    minimises it) and the memory (bytes) of the whole graph on one mesh; ``optimal``: the
    solver proved it optimal (else it is the best found within the time limit)."""

    problem: ShardingProblem
    choice: dict[int, int]
    objective_s: float
    memory_bytes: float
    solve_s: float = 0.0
    optimal: bool = True

    def strategy(self, v: int) -> Strategy:
        """The strategy of node ``v``."""
        return self.problem.strategies[v][self.choice[v]]

    def layouts(self) -> list[tuple[int, str, str, str]]:
        """(node, op, strategy label, output layout) of every node."""
        out = []
        for v in self.problem.nodes:
            st = self.strategy(v)
            out.append((v, self.problem.graph.node(v).op, st.label,
                        ",".join(describe(p) for p in st.out)))
        return out

    def collectives(self) -> list[tuple[int, int, str, float]]:
        """(producer, consumer, collectives, seconds per micro-batch) of every conversion
        the layouts insert (propagation: where a consumer needs another layout)."""
        out = []
        for g, v, slot, t in self.problem.conversions(self.choice):
            if t > 0:
                need, grad = g.need(self.strategy(v), slot)
                out.append((g.producer, v, _collective_names(self.strategy(g.producer),
                                                             need, grad), t))
        return out


def _collective_names(src: Strategy, need: Layout, grad: Layout | None) -> str:
    """The collectives converting producer strategy ``src``'s output into ``need`` and,
    backward, the gradient ``grad`` into the layout ``src`` takes it in."""
    def one(a: Layout, b: Layout) -> list[str]:
        names = []
        for axis, (s, d) in enumerate(zip(a, b, strict=True)):
            if s in (d, REPLICATE):
                continue
            kind = ("all-reduce" if d == REPLICATE else "reduce-scatter") if s == PARTIAL \
                else "all-gather" if d == REPLICATE else "all-to-all"
            names.append(f"{kind}@{axis}")
        return names

    fwd = one(src.out, need)
    bwd = one(grad, _taking(grad, src.grad_layout)) if grad is not None else []
    return " ".join(fwd + [f"bwd:{x}" for x in bwd])


def _chosen(options: list[Any]) -> int:
    """The index of the strategy a solved MIP picked among a node's ``options`` (its
    variables): the largest solution value, the first among equals."""
    return max(range(len(options)), key=lambda k: options[k].solution_value())


def solve(problem: ShardingProblem, *, time_limit_s: float = 30.0) -> Solution:
    """The ILP of the module docstring on ``problem`` (OR-Tools' MIP interface with SCIP:
    only ``x`` is integral; ``w`` and ``y`` take 0/1 values at the optimum). Raises
    ``SpecError`` when no assignment fits the memory budget."""
    import time

    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter()
    p = problem
    us = 1e6  # the solver works in microseconds and MiB
    solver = pywraplp.Solver.CreateSolver("SCIP")
    solver.SetNumThreads(1)
    solver.SetTimeLimit(int(time_limit_s * 1000))
    inf = solver.infinity()
    x: dict[int, list[Any]] = {}
    for v in p.nodes:
        if v in p.follow:  # (f) a follower's strategy is a function of its leader's
            u, f = p.follow[v]
            x[v] = [solver.Sum([x[u][k] for k in range(len(f)) if f[k] == j])
                    for j in range(len(p.strategies[v]))]
        else:
            x[v] = [solver.BoolVar(f"x{v}_{k}") for k in range(len(p.strategies[v]))]
            solver.Add(solver.Sum(x[v]) == 1)  # (a)
    objective = []
    m = p.micro_batches
    for gi, (g, (classes, cost)) in enumerate(zip(p.groups, p._classes, strict=True)):
        for cls, c in classes.items():
            if not cost[:, c].any():
                continue
            w = solver.NumVar(0.0, 1.0, f"w{gi}_{c}")
            for v, slot in g.consumers:  # (b)
                members = [x[v][k] for k, st in enumerate(p.strategies[v])
                           if g.need(st, slot) == cls]
                if members:
                    solver.Add(w >= solver.Sum(members))
            # (c) as y[k] = x[u, k] AND w[u, c] (exactly one producer strategy carries the
            # class): sum_k y[k] = w, y[k] <= x[u, k]; z = sum_k r[u, k, c] y[k].
            y = [solver.NumVar(0.0, 1.0, f"y{gi}_{c}_{k}")
                 for k in range(len(p.strategies[g.producer]))]
            solver.Add(solver.Sum(y) == w)
            for k, yk in enumerate(y):
                solver.Add(yk <= x[g.producer][k])
                if cost[k, c]:
                    objective.append(m * g.weight * float(cost[k, c]) * us * yk)
    mib = 2.0**20
    solver.Add(solver.Sum([p.weight[v] * st.memory / mib * x[v][k]  # (d)
                           for v in p.nodes for k, st in enumerate(p.strategies[v])])
               <= p.budget / mib)
    e = solver.NumVar(0.0, inf, "e")
    solver.Add(e >= solver.Sum([p.weight[v] * (st.sync_s - st.backward_s) * us * x[v][k]  # (e)
                                for v in p.nodes for k, st in enumerate(p.strategies[v])]))
    objective.append(e)
    objective += [m * p.weight[v] * st.compute_s * us * x[v][k]
                  for v in p.nodes for k, st in enumerate(p.strategies[v])]
    solver.Minimize(solver.Sum(objective))
    status = solver.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        raise SpecError(f"{p.graph.name} on a {p.mesh.shape[0]}x{p.mesh.shape[1]} mesh: no "
                        f"sharding fits {p.budget / GIB:.1f} GiB; use more GPUs or a "
                        f"smaller batch")
    choice = p.complete({v: _chosen(x[v]) for v in p.free_nodes()})
    obj, mem = p.evaluate(choice)
    return Solution(p, choice, obj, mem, time.perf_counter() - t0,
                    status == pywraplp.Solver.OPTIMAL)


def brute_force(problem: ShardingProblem, *, limit: int = 2_000_000) -> Solution:
    """The best assignment by enumerating all of them (at most ``limit``)."""
    p = problem
    if p.size() > limit:
        raise SpecError(f"{p.size():,} assignments is more than brute force's limit {limit:,}")
    free = p.free_nodes()
    best: tuple[float, float, dict[int, int]] | None = None
    for combo in itertools.product(*(range(len(p.strategies[v])) for v in free)):
        choice = p.complete(dict(zip(free, combo, strict=True)))
        obj, mem = p.evaluate(choice)
        if mem <= p.budget and (best is None or obj < best[0] - 1e-15):
            best = (obj, mem, choice)
    if best is None:
        raise SpecError("no assignment fits the memory budget")
    return Solution(p, best[2], best[0], best[1])

"""The whole plan of a traced layer graph: every pipeline degree and mesh shape, each stage's
sharding solved by ``costmodel.autoshard`` and the layers split over the stages by a DP;
``GraphPlan`` is the best of them with why the others lost.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.arrays import divisors
from costmodel.autoshard import Mesh, ShardingProblem, Solution, solve
from costmodel.config import Job
from costmodel.errors import Infeasible, SpecError
from costmodel.estimate import _html_table, mfu_peak_flops, usd_per_million_tokens
from costmodel.graph import LayerGraph
from costmodel.hardware import Cluster
from costmodel.units import GIB
from hardware_profiles.files import write_text

__all__ = ["GraphPlan", "plan_graph", "traced_batch"]


# ---- the whole plan: pipeline stages x mesh shapes -----------------------------------------

@dataclass(frozen=True)
class GraphPlan:
    """The best plan for a graph: ``pp`` pipeline stages, each a ``mesh`` of GPUs sharded as
    ``solution`` says; ``stages`` the layer instances per stage; ``step_time_s`` seconds
    per step, ``stage_memory_bytes`` peak bytes per GPU of each stage; ``alternatives``:
    (pp, mesh shape, step seconds or ``inf``, why) for every candidate tried."""

    graph: LayerGraph
    cluster: Cluster
    job: Job
    pp: int
    mesh: Mesh
    micro_batches: int
    stages: tuple[tuple[str, ...], ...]
    step_time_s: float
    stage_memory_bytes: tuple[float, ...]
    solution: Solution
    alternatives: tuple[tuple[int, tuple[int, ...], float, str], ...]
    solve_s: float

    @property
    def peak_memory_bytes(self) -> float:
        """The most memory any GPU needs (bytes)."""
        return max(self.stage_memory_bytes)

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch: the traced batch (the first dimension of the first
        input), split across each stage's mesh by the sharding."""
        return traced_batch(self.graph)

    @property
    def tokens_per_s(self) -> float:
        """Training throughput: the job's tokens per step (global batch x sequence length)
        over the step time."""
        return self.job.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the graph's matmul, convolution and attention FLOPs per
        step over the GPUs' dense peak in the job's precision (PaLM, App. B)."""
        flops = self.graph.model_flops() * self.micro_batches
        return flops / self.step_time_s / self.cluster.num_gpus / mfu_peak_flops(
            self.cluster, self.job.precision)

    @property
    def usd_per_million_tokens(self) -> float | None:
        """US dollars to train a million tokens at the GPU profile's rental price (``None``
        without a price)."""
        return usd_per_million_tokens(self.cluster, self.step_time_s, self.job.tokens_per_step)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (``"kind": "graph"``). ``config``: the pipeline degree,
        mesh shape, micro-batches and the layer instances of each stage; ``estimate``:
        ``step_time_s``, ``peak_memory_bytes``, ``stage_memory_bytes``, ``mfu``,
        ``tokens_per_s``, ``usd_per_million_tokens``; ``sharding``: each node's strategy
        and output layout; ``collectives``: each inserted conversion and its seconds per
        micro-batch; ``alternatives``: every (pp, mesh) tried, with its step time (``null``:
        did not fit) and why."""
        return {
            "kind": "graph",
            "model": {"name": self.graph.name, "num_params": self.graph.num_params(),
                      "layers": len(self.graph.layers),
                      "model_flops_per_micro_batch": self.graph.model_flops()},
            "cluster": self.cluster.to_dict(),
            "job": {"global_batch_size": self.job.global_batch_size,
                    "seq_len": self.job.seq_len, "precision": self.job.precision,
                    "optimizer": self.job.optimizer},
            "config": {"pp": self.pp, "mesh": list(self.mesh.shape),
                       "micro_batch_size": self.micro_batch_size,
                       "micro_batches": self.micro_batches,
                       "stages": [list(names) for names in self.stages]},
            "estimate": {"step_time_s": self.step_time_s,
                         "peak_memory_bytes": self.peak_memory_bytes,
                         "stage_memory_bytes": list(self.stage_memory_bytes),
                         "mfu": self.mfu, "tokens_per_s": self.tokens_per_s,
                         "usd_per_million_tokens": self.usd_per_million_tokens},
            "optimal": self.solution.optimal,
            "solve_seconds": self.solve_s,
            "sharding": [{"node": v, "op": op, "strategy": label, "output": out}
                         for v, op, label, out in self.solution.layouts()],
            "collectives": [{"producer": a, "consumer": b, "collectives": what,
                             "seconds_per_micro_batch": t}
                            for a, b, what, t in self.solution.collectives()],
            "alternatives": [{"pp": pp, "mesh": list(shape),
                              "step_time_s": t if math.isfinite(t) else None, "reason": why}
                             for pp, shape, t, why in self.alternatives],
        }

    def to_json(self, path: Any = None) -> str:
        """The plan as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            write_text(path, text + "\n", "plan file")
        return text

    def summary(self, rows: int | None = None) -> str:
        """The plan as text: mesh, stages, step time, memory, then each node's sharding
        (the first ``rows`` nodes; all when ``None``)."""
        lines = [self._headline()]
        for s, names in enumerate(self.stages):
            lines.append(f"  stage {s}: {len(names)} layers ({names[0]} .. {names[-1]}), "
                         f"{self.stage_memory_bytes[s] / GIB:.2f} GiB")
        layouts = self.solution.layouts()
        for v, op, label, out in layouts[:rows]:
            lines.append(f"  {v:>5d} {op:<48s} {label:<8s} out {out}")
        if rows is not None and len(layouts) > rows:
            lines.append(f"  ... {len(layouts) - rows} more nodes (--json lists them all)")
        return "\n".join(lines)

    def _headline(self) -> str:
        """One line: mesh, micro-batches, step time, MFU, peak memory, solve time."""
        return (f"{self.graph.name}: pp={self.pp} x mesh {self.mesh.shape[0]}x"
                f"{self.mesh.shape[1]}, {self.micro_batches} micro-batches of "
                f"{self.micro_batch_size}; step "
                f"{self.step_time_s * 1e3:.2f} ms, MFU {100 * self.mfu:.1f}%, peak "
                f"{self.peak_memory_bytes / GIB:.2f} GiB/GPU (solved in {self.solve_s:.2f} s"
                f"{'' if self.solution.optimal else ', best found in the time limit'})")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """The headline and the stages as an HTML table (Jupyter)."""
        rows = [(s, len(n), f"{n[0]} .. {n[-1]}", f"{m / GIB:.2f}")
                for s, (n, m) in enumerate(zip(self.stages, self.stage_memory_bytes,
                                               strict=True))]
        return (f"<p><b>{html.escape(self._headline())}</b></p>"
                + _html_table(("stage", "layers", "from .. to", "GiB/GPU"), rows))


def traced_batch(graph: LayerGraph) -> int:
    """The batch ``graph`` was traced with: the first dimension of its first input (1 when
    it has none): one micro-batch."""
    return graph.inputs[0][0] if graph.inputs and graph.inputs[0] else 1


def _units(graph: LayerGraph) -> list[str]:
    """The layer instances in order, repeated blocks unrolled (by their traced name)."""
    out: list[str] = []
    for x in graph.layers:
        out += [x.name] * x.repeat
    return out


def _stage_dp(times: list[float], mems: list[float], pp: int, capacity: float,
              acts: list[float], micro_batches: int) -> tuple[float, list[int]] | None:
    """Contiguous split of the layers into ``pp`` stages minimising the slowest; stage ``s``
    holds ``min(pp - s, M)`` micro-batches of activations (1F1B). Returns (slowest stage
    seconds, stage boundaries) or ``None`` when nothing fits."""
    n = len(times)
    ct = np.concatenate([[0.0], np.cumsum(times)])
    cm = np.concatenate([[0.0], np.cumsum(mems)])
    ca = np.concatenate([[0.0], np.cumsum(acts)])
    inf = math.inf
    best = np.full((pp, n + 1), inf)
    arg = np.zeros((pp, n + 1), dtype=int)

    def fits(s: int, i: int, j: int) -> bool:
        held = min(pp - s, micro_batches)
        return (cm[j] - cm[i]) + held * (ca[j] - ca[i]) <= capacity

    for j in range(1, n + 1):
        if fits(0, 0, j):
            best[0, j] = ct[j]
    for s in range(1, pp):
        for j in range(s + 1, n + 1):
            for i in range(s, j):
                if best[s - 1, i] < inf and fits(s, i, j):
                    t = max(best[s - 1, i], ct[j] - ct[i])
                    if t < best[s, j]:
                        best[s, j], arg[s, j] = t, i
    if best[pp - 1, n] == inf:
        return None
    cuts = [n]
    for s in range(pp - 1, 0, -1):
        cuts.append(int(arg[s, cuts[-1]]))
    return float(best[pp - 1, n]), [0, *reversed(cuts)]


def plan_graph(graph: LayerGraph, cluster: Cluster, job: Job, *,
               micro_batches: int | None = None, max_pp: int | None = None,
               time_limit_s: float = 10.0, progress: Any = None) -> GraphPlan:
    """Plan ``graph`` (traced on one micro-batch) on ``cluster``: every pipeline degree and
    2-D mesh shape, the ILP per candidate, the stage DP, the fastest that fits.

    ``micro_batches``: per step (default: ``job.global_batch_size`` over the traced batch).
    Raises ``Infeasible`` when nothing fits, saying the least memory a candidate needed.
    """
    import time

    t0 = time.perf_counter()
    batch = traced_batch(graph)
    if micro_batches is None:
        if job.global_batch_size % batch:
            raise SpecError(f"global batch {job.global_batch_size} is not a multiple of the "
                            f"traced batch {batch}; trace a batch that divides it")
        micro_batches = job.global_batch_size // batch
    units = _units(graph)
    n = cluster.num_gpus
    g = cluster.gpus_per_node
    capacity = float(cluster.gpu.memory_bytes)
    tried: list[tuple[int, tuple[int, ...], float, str]] = []
    best: tuple[float, Any] | None = None
    least = math.inf
    for pp in divisors(n):
        if pp > len(units) or (max_pp is not None and pp > max_pp):
            continue
        per = n // pp
        # Alpa's logical meshes (Sec. 5.2): part of one node, or whole nodes x a node's GPUs.
        for mesh in [Mesh((1, per))] if per <= g else [Mesh((per // g, g))] \
                if per % g == 0 else []:
            held = min((pp + 2) // 2, micro_batches)  # 1F1B's average; the DP checks each stage
            if progress is not None:
                progress(f"pp={pp} mesh {mesh.shape[0]}x{mesh.shape[1]}")
            prob = ShardingProblem(graph, mesh, cluster, job, micro_batches=micro_batches,
                                   in_flight=held, budget=capacity * pp)
            try:
                sol = solve(prob, time_limit_s=time_limit_s)
            except SpecError:
                tried.append((pp, mesh.shape, math.inf, "no sharding fits"))
                continue
            costs = sol.layer_costs()
            rows = [costs.get(u, (0.0,) * 5) for u in units]
            times, mems, acts = ([r[i] for r in rows] for i in (0, 3, 4))
            found = _stage_dp(times, mems, pp, capacity, acts, micro_batches)
            if found is None:
                least = min(least, (sum(mems) + min(pp, micro_batches) * sum(acts)) / pp)
                tried.append((pp, mesh.shape, math.inf, "stages do not fit"))
                continue
            slowest, cuts = found
            sync = sum(r[2] - r[1] for r in rows[cuts[-2]:cuts[-1]])
            p2p = 0.0
            if pp > 1:
                out_bytes = max(x.output_bytes for x in graph.layers)
                p2p = 2 * float(prob.topo.p2p(out_bytes / mesh.size, per))
            step = (micro_batches + pp - 1) * (slowest + p2p) + max(0.0, sync)
            tried.append((pp, mesh.shape, step, ""))
            if best is None or step < best[0] - 1e-12:
                stage_mem = tuple(
                    sum(mems[cuts[s]:cuts[s + 1]]) + min(pp - s, micro_batches)
                    * sum(acts[cuts[s]:cuts[s + 1]]) for s in range(pp))
                stages = tuple(tuple(units[cuts[s]:cuts[s + 1]]) for s in range(pp))
                best = (step, (pp, mesh, stages, stage_mem, sol))
    if best is None:
        need = f"; the best candidate needs {least / GIB:.1f} GiB per GPU" \
            if least < math.inf else ""
        raise Infeasible(f"{graph.name}: no plan fits {capacity / GIB:.1f} GiB per GPU on "
                         f"{n} GPU{'s' if n > 1 else ''}{need}; use more GPUs or trace a smaller "
                         "micro-batch")
    step, (pp, mesh, stages, stage_mem, sol) = best
    return GraphPlan(graph, cluster, job, pp, mesh, micro_batches, stages, step, stage_mem,
                     sol, tuple(tried), time.perf_counter() - t0)

"""Stage partition: the DP and the ILP against brute force, and against the uniform split."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from planner.partition import brute_force, partition, partition_ilp, stage_costs
from planner.plan import plan

# A large vocabulary makes the last stage (LM head and loss) the heavy one.
DENSE = ModelSpec(name="head-heavy", num_layers=9, hidden_size=1024, num_heads=8,
                  ffn_hidden_size=4096, vocab_size=128000)
MOE = ModelSpec(name="moe", num_layers=8, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
                vocab_size=32000, num_experts=8, top_k=2, moe_ffn_hidden_size=512,
                first_dense_layers=2)
CLUSTER = Cluster(gpu="a100-80gb", num_nodes=1, gpus_per_node=8)


def _capacity(costs, share: float) -> float:
    """A memory capacity between the least and the most a candidate stage needs."""
    finite = costs.memory[np.isfinite(costs.memory)]
    return float(np.quantile(finite, share))


@pytest.mark.parametrize("model", [DENSE, MOE])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("share", [1.0, 0.5])
def test_dp_and_ilp_equal_brute_force(model: ModelSpec, recompute: str, share: float) -> None:
    job = Job(global_batch_size=32, seq_len=2048, framework="megatron")
    cfg = ParallelConfig(dp=2, tp=1, pp=4, micro_batch_size=1, recompute=recompute)
    costs = stage_costs(model, CLUSTER, job, cfg)
    cap = _capacity(costs, share)
    per_stage = recompute == "full"
    want = brute_force(costs, model.num_layers, cap, per_stage)
    dp = partition(costs, model.num_layers, cap, per_stage)
    ilp = partition_ilp(costs, model.num_layers, cap, per_stage)
    if not np.isfinite(want):
        assert dp is None and ilp is None
        return
    assert dp is not None and ilp is not None
    assert dp.slowest == want
    assert ilp.slowest == pytest.approx(want, abs=2e-9)  # CP-SAT works in whole nanoseconds
    assert sum(dp.stage_layers) == model.num_layers
    assert max(dp.memory) <= cap


def test_partition_costs_are_the_estimates() -> None:
    """The chosen partition's stage memory is what estimate() reports for it."""
    job = Job(global_batch_size=32, seq_len=2048, framework="megatron")
    cfg = ParallelConfig(dp=2, tp=1, pp=4, micro_batch_size=1, recompute="full")
    costs = stage_costs(DENSE, CLUSTER, job, cfg)
    part = partition(costs, DENSE.num_layers, CLUSTER.gpu.memory_bytes, True)
    assert part is not None
    est = estimate(DENSE, CLUSTER, job, part.apply(cfg))
    got = [s.memory.total_bytes for s in est.stages]
    assert got == pytest.approx(list(part.memory), rel=1e-12)


def test_partition_beats_the_uniform_split_when_stages_are_imbalanced() -> None:
    job = Job(global_batch_size=32, seq_len=2048, framework="megatron")
    cfg = ParallelConfig(dp=2, tp=1, pp=4, micro_batch_size=1)
    costs = stage_costs(DENSE, CLUSTER, job, cfg)
    part = partition(costs, DENSE.num_layers, CLUSTER.gpu.memory_bytes, False)
    assert part is not None and part.stage_layers != (2, 2, 2, 3)
    uniform = estimate(DENSE, CLUSTER, job, cfg)
    better = estimate(DENSE, CLUSTER, job, part.apply(cfg))
    assert better.step_time_s < uniform.step_time_s
    # plan() applies it when the search picks a pipelined configuration.
    p = plan(DENSE, CLUSTER, job, constraints={"fixed": {"pp": 4, "tp": 1}})
    assert p.config.stage_layers is not None
    assert p.alternatives[0].reason.startswith("the uniform stage split")
    assert p.estimate.step_time_s < p.alternatives[0].step_time_s

"""DeepSeek's bidirectional DualPipe: micro-batches fed from both ends of an even number of
ranks, rank r holding stages r and pp - 1 - r.

Oracles: deepseek-ai/DualPipe@3da1bbe (dualpipe.py ``DualPipe.step``; the stage placement of
examples/example_dualpipe.py) and its README's bubble, (PP/2 - 1)(F&B + B - 3W), and its
statement that the cut-in-half DualPipeV on PP/2 ranks has DualPipe's bubble and memory per
device; the op-by-op event simulation against the estimate.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import SpecError
from costmodel.formulas.pipeline import _vs, simulate
from costmodel.formulas.vschedules import dualpipe_orders
from planner import Plan, timeline
from planner.emit import emit
from planner.runtime.checks import unsupported

QWEN = ModelSpec.preset("qwen3-30b-a3b")
CLUSTER = Cluster.preset("dgx-h100", num_nodes=8)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 14), (6, 12), (8, 20), (8, 34)])
def test_each_stage_of_each_direction_runs_once_on_the_rank_that_holds_it(p: int, m: int
                                                                         ) -> None:
    """Every micro-batch runs each stage's forward once and its backward once (whole, or an
    input gradient and then a weight gradient) on the rank holding that stage in its
    direction: stage s on rank s for the first m / 2 (fed at rank 0), on rank p - 1 - s for
    the others (fed at rank p - 1). Mirror ranks r and p - 1 - r run the same kinds of ops
    on the same chunks in the same order (DualPipe.step depends on the rank only through
    half_rank and is_in_second_half)."""
    orders = dualpipe_orders(p, m)
    done: Counter[tuple[str, int, int]] = Counter()
    for r, seq in enumerate(orders):
        for op in seq:
            parts = [("F", op[1], op[2]), ("B", op[3], op[4])] if op[0] == "O" \
                else [(op[0], op[1], op[2])]
            for kind, mb, chunk in parts:
                stage = _vs(chunk, r, p, "dualpipe")
                assert r == (stage if mb < m // 2 else p - 1 - stage)
                done[("B" if kind == "I" else kind, mb, stage)] += 1
                if kind == "I":
                    done[("I", mb, stage)] += 1
    for mb in range(m):
        for stage in range(p):
            assert done[("F", mb, stage)] == 1
            assert done[("B", mb, stage)] == 1
            assert done[("W", mb, stage)] == done[("I", mb, stage)]
    for r in range(p):
        assert [(o[0], o[2]) for o in orders[r]] == [(o[0], o[2]) for o in orders[p - 1 - r]]


@pytest.mark.parametrize(("p", "m"), [(4, 16), (6, 24), (8, 20), (8, 32)])
def test_the_bubble_is_deepseeks(p: int, m: int) -> None:
    """Stages of forward F = 1 s, full backward B = 2 s (input and weight gradients W = 1 s
    each): every rank computes m (F + B) and idles (PP/2 - 1)(F&B + B - 3W), F&B = F + B
    without an overlap saving (DualPipe README, 'Pipeline Bubbles and Memory Usage
    Comparison')."""
    t = simulate([2.0] * p, [4.0] * p, m, "dualpipe")  # a rank's two stages together
    assert t.makespan == pytest.approx(m * 3.0 + (p / 2 - 1) * (3.0 + 2.0 - 3.0))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (6, 16), (8, 20)])
def test_dualpipe_takes_as_long_as_dualpipev_on_half_the_ranks(p: int, m: int) -> None:
    """With each rank timed as its mirror (it holds the same two stages), DualPipe over p
    ranks and m micro-batches ends when DualPipeV over p / 2 ranks and m / 2 does, whatever
    the stage times and the overlap saving: the equivalence its costing rests on
    (``vschedules.dualpipe_costing``)."""
    rng = random.Random(p * 100 + m)
    f = [rng.uniform(0.5, 1.5) for _ in range(p // 2)]
    b = [x * rng.uniform(1.6, 2.4) for x in f]
    h = [x * rng.uniform(0.0, 0.5) for x in f]
    half = [min(r, p - 1 - r) for r in range(p)]
    full = simulate([f[i] for i in half], [b[i] for i in half], m, "dualpipe", 1,
                    [h[i] for i in half])
    v = simulate(f, b, m // 2, "dualpipev", 2, h)
    assert full.makespan == pytest.approx(v.makespan, rel=1e-12)
    assert full.num_stages == p and len(full.ops) == 2 * len(v.ops)


def test_a_dualpipe_plan_costs_as_its_dualpipev_and_times_as_its_own_timeline() -> None:
    """Qwen3-30B-A3B on 64 H100: DualPipe over pp = 4 and dp = 16 is estimated as DualPipeV
    over pp = 2 and dp = 32 (same step and memory per GPU), lists its 4 ranks (mirrors
    alike), counts its own 2x micro-batches, and its estimate is its own timeline played
    out. Under Megatron-LM's kernels with selective recompute its pairs hide expert
    all-to-all time, which 1F1B on the same ranks does not."""
    for fw, zero, recompute in (("torchtitan", 2, "none"), ("megatron", 1, "selective")):
        job = Job(global_batch_size=256, seq_len=4096, framework=fw)
        cfg = ParallelConfig(dp=16, pp=4, ep=8, zero_stage=zero, recompute=recompute,
                             pipeline_schedule="dualpipe")
        e = estimate(QWEN, CLUSTER, job, cfg)
        assert e.config == cfg and e.num_micro_batches == 16
        assert [s.stage for s in e.stages] == [0, 1, 2, 3]
        # Its 4 stages split as the DualPipeV's: torchtitan's V split, the embedding and the
        # output layer counted as a layer each (vschedules.v_split), mirrors alike.
        assert [s.num_layers for s in e.stages] == [23, 25, 25, 23]
        assert e.stages[0].memory == e.stages[3].memory
        assert e.stages[1].memory == e.stages[2].memory
        t = e.time_breakdown_s
        pipeline = e.step_time_s - t["dp_comm"] - t["optimizer"] - t["offload"]
        line = timeline(QWEN, CLUSTER, job, cfg)
        assert line.num_stages == 4
        assert line.makespan == pytest.approx(pipeline, rel=1e-9)
        assert 0 < t["ep_comm"] < 0.8 * t["ep_comm_total"]
        if fw == "torchtitan":
            v = estimate(QWEN, CLUSTER, job, ParallelConfig(
                dp=32, pp=2, ep=8, zero_stage=2, pipeline_schedule="dualpipev",
                virtual_pipeline_stages=2))
            assert v.step_time_s == pytest.approx(e.step_time_s, rel=1e-12)
            assert v.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-12)
        else:
            one = estimate(QWEN, CLUSTER, job, ParallelConfig(
                dp=16, pp=4, ep=8, zero_stage=1, recompute="selective"))
            assert one.time_breakdown_s["ep_comm"] == pytest.approx(
                one.time_breakdown_s["ep_comm_total"])


def test_dualpipe_is_refused_where_it_does_not_run_and_emitted_as_what_does() -> None:
    for pp, v in ((3, 1), (2, 1), (4, 2)):
        with pytest.raises(SpecError, match="even pp >= 4"):
            ParallelConfig(dp=8, pp=pp, pipeline_schedule="dualpipe", virtual_pipeline_stages=v)
    cfg = ParallelConfig(dp=16, pp=4, ep=8, zero_stage=1, pipeline_schedule="dualpipe")
    for batch, count in ((112, 7), (96, 6)):  # odd; fewer than 2 pp = 8
        with pytest.raises(SpecError, match=f"at least 2 \\* pp = 8 .*got {count}"):
            estimate(QWEN, CLUSTER, Job(global_batch_size=batch, seq_len=4096,
                                         framework="megatron"), cfg)
    with pytest.raises(SpecError, match="no 'dualpipe' schedule"):
        estimate(QWEN, CLUSTER, Job(global_batch_size=256, seq_len=4096,
                                     framework="deepspeed"), cfg)
    # Neither trainer runs DualPipe: torchtitan gets the DualPipeV it costs as, Megatron-LM
    # 1F1B; planner.apply runs neither.
    job = Job(global_batch_size=256, seq_len=4096, framework="torchtitan")
    tt = ParallelConfig(dp=16, pp=4, ep=8, zero_stage=2, pipeline_schedule="dualpipe")
    plan = Plan(model=QWEN, cluster=CLUSTER, job=job, config=tt,
                estimate=estimate(QWEN, CLUSTER, job, tt))
    out = emit(plan, "torchtitan")
    assert 'pipeline_parallel_schedule = "DualPipeV"' in out.text
    assert "pipeline_parallel_degree = 2" in out.text
    assert any("no DualPipe" in w for w in out.warnings)
    out = emit(plan, "megatron")
    assert "--pipeline-model-parallel-size 4" in out.text
    assert any("no dualpipe pipeline schedule" in w for w in out.warnings)
    assert any("DualPipe" in s for s in unsupported(QWEN, job, tt))


@pytest.mark.slow  # explains a whole MoE search: 3 s
def test_explain_prices_dualpipe_beside_the_searched_schedules() -> None:
    """The search never offers DualPipe, but explain costs it on the pipelines of the plan
    and of every other schedule's fastest configuration: here the plan's own DualPipeV, over
    twice the ranks, which runs the same ops in the same time."""
    from planner import explain, plan

    job = Job(global_batch_size=256, seq_len=4096, framework="torchtitan")
    p = plan(QWEN, CLUSTER, job)
    assert p.config.pipeline_schedule == "dualpipev"
    (choice,) = explain(p, fields=["pipeline_schedule"]).choices
    (dual,) = [o for o in choice.options if o.value == "dualpipe"]
    assert dual.config is not None and dual.config.pipeline_schedule == "dualpipe"
    assert (dual.config.pp, dual.config.dp) == (2 * p.config.pp, p.config.dp // 2)
    assert dual.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-12)
    assert "costed, not searched" in dual.reason


def test_a_search_fixed_to_dualpipe_says_it_is_costed_not_searched() -> None:
    from costmodel.errors import Infeasible
    from planner import plan
    from planner.space import Constraints

    job = Job(global_batch_size=256, seq_len=4096, framework="megatron")
    with pytest.raises(Infeasible, match="DeepSeek's DualPipe runs in none: 'planner "
                                         "estimate --schedule dualpipe' costs it"):
        plan(QWEN, CLUSTER, job, constraints=Constraints(fixed={"pipeline_schedule": "dualpipe"}))


def test_the_rank_holding_the_embedding_and_the_head_keeps_one_copy_of_the_embedding() -> None:
    """DeepSeek-V3's multi-token prediction module reads the embedding on the head's stage:
    a pipeline keeps a copy of it there (Megatron-LM), but DualPipe's rank 0 holds both
    stages and shares the tensor (DeepSeek-V3 report, Sec. 3.2.1)."""
    model = ModelSpec.preset("deepseek-v3")
    cluster = Cluster.preset("dgx-h100", num_nodes=128)
    job = Job(global_batch_size=4096, seq_len=4096, framework="megatron")
    plain = ParallelConfig(dp=64, pp=16, ep=64, zero_stage=1, recompute="full")
    dual = ParallelConfig(dp=64, pp=16, ep=64, zero_stage=1, recompute="full",
                          pipeline_schedule="dualpipe")
    word = model.vocab_size * model.hidden_size
    a, d = estimate(model, cluster, job, plain), estimate(model, cluster, job, dual)
    # 1F1B: the embedding on stage 0, the head, the MTP extras and the embedding's copy on
    # stage 15. DualPipe (costed as DualPipeV on 8 ranks): all of it on rank 0, the copy once.
    assert a.stages[0].embedding_params + a.stages[15].embedding_params \
        == pytest.approx(d.stages[0].embedding_params + word)

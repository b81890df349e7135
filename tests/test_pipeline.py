"""The pipeline term of the estimate is the trainer's schedule played out.

Oracles: ``costmodel.formulas.pipeline.makespan`` (vectorized, extrapolating repeated steady states)
against the op-by-op event simulation ``simulate``; the rank orders against
torch.distributed.pipelining's own schedules; ``pipeline_bound`` below the simulation; and the
step time of ``estimate`` against ``planner.timeline`` for random models, pipeline degrees,
schedules, stage splits and recompute.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fastloop import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.config import accounted_split
from costmodel.errors import SpecError
from costmodel.formulas.memory import SCHEDULE_CODES
from costmodel.formulas.pipeline import makespan, rank_orders, simulate
from costmodel.formulas.pipelinetable import pipeline_bound
from planner import plan, timeline

SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "zero-bubble", "zbv", "dualpipev")
V = ("zbv", "dualpipev")


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int, int, str]:
    """(p, m, v, schedule) that the trainers run (interleaved: m a multiple of its rounds)."""
    p = draw(st.integers(2, 8))
    schedule = draw(st.sampled_from(SCHEDULES))
    v = draw(st.integers(2, 4)) if schedule == "interleaved-1f1b" else 2 if schedule in V else 1
    m = draw(st.integers(2 * p if schedule == "dualpipev" else 1, 30 * p))
    if schedule == "interleaved-1f1b":
        rounds = max(1, m // p)
        m -= m % rounds
    return p, m, v, schedule


@st.composite
def stage_times(draw: st.DrawFn, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank forward and backward seconds: random, or equal middle stages with a first
    and last stage apart and near ties (where steady states take longest to repeat)."""
    kind = draw(st.sampled_from(("random", "classes", "near")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "random":
        return rng.uniform(0.05, 3.0, p), rng.uniform(0.05, 6.0, p)
    f, b = np.ones(p), 2 * np.ones(p)
    spread = 0.03 if kind == "near" else 0.6
    f[0] *= 1 + rng.uniform(-spread, spread)
    b[-1] *= 1 + rng.uniform(-spread, spread)
    f *= rng.uniform(1 - spread / 10, 1 + spread / 10, p)
    return f, b


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_vectorized_makespan_is_the_event_simulation(data: st.DataObject) -> None:
    p, m, v, schedule = data.draw(shapes())
    f, b = data.draw(stage_times(p))
    want = simulate(list(f), list(b), m, schedule, v).makespan
    got = makespan(f[:, None], b[:, None], m, schedule, v)[0]
    assert got == pytest.approx(want, rel=1e-9)
    # The bound a search prunes with is below it, with and without the forward split.
    code = np.array([SCHEDULE_CODES[schedule]])
    t, cnt = (f + b)[:, None], np.ones((p, 1), dtype=np.int64)
    for fwd in (f[:, None], None):
        sched = code if fwd is not None or schedule != "gpipe" else np.array([0])
        bound = pipeline_bound(t, fwd, cnt, np.array([m]), np.array([v]), sched)[0]
        assert bound <= want * (1 + 1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES[:4])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 32), (4, 3), (4, 1), (6, 200)])
def test_the_bound_is_exact_for_equal_stages(schedule: str, p: int, m: int) -> None:
    """Equal stages, forward 1 s and backward 2 s: the bound is the simulated makespan, so a
    search loses nothing to it on uniform pipelines."""
    v = 2 if schedule == "interleaved-1f1b" else 1
    if schedule == "interleaved-1f1b" and (m % max(1, m // p) or 1 < m < p):
        pytest.skip("not a micro-batch count the schedule runs, or one round of fewer than p")
    want = simulate([1.0] * p, [2.0] * p, m, schedule, v).makespan
    t, f = np.full((p, 1), 3.0), np.ones((p, 1))
    bound = pipeline_bound(t, f, np.ones((p, 1), dtype=np.int64), np.array([m]), np.array([v]),
                           np.array([SCHEDULE_CODES[schedule]]))[0]
    assert bound == pytest.approx(want, rel=1e-12)


def test_one_micro_batch_runs_through_every_stage_in_turn() -> None:
    """m < p, the corner the closed-form bubble (p - 1) / (v m) got wrong: one micro-batch
    through p stages takes the sum of every stage's time, whatever the interleaving."""
    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 20)):
        tl = simulate([1.0, 1.0], [2.0, 2.0], 1, schedule, v)
        assert tl.makespan == pytest.approx(6.0)
        assert tl.bubble_fraction == pytest.approx(0.5)
    # Zero bubble: rank 1's weight gradient runs beside rank 0's input gradient.
    assert simulate([1.0, 1.0], [2.0, 2.0], 1, "zero-bubble").makespan == pytest.approx(5.0)


def test_the_rank_orders_are_torchs() -> None:
    """Interleaved 1F1B in rounds and zero bubble (ZB1P, one chunk per rank) op for op as
    torch.distributed.pipelining builds them (ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ct = schedules._ComputationType
    kinds = {ct.FORWARD: "F", ct.FULL_BACKWARD: "B", ct.BACKWARD_INPUT: "B",
             ct.BACKWARD_WEIGHT: "W"}

    def torchs(cls: type, p: int, m: int, v: int, r: int) -> tuple:
        s = object.__new__(cls)  # the order only; no process group
        s.n_local_stages, s.pp_group_size, s._n_microbatches, s.rank = v, p, m, r
        s.number_of_rounds = max(1, m // p)
        s.microbatches_per_round = m // s.number_of_rounds
        acts = [a for a in s._calculate_single_rank_operations(r) if a is not None]
        return tuple((kinds[a.computation_type], a.microbatch_index, a.stage_index // p)
                     for a in acts)

    checked = 0
    for p in range(2, 6):
        for m in range(1, 3 * p + 1):
            if m % max(1, m // p):
                continue
            for r in range(p):
                for v in (2, 3):
                    assert rank_orders(p, m, v, "interleaved-1f1b")[r] == \
                        torchs(schedules.ScheduleInterleaved1F1B, p, m, v, r)
                assert rank_orders(p, m, 1, "zero-bubble")[r] == \
                    torchs(schedules.ScheduleInterleavedZeroBubble, p, m, 1, r)
                checked += 1
    assert checked > 100


def test_bad_schedules_are_refused() -> None:
    for args, msg in (((2, 4, 1, "2f2b"), "unknown"), ((2, 4, 2, "1f1b"), "interleaved"),
                      ((2, 0, 1, "1f1b"), "at least")):
        with pytest.raises(SpecError, match=msg):
            rank_orders(*args)


MODELS = [ModelSpec.preset("llama-3-8b"), ModelSpec.preset("gpt3-175b"),
          ModelSpec.preset("mixtral-8x7b"), ModelSpec.preset("deepseek-v2-lite")]
H100 = Cluster.preset("dgx-h100", num_nodes=8)


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[ModelSpec, Job, ParallelConfig]:
    """A random pipelined configuration: model, pp, schedule, micro-batches, uneven stages,
    per-stage recompute, trainer."""
    model = draw(st.sampled_from(MODELS))
    fw = draw(st.sampled_from(("megatron", "torchtitan", "deepspeed")))
    pp = draw(st.sampled_from((2, 4, 8)))
    schedule = draw(st.sampled_from({"megatron": ("1f1b", "interleaved-1f1b", "combined-1f1b"),
                                     "deepspeed": ("1f1b",),
                                     "torchtitan": SCHEDULES}[fw]))
    L = model.num_layers
    interleaved = schedule in ("interleaved-1f1b", "combined-1f1b")
    v = draw(st.integers(2, 4)) if interleaved else 2 if schedule in V else 1
    dp = 64 // pp // 8
    m = draw(st.integers(2 * pp if schedule == "dualpipev" else 1, 24))
    if interleaved:
        m = pp * max(1, m // pp) if fw == "megatron" else m - m % max(1, m // pp)
    if fw == "torchtitan" and schedule == "1f1b":
        m = max(m, pp)
    stage_layers = None
    recompute, per_stage = draw(st.sampled_from(("none", "selective", "full"))), None
    if interleaved and (L % (pp * v) or draw(st.booleans())):
        # Uneven chunks in virtual order, some empty (Megatron-LM's layouts): every rank
        # holds a layer.
        cuts = sorted(draw(st.lists(st.integers(0, L), min_size=pp * v - 1,
                                    max_size=pp * v - 1)))
        stage_layers = tuple(int(x) for x in np.diff([0, *cuts, L]))
        if any(sum(stage_layers[r::pp]) == 0 for r in range(pp)):
            stage_layers = accounted_split(L, pp, v) or tuple(
                int(x) for x in np.diff(np.linspace(0, L, pp * v + 1).round()))
    elif schedule in V and draw(st.booleans()):
        # Uneven V stages in virtual order, every stage a layer.
        cuts = sorted(draw(st.lists(st.integers(1, L - 1), min_size=2 * pp - 1,
                                    max_size=2 * pp - 1, unique=True)))
        stage_layers = tuple(int(x) for x in np.diff([0, *cuts, L]))
    elif not interleaved and schedule not in V and draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(1, L - 1), min_size=pp - 1, max_size=pp - 1,
                                    unique=True)))
        stage_layers = tuple(int(x) for x in np.diff([0, *cuts, L]))
        if recompute == "full" and fw != "deepspeed":
            per_stage = tuple(draw(st.integers(0, n)) for n in stage_layers)
    # Combined 1F1B overlaps expert all-to-alls: a MoE model's experts over the DP ranks.
    ep = dp if schedule == "combined-1f1b" and model.is_moe else 1
    cfg = ParallelConfig(dp=dp, tp=8, pp=pp, ep=ep, sequence_parallel=True, micro_batch_size=1,
                         pipeline_schedule=schedule, virtual_pipeline_stages=v,
                         recompute=recompute, stage_layers=stage_layers,
                         stage_recompute_layers=per_stage)
    job = Job(global_batch_size=dp * m, seq_len=4096, framework=fw)
    return model, job, cfg


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines())
def test_the_estimate_is_its_simulated_timeline(drawn: tuple) -> None:
    """The step time before what follows the last backward is the makespan of the timeline of
    the same configuration, for every schedule, stage split and recompute (the issue asks for
    1 %; they are one computation, so they agree to rounding)."""
    model, job, cfg = drawn
    try:
        est = estimate(model, H100, job, cfg)
    except SpecError:
        return  # a drawn combination some trainer refuses (checked elsewhere)
    bd = est.time_breakdown_s
    pipeline = est.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
    tl = timeline(model, H100, job, cfg)
    assert tl.makespan == pytest.approx(pipeline, rel=1e-9)
    assert bd["bubble"] >= -1e-12


def test_the_issues_plan_is_timed_as_its_schedule_runs() -> None:
    """Llama-3 70B on 512 H100, global batch 128 of 8,192 tokens: the search used to pick one
    micro-batch through two interleaved stages (estimate 1.94 s, timeline 3.65 s). The plan's
    step time is now its timeline's, and no plan leaves most of the pipeline idle."""
    model = ModelSpec.preset("llama-3-70b")
    cluster = Cluster.preset("dgx-h100", num_nodes=64)
    job = Job(global_batch_size=128, seq_len=8192, framework="torchtitan")
    p = plan(model, cluster, job)
    cfg = p.config
    bd = p.estimate.time_breakdown_s
    pipeline = p.estimate.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
    assert timeline(model, cluster, job, cfg).makespan == pytest.approx(pipeline, rel=1e-9)
    if cfg.pp > 1:
        assert p.estimate.num_micro_batches >= cfg.pp
    assert bd["bubble"] < 0.25 * p.estimate.step_time_s


def test_megatron_interleaving_needs_a_multiple_of_pp_micro_batches() -> None:
    """megatron/core/pipeline_parallel/schedules.py refuses it otherwise; torch's rounds run
    it (ScheduleInterleaved1F1B)."""
    model = MODELS[0]
    cfg = ParallelConfig(dp=2, tp=8, pp=4, virtual_pipeline_stages=2, sequence_parallel=True)
    job = Job(global_batch_size=2 * 6, seq_len=4096, framework="megatron")
    with pytest.raises(SpecError, match="multiple of pp=4"):
        estimate(model, H100, job, cfg)
    estimate(model, H100, dataclasses.replace(job, global_batch_size=16), cfg)


@settings(max_examples=examples(40), deadline=None)
@given(st.sampled_from((2, 4, 8)), st.integers(1, 40), st.sampled_from((2, 4)))
def test_activations_held_are_what_the_schedule_keeps_in_flight(p: int, m: int, v: int
                                                                ) -> None:
    """The memory model's micro-batches in flight per stage under interleaving (torch's rounds,
    torchtitan) are the most forwards each rank's op order runs ahead of its backwards."""
    m -= m % max(1, m // p)
    model = MODELS[0]
    if model.num_layers % (p * v):
        return
    cfg = ParallelConfig(dp=1, tp=8, pp=p, sequence_parallel=True, virtual_pipeline_stages=v,
                         pipeline_schedule="interleaved-1f1b")
    cluster = Cluster.preset("dgx-h100", num_nodes=p)
    est = estimate(model, cluster, Job(global_batch_size=m, seq_len=4096), cfg)
    for r, seq in enumerate(rank_orders(p, m, v, "interleaved-1f1b")):
        ahead = peak = 0
        for kind, _, _ in seq:
            ahead += 1 if kind == "F" else -1
            peak = max(peak, ahead)
        assert est.stages[r].in_flight_micro_batches * v == pytest.approx(peak), (r, m)

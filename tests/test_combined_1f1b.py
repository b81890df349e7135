"""Megatron-LM's combined 1F1B (``--overlap-moe-expert-parallel-comm``): each steady-state
forward paired with another micro-batch's backward so that one's expert all-to-alls run under
the other's compute.

Oracles: the interleaved 1F1B order it is built from (megatron/core/pipeline_parallel/
combined_1f1b.py: one warm-up forward more, then forward-backward pairs; without a pipeline
the first forward and the last backward alone); the event simulation against the vectorized
makespan and the search's bound; Megatron-Core's own refusals (transformer_config.py,
core_v0.14.0); NVIDIA's Megatron-MoE-ModelZoo pair of runs of one Qwen3-235B layout on 256
H100 without and with the overlap (yanring/Megatron-MoE-ModelZoo@e8650517,
best_practice/qwen3/readme.md: 19.7 s and 17.6 s per step).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.config import accounted_split
from costmodel.errors import SpecError
from costmodel.formulas.memory import SCHEDULE_CODES
from costmodel.formulas.pipeline import makespan, rank_orders, simulate
from costmodel.formulas.pipelinetable import pipeline_bound
from planner import plan, timeline
from planner.space import Constraints

COMBINED = "combined-1f1b"


@pytest.mark.parametrize(("p", "m", "v"), [(1, 6, 1), (2, 8, 2), (4, 8, 2), (4, 16, 3),
                                           (8, 24, 4)])
def test_the_order_is_interleaved_1f1b_with_its_steady_state_paired(p: int, m: int, v: int
                                                                   ) -> None:
    base = rank_orders(p, m, v, "interleaved-1f1b") if p > 1 else rank_orders(1, m, 1, "1f1b")
    for r, seq in enumerate(rank_orders(p, m, v, COMBINED)):
        fwd = [op[1:3] for op in seq if op[0] == "F"] + [op[1:3] for op in seq if op[0] == "O"]
        bwd = [op[3:5] for op in seq if op[0] == "O"] + [op[1:3] for op in seq if op[0] == "B"]
        assert fwd == [op[1:] for op in base[r] if op[0] == "F"]
        assert bwd == [op[1:] for op in base[r] if op[0] == "B"]
        # One forward more before the first backward: the first steady forward stays alone.
        ahead = next(i for i, op in enumerate(base[r]) if op[0] == "B")
        assert sum(op[0] == "F" for op in seq) == min(ahead, m * v)
    if p == 1:  # the first forward and the last backward alone
        assert rank_orders(1, 3, 1, COMBINED) == (
            (("F", 0, 0), ("O", 1, 0, 0, 0), ("O", 2, 0, 1, 0), ("B", 2, 0)),)


def test_the_makespan_is_the_simulation_and_the_bound_is_below() -> None:
    rng = np.random.default_rng(11)
    code = np.array([SCHEDULE_CODES[COMBINED]])
    for _ in range(80):
        p = int(rng.integers(1, 7))
        v = 1 if p == 1 else int(rng.integers(2, 5))
        m = int(rng.integers(1, 40 * p))
        if p > 1:
            m -= m % max(1, m // p)
        f, b = rng.uniform(0.05, 3.0, p), rng.uniform(0.05, 6.0, p)
        h = rng.uniform(0, 1, p) * np.minimum(f, b)
        tl = simulate(list(f), list(b), m, COMBINED, v, list(h))
        got = makespan(f[:, None], b[:, None], m, COMBINED, v, h[:, None])[0]
        assert got == pytest.approx(tl.makespan, rel=1e-9)
        t, cnt = (f + b)[:, None], np.ones((p, 1), dtype=np.int64)
        for fwd in (f[:, None], None):
            bound = pipeline_bound(t, fwd, cnt, np.array([m]), np.array([v]), code,
                                   h[:, None])[0]
            assert bound <= tl.makespan * (1 + 1e-12)
            if p == 1:  # without a pipeline the bound is the time
                assert bound == pytest.approx(tl.makespan, rel=1e-12)


MOE = ModelSpec.preset("qwen3-30b-a3b")
H100 = Cluster.preset("dgx-h100", num_nodes=4)
JOB = Job(global_batch_size=256, seq_len=4096, framework="megatron")


# Micro-batches of 4 sequences: at 1, each Megatron MoE layer takes about as
# much GPU time as the host needs to launch it (steptime.host_floor), and what the pairs hide
# cannot take a stage below that.
PAIR_JOB = dataclasses.replace(JOB, global_batch_size=1024)


def _pair(pp: int, v: int) -> tuple[ParallelConfig, ParallelConfig]:
    plain = ParallelConfig(dp=32 // pp, pp=pp, ep=8, zero_stage=1, micro_batch_size=4,
                           pipeline_schedule="interleaved-1f1b" if v > 1 else "1f1b",
                           virtual_pipeline_stages=v)
    return plain, dataclasses.replace(plain, pipeline_schedule=COMBINED)


@pytest.mark.parametrize(("pp", "v"), [(1, 1), (4, 2)])
def test_pairs_hide_the_expert_all_to_alls_and_the_estimate_is_its_timeline(pp: int, v: int
                                                                           ) -> None:
    plain, comb = _pair(pp, v)
    a, c = estimate(MOE, H100, PAIR_JOB, plain), estimate(MOE, H100, PAIR_JOB, comb)
    ta, tc = a.time_breakdown_s, c.time_breakdown_s
    assert tc["compute"] == pytest.approx(ta["compute"])
    assert tc["ep_comm_total"] == pytest.approx(ta["ep_comm_total"])
    # Most of the all-to-all hides; the fitted slowdown of compute beside it stays.
    assert 0 < tc["ep_comm"] < 0.5 * ta["ep_comm"]
    assert c.step_time_s < a.step_time_s - 0.4 * ta["ep_comm"]
    terms = sum(x for k, x in tc.items() if not k.endswith("_total"))
    assert terms == pytest.approx(c.step_time_s)
    pipeline = c.step_time_s - tc["dp_comm"] - tc["optimizer"] - tc["offload"]
    assert timeline(MOE, H100, PAIR_JOB, comb).makespan == pytest.approx(pipeline, rel=1e-9)
    # One micro-batch (chunk) more in flight: the pair holds its forward's activations
    # before its backward frees the other's.
    first = c.stages[0].in_flight_micro_batches
    assert first == pytest.approx(a.stages[0].in_flight_micro_batches + 1 / v)


@pytest.mark.parametrize(("change", "needle"), [
    ({"model": ModelSpec.preset("llama-3-8b"), "ep": 1}, "mixture of experts"),
    ({"ep": 1}, "ep >= 2"),
    ({"recompute": "full"}, "full recompute"),
    ({"moe_dispatcher": "allgather"}, "allgather"),
    ({"framework": "torchtitan"}, "does not run it"),
    ({"pp": 4, "v": 1}, "interleaved pipeline"),
])
def test_what_megatron_refuses_is_refused(change: dict, needle: str) -> None:
    model = change.get("model", MOE)
    job = dataclasses.replace(JOB, framework=change.get("framework", "megatron"),
                              moe_dispatcher=change.get("moe_dispatcher", "alltoall"))
    with pytest.raises(SpecError, match=needle):
        pp = change.get("pp", 1)
        cfg = ParallelConfig(dp=32 // pp, pp=pp, ep=change.get("ep", 8),
                             zero_stage=2 if "framework" in change else 1,
                             pipeline_schedule=COMBINED,
                             virtual_pipeline_stages=change.get("v", 1),
                             recompute=change.get("recompute", "none"))
        estimate(model, H100, job, cfg)


def test_the_megatron_search_pairs_a_moe_job_and_not_a_dense_one() -> None:
    got = plan(MOE, H100, JOB)
    assert got.config.pipeline_schedule == COMBINED and got.config.ep > 1
    dense = plan(ModelSpec.preset("llama-3-8b"), H100,
                 dataclasses.replace(JOB, global_batch_size=64))
    assert dense.config.pipeline_schedule != COMBINED
    # Forced off, the fastest configuration is slower by what the pairs hid.
    off = plan(MOE, H100, JOB, constraints=Constraints(
        allowed={"pipeline_schedule": ("1f1b", "interleaved-1f1b")}))
    assert off.estimate.step_time_s > got.estimate.step_time_s


def test_the_modelzoo_overlap_gain_is_of_the_published_size() -> None:
    """The same Qwen3-235B layout on 256 H100 (TP2 EP32 PP8 VPP4, DeepEP, forced even
    routing): 19.7 s per step without the overlap and 17.6 s with it, 1.12x (ModelZoo readme,
    'Cross-node EP strategy'). Predicted within a tenth of that ratio, and each step within
    12 %."""
    model = ModelSpec.preset("qwen3-235b-a22b")
    cluster = Cluster.preset("dgx-h100", num_nodes=32)
    job = Job(global_batch_size=2048, seq_len=4096, framework="megatron",
              moe_dispatcher="deepep", moe_load_imbalance=1.0,
              recompute_modules=("layernorm", "moe_act"))
    plain = ParallelConfig(dp=16, tp=2, pp=8, ep=32, etp=1, zero_stage=1,
                           sequence_parallel=True, recompute="selective",
                           pipeline_schedule="interleaved-1f1b", virtual_pipeline_stages=4,
                           stage_layers=accounted_split(94, 8, 4))
    comb = dataclasses.replace(plain, pipeline_schedule=COMBINED)
    a, c = estimate(model, cluster, job, plain), estimate(model, cluster, job, comb)
    assert a.step_time_s / c.step_time_s == pytest.approx(19.7 / 17.6, rel=0.1)
    assert a.step_time_s == pytest.approx(19.7, rel=0.12)
    assert c.step_time_s == pytest.approx(17.6, rel=0.12)


def test_a_pair_runs_in_three_phases_and_never_beats_an_even_overlap() -> None:
    """The phases of megatron/core/models/common/model_chunk_schedule_plan.py
    (``TransformerLayerSchedulePlan.run``): forward attention beside backward combine;
    backward then forward experts beside forward then backward dispatch; backward attention
    beside forward combine. Worked by hand: forward 1 s (0.2 s routed experts), backward 4 s,
    each pass's dispatch and combine 2 s, slowdown 0.3: phases 1.1 + 2 + 3.9 = 7 s, where an
    even overlap of 5 s of compute with 4 s of all-to-all would take 5 + 0.3 x 4 = 6.2 s."""
    from costmodel.formulas.steptime import pair_phases

    assert pair_phases(np.array(1.0), np.array(4.0), np.array(0.2), np.array(2.0), 0.3) \
        == pytest.approx(7.0)
    rng = np.random.default_rng(5)
    f, b, pair = rng.uniform(0.1, 5, 500), rng.uniform(0.1, 10, 500), rng.uniform(0, 8, 500)
    routed = rng.uniform(0, 1, 500) * f
    k = 0.3
    t = pair_phases(f, b, routed, pair, k)
    even = np.maximum(f + b + 2 * k * pair, 2 * pair)
    assert np.all(t >= even - 1e-12) and np.any(t > even + 0.1)
    assert np.all(t <= f + b + 2 * pair + 1e-12)  # never slower than no overlap
    # Compute longer than the communication beside it in every phase: the even overlap.
    busy = (f - routed >= pair / 2) & (b - 2 * routed >= pair / 2) & (routed >= pair)
    assert busy.any()
    assert t[busy] == pytest.approx(even[busy])


def test_a_pair_whose_dispatch_outlasts_its_compute_saves_less() -> None:
    """Qwen3-235B in fp8 on 256 H100 with the all-to-all dispatcher (NVIDIA Megatron-Bridge
    26.02 performance table's layout: TP2 PP8 VPP4 EP32): each pass's dispatch and combine
    outlast the compute beside them, so the pairs hide less than an even overlap would
    (``steptime.pair_phases``)."""
    model = ModelSpec.preset("qwen3-235b-a22b")
    cluster = Cluster.preset("dgx-h100", num_nodes=32)
    job = Job(global_batch_size=8192, seq_len=4096, framework="megatron", precision="fp8",
              moe_dispatcher="alltoall", moe_load_imbalance=1.0)
    cfg = ParallelConfig(dp=16, tp=2, pp=8, ep=32, etp=1, zero_stage=1,
                         sequence_parallel=True, pipeline_schedule=COMBINED,
                         virtual_pipeline_stages=4, stage_layers=accounted_split(94, 8, 4))
    est = estimate(model, cluster, job, cfg)
    bd = est.time_breakdown_s
    k = cluster.gpu.efficiency.comm_slowdown
    # More exposed than an even overlap's (what exceeds compute plus the slowdown) ...
    even = max(bd["ep_comm_total"] * k, bd["ep_comm_total"] - bd["compute"])
    assert bd["ep_comm"] > even * 1.2
    # ... and the estimate is still its timeline.
    pipeline = est.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
    assert timeline(model, cluster, job, cfg).makespan == pytest.approx(pipeline, rel=1e-9)


def test_combined_1f1b_loses_the_ordered_tensor_parallel_backward_overlap() -> None:
    """Megatron-LM's expert all-to-all overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1
    (megatron/core/transformer/moe/README.md), and its asynchronous TP backward collectives
    hide behind the matmuls launched after them only with 1 (megatron/core/tensor_parallel/
    layers.py): under combined 1F1B they are all exposed; userbuffers keep their overlap."""
    plain = ParallelConfig(dp=4, tp=2, pp=4, ep=4, etp=2, zero_stage=1, micro_batch_size=4,
                           sequence_parallel=True, pipeline_schedule="interleaved-1f1b",
                           virtual_pipeline_stages=2)
    comb = dataclasses.replace(plain, pipeline_schedule=COMBINED)
    a, c = (estimate(MOE, H100, PAIR_JOB, x).time_breakdown_s for x in (plain, comb))
    assert c["tp_comm_total"] == pytest.approx(a["tp_comm_total"])
    assert a["tp_comm"] < c["tp_comm"] <= c["tp_comm_total"]
    ub = dataclasses.replace(PAIR_JOB, tp_comm_overlap=True)
    a, c = (estimate(MOE, H100, ub, x).time_breakdown_s for x in (plain, comb))
    assert c["tp_comm"] == pytest.approx(a["tp_comm"])

"""The V-shaped schedules (ZB-V, DualPipeV): two chunks per rank placed as a V.

Oracles: torch.distributed.pipelining's own op orders (``ScheduleZBVZeroBubble``,
``ScheduleDualPipeV``); the op-by-op event simulation against the vectorized makespan and the
search's lower bound; the activations each rank holds against the counts DeepSeek-V3's
report gives (Table 2: DualPipe holds PP + 1 chunks' worth, 1F1B and ZB1P PP) and the ZB-V
paper's (Qi et al. 2024, Sec. 6: ZB-V's peak equals 1F1B's); torchtitan's V split
(torchtitan/distributed/pipeline_parallel.py, ``generate_llm_fqn_per_model_part``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import SpecError
from costmodel.formulas.memory import SCHEDULE_CODES
from costmodel.formulas.pipeline import makespan, simulate
from costmodel.formulas.pipelinetable import pipeline_bound
from costmodel.formulas.vschedules import in_flight, v_orders, v_rank_layers, v_split
from planner import timeline

V = ("zbv", "dualpipev")


def _torch_orders(cls: type, p: int, m: int) -> tuple:
    """A torch V schedule's op order per rank, as ``v_orders`` writes it."""
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I",
             "BACKWARD_WEIGHT": "W"}
    state = SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)

    def one(a: object, r: int) -> tuple:
        kind = kinds[a.computation_type.name]  # type: ignore[attr-defined]
        return kind, a.microbatch_index, 0 if a.stage_index == r else 1  # type: ignore[attr-defined]

    out = []
    for r in range(p):
        seq = []
        for a in cls._calculate_single_rank_operations(state, r):  # type: ignore[attr-defined]
            if a is None:
                continue
            if a.sub_actions:
                f, b = one(a.sub_actions[0], r), one(a.sub_actions[1], r)
                seq.append(("O", f[1], f[2], b[1], b[2]))
            else:
                seq.append(one(a, r))
        out.append(tuple(seq))
    return tuple(out)


def test_the_v_orders_are_torchs() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    checked = 0
    for p in range(1, 7):
        for m in range(1, 5 * p + 1):
            assert v_orders(p, m, "zbv") == _torch_orders(schedules.ScheduleZBVZeroBubble, p, m)
            if m >= 2 * p:
                assert v_orders(p, m, "dualpipev") == _torch_orders(
                    schedules.ScheduleDualPipeV, p, m)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("schedule", V)
def test_the_makespan_is_the_simulation_and_the_bound_is_below(schedule: str) -> None:
    rng = np.random.default_rng(7)
    code = np.array([SCHEDULE_CODES[schedule]])
    for _ in range(60):
        p = int(rng.integers(1, 7))
        m = int(rng.integers(2 * p if schedule == "dualpipev" else 1, 6 * p + 1))
        f, b = rng.uniform(0.05, 3.0, p), rng.uniform(0.05, 6.0, p)
        h = rng.uniform(0, 1, p) * np.minimum(f, b)
        tl = simulate(list(f), list(b), m, schedule, 2, list(h))
        got = makespan(f[:, None], b[:, None], m, schedule, 2, h[:, None])[0]
        assert got == pytest.approx(tl.makespan, rel=1e-9)
        # Every op ran once: each rank's busy time is its work less what its pairs saved.
        pairs = np.array([sum(o.kind == "O" for o in tl.ops if o.stage == r) for r in range(p)])
        for r in range(p):
            assert tl.busy(r) == pytest.approx(m * (f[r] + b[r]) - pairs[r] * h[r] / 2)
        t, cnt = (f + b)[:, None], np.ones((p, 1), dtype=np.int64)
        for fwd in (f[:, None], None):
            bound = pipeline_bound(t, fwd, cnt, np.array([m]), np.array([2]), code,
                                   h[:, None])[0]
            assert bound <= tl.makespan * (1 + 1e-12)


def test_zbv_has_a_smaller_bubble_than_1f1b_and_pairs_hide_dualpipev_communication() -> None:
    """Equal stages, forward 1 s and backward 2 s per micro-batch on each of 4 ranks, 16
    micro-batches: 1F1B idles (p - 1)(F + B) = 9 s; ZB-V fills it with weight gradients.
    DualPipeV's overlapped pairs shorten the step by what they hide."""
    f, b = [1.0] * 4, [2.0] * 4
    one = simulate(f, b, 16, "1f1b").makespan
    assert one == pytest.approx(48 + 9)
    assert simulate(f, b, 16, "zbv", 2).makespan < one - 6
    plain = simulate(f, b, 16, "dualpipev", 2).makespan
    hidden = simulate(f, b, 16, "dualpipev", 2, [0.5] * 4).makespan
    assert hidden < plain - 0.25 * 16 * 0.5 * 0.5


@pytest.mark.parametrize(("p", "m"), [(4, 16), (8, 64), (4, 8)])
def test_activations_in_flight_are_the_published_counts(p: int, m: int) -> None:
    """ZB-V holds what 1F1B's first stage does, p micro-batches of all a rank's layers, on
    every rank; DualPipeV PP + 1 = 2p + 1 chunks (DeepSeek-V3 report, Table 2)."""
    layers, _, _ = in_flight(p, m, "zbv")
    assert layers == (float(p),) * p
    layers, _, _ = in_flight(p, m, "dualpipev")
    assert [2 * x for x in layers] == [2 * p + 1] * p


def test_the_peak_in_flight_is_reached_before_the_steady_state() -> None:
    """``in_flight`` plays only ``4p + 4`` micro-batches: more repeat the steady state."""
    from costmodel.formulas.vschedules import _in_flight
    for schedule in V:
        for p in (1, 2, 3, 5, 8):
            for m in (4 * p + 4, 4 * p + 9, 10 * p + 3):
                assert in_flight(p, m, schedule) == _in_flight(p, m, schedule)


def test_torchtitans_v_split() -> None:
    """32 layers on 8 stages: 34 units of 4, the first two one more, the embedding and the
    output one layer each; 61 layers on 32 stages: the last stage holds only the output."""
    assert v_split(32, 4) == (4, 5, 4, 4, 4, 4, 4, 3)
    assert v_rank_layers(v_split(32, 4)) == [7, 9, 8, 8]
    split = v_split(61, 16)
    assert sum(split) == 61 and split[0] == 1 and split[-1] == 0


H100 = Cluster.preset("dgx-h100", num_nodes=4)
JOB = Job(global_batch_size=64, seq_len=4096, framework="torchtitan")


@pytest.mark.parametrize("schedule", V)
def test_a_v_plan_holds_the_output_layer_on_rank_0_and_times_as_its_timeline(schedule: str
                                                                             ) -> None:
    model = ModelSpec.preset("llama-3-8b")
    cfg = ParallelConfig(dp=4, tp=2, pp=4, sequence_parallel=True, pipeline_schedule=schedule,
                         virtual_pipeline_stages=2)
    est = estimate(model, H100, JOB, cfg)
    assert [s.num_layers for s in est.stages] == [7, 9, 8, 8]
    per, _, _ = in_flight(4, est.num_micro_batches, schedule)
    assert [s.in_flight_micro_batches for s in est.stages] == pytest.approx(per)
    # The output layer sits on rank 0 beside the embedding (untied: twice the parameters).
    plain = estimate(model, H100, JOB, ParallelConfig(dp=4, tp=2, pp=4, sequence_parallel=True))
    assert est.stages[0].embedding_params == pytest.approx(
        plain.stages[0].embedding_params + plain.stages[-1].embedding_params)
    assert est.stages[-1].embedding_params == 0
    bd = est.time_breakdown_s
    pipeline = est.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
    assert timeline(model, H100, JOB, cfg).makespan == pytest.approx(pipeline, rel=1e-9)


def test_v_schedules_are_refused_where_they_do_not_run() -> None:
    model = ModelSpec.preset("llama-3-8b")
    with pytest.raises(SpecError, match="virtual_pipeline_stages=2"):
        ParallelConfig(dp=4, tp=2, pp=4, pipeline_schedule="zbv")
    with pytest.raises(SpecError, match="no 'dualpipev' schedule"):
        estimate(model, H100, Job(global_batch_size=64, seq_len=4096, framework="megatron"),
                 ParallelConfig(dp=4, tp=2, pp=4, pipeline_schedule="dualpipev",
                                virtual_pipeline_stages=2, sequence_parallel=True))
    with pytest.raises(SpecError, match="at least 2 \\* pp = 8"):
        estimate(model, H100, Job(global_batch_size=16, seq_len=4096, framework="torchtitan"),
                 ParallelConfig(dp=4, tp=2, pp=4, pipeline_schedule="dualpipev",
                                virtual_pipeline_stages=2, sequence_parallel=True))


def test_the_cli_places_two_chunks_per_rank_under_a_v_schedule_unless_told() -> None:
    """``--schedule zbv`` alone means torchtitan's two chunks per rank (the schedule has no
    other); ``--virtual-stages`` still sets the count, and a count a V cannot run is refused."""
    from inprocess import run_planner

    base = ("estimate", "--model", "llama-3-8b", "--gpus", "8", "--pp", "4", "--dp", "2",
            "--zero", "3", "--global-batch-size", "64", "--seq-len", "4096", "--schedule", "zbv")
    r = run_planner(*base, "--json")
    assert r.returncode == 0, r.stderr
    assert '"virtual_pipeline_stages": 2' in r.stdout
    # The split it says it used is torchtitan's (v_split: 34 counted layers over 8 stages,
    # one fewer on the first and the last), not Megatron-LM's interleaved one.
    assert "torchtitan's split [4, 5, 4x5, 3]" in r.stderr
    r = run_planner(*base, "--virtual-stages", "3")
    assert r.returncode == 2 and "virtual_pipeline_stages=2" in r.stderr
    # Interleaving has no one count: the flag that sets it is named.
    r = run_planner(*base[:-1], "interleaved-1f1b")
    assert r.returncode == 2 and "--virtual-stages (2 or more)" in r.stderr


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_the_dualpipev_pair_count_is_torchs(p: int) -> None:
    """``pipeline.pairs``' closed form for DualPipeV, 2m - 3p + 1 + min(r, p - 2) overlapped
    pairs on rank r, is the count of torch's own op order for every micro-batch count it
    takes (and ZB-V pairs nothing)."""
    from costmodel.formulas.pipelinetable import pairs

    for m in range(2 * p, 6 * p + 2):
        want = [sum(op[0] == "O" for op in order) for order in v_orders(p, m, "dualpipev")]
        count = np.ones((p, 1), dtype=np.int64)
        got = pairs(count, np.array([m]), np.array([2]),
                    np.array([SCHEDULE_CODES["dualpipev"]]))
        assert [int(x) for x in got[:, 0]] == want
        assert not pairs(count, np.array([m]), np.array([2]),
                         np.array([SCHEDULE_CODES["zbv"]])).any()


def test_torchtitans_dualpipev_hides_the_expert_all_to_alls_without_recompute() -> None:
    """torchtitan 0.2.2 overlaps each DualPipeV pair's expert dispatch and combine with the
    other micro-batch's compute (torchtitan/distributed/dual_pipe_v.py) when pp > 1, ep > 1
    and nothing is recomputed, and refuses the overlap with activation checkpointing: the
    emitted file turns it off there, and the estimate hides nothing. With it on, the
    estimate is still its own timeline played out."""
    from planner import Plan
    from planner.emit import emit

    qwen = ModelSpec.preset("qwen3-30b-a3b")
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    job = Job(global_batch_size=64, seq_len=4096, framework="torchtitan")
    out = {}
    for recompute in ("none", "selective"):
        cfg = ParallelConfig(dp=8, pp=2, ep=8, zero_stage=2, pipeline_schedule="dualpipev",
                             virtual_pipeline_stages=2, recompute=recompute)
        e = estimate(qwen, cluster, job, cfg)
        t = e.time_breakdown_s
        out[recompute] = t
        pipeline = e.step_time_s - t["dp_comm"] - t["optimizer"] - t["offload"]
        assert timeline(qwen, cluster, job, cfg).makespan == pytest.approx(pipeline, rel=1e-9)
        text = emit(Plan(model=qwen, cluster=cluster, job=job, config=cfg, estimate=e),
                    "torchtitan").text
        flag = "true" if recompute == "none" else "false"
        assert f"pipeline_parallel_expert_parallel_overlap = {flag}" in text
    assert 0 < out["none"]["ep_comm"] < 0.6 * out["none"]["ep_comm_total"]
    assert out["selective"]["ep_comm"] == pytest.approx(out["selective"]["ep_comm_total"])
    # Megatron-LM runs no DualPipeV; ZB-V has no pairs: neither hides anything.
    zbv = ParallelConfig(dp=8, pp=2, ep=8, zero_stage=2, pipeline_schedule="zbv",
                         virtual_pipeline_stages=2)
    t = estimate(qwen, cluster, job, zbv).time_breakdown_s
    assert t["ep_comm"] == pytest.approx(t["ep_comm_total"])

"""Step-time model: formulas against their sources, properties, and the two paths agreeing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fastloop import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hardware_profiles
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import SpecError
from costmodel.fitting.published import eq3_flops
from costmodel.formulas.comm import Topology
from costmodel.formulas.compute import layer_compute
from costmodel.formulas.memory import ConfigArrays, first_argmax, memory_table
from costmodel.formulas.steptime import TIME_TERMS, model_flops_per_token
from costmodel.formulas.tables import evaluate
from costmodel.hardware import Link

GPT3 = ModelSpec.preset("gpt3-175b")
LLAMA = ModelSpec.preset("llama-3-8b")
MIXTRAL = ModelSpec.preset("mixtral-8x7b")
H100 = Cluster.preset("dgx-h100", num_nodes=4)


def test_eq3_is_narayanan_2021_equation_3() -> None:
    # Narayanan et al. 2021, Eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16lh), by hand for the
    # GPT-3 175B shape with the paper's padded vocabulary V = 51200, B = 1536, s = 2048.
    model = dataclasses.replace(GPT3, vocab_size=51200)
    job = Job(global_batch_size=1536, seq_len=2048)
    by_hand = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / 73728 + 51200 / 18874368)
    assert eq3_flops(model, job) == pytest.approx(by_hand, rel=1e-12)
    # Its leading term is 6 x (parameters) x (tokens) x 4/3 for the recomputed forward.
    assert eq3_flops(model, job) == pytest.approx(
        8 * model.num_params() * 1536 * 2048, rel=0.05)


def test_model_flops_follow_palm_appendix_b() -> None:
    # PaLM (Chowdhery et al. 2022) App. B: 6N + 12 L H Q T per token. GPT-3 175B with tied
    # embeddings: N counts the word embedding once (it is the output layer's matmul) and not
    # the learned positions (a lookup).
    n = GPT3.num_params() - GPT3.max_position_embeddings * GPT3.hidden_size
    expected = 6 * n + 12 * 96 * 12288 * 2048
    assert model_flops_per_token(GPT3, 2048) == pytest.approx(expected, rel=1e-12)
    # Mixtral: only the top-2 of 8 experts count.
    assert model_flops_per_token(MIXTRAL, 4096) < 6 * MIXTRAL.num_params() / 2


@pytest.mark.parametrize("model", [GPT3, LLAMA, MIXTRAL], ids=lambda m: m.name)
@pytest.mark.parametrize("flash", [True, False])
def test_flops_summed_over_a_tp_group_equal_the_unsharded_flops(model: ModelSpec,
                                                                flash: bool) -> None:
    job = Job(global_batch_size=8, seq_len=2048, flash_attention=flash)
    tp = np.array([1, 2, 4, 8])
    one = np.ones_like(tp)
    # With sequence parallel every rank routes its own tokens; without it a MoE router runs
    # on all tokens of every TP rank (replicated work, as in Megatron-LM).
    sp = (tp > 1).astype(np.int64)
    lc = layer_compute(model, H100.gpu, job, tp, one, 2 * one, sp, moe=model.is_moe, ep=one)
    total = lc.flops * tp
    assert total == pytest.approx(np.full(4, total[0]), rel=1e-12)
    # Backward matmuls cost twice the forward (Narayanan et al. 2021, Sec. 5.1).
    if not flash:
        assert lc.flops == pytest.approx(3 * lc.forward_flops, rel=1e-12)


def _nccl() -> tuple[float, float, float]:
    """NCCL's base latencies (LL, Simple) and the LL protocol's share of the bandwidth."""
    nccl = hardware_profiles.load_software()["nccl"]
    return (nccl["base_latency_us"] * 1e-6, nccl["base_latency_simple_us"] * 1e-6,
            nccl["ll_bandwidth_share"])


def test_ring_collectives_inside_a_node_follow_the_textbook_formula() -> None:
    topo = Topology.of(H100)
    link = H100.intra_node_link
    base_ll, base_simple, share = _nccl()
    # A large message runs NCCL's Simple protocol: full bandwidth, its larger latencies.
    s = 1e9
    ring = 2 * 7 / 8 * s / link.achieved_bytes_per_s + 2 * 7 * link.simple_latency_s \
        + base_simple
    assert float(topo.all_reduce(s, 8, 1)) == pytest.approx(ring, rel=1e-12)
    ag = 7 / 8 * s / link.achieved_bytes_per_s + 7 * link.simple_latency_s + base_simple
    assert float(topo.all_gather(s, 8, 1)) == pytest.approx(ag, rel=1e-12)
    assert float(topo.all_reduce(s, 1, 1)) == 0.0
    # A small one runs LL: NCCL's LL latencies, half the bandwidth (4-byte flag per 4 bytes).
    s = 4096.0
    ring = 2 * 7 / 8 * s / (share * link.achieved_bytes_per_s) + 2 * 7 * link.latency_s \
        + base_ll
    assert float(topo.all_reduce(s, 8, 1)) == pytest.approx(ring, rel=1e-12)


def test_a_table_of_groups_costs_each_row_as_its_group_alone() -> None:
    """``Topology.group`` caches a table's groups by value: every row of a table costs what
    its group costs alone (scalars are never cached), and two tables whose sizes sum alike
    (the cache's key) but differ are not confused."""
    topo = Topology.of(Cluster.preset("dgx-h100", num_nodes=8))
    rng = np.random.default_rng(0)
    size = rng.choice([1.0, 2.0, 4.0, 8.0, 16.0, 64.0], 200)
    stride = rng.choice([1.0, 2.0, 8.0, 16.0], 200)
    nbytes = rng.choice([0.0, 4096.0, 1e6, 1e9], (3, 200))
    swapped = size[::-1].copy()  # the same sum, other rows
    for _ in range(2):  # the second pass reads the cache
        for f in (topo.all_reduce, topo.all_gather, topo.reduce_scatter):
            for sz in (size, swapped):
                got = f(nbytes, sz, stride)
                alone = [[float(f(nbytes[i, j], sz[j], stride[j])) for j in range(200)]
                         for i in range(3)]
                np.testing.assert_allclose(got, alone, rtol=1e-12)
    assert 0 < len(topo._groups) <= 4


def test_a_tables_communicators_are_costed_once_per_mesh_and_exactly_as_per_row() -> None:
    """``Topology.rows``: a communicator whose ranks and stride are the same throughout each
    group of rows is costed once per group and spread, with exactly the per-row values; one
    whose ranks vary within a group is costed per row all the same."""
    from costmodel.formulas.arrays import distinct_rows

    cluster = Cluster.preset("dgx-h100", num_nodes=8)
    rng = np.random.default_rng(1)
    tp = rng.choice([1, 2, 4, 8], 300)
    dp = rng.choice([1, 2, 8, 16], 300)
    mbs = rng.choice([1, 2, 4], 300)  # not a mesh column
    mesh = distinct_rows(tp, dp)
    assert len(mesh.first) <= 16
    nbytes = rng.choice([0.0, 4096.0, 1e6, 1e9], (3, 300))
    per_row, grouped = Topology.of(cluster), Topology.of(cluster, mesh)
    for size, stride in ((dp.astype(float), tp.astype(float)), (tp.astype(float), 1.0),
                         ((dp * mbs).astype(float), tp.astype(float))):
        for f in ("all_reduce", "all_gather", "reduce_scatter"):
            want = getattr(per_row, f)(nbytes, size, stride)
            assert np.array_equal(getattr(grouped, f)(nbytes, size, stride), want)
    spread = [g for gs in grouped._groups.values() for g in gs if g.rows is not None]
    assert len(spread) == 2  # (dp, tp) and (tp, 1); dp * mbs varies within a mesh


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1, 8, 512, 70000]),
                          st.booleans(), st.integers(-2, 2)), min_size=1, max_size=60),
       st.integers(1, 4))
def test_distinct_rows_groups_rows_by_their_values(rows: list, ncols: int) -> None:
    """``distinct_rows``: one group per distinct combination of the columns' values, whatever
    they are (small digits, values ranked first, negative values, bools), each row's group
    holding its values."""
    from costmodel.formulas.arrays import distinct_rows

    cols = [np.array([r[i] for r in rows]) for i in range(ncols)]
    d = distinct_rows(*cols)
    combos = sorted({tuple(int(c[i]) for c in cols) for i in range(len(rows))})
    assert len(d.first) == len(combos)
    for c in cols:
        assert np.array_equal(c[d.first][d.inverse], c)
    # Rows of one group are equal; rows of different groups differ.
    firsts = [tuple(int(c[j]) for c in cols) for j in d.first]
    assert sorted(firsts) == combos


def test_a_many_rowed_table_costs_each_row_as_it_costs_alone() -> None:
    """``evaluate`` computes each layer's kernels, saved bytes and TP and CP collectives once
    per group of rows that share them (``ConfigArrays.kernel_groups``) and each communicator
    once per mesh: every row of a table of a few hundred configurations has exactly its own
    table's step time, terms and peak memory (Megatron-LM's TP overlap switches too)."""
    from costmodel.formulas.arrays import ConfigArrays as Columns

    for model, job in ((LLAMA, Job(global_batch_size=256, seq_len=4096, framework="megatron")),
                       (LLAMA, Job(global_batch_size=256, seq_len=4096, framework="megatron",
                                   tp_comm_overlap=True, distribute_saved_activations=True)),
                       (MIXTRAL, Job(global_batch_size=256, seq_len=4096,
                                     framework="torchtitan"))):
        cfgs = [ParallelConfig(dp=32 // (tp * pp * cp), tp=tp, pp=pp, cp=cp, ep=ep,
                               zero_stage=zero, micro_batch_size=mbs,
                               sequence_parallel=sp and tp > 1, recompute=rec)
                for tp in (1, 2, 4) for pp in (1, 2) for cp in (1, 2) for ep in (1, 2)
                for zero in (0, 1, 3) for mbs in (1, 2) for sp in (False, True)
                for rec in ("none", "full")
                if (ep == 1 or model.num_experts) and (32 // (tp * pp * cp)) * cp % ep == 0
                and not (sp and tp == 1)]
        table = evaluate(model, H100, job, Columns.from_configs(model, cfgs, all_stages=False))
        assert len(table.step_time) > 100
        for i in range(0, len(cfgs), 7):
            one = evaluate(model, H100, job,
                           Columns.from_configs(model, [cfgs[i]], all_stages=False))
            assert table.step_time[i] == one.step_time[0]
            assert table.peak_memory[i] == one.peak_memory[0]
            assert {t: table.terms[t][i] for t in TIME_TERMS} == \
                {t: one.terms[t][0] for t in TIME_TERMS}


def test_nvlink3_all_reduce_follows_the_published_nccl_tests_curves() -> None:
    # nccl-tests all_reduce_perf, one node of 8 A100 SXM4 (benchmarks/data/nccl-tests-a100-8gpu
    # .json: Azure/AI-benchmarking-guide ND A100 v4 with NCCL 2.18.5, busbw 166.63 GB/s at
    # 64 MiB and 228.10 GB/s at 1 GiB; stas00/ml-engineering's A100 node, 684.6 us at 64 MiB).
    a100 = Cluster.preset("selene", num_nodes=1)
    topo = Topology.of(a100)
    for nbytes, busbw in ((2**26, 166.63e9), (2**30, 228.10e9)):
        measured = 2 * 7 / 8 * nbytes / busbw
        assert float(topo.all_reduce(nbytes, 8, 1)) == pytest.approx(measured, rel=0.03)
    assert float(topo.all_reduce(2**26, 8, 1)) == pytest.approx(684.6e-6, rel=0.03)
    # With NCCL's own Simple latency (3.4 us a hop) the 64 MiB all-reduce is 18% too fast.
    nccl_model = dataclasses.replace(a100, intra_node_link=dataclasses.replace(
        a100.intra_node_link, simple_latency_s=3.4e-6))
    assert float(Topology.of(nccl_model).all_reduce(2**26, 8, 1)) < 0.83 * 684.6e-6


def test_a_group_across_nodes_is_limited_by_the_nics() -> None:
    topo = Topology.of(H100)
    _, base_simple, _ = _nccl()
    # Data parallel across 4 nodes with tp = 8 inside: one rank per node, one NIC each.
    across = float(topo.all_gather(1e9, 4, 8))
    nic = H100.inter_node_link.achieved_bytes_per_s
    assert across == pytest.approx(3 / 4 * 1e9 / nic + 3 * H100.inter_node_link.simple_latency_s
                                   + base_simple, rel=1e-12)
    # The same group inside one node is faster.
    assert float(topo.all_gather(1e9, 4, 1)) < across


def test_a_context_parallel_ring_waits_for_its_hop_between_nodes() -> None:
    topo = Topology.of(H100)
    kv = 8e6  # bytes of one K and V block
    nic = H100.inter_node_link.achieved_bytes_per_s * H100.nics_per_node / H100.gpus_per_node
    link = H100.intra_node_link
    _, base, _ = _nccl()  # 8 MB sends run the Simple protocol
    # tp = 2, cp = 4: the ring's 4 ranks sit in one node.
    inside = float(topo.ring_step(kv, 4, 2))
    assert inside == pytest.approx(base + kv / link.achieved_bytes_per_s
                                   + link.simple_latency_s, rel=1e-12)
    # tp = 2, cp = 16: the ring spans 4 nodes; every step waits for a hop through a NIC.
    across = float(topo.ring_step(kv, 16, 2))
    assert across == pytest.approx(base + kv / nic + H100.inter_node_link.simple_latency_s,
                                   rel=1e-12)
    assert across > inside
    # The step time follows: the same job is slower with its ring across nodes.
    job = _job(gbs=32, fw="torchtitan", seq=32768)
    one = estimate(LLAMA, H100, job, ParallelConfig(dp=4, tp=2, cp=4, zero_stage=3))
    four = estimate(LLAMA, H100, job, ParallelConfig(dp=1, tp=2, cp=16, zero_stage=3))
    assert four.time_breakdown_s["cp_comm_total"] > 3 * one.time_breakdown_s["cp_comm_total"]


def _job(gbs: int = 64, fw: str = "megatron", seq: int = 2048) -> Job:
    return Job(global_batch_size=gbs, seq_len=seq, framework=fw)


CONFIGS = [
    ParallelConfig(dp=4, tp=8, zero_stage=1, sequence_parallel=True, recompute="selective"),
    ParallelConfig(dp=2, tp=4, pp=4, micro_batch_size=2, recompute="full"),
    ParallelConfig(dp=1, tp=8, pp=4, virtual_pipeline_stages=2, sequence_parallel=True),
    ParallelConfig(dp=32, zero_stage=3, recompute="full"),
    ParallelConfig(dp=8, tp=2, pp=2, cp=1, zero_stage=0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_breakdown_sums_to_the_step_and_flops_rates_are_consistent(cfg: ParallelConfig) -> None:
    est = estimate(LLAMA, H100, _job(), cfg)
    parts = sum(est.time_breakdown_s[t] for t in TIME_TERMS)
    assert parts == pytest.approx(est.step_time_s, rel=1e-12)
    assert est.tokens_per_s == pytest.approx(64 * 2048 / est.step_time_s)
    assert 0 < est.mfu <= est.hfu < 1
    for kind in ("tp", "cp", "ep", "pp", "fsdp", "dp"):
        assert est.time_breakdown_s[f"{kind}_comm"] <= est.time_breakdown_s[f"{kind}_comm_total"] \
            + 1e-12


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_pp_1_has_no_bubble_and_more_micro_batches_shrink_its_fraction(
        cfg: ParallelConfig) -> None:
    fractions = []
    for gbs in (64, 128, 256):
        est = estimate(LLAMA, H100, _job(gbs), cfg)
        if cfg.pp == 1:
            assert est.time_breakdown_s["bubble"] == 0.0
        fractions.append(est.time_breakdown_s["bubble"] / est.step_time_s)
    assert fractions == sorted(fractions, reverse=True)


def test_interleaving_and_zero_bubble_shrink_the_bubble() -> None:
    # Narayanan et al. 2021, Sec. 2.2.2: the interleaved bubble is 1/v of 1F1B's; ZB-H1 keeps
    # only the forward part of it (Qi et al. 2024).
    job = _job(32, "torchtitan")
    plain = estimate(LLAMA, H100, job, ParallelConfig(dp=1, tp=8, pp=4))
    inter = estimate(LLAMA, H100, job, ParallelConfig(dp=1, tp=8, pp=4,
                                                      virtual_pipeline_stages=2))
    zb = estimate(LLAMA, H100, job, ParallelConfig(dp=1, tp=8, pp=4,
                                                   pipeline_schedule="zero-bubble"))
    b = plain.time_breakdown_s["bubble"]
    assert inter.time_breakdown_s["bubble"] < 0.6 * b
    assert zb.time_breakdown_s["bubble"] < 0.5 * b


def _faster(cluster: Cluster, factor: float) -> Cluster:
    def scale(link: Link) -> Link:
        return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s
                                   * factor)
    return dataclasses.replace(cluster, intra_node_link=scale(cluster.intra_node_link),
                               inter_node_link=scale(cluster.inter_node_link))


SETTINGS = settings(max_examples=examples(40), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw: st.DrawFn) -> tuple[ParallelConfig, Job]:
    fw = draw(st.sampled_from(["megatron", "deepspeed", "torchtitan"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if tp * p <= 16]))
    cp = draw(st.sampled_from([c for c in (1, 2) if tp * pp * c <= 32]))
    dp = 32 // (tp * pp * cp)
    zeros = {"megatron": (0, 1, 3), "deepspeed": (0, 1, 2, 3), "torchtitan": (0, 2, 3)}[fw]
    if pp > 1:
        zeros = tuple(z for z in zeros if z in {"megatron": (0, 1), "deepspeed": (0, 1),
                                                "torchtitan": (0, 2, 3)}[fw])
    zero = draw(st.sampled_from(zeros))
    mbs = draw(st.sampled_from([1, 2]))
    v = draw(st.sampled_from([1, 2])) if pp > 1 and fw != "deepspeed" else 1
    cfg = ParallelConfig(
        dp=dp, tp=tp, pp=pp, cp=cp, zero_stage=zero, micro_batch_size=mbs,
        sequence_parallel=tp > 1 and draw(st.booleans()), virtual_pipeline_stages=v,
        recompute=draw(st.sampled_from(["none", "selective", "full"])))
    # torch.distributed.pipelining's 1F1B (torchtitan) needs at least pp micro-batches;
    # Megatron-LM's interleaving a multiple of pp.
    ks = [k for k in (1, 4, 8) if (fw != "torchtitan" or k >= pp)
          and (fw != "megatron" or v == 1 or k % pp == 0)]
    job = Job(global_batch_size=dp * mbs * draw(st.sampled_from(ks)), seq_len=4096,
              framework=fw, overlap_grad_reduce=draw(st.booleans()),
              tp_comm_overlap=draw(st.booleans()), overlap_p2p_comm=draw(st.booleans()))
    return cfg, job


@SETTINGS
@given(configs())
def test_pipelining_tp_collectives_never_slows_a_step(drawn: tuple) -> None:
    cfg, job = drawn
    on = estimate(LLAMA, H100, dataclasses.replace(job, tp_comm_overlap=True), cfg)
    off = estimate(LLAMA, H100, dataclasses.replace(job, tp_comm_overlap=False), cfg)
    assert on.step_time_s <= off.step_time_s * (1 + 1e-12)


@SETTINGS
@given(configs(), st.sampled_from([1.5, 4.0]))
def test_more_bandwidth_never_raises_step_time(drawn: tuple, factor: float) -> None:
    cfg, job = drawn
    slow = estimate(LLAMA, H100, job, cfg)
    fast = estimate(LLAMA, _faster(H100, factor), job, cfg)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-12)


@SETTINGS
@given(st.lists(configs(), min_size=1, max_size=6))
def test_scalar_estimate_equals_the_vectorized_table_exactly(drawn: list) -> None:
    job = dataclasses.replace(drawn[0][1], global_batch_size=256)  # divisible by every dp*mbs
    cfgs = [c for c, j in drawn if j.framework == job.framework]
    ests = [estimate(LLAMA, H100, job, c) for c in cfgs]
    table = evaluate(LLAMA, H100, job, ConfigArrays.from_configs(LLAMA, cfgs, all_stages=False))
    for i, est in enumerate(ests):
        assert table.step_time[i] == est.step_time_s
        assert table.peak_memory[i] == est.peak_memory_bytes
        assert int(table.peak_stage[i]) == est.peak_stage


@given(st.integers(1, 5), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_first_argmax_is_numpys_argmax_over_stages(stages: int, rows: int, seed: int) -> None:
    # Few distinct values, so that equal maxima (ties) are common: the first one wins.
    x = np.random.default_rng(seed).integers(0, 3, size=(stages, rows)).astype(float)
    assert np.array_equal(first_argmax(x), np.argmax(x, axis=0))


@SETTINGS
@given(st.lists(configs(), min_size=1, max_size=6))
def test_the_searchs_terms_are_the_estimates_breakdown(drawn: list) -> None:
    job = dataclasses.replace(drawn[0][1], global_batch_size=256)
    cfgs = [c for c, j in drawn if j.framework == job.framework]
    table = evaluate(LLAMA, H100, job, ConfigArrays.from_configs(LLAMA, cfgs, all_stages=False))
    for i, cfg in enumerate(cfgs):
        breakdown = estimate(LLAMA, H100, job, cfg).time_breakdown_s
        assert {t: float(table.terms[t][i]) for t in TIME_TERMS} == \
            {t: breakdown[t] for t in TIME_TERMS}


@SETTINGS
@given(configs())
def test_representative_stage_columns_equal_every_stage(drawn: tuple) -> None:
    cfg, job = drawn
    rep = ConfigArrays.from_configs(LLAMA, [cfg], all_stages=False)
    full = ConfigArrays.from_configs(LLAMA, [cfg])
    assert rep.stage_layers.shape[1] <= 4
    a, b = evaluate(LLAMA, H100, job, rep), evaluate(LLAMA, H100, job, full)
    assert a.peak_memory[0] == b.peak_memory[0]
    assert a.step_time[0] == pytest.approx(b.step_time[0], rel=1e-12)
    assert memory_table(LLAMA, H100, job, full).num_layers.sum() == LLAMA.num_layers


def test_stage_imbalance_from_the_lm_head_sets_the_bottleneck() -> None:
    # Llama-3-8B's 128k-vocabulary head makes the last stage the slowest of an even split.
    est = estimate(LLAMA, H100, _job(64, "torchtitan"), ParallelConfig(dp=4, tp=2, pp=4))
    assert est.bottleneck_stage == 3
    lighter = estimate(LLAMA, H100, _job(64, "torchtitan"),
                       ParallelConfig(dp=4, tp=2, pp=4, stage_layers=(9, 8, 8, 7)))
    assert lighter.step_time_s < est.step_time_s


def test_offload_and_fsdp_terms_appear_where_they_should() -> None:
    job = _job(64, "deepspeed")
    off = estimate(LLAMA, H100, job, ParallelConfig(dp=32, zero_stage=2, offload="optimizer"))
    on_gpu = estimate(LLAMA, H100, job, ParallelConfig(dp=32, zero_stage=2))
    assert off.time_breakdown_s["offload"] > 0 and off.time_breakdown_s["optimizer"] == 0
    assert on_gpu.time_breakdown_s["optimizer"] > 0 and on_gpu.time_breakdown_s["offload"] == 0
    z3 = estimate(LLAMA, H100, job, ParallelConfig(dp=32, zero_stage=3))
    assert z3.time_breakdown_s["fsdp_comm_total"] > 0


def test_expert_parallel_all_to_all_is_counted() -> None:
    job = _job(64, "megatron", 4096)
    est = estimate(MIXTRAL, H100, job, ParallelConfig(dp=8, tp=4, ep=8, zero_stage=1))
    assert est.time_breakdown_s["ep_comm"] > 0
    assert estimate(MIXTRAL, H100, job, ParallelConfig(dp=8, tp=4, zero_stage=1)
                    ).time_breakdown_s["ep_comm"] == 0


# ---- Korthikanti et al. 2022, Table 4: one layer of their 22B model, per experiment ---------
# Forward and backward milliseconds of one transformer layer (h 6144, 64 heads, s 2048,
# micro-batch 4, tp 8, fp16, A100 80GB): baseline 7.7 / 11.9, sequence parallel 7.2 / 11.8,
# full recompute 7.7 / 19.5, selective 7.7 / 13.2, selective + sequence parallel 7.2 / 13.1
# (arXiv 2205.05198, Table 4).
TABLE4 = {("none", False): 19.6, ("none", True): 19.0, ("full", False): 27.2,
          ("selective", False): 20.9, ("selective", True): 20.3}


def _layer_ms(recompute: str, sp: bool, **job_changes: object) -> float:
    """One layer's time from the step-time model: the difference of a 4- and 2-layer 22B,
    less the optimizer step (per layer too, but not in Table 4)."""
    from costmodel.fitting.published import load_runs

    run = next(r for r in load_runs() if r.id == "korthikanti2022_22B_full_recompute")
    job = dataclasses.replace(run.job, **job_changes)
    cfg = dataclasses.replace(run.config, recompute=recompute, sequence_parallel=sp)

    def step(layers: int) -> float:
        est = estimate(dataclasses.replace(run.model, num_layers=layers), run.cluster, job, cfg)
        return est.step_time_s - est.time_breakdown_s["optimizer"]

    return (step(4) - step(2)) / 2 * 1e3


def test_one_layer_follows_korthikanti_table_4() -> None:
    ours = {k: _layer_ms(*k) for k in TABLE4}
    # Each layer within 7 % of its published time, the five within 6 % on average: the
    # model's shared parameters are refitted to every published run (planner calibrate), and
    # each refit moves these layers by a few tenths of a percent.
    errors = {k: abs(ours[k] / published - 1) for k, published in TABLE4.items()}
    assert max(errors.values()) < 0.07, errors
    assert sum(errors.values()) / len(errors) < 0.06, errors
    base = ours[("none", False)]
    # Overheads against the baseline, as the paper states them: full recompute 39%, selective
    # 7%, selective + sequence parallel 4%; sequence parallel alone saves 3%.
    assert ours[("full", False)] / base - 1 == pytest.approx(0.39, abs=0.03)
    assert ours[("selective", False)] / base - 1 == pytest.approx(0.07, abs=0.03)
    assert ours[("selective", True)] / base - 1 == pytest.approx(0.04, abs=0.03)
    assert ours[("none", True)] / base - 1 == pytest.approx(-0.03, abs=0.03)


def test_megatron_hides_the_tp_gradient_all_reduce_behind_the_weight_gradient() -> None:
    # Without the asynchronous all-reduce (Megatron-LM before August 2021) the backward
    # all-reduces are exposed: the layer is slower by up to their time, and by more than 0.
    hidden = _layer_ms("none", False)
    exposed = _layer_ms("none", False, overlap_tp_grad_comm=False)
    topo = Topology.of(Cluster.preset("selene", num_nodes=1))
    ar = float(topo.all_reduce(np.array([2.0 * 4 * 2048 * 6144]), np.array([8.0]), 1.0)[0])
    assert 0 < exposed - hidden <= 2 * ar * 1e3 + 1e-9
    # torchtitan's TP runs its collectives on the critical path: the flag changes nothing.
    job = _job(64, "torchtitan")
    cfg = ParallelConfig(dp=4, tp=8)
    on = estimate(LLAMA, H100, job, cfg).step_time_s
    off = estimate(LLAMA, H100, dataclasses.replace(job, overlap_tp_grad_comm=False), cfg)
    assert off.step_time_s == on


def test_optimizer_step_moves_the_bytes_of_each_trainers_passes() -> None:
    from costmodel.formulas.steptime import optimizer_bytes

    def job(fw: str, precision: str) -> Job:
        return Job(global_batch_size=8, seq_len=1024, precision=precision, framework=fw,
                   optimizer="adam")
    # Adam reads fp32 parameter, gradient and two moments and writes three (28 bytes), the norm
    # reads the gradient (4); Megatron fp16 adds unscaling (8) and the master copy (4 + 2), and
    # zeroes its gradient buffer (4); torchtitan scales the gradients when clipping (8).
    assert optimizer_bytes(job("megatron", "fp16"), LLAMA) == (46.0, 4.0)
    assert optimizer_bytes(job("megatron", "bf16"), LLAMA) == (38.0, 4.0)
    assert optimizer_bytes(job("deepspeed", "fp16"), LLAMA) == (46.0, 0.0)
    assert optimizer_bytes(job("torchtitan", "bf16"), LLAMA) == (40.0, 0.0)
    assert optimizer_bytes(job("torchtitan", "fp32"), LLAMA) == (40.0, 0.0)


def test_fsdp2_copies_its_buffers_on_the_compute_stream_even_on_one_gpu() -> None:
    # torchtitan FSDP on one GPU: no communication, but each all-gather's copy-out (read and
    # write 2 bytes per bf16 parameter) and each reduce-scatter's copy-in (read the bf16
    # gradient, write it as fp32: 2 + 4) stay; ZeRO-3 gathers twice (forward and backward),
    # ZeRO-2 (reshard_after_forward=False) once. One kernel each per FSDP unit: every layer,
    # the embedding and the head (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
    one = Cluster.preset("dgx-h100", num_nodes=1, gpus_per_node=1)
    small = ModelSpec.preset("llama-3.2-1b")
    gpu = one.gpu
    rate = gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory
    job = Job(global_batch_size=1, seq_len=2048, framework="torchtitan")
    for zero, gathers in ((3, 2), (2, 1)):
        est = estimate(small, one, job, ParallelConfig(zero_stage=zero, micro_batch_size=1))
        params = est.stages[0].layer_params + est.stages[0].embedding_params
        kernels = (gathers + 1) * (small.num_layers + 2)
        expected = (gathers * 2 * 2.0 + 2.0 + 4.0) * params / rate \
            + kernels * gpu.efficiency.kernel_overhead_s
        assert est.time_breakdown_s["fsdp_comm"] == pytest.approx(expected, rel=1e-9)
        assert est.time_breakdown_s["fsdp_comm_total"] == pytest.approx(expected, rel=1e-9)
    # Megatron-LM's ZeRO-3 (its FSDP mode) is not FSDP2 and has none of these copies.
    mg = estimate(small, one, dataclasses.replace(job, framework="megatron"),
                  ParallelConfig(zero_stage=3, micro_batch_size=1))
    assert mg.time_breakdown_s["fsdp_comm"] == 0.0


def test_userbuffers_pipeline_each_tp_collective_with_its_matmul() -> None:
    # Megatron-LM --tp-comm-overlap (megatron/core/model_parallel_config.py): the forward's two
    # all-gathers and two reduce-scatters, and backward's two output-gradient gathers, each hide
    # behind (tp - 1)/tp of their linear's matmul; the rest of backward is as without it.
    one_node = Cluster.preset("dgx-h100", num_nodes=1)
    job = Job(global_batch_size=8, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(tp=8, dp=1, sequence_parallel=True, micro_batch_size=1)
    off = estimate(LLAMA, one_node, job, cfg)
    on = estimate(LLAMA, one_node, dataclasses.replace(job, tp_comm_overlap=True), cfg)
    tokens = job.seq_len
    ag = float(Topology.of(one_node).all_gather(2.0 * tokens * LLAMA.hidden_size, 8, 1.0))
    lc = layer_compute(LLAMA, one_node.gpu, job, np.array([8]), np.array([1]), np.array([1]),
                       np.array([1]), moe=False)
    hidden = [min(ag, 7 / 8 * float(getattr(lc, g)[0]))
              for g in ("qkv_gemm", "proj_gemm", "up_gemm", "down_gemm")]
    saved_per_layer = sum(hidden) + hidden[1] + hidden[3]  # forward four, backward two
    m = off.num_micro_batches
    assert off.step_time_s - on.step_time_s == pytest.approx(
        m * LLAMA.num_layers * saved_per_layer, rel=1e-9)
    assert on.time_breakdown_s["tp_comm_total"] == off.time_breakdown_s["tp_comm_total"]
    # Sequence parallel is what it pipelines with; without it, and for DeepSpeed, no change.
    plain = dataclasses.replace(cfg, sequence_parallel=False)
    assert estimate(LLAMA, one_node, dataclasses.replace(job, tp_comm_overlap=True),
                    plain).step_time_s == estimate(LLAMA, one_node, job, plain).step_time_s
    ds = dataclasses.replace(job, framework="deepspeed")
    assert estimate(LLAMA, one_node, dataclasses.replace(ds, tp_comm_overlap=True),
                    plain).step_time_s == estimate(LLAMA, one_node, ds, plain).step_time_s
    # torchtitan's async TP (inductor's micro-pipeline pass) fuses the forward's four
    # collectives with their matmuls, and in backward the two output-gradient all-gathers
    # into the input-gradient matmuls of wo and w2. An input-gradient reduce-scatter fuses
    # only where one matmul made that gradient: not the sum of q, k and v's, nor of a gated
    # MLP's w1 and w3 (exposed), but a plain MLP's fc1 (GPT-3: hidden behind it).
    tt = dataclasses.replace(job, framework="torchtitan")
    for model, plain_mlp in ((LLAMA, False), (GPT3, True)):
        tt_off = estimate(model, one_node, tt, cfg)
        tt_on = estimate(model, one_node, dataclasses.replace(tt, tp_comm_overlap=True), cfg)
        lc_tt = layer_compute(model, one_node.gpu, tt, np.array([8]), np.array([1]),
                              np.array([1]), np.array([1]), moe=False)
        ag_m = float(Topology.of(one_node).all_gather(2.0 * tokens * model.hidden_size, 8, 1.0))
        h = [min(ag_m, 7 / 8 * float(getattr(lc_tt, g)[0]))
             for g in ("qkv_gemm", "proj_gemm", "up_gemm", "down_gemm")]
        backward = h[1] + h[3] + (h[2] if plain_mlp else 0.0)
        assert tt_off.step_time_s - tt_on.step_time_s == pytest.approx(
            m * model.num_layers * (sum(h) + backward), rel=1e-9), model.name


def test_interleaved_megatron_hides_pipeline_transfers_behind_the_next_chunk() -> None:
    # Megatron-LM's --overlap-p2p-communication (default since October 2023, interleaved
    # schedules only): each send/receive hides behind one chunk's forward pass, which for a
    # 70B layer chunk is far longer than the transfer; 2021-2022 releases waited for each.
    job = Job(global_batch_size=64, seq_len=8192, framework="megatron")
    old = dataclasses.replace(job, overlap_p2p_comm=False)
    model = ModelSpec.preset("llama-3-70b")
    interleaved = ParallelConfig(dp=1, tp=8, pp=4, virtual_pipeline_stages=2,
                                 pipeline_schedule="interleaved-1f1b", sequence_parallel=True)
    plain = dataclasses.replace(interleaved, virtual_pipeline_stages=1, pipeline_schedule="1f1b")
    new_i, old_i = (estimate(model, H100, j, interleaved) for j in (job, old))
    assert old_i.time_breakdown_s["pp_comm"] > 0 and new_i.time_breakdown_s["pp_comm"] == 0.0
    assert new_i.time_breakdown_s["pp_comm_total"] == old_i.time_breakdown_s["pp_comm_total"]
    assert new_i.step_time_s < old_i.step_time_s
    assert estimate(model, H100, job, plain).step_time_s == \
        estimate(model, H100, old, plain).step_time_s


def test_a_few_token_weight_gradient_matmul_moves_megatrons_fp32_main_grad() -> None:
    # Megatron-LM's gradient-accumulation fusion has each weight-gradient matmul add into the
    # fp32 main_grad (read 4 + write 4 bytes a weight) where an unfused one writes a bf16
    # gradient (2). Over few tokens (64 here; a routed expert's share at high expert
    # parallelism) every such matmul is bound by that traffic, so the layer's backward is
    # 8 - 2 bytes per weight on the rank slower: attention, the router and the rank's one
    # routed expert of Mixtral's eight at ep = 8; the forward is untouched.
    gpu = H100.gpu
    rate = gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory
    one = np.ones(1)
    h, f = MIXTRAL.hidden_size, float(MIXTRAL.moe_ffn_hidden_size or 0)
    weights = h * (MIXTRAL.q_dim + 2 * MIXTRAL.kv_dim) + MIXTRAL.o_dim * h \
        + h * MIXTRAL.num_experts + 3 * h * f * MIXTRAL.num_experts / 8
    job = Job(global_batch_size=8, seq_len=64, framework="megatron")
    fused, unfused = (layer_compute(MIXTRAL, gpu, j, one, one, one, one, moe=True,
                                    ep=8 * one)
                      for j in (job, dataclasses.replace(job, fuse_grad_accumulation=False)))
    assert float(fused.forward[0]) == float(unfused.forward[0])
    assert float(fused.backward[0] - unfused.backward[0]) == pytest.approx(6 * weights / rate,
                                                                           rel=1e-9)
    # Over a long sequence the matmuls' FLOPs hide the traffic but for the router's (eight
    # outputs: its activations' traffic bounds it either way, and it adds its gradient's).
    long = dataclasses.replace(job, seq_len=8192)
    fused, unfused = (layer_compute(MIXTRAL, gpu, j, one, one, one, one, moe=True,
                                    ep=8 * one)
                      for j in (long, dataclasses.replace(long, fuse_grad_accumulation=False)))
    assert float(fused.backward[0] - unfused.backward[0]) == pytest.approx(
        6 * h * MIXTRAL.num_experts / rate, rel=1e-6)


def test_unfused_gradient_accumulation_adds_three_gradient_passes_per_later_micro_batch() -> None:
    # One GPU, Megatron-LM bf16 (fp32 main gradients, 4 bytes): without gradient accumulation
    # fusion each micro-batch after the first reads the new gradient and the accumulated one
    # and writes the sum, 3 x 4 bytes per parameter at the profile's copy rate.
    one = Cluster.preset("dgx-h100", num_nodes=1, gpus_per_node=1)
    small = ModelSpec.preset("llama-3.2-1b")
    cfg = ParallelConfig(micro_batch_size=1, recompute="full")
    gpu = one.gpu
    rate = gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory
    for m in (1, 4):
        job = Job(global_batch_size=m, seq_len=2048, framework="megatron")
        fused = estimate(small, one, job, cfg)
        unfused = estimate(small, one, dataclasses.replace(job, fuse_grad_accumulation=False),
                           cfg)
        params = fused.stages[0].layer_params + fused.stages[0].embedding_params
        expected = (m - 1) * 3 * 4.0 * params / rate
        assert unfused.step_time_s - fused.step_time_s == pytest.approx(expected, rel=1e-9)
    # torchtitan always accumulates through autograd, and with FSDP into the GPU's shard.
    eight = Cluster.preset("dgx-h100", num_nodes=1)
    for zero, shard in ((0, 1), (3, 8)):
        cfg = ParallelConfig(dp=8, zero_stage=zero, micro_batch_size=1, recompute="full")
        t1 = estimate(small, eight, Job(global_batch_size=8, seq_len=2048), cfg)
        t4 = estimate(small, eight, Job(global_batch_size=32, seq_len=2048), cfg)
        params = t1.stages[0].layer_params + t1.stages[0].embedding_params
        extra = 3 * 3 * 4.0 * params / shard / rate  # three later micro-batches, fp32 grads
        assert t4.step_time_s - 4 * (t1.step_time_s - t1.time_breakdown_s["optimizer"]
                                     - t1.time_breakdown_s["dp_comm"]) \
            - t4.time_breakdown_s["optimizer"] - t4.time_breakdown_s["dp_comm"] \
            == pytest.approx(extra, rel=1e-6)


def test_deepspeed_2021_zero3_gathers_each_parameter_alone_and_overlaps_nothing() -> None:
    # DeepSpeed v0.3.12-v0.5.4 (Job.zero3_synchronous_gather): each parameter tensor is
    # gathered by its own all_gather after a torch.cuda.synchronize(), and each gradient
    # reduce-scattered alone, through torch's list collectives, which copy the world size's
    # per-rank pieces one kernel each (deepspeed/runtime/zero/partition_parameters.py at
    # c83e49f9e; DeepSpeed PR #1188). A GPT layer has 4 weight matrices (fused qkv, output,
    # fc1, fc2) and 8 vectors (2 layernorms' scale and shift, 4 biases). With full recompute
    # the layer is gathered in forward and again in backward, then its gradients scattered.
    model = ModelSpec.preset("gpt3-2.7b")
    cluster = Cluster(gpu="a100-80gb", num_nodes=4, gpus_per_node=8, inter_node_link="ib-hdr")
    job = Job(global_batch_size=32, seq_len=2048, precision="fp16", framework="deepspeed",
              flash_attention=False, zero3_synchronous_gather=True)
    cfg = ParallelConfig(dp=32, zero_stage=3, micro_batch_size=1, recompute="full")
    est = estimate(model, cluster, job, cfg)
    topo = Topology.of(cluster)
    h, z = float(model.hidden_size), 32
    weight = (model.dense_layer_params() - 8 * h) / 4
    copies = 12 * z * cluster.gpu.efficiency.kernel_overhead_s
    gather = 4 * topo.all_gather(2.0 * weight, z, 1) + 8 * topo.all_gather(2.0 * h, z, 1)
    scatter = 4 * topo.reduce_scatter(2.0 * weight, z, 1) \
        + 8 * topo.reduce_scatter(2.0 * h, z, 1)
    per_layer = 2 * (gather + copies) + scatter + copies
    expected = est.num_micro_batches * model.num_layers * float(per_layer)
    assert est.time_breakdown_s["fsdp_comm"] == pytest.approx(expected, rel=1e-9)
    # Nothing hides: the exposed time is all of it.
    assert est.time_breakdown_s["fsdp_comm_total"] == pytest.approx(expected, rel=1e-9)
    # Today's DeepSpeed gathers coalesced and prefetched, hidden behind compute but the edges.
    now = estimate(model, cluster, dataclasses.replace(job, zero3_synchronous_gather=False),
                   cfg)
    assert now.time_breakdown_s["fsdp_comm"] < 0.5 * now.time_breakdown_s["fsdp_comm_total"]
    assert now.step_time_s < est.step_time_s
    # Twice the ranks at the same per-GPU batch: the per-rank copies alone add their cost.
    big = Cluster(gpu="a100-80gb", num_nodes=8, gpus_per_node=8, inter_node_link="ib-hdr")
    wide = estimate(model, big, dataclasses.replace(job, global_batch_size=64),
                    dataclasses.replace(cfg, dp=64))
    assert wide.time_breakdown_s["fsdp_comm"] - expected > \
        est.num_micro_batches * model.num_layers * 3 * copies
    # ZeRO-1/2 and other trainers ignore the flag.
    z2 = dataclasses.replace(cfg, zero_stage=2)
    assert _step_s(model, cluster, job, z2) == _step_s(
        model, cluster, dataclasses.replace(job, zero3_synchronous_gather=False), z2)
    tt = dataclasses.replace(job, framework="torchtitan", precision="bf16")
    assert estimate(model, cluster, tt, cfg).step_time_s == estimate(
        model, cluster, dataclasses.replace(tt, zero3_synchronous_gather=False), cfg).step_time_s


def _step_s(model: ModelSpec, cluster: Cluster, job: Job, cfg: ParallelConfig) -> float:
    step = estimate(model, cluster, job, cfg).step_time_s
    assert step is not None
    return step


def test_per_parameter_zero3_gathers_are_refused_where_the_tensors_are_unknown() -> None:
    job = Job(global_batch_size=64, seq_len=4096, framework="deepspeed",
              zero3_synchronous_gather=True)
    with pytest.raises(SpecError, match="zero3_synchronous_gather"):
        estimate(MIXTRAL, H100, job, ParallelConfig(dp=32, zero_stage=3))


def test_float8_rowwise_casts_more_and_rescales_the_gradients() -> None:
    # torchao's roofline of its recipes (pytorch/ao@0598012, torchao/testing/training/
    # roofline_utils.py): row-wise casting of an activation moves 8 bytes per element against
    # tensor-wise's 6 (its first kernel also writes a transposed bf16 copy, 2 bytes more).
    # So a layer's casts take e = 2 bytes more per element of each linear's input and of its
    # output gradient. Row-wise, each backward matmul runs tensor-wise cuBLAS and its output
    # is then multiplied by the scales (torchao/float8/float8_ops.py addmm_float8_unwrapped,
    # pytorch/ao#1325): every input gradient and weight gradient read and written once more,
    # a kernel per matmul (compiled; pytorch/ao#2184). And row-wise each linear casts its
    # bf16 weight on every pass, along one axis in forward and the other in backward
    # (matmul_with_hp_or_float8_args, pytorch/ao@890e0ac8): tensor-wise keeps one float8 copy,
    # made on the shard before FSDP's float8 all-gather (Job.fp8_param_gather), else cast
    # from the bf16 weight once per forward (an amax pass, then the cast: 2 kernels).
    from costmodel.formulas.eager import float8_cast_time

    gpu = H100.gpu
    job = Job(global_batch_size=8, seq_len=8192, precision="fp8", framework="torchtitan",
              compile=True, fp8_param_gather=True)
    row = dataclasses.replace(job, float8_recipe="rowwise")
    tokens, t = np.array([8192.0]), np.array([1.0])
    tw_f, tw_b = float8_cast_time(LLAMA, gpu, job, tokens, t, moe=False)
    rw_f, rw_b = float8_cast_time(LLAMA, gpu, row, tokens, t, moe=False)
    h, q, kv, f = (float(LLAMA.hidden_size), float(LLAMA.q_dim), float(LLAMA.kv_dim),
                   float(LLAMA.ffn_hidden_size or 0))
    ins = 8192 * (3 * h + q + 2 * h + f)  # q, k, v; o; gate, up; down
    outs = 8192 * (q + 2 * kv + h + 2 * f + h)
    weights = h * (q + 2 * kv) + q * h + 3 * h * f
    rate = gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory
    overhead = gpu.efficiency.kernel_overhead_s
    # Compiled, a cast reads 2 bytes and writes 1, in one kernel per linear (7 in a layer).
    weight_cast = 3.0 * weights / rate + 7 * overhead
    assert (rw_f - tw_f)[0] == pytest.approx(2.0 * ins / rate + weight_cast, rel=1e-9)
    rescale = 4.0 * (ins + weights) / rate + 2 * 7 * overhead
    assert (rw_b - tw_b)[0] == pytest.approx(2.0 * outs / rate + rescale + weight_cast,
                                             rel=1e-9)
    # Eager, the scales' fp32 outer product is written and read as well (8 bytes more), and a
    # cast takes its amax in a kernel of its own (read 2 more).
    eager, eager_row = (dataclasses.replace(j, compile=False) for j in (job, row))
    tw_eb = float8_cast_time(LLAMA, gpu, eager, tokens, t, moe=False)[1]
    rw_eb = float8_cast_time(LLAMA, gpu, eager_row, tokens, t, moe=False)[1]
    assert (rw_eb - tw_eb)[0] == pytest.approx(
        2.0 * outs / rate + 12.0 * (ins + weights) / rate + 5.0 * weights / rate
        + 6 * 7 * overhead, rel=1e-9)
    # Tensor-wise without the float8 all-gather: the weight cast in forward, none in backward.
    bare = dataclasses.replace(job, fp8_param_gather=False)
    bare_f, bare_b = float8_cast_time(LLAMA, gpu, bare, tokens, t, moe=False)
    assert (bare_f - tw_f)[0] == pytest.approx(5.0 * weights / rate + 2 * 7 * overhead,
                                               rel=1e-9)
    assert bare_b[0] == tw_b[0]
    assert float8_cast_time(LLAMA, gpu, dataclasses.replace(row, fp8_param_gather=False),
                            tokens, t, moe=False)[0][0] == rw_f[0]  # row-wise ignores it
    # The step: slower row-wise, and the recipe is torchtitan's alone.
    cfg = ParallelConfig(dp=8, tp=4, zero_stage=3, micro_batch_size=1, recompute="selective",
                         sequence_parallel=True)
    assert _step_s(LLAMA, H100, row, cfg) > _step_s(LLAMA, H100, job, cfg)
    mg = dataclasses.replace(job, framework="megatron")
    assert _step_s(LLAMA, H100, mg, cfg) == _step_s(
        LLAMA, H100, dataclasses.replace(mg, float8_recipe="rowwise"), cfg)
    with pytest.raises(SpecError, match="float8_recipe"):
        Job(global_batch_size=8, seq_len=8192, float8_recipe="delayed")


def test_float8_casts_one_per_float8_linear_and_the_output_layer_in_bf16() -> None:
    # torchao's Float8Linear casts its own input (torchao/float8/float8_linear.py): a gated
    # layer has 7 (q, k, v, o, gate, up, down), a plain MLP's 6, a MoE layer's attention 4
    # (its router and experts are not Float8Linears); one kernel per cast compiled, two
    # eager (the amax, then the cast). At no tokens only the launches remain (the weights are
    # cast on the shard before FSDP's float8 all-gather: Job.fp8_param_gather).
    from costmodel.formulas.eager import float8_cast_time
    from costmodel.formulas.headcompute import lm_head_compute

    gpu = H100.gpu
    job = Job(global_batch_size=8, seq_len=8192, precision="fp8", framework="torchtitan",
              compile=True, fp8_param_gather=True)
    launch = gpu.efficiency.kernel_overhead_s
    zero, one = np.array([0.0]), np.array([1.0])
    plain = dataclasses.replace(LLAMA, gated_mlp=False)
    for model, moe, casts in ((LLAMA, False, 7), (plain, False, 6), (LLAMA, True, 4)):
        fwd, bwd = float8_cast_time(model, gpu, job, zero, one, moe)
        assert fwd[0] == pytest.approx(casts * launch) and bwd[0] == pytest.approx(2 * fwd[0])
        eager, _ = float8_cast_time(model, gpu, dataclasses.replace(job, compile=False),
                                    zero, one, moe)
        assert eager[0] == pytest.approx(2 * fwd[0])
    # The output layer stays in bf16 (Megatron-Core's fp8 runs inside its transformer
    # layers; torchtitan leaves ``output`` out of its float8 conversion): its matmul takes
    # as long as in a bf16 job, where a layer's runs faster.
    bf16 = dataclasses.replace(job, precision="bf16")
    rows = (np.array([1]), np.array([1]), np.array([1]), np.array([0]))
    assert lm_head_compute(LLAMA, gpu, job, *rows)[1].forward[0] == pytest.approx(
        lm_head_compute(LLAMA, gpu, bf16, *rows)[1].forward[0])
    fp8_layer = layer_compute(LLAMA, gpu, job, *rows, moe=False).forward[0]
    assert fp8_layer < layer_compute(LLAMA, gpu, bf16, *rows, moe=False).forward[0]


def test_torchtitans_per_op_sac_gathers_again_in_backward() -> None:
    # torchtitan's per-op selective AC saves matmul, attention and reduce-scatter outputs,
    # not all-gathers (torchtitan _apply_ac_to_transformer_block's _save_list): under TP with
    # SP, backward gathers the attention and MLP inputs again, 2 all-gathers per layer more.
    cfg = ParallelConfig(dp=4, tp=8, zero_stage=3, micro_batch_size=2, sequence_parallel=True)
    job = Job(global_batch_size=64, seq_len=8192, framework="torchtitan", compile=True)
    sel = dataclasses.replace(cfg, recompute="selective")

    def tp(j: Job, c: ParallelConfig) -> tuple[float, float]:
        t = estimate(LLAMA, H100, j, c).time_breakdown_s
        return t["tp_comm"], t["tp_comm_total"]

    act = 2.0 * 2 * 8192 * LLAMA.hidden_size  # bf16, micro-batch 2
    gather = Topology.of(H100, {"tp": 8}).all_gather(np.array([act]), np.array([8.0]), 1.0)
    extra = 8 * LLAMA.num_layers * 2 * float(gather[0])  # 8 micro-batches a step
    (e0, t0), (e1, t1) = tp(job, cfg), tp(job, sel)
    assert t1 - t0 == pytest.approx(extra, rel=1e-6)
    assert e1 - e0 == pytest.approx(extra, rel=1e-6)  # all exposed without async TP
    # Async TP hides them behind the recomputed matmuls they feed (K projection, w3).
    on = dataclasses.replace(job, tp_comm_overlap=True)
    (a0, _), (a1, _) = tp(on, cfg), tp(on, sel)
    assert 0 < a1 - a0 < extra
    # Megatron-LM's selective recompute (the attention core) gathers nothing more.
    mg = dataclasses.replace(job, framework="megatron", compile=False)
    assert tp(mg, sel)[1] == pytest.approx(tp(mg, cfg)[1], rel=1e-12)


def test_torchtitan_fsdp_float8_all_gather_moves_and_holds_one_byte_per_weight() -> None:
    # torchtitan's float8.enable_fsdp_float8_all_gather with torchao's tensor-wise recipe
    # (Job.fp8_param_gather): each Float8Linear's weight shard is cast before FSDP's
    # all-gather (torchao/float8/fsdp_utils.py, WeightWithDynamicFloat8CastTensor), so a
    # layer's gathers move, and its unsharded weights hold, 1 byte per weight instead of 2.
    import hardware_profiles

    m = ModelSpec.preset("llama-3-8b")
    c = Cluster.preset("dgx-h100", num_nodes=2)
    job = Job(global_batch_size=64, seq_len=8192, precision="fp8", framework="torchtitan",
              compile=True)
    cfg = ParallelConfig(dp=16, zero_stage=3, recompute="selective")
    on_job = dataclasses.replace(job, fp8_param_gather=True)
    off, on = estimate(m, c, job, cfg), estimate(m, c, on_job, cfg)
    # Per layer: two gathers (forward, backward) and one reduce-scatter of the fp32 gradients:
    # 2 x 2 + 4 = 8 bytes a weight, 2 x 1 + 4 = 6 with float8 gathers (the embedding's and
    # head's stay bf16, and each collective's latency stays): a quarter less, not more.
    ratio = on.time_breakdown_s["fsdp_comm_total"] / off.time_breakdown_s["fsdp_comm_total"]
    assert 0.75 <= ratio < 0.80
    assert on.step_time_s < off.step_time_s
    # FSDP holds about two blocks unsharded (software.toml): 1 byte less per weight of each.
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size or 0
    layer = h * (2 * h + 2 * kv) + 3 * h * f + 2 * h  # q, o, k, v; gate, up, down; norms
    blocks = hardware_profiles.load_software()["torchtitan"]["unsharded_blocks_live"]
    assert off.memory.buffers_bytes - on.memory.buffers_bytes == pytest.approx(
        blocks * layer, rel=1e-9)
    # Row-wise, torchao gathers in bf16; other trainers ignore the torchtitan meaning.
    row = dataclasses.replace(job, float8_recipe="rowwise")
    assert estimate(m, c, dataclasses.replace(row, fp8_param_gather=True), cfg).step_time_s \
        == estimate(m, c, row, cfg).step_time_s
    ds = dataclasses.replace(job, framework="deepspeed")
    assert estimate(m, c, dataclasses.replace(ds, fp8_param_gather=True), cfg).step_time_s \
        == estimate(m, c, ds, cfg).step_time_s
    # Without FSDP (DDP at ZeRO-0) nothing is gathered: each Float8Linear casts its bf16
    # weight on every forward, flag or not. Under FSDP the shard is cast in the all-gather's
    # copy-in, beside the compute, so a layer's forward computes less with the flag.
    ddp = ParallelConfig(dp=16, zero_stage=0, recompute="selective")
    assert estimate(m, c, on_job, ddp).step_time_s == estimate(m, c, job, ddp).step_time_s
    assert on.time_breakdown_s["compute"] < off.time_breakdown_s["compute"]


def test_torchtitan_float8_tensorwise_gathers_float8_and_rowwise_async_tp_gathers_unfused(
        ) -> None:
    # torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput
    # (torchao/float8/float8_tensor_parallel.py), which torchtitan's apply_tp takes for the
    # tensorwise recipe only, cast before each SP all-gather: an all-gather moves 1 byte per
    # element, a reduce-scatter 2. Per layer and pass: 2 of each.
    def tp(job: Job, cfg: ParallelConfig) -> tuple[float, float]:
        t = estimate(LLAMA, H100, job, cfg).time_breakdown_s
        return t["tp_comm"], t["tp_comm_total"]

    cfg = ParallelConfig(dp=4, tp=8, zero_stage=3, micro_batch_size=2, sequence_parallel=True)
    job = Job(global_batch_size=64, seq_len=8192, precision="fp8", framework="torchtitan",
              compile=True)
    row, bf16 = (dataclasses.replace(job, float8_recipe="rowwise"),
                 dataclasses.replace(job, precision="bf16"))
    (tw_exp, tw_all), (rw_exp, rw_all), (bf_exp, bf_all) = (tp(j, cfg) for j in (job, row, bf16))
    assert rw_all == pytest.approx(bf_all, rel=1e-12)
    # (1 + 2) / (2 + 2) in the layers; the embedding's and the LM head's collectives (no
    # float8 linears there) and the latencies stay.
    assert 0.75 < tw_all / rw_all < 0.8
    # Megatron-LM's fp8 (Transformer Engine) is left as it was: bf16 gathers.
    mg = [tp(dataclasses.replace(j, framework="megatron"), cfg)[1] for j in (job, bf16)]
    assert mg[0] == pytest.approx(mg[1], rel=1e-12)
    # Async TP hides gathers and scatters behind their matmuls, but its all-gather-matmul
    # pattern misses the row-scaled matmul (pytorch/pytorch#149990): rowwise, only the
    # reduce-scatters hide, so at least the two gathers per pass stay exposed.
    on = [tp(dataclasses.replace(j, tp_comm_overlap=True), cfg)[0] for j in (job, row, bf16)]
    assert on[0] < tw_exp and on[2] < bf_exp and on[1] < rw_exp
    assert on[1] > on[2] and on[1] >= 0.5 * rw_exp * (1 - 1e-9)


def test_qk_norm_keeps_its_inputs_and_moves_q_and_k_once_more() -> None:
    """Qwen3's query and key norms (ModelSpec.qk_norm): each keeps its input, the rank's
    projected q and k heads, for backward (e bytes per element: 64 layers x 4096 tokens x
    (8192 + 1024) / tp 8 x 2 bytes more without recompute, none under full recompute, which
    keeps only the layer input), and reads and writes them once more in forward and
    backward, in two kernels each way: the step takes a little longer (1 % here)."""
    qwen = ModelSpec.preset("qwen3-32b")
    plain = ModelSpec(**{**qwen.to_dict(), "qk_norm": False})
    cluster = Cluster(gpu="h100-sxm", num_nodes=8, gpus_per_node=8)
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    for recompute, extra in (("none", 64 * 4096 * (8192 + 1024) / 8 * 2), ("full", 0.0)):
        cfg = ParallelConfig(dp=8, tp=8, micro_batch_size=1, sequence_parallel=True,
                             recompute=recompute)
        with_norms, without = estimate(qwen, cluster, job, cfg), estimate(plain, cluster, job, cfg)
        assert with_norms.memory.activations_bytes - without.memory.activations_bytes \
            == pytest.approx(extra, rel=1e-9, abs=1.0)
        assert without.step_time_s < with_norms.step_time_s < 1.03 * without.step_time_s

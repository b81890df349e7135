"""MoE routing at scale (issue 60): the busiest expert-parallel rank's load and the token
dispatchers costed on the topology they run on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_emit import megatron_parser

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.formulas.comm import Topology
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.moe import (
    deepep_buffer_bytes,
    dispatch_combine,
    remote_domains,
    routed_load,
    units_hit,
)
from planner.emit import emit, read_back
from planner.emit.megatron import parse_array
from planner.result import Plan

QWEN = ModelSpec.preset("qwen3-30b-a3b")


def _job(**kw: object) -> Job:
    return Job(**{"global_batch_size": 256, "seq_len": 4096, "framework": "megatron", **kw})  # type: ignore[arg-type]


def _est(cluster: Cluster, cfg: ParallelConfig, **kw: object):
    return estimate(QWEN, cluster, _job(**kw), cfg)


def test_the_busiest_rank_sets_the_expert_time_and_memory() -> None:
    """Dropless routing is never even: the busiest rank's routed tokens, ``load`` times the
    even share, set the experts' matmuls and the all-to-all; a capacity factor caps the
    load; forced even routing (1.0) is the floor."""
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    cfg = ParallelConfig(dp=16, ep=16, zero_stage=1)
    even = _est(cluster, cfg, moe_load_imbalance=1.0)
    busy = _est(cluster, cfg, moe_load_imbalance=1.5)
    assert busy.step_time_s > even.step_time_s
    assert busy.time_breakdown_s["ep_comm"] == pytest.approx(
        even.time_breakdown_s["ep_comm"] * 1.5, rel=0.05)
    capped = _est(cluster, cfg, moe_capacity_factor=1.5)
    assert capped.step_time_s == pytest.approx(busy.step_time_s)
    # The busiest rank saves its routed copies too: the layers' activations and the
    # all-to-all buffers grow linearly with the load, the rest does not move.
    busier = _est(cluster, cfg, moe_load_imbalance=2.0)

    def held(e: Estimate, term: str) -> float:
        return float(getattr(e.stages[0].memory, f"{term}_bytes"))

    for term in ("activations", "buffers"):
        lo, mid, hi = held(even, term), held(busy, term), held(busier, term)
        assert lo < mid < hi
        assert hi - mid == pytest.approx(mid - lo, rel=1e-9)
    assert held(busy, "weights") == held(even, "weights")
    assert routed_load(_job()) >= 1.0  # the published default, never better than even
    with pytest.raises(SpecError, match="not both"):
        _job(moe_load_imbalance=1.2, moe_capacity_factor=1.25)
    with pytest.raises(SpecError, match="at least 1"):
        _job(moe_load_imbalance=0.5)


def test_deepeps_buffer_is_its_size_hints() -> None:
    """DeepEP's communication buffer under Megatron-LM's flex dispatcher: the size hints of
    its dispatch and combine configurations (deepseek-ai/DeepEP csrc/legacy/config.hpp,
    deep_ep/buffers/legacy.py) for rows of hidden x 2 bytes, and a 32 MiB workspace.
    Hidden 7168 over 8 ranks: 10 channels x 8 peers x 256 rows x 16,392 bytes plus 1,600
    bytes of counters, 335,709,824 bytes; over 32 ranks the RDMA buffer adds 160 MiB."""
    mib = 2**20
    got = deepep_buffer_bytes(7168, np.array([1, 8, 32]))
    assert got[0] == 0
    assert got[1] == 335_709_824 + 32 * mib
    assert (got[2] - got[1]) / mib == pytest.approx(520.4 - 320.2, abs=0.1)
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    cfg = ParallelConfig(dp=16, ep=16, zero_stage=1)
    a2a = _est(cluster, cfg, moe_dispatcher="alltoall")
    deep = _est(cluster, cfg, moe_dispatcher="deepep")
    extra = deep.stages[0].memory.buffers_bytes - a2a.stages[0].memory.buffers_bytes
    assert extra == pytest.approx(float(deepep_buffer_bytes(QWEN.hidden_size, 16)))


def test_remote_domains_counts_distinct_destination_nodes() -> None:
    """One domain: no remote copies. Many domains and a large top-k: every other domain.
    Brute force over all routings of a small case agrees with the closed form's independent
    draws within the sampling approximation."""
    assert float(remote_domains(8, 8, 8)) == 0.0
    assert float(remote_domains(64, 64, 8)) == pytest.approx(7.0, rel=1e-3)
    # top-2 of 8 experts on 4 domains of one expert-rank pair each: exact expectation of
    # distinct other domains, over all (8 choose 2) routings from domain 0.
    import itertools

    experts = [e // 2 for e in range(8)]  # 2 experts per domain, 4 domains
    picks = list(itertools.combinations(range(8), 2))
    exact = np.mean([len({experts[a], experts[b]} - {0}) for a, b in picks])
    assert float(remote_domains(2, 4, 1)) == pytest.approx(exact, rel=0.1)


def _distinct_units(routings: list[tuple[int, ...]], unit_of: list[int]) -> float:
    """Mean number of distinct units the experts of equally likely routings are on."""
    return float(np.mean([len({unit_of[x] for x in r}) for r in routings]))


def test_units_hit_is_the_exact_expectation_over_every_routing() -> None:
    """Expected ranks (or domains) holding any of a token's experts, against brute force
    over every routing of small cases: uniform top-k, group-limited routing whose groups a
    unit holds whole (DeepSeek-V3's node limit), groups spanning several units, and NeMo
    AutoModel's fake balanced gate (one contiguous block of top-k experts per token)."""
    import itertools

    # Uniform: top-3 of 8 experts on 4 ranks of 2.
    uniform = list(itertools.combinations(range(8), 3))
    assert float(units_hit(3, 4, 1, num_experts=8)) == pytest.approx(
        _distinct_units(uniform, [x // 2 for x in range(8)]), rel=1e-9)
    # Group-limited: 16 experts in 8 groups of 2, a token's top-3 from 2 groups drawn at
    # random; 4 ranks of 4 experts (2 whole groups each).
    limited = [c for gs in itertools.combinations(range(8), 2)
               for c in itertools.combinations([2 * g + i for g in gs for i in (0, 1)], 3)]
    assert float(units_hit(3, 4, 1, groups=8, limit=2, num_experts=16)) == pytest.approx(
        _distinct_units(limited, [x // 4 for x in range(16)]), rel=1e-9)
    # Groups spanning ranks: 2 groups of 8 experts, limit 1, 8 ranks of 2 experts.
    spanning = [c for g in (0, 1) for c in itertools.combinations(range(8 * g, 8 * g + 8), 3)]
    assert float(units_hit(3, 8, 1, groups=2, limit=1, num_experts=16)) == pytest.approx(
        _distinct_units(spanning, [x // 2 for x in range(16)]), rel=1e-9)
    # The fake balanced gate on DeepSeek-V3's 256 experts, top-8, over EP 64 (4 experts a
    # rank) on 8 nodes: 2 ranks, one node, remote with chance 7/8.
    assert float(units_hit(8, 64, 1, groups=32, limit=1, num_experts=256)) == 2.0
    assert float(remote_domains(8, 64, 8, 32, 1, 256)) == pytest.approx(7 / 8)


def test_deepep_sends_a_token_once_per_rank_and_once_per_node() -> None:
    """DeepEP's normal kernels send a token once to each rank holding any of its experts and,
    across nodes, once per destination node, forwarded over NVLink: fewer bytes than an
    all-to-all of every routed copy, in a node by the share of distinct ranks, and by much
    more where a token's experts share a rank; the all-gather dispatcher moves the whole
    group's tokens, whatever top-k."""
    topo = Topology.of(Cluster.preset("dgx-h100", num_nodes=8))
    nbytes = 2 * 4096 * 2048.0
    a2a = dispatch_combine(topo, "alltoall", nbytes, 8, 1.0, 64, 1)
    deep = dispatch_combine(topo, "deepep", nbytes, 8, 1.0, 64, 1, num_experts=256)
    assert float(deep) < float(a2a)
    one = Topology.of(Cluster.preset("dgx-h100"))
    nbytes = 2 * 16384 * 7168.0  # large enough that the fixed latencies do not count
    in_node = float(dispatch_combine(one, "alltoall", nbytes, 8, 1.0, 8, 1))
    # 256 experts over 8 ranks: a token's top-8 reach 5.29 ranks on average.
    share = float(units_hit(8, 8, 1, num_experts=256)) / 8
    assert share == pytest.approx(0.662, abs=1e-3)
    assert float(dispatch_combine(one, "deepep", nbytes, 8, 1.0, 8, 1, num_experts=256)) \
        == pytest.approx(share * in_node, rel=0.05)
    # 128 experts in 16 blocks of 8, one block a token: all its experts on one rank of 16.
    blocked = float(dispatch_combine(one, "deepep", nbytes, 8, 1.0, 8, 1, 16, 1, 128))
    assert blocked == pytest.approx(in_node / 8, rel=0.1)
    ag = [float(dispatch_combine(topo, "allgather", nbytes, k, 1.0, 64, 1)) for k in (2, 8)]
    assert ag[0] == ag[1]
    assert float(dispatch_combine(topo, "allgather", nbytes, 8, 1.0, 1, 1)) == 0.0


def test_the_dispatcher_is_emitted_in_megatrons_words_and_mapped_elsewhere() -> None:
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    cfg = ParallelConfig(dp=16, ep=16, zero_stage=1)
    for dispatcher, want in (("alltoall", ("alltoall", False)), ("allgather", ("allgather", False)),
                             ("deepep", ("flex", True))):
        job = _job(moe_dispatcher=dispatcher)
        plan = Plan(model=QWEN, cluster=cluster, job=job, config=cfg,
                    estimate=estimate(QWEN, cluster, job, cfg))
        out = emit(plan, "megatron").text
        ns = megatron_parser().parse_args(parse_array(out))
        assert (ns.moe_token_dispatcher_type, bool(ns.moe_enable_deepep)) == want
        assert f"routing: {dispatcher} dispatcher" in out
    job = dataclasses.replace(_job(moe_dispatcher="allgather"), framework="torchtitan")
    plan = Plan(model=QWEN, cluster=cluster, job=job, config=dataclasses.replace(cfg, zero_stage=3),
                estimate=estimate(QWEN, cluster, job, dataclasses.replace(cfg, zero_stage=3)))
    assert "not the allgather dispatcher the plan assumed" in emit(plan, "torchtitan").text


def test_the_summary_states_the_imbalance_it_assumed() -> None:
    from planner import plan

    got = plan(QWEN, Cluster.preset("dgx-h100", num_nodes=2),
               _job(moe_load_imbalance=1.25))
    assert "routing  alltoall dispatcher; the busiest expert-parallel rank takes 1.25x" \
        in got.summary()


def test_the_default_load_is_what_its_calibration_fits() -> None:
    """software.toml's [moe] load_imbalance is benchmarks/moe_imbalance.py's fit to the
    published forced-vs-trained routing runs, and one load explains all four sequence
    lengths (the slowdown shrinks as attention's share grows)."""
    import importlib.util
    from pathlib import Path

    import hardware_profiles

    path = Path(__file__).parents[1] / "benchmarks/moe_imbalance.py"
    spec = importlib.util.spec_from_file_location("moe_imbalance", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    loads = [f for *_, f in mod.fitted_loads()]
    assert max(loads) - min(loads) < 0.1
    shipped = float(hardware_profiles.load_software()["moe"]["load_imbalance"])
    assert shipped == pytest.approx(sum(loads) / len(loads), abs=0.01)


@pytest.mark.slow  # explains a whole MoE search: 2 s
def test_explain_says_what_each_dispatcher_and_even_routing_would_cost() -> None:
    """A MoE plan's explanation searches the job again with every other dispatcher and
    with forced even routing (never slower than the trained router's load), when every
    choice or a routing field is asked; a dense plan's has no routing choices."""
    from planner import explain, plan

    # One pipeline stage keeps each of the searches small (explain searches again under the
    # plan's constraints).
    one_stage = {"fixed": {"pp": 1}}
    p = plan(QWEN, Cluster.preset("dgx-h100"), _job(global_batch_size=64), constraints=one_stage)
    got = explain(p, fields=["ep", "moe_dispatcher"])
    by = {c.field: c for c in got.choices}
    assert {o.value for o in by["moe_dispatcher"].options} == {"allgather", "deepep"}
    assert by["moe_dispatcher"].chosen == "alltoall"
    even = by["moe_load"].options[0]
    assert even.value == 1.0 and even.verdict == "faster"
    assert even.step_time_s < got.plan.estimate.step_time_s
    assert "dispatcher=deepep" in got.summary()
    # Fields named without them: the routing is not searched again.
    assert {c.field for c in explain(p, fields=["ep"]).choices} == {"ep"}
    # Only the dispatchers the trainer runs: torchtitan 0.2.2 has an all-to-all and DeepEP
    # (expert_parallel_comm_backend "standard", "deepep"), no all-gather dispatcher.
    tt = plan(QWEN, Cluster.preset("dgx-h100"), _job(global_batch_size=64,
                                                    framework="torchtitan"),
              constraints=one_stage)
    choice = {c.field: c for c in explain(tt, fields=["moe_dispatcher"]).choices}
    assert [o.value for o in choice["moe_dispatcher"].options] == ["deepep"]
    assert choice["moe_dispatcher"].options[0].framework == "torchtitan"
    dense = explain(plan(ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-h100"),
                         Job(global_batch_size=64, seq_len=4096, framework="megatron")),
                    fields=["tp"])
    assert not {c.field for c in dense.choices} & {"moe_dispatcher", "moe_load"}


def test_node_limited_routing_caps_the_destination_nodes() -> None:
    """DeepSeek-V3's routing (top-8 from at most 4 of 8 expert groups) on EP64 over 8 nodes,
    one group a node: a token reaches 3.5 other nodes on average, as brute force over every
    choice of 4 groups says, where unlimited top-8 routing reaches 4.6."""
    import itertools

    picks = list(itertools.combinations(range(8), 4))
    exact = np.mean([len(set(p) - {0}) for p in picks])
    assert float(remote_domains(8, 64, 8, 8, 4)) == pytest.approx(exact)
    assert float(remote_domains(8, 64, 8)) > exact + 1.0
    v3 = ModelSpec.preset("deepseek-v3")
    assert (v3.expert_groups, v3.expert_group_limit) == (8, 4)
    with pytest.raises(SpecError, match="expert_group_limit"):
        dataclasses.replace(v3, expert_group_limit=8)


# ---- MoE parallel folding: the experts' own tensor-parallel degree -----------------------

QWEN235 = ModelSpec.preset("qwen3-235b-a22b")


def _folded(etp: int | None, ep: int = 8, tp: int = 2, dp: int = 8) -> ParallelConfig:
    from costmodel.config import accounted_split

    return ParallelConfig(dp=dp, tp=tp, pp=8, ep=ep, etp=etp, zero_stage=1,
                          sequence_parallel=True, virtual_pipeline_stages=4,
                          recompute="selective",
                          stage_layers=accounted_split(QWEN235.num_layers, 8, 4))


def test_etp_equal_to_tp_is_the_unfolded_layout() -> None:
    cluster = Cluster.preset("dgx-h100", num_nodes=16)
    job = _job(global_batch_size=1024, moe_load_imbalance=1.0)
    a, b = (estimate(QWEN235, cluster, job, _folded(etp)) for etp in (None, 2))
    assert a.step_time_s == b.step_time_s
    assert a.peak_memory_bytes == b.peak_memory_bytes


def test_folding_the_experts_over_the_tp_ranks() -> None:
    """etp = 1 under tp = 2 (Megatron-Core's MoE parallel folding): each rank dispatches its
    own sequence share (half the all-to-all bytes), runs whole experts (the same FLOPs), drops
    its MoE layers' MLP-half TP exchanges, and holds the experts split ep * etp ways: the
    expert data-parallel group grows by tp / etp. It also admits ep = 16 over a stage's 16
    ranks (tp 2 x dp 8), where the unfolded mesh (ep borrowing dp) cannot."""
    cluster = Cluster.preset("dgx-h100", num_nodes=16)
    job = _job(global_batch_size=1024, moe_load_imbalance=1.0)
    even, folded = (estimate(QWEN235, cluster, job, _folded(etp)) for etp in (None, 1))
    t, f = even.time_breakdown_s, folded.time_breakdown_s
    assert f["ep_comm_total"] < t["ep_comm_total"]
    assert f["tp_comm_total"] <= t["tp_comm_total"] and f["tp_comm"] < t["tp_comm"]
    assert folded.step_time_s < even.step_time_s
    assert folded.peak_memory_bytes < even.peak_memory_bytes
    wide = estimate(QWEN235, cluster, job, _folded(1, ep=16))
    assert wide.step_time_s > 0
    with pytest.raises(SpecError, match="ep=16 must divide dp"):
        estimate(QWEN235, cluster, job, _folded(None, ep=16))


def test_folding_is_refused_where_it_does_not_apply() -> None:
    cluster = Cluster.preset("dgx-h100", num_nodes=16)
    job = _job(global_batch_size=1024)
    with pytest.raises(SpecError, match=r"etp\*ep = 64 must divide tp\*cp\*dp = 16"):
        estimate(QWEN235, cluster, job, _folded(1, ep=64, dp=8))
    with pytest.raises(SpecError, match="zero_stage=3"):
        estimate(QWEN235, cluster, job, dataclasses.replace(_folded(1), zero_stage=3))
    # torchtitan 0.2.2 takes etp = tp or 1 (parallel_dims.py), and its expert parallel
    # lives in the FSDP shard group, which DDP (zero 0) leaves at one rank.
    titan = dataclasses.replace(job, framework="torchtitan")
    with pytest.raises(SpecError, match="torchtitan splits its experts over etp = 1 or tp"):
        estimate(QWEN235, cluster, titan, dataclasses.replace(_folded(2, tp=4, dp=4),
                                                              zero_stage=3))
    with pytest.raises(SpecError, match="ep\\*etp = 8 must divide the FSDP shard group"):
        estimate(QWEN235, cluster, titan, dataclasses.replace(_folded(1), zero_stage=0))
    with pytest.raises(SpecError, match="deepspeed splits its experts over etp = tp"):
        estimate(QWEN235, cluster, dataclasses.replace(job, framework="deepspeed"),
                 dataclasses.replace(_folded(1), zero_stage=1))
    with pytest.raises(SpecError, match="needs a mixture-of-experts model"):
        estimate(ModelSpec.preset("llama-3-70b"), cluster, job,
                 ParallelConfig(dp=64, tp=2, etp=1, zero_stage=1, sequence_parallel=True))


def test_a_folded_plan_is_emitted_for_megatron_and_refused_elsewhere() -> None:
    cluster = Cluster.preset("dgx-h100", num_nodes=16)
    job = _job(global_batch_size=1024)
    cfg = _folded(1, ep=16)
    plan = Plan(model=QWEN235, cluster=cluster, job=job, config=cfg,
                estimate=estimate(QWEN235, cluster, job, cfg))
    ns = megatron_parser().parse_args(parse_array(emit(plan, "megatron").text))
    assert (ns.expert_tensor_parallel_size, ns.expert_model_parallel_size) == (1, 16)
    back = Plan.from_json(plan.to_json())
    assert back.config.etp == 1
    # torchtitan runs etp 1 (its expert_tensor_parallel_degree), with FSDP over its expert
    # shard group; DeepSpeed folds nothing.
    titan = dataclasses.replace(job, framework="torchtitan")
    flat = ParallelConfig(dp=64, tp=2, ep=16, etp=1, zero_stage=3, sequence_parallel=True)
    plan = Plan(model=QWEN235, cluster=cluster, job=titan, config=flat,
                estimate=estimate(QWEN235, cluster, titan, flat))
    text = emit(plan, "torchtitan").text
    assert "expert_tensor_parallel_degree = 1" in text
    assert read_back("torchtitan", text, QWEN235).config.etp == 1
    with pytest.raises(SpecError, match="cannot run the plan's folded expert mesh"):
        emit(dataclasses.replace(plan, job=dataclasses.replace(job, framework="deepspeed")),
             "deepspeed")


# ---- Megatron-LM's recompute modules ------------------------------------------------------

def test_recompute_modules_trade_the_experts_and_norms_memory_for_kernels() -> None:
    """Megatron-LM's selective recompute with --recompute-modules layernorm moe_act (the
    GPT-OSS and ModelZoo Qwen3 recipes) frees the routed experts' activation outputs and the
    two norms' outputs and re-runs those kernels in backward: less activation memory, more
    recompute time than the default (the attention core, nothing with a fused attention)."""
    cluster = Cluster.preset("dgx-h100", num_nodes=16)
    cfg = _folded(1, ep=16)
    plain = estimate(QWEN235, cluster, _job(global_batch_size=1024), cfg)
    mods = estimate(QWEN235, cluster,
                    _job(global_batch_size=1024, recompute_modules=("layernorm", "moe_act")), cfg)
    assert mods.memory.activations_bytes < 0.9 * plain.memory.activations_bytes
    assert mods.time_breakdown_s["recompute"] > plain.time_breakdown_s.get("recompute", 0.0)
    with pytest.raises(SpecError, match="'moe_layer' is not one the planner costs"):
        _job(recompute_modules=("moe_layer",))
    with pytest.raises(SpecError, match="Megatron-LM's --recompute-modules"):
        estimate(QWEN, Cluster.preset("dgx-h100"),
                 _job(framework="torchtitan", recompute_modules=("moe_act",)),
                 ParallelConfig(dp=8, ep=8, zero_stage=2, recompute="selective"))
    plan = Plan(model=QWEN235, cluster=cluster,
                job=_job(global_batch_size=1024, recompute_modules=("layernorm", "moe_act")),
                config=cfg, estimate=mods)
    ns = megatron_parser().parse_args(parse_array(emit(plan, "megatron").text))
    assert ns.recompute_granularity == "selective"
    assert ns.recompute_modules == ["layernorm", "moe_act"]


@pytest.mark.parametrize("module", ["mla_up_proj", "shared_experts", "mlp"])
def test_each_recompute_module_trades_its_memory_for_its_forward(module: str) -> None:
    """DeepSeek-V2-Lite (latent attention, shared experts, a dense first layer) under
    Megatron-LM's selective recompute: each of --recompute-modules mla_up_proj (the query,
    key and value the up projections make), shared_experts and mlp (their inner tensors)
    saves less and re-runs its forward in backward: more recompute time and more hardware
    FLOPs for the same model FLOPs."""
    lite = ModelSpec.preset("deepseek-v2-lite")
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    cfg = ParallelConfig(dp=8, tp=2, ep=8, zero_stage=1, sequence_parallel=True,
                         recompute="selective")
    base = estimate(lite, cluster, _job(global_batch_size=64), cfg)
    more = estimate(lite, cluster, _job(global_batch_size=64,
                                        recompute_modules=("core_attn", module)), cfg)
    assert more.memory.activations_bytes < base.memory.activations_bytes
    assert more.time_breakdown_s["recompute"] > base.time_breakdown_s.get("recompute", 0.0)
    # FLOPs per step (utilization x time): the hardware's grow, the model's do not.
    assert more.hfu * more.step_time_s > base.hfu * base.step_time_s
    assert more.mfu * more.step_time_s == pytest.approx(base.mfu * base.step_time_s, rel=1e-9)
    # Emitted as Megatron-LM's flag, which its own parser takes.
    job = _job(global_batch_size=64, recompute_modules=("core_attn", module))
    ns = megatron_parser().parse_args(parse_array(emit(
        Plan(model=lite, cluster=cluster, job=job, config=cfg, estimate=more),
        "megatron").text))
    assert ns.recompute_modules == ["core_attn", module]


def test_the_moe_module_recomputes_the_whole_layer_dispatch_included() -> None:
    """--recompute-modules moe checkpoints a MoE layer's whole forward from its norm's output
    (megatron/core/transformer/moe/moe_layer.py): everything else the layer kept goes (more
    than moe_act and shared_experts together, which it covers), backward re-runs its router,
    experts and shared experts (hardware FLOPs, not model FLOPs) and its dispatch and combine
    (one more pair of all-to-alls per MoE layer: 3 pairs where 2 were); a dense layer's MLP
    is untouched; combined 1F1B refuses it, as Megatron-LM's config does, and the search
    leaves that pair out; it is emitted in Megatron-LM's words."""
    lite = ModelSpec.preset("deepseek-v2-lite")
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    cfg = ParallelConfig(dp=16, ep=16, zero_stage=1, recompute="selective")
    runs = {mods: estimate(lite, cluster, _job(global_batch_size=64, recompute_modules=mods), cfg)
            for mods in (("core_attn",), ("moe_act", "shared_experts"), ("moe",),
                         ("moe", "moe_act", "shared_experts"))}
    base, parts, whole = runs[("core_attn",)], runs[("moe_act", "shared_experts")], runs[("moe",)]
    assert whole.memory.activations_bytes < parts.memory.activations_bytes \
        < base.memory.activations_bytes
    covered = runs[("moe", "moe_act", "shared_experts")]
    assert covered.memory.activations_bytes == whole.memory.activations_bytes
    assert covered.step_time_s == whole.step_time_s
    assert whole.time_breakdown_s["recompute"] > parts.time_breakdown_s["recompute"]
    assert whole.hfu * whole.step_time_s > base.hfu * base.step_time_s
    assert whole.mfu * whole.step_time_s == pytest.approx(base.mfu * base.step_time_s, rel=1e-9)
    assert whole.time_breakdown_s["ep_comm_total"] == pytest.approx(
        1.5 * base.time_breakdown_s["ep_comm_total"], rel=1e-9)
    dense = ModelSpec.preset("llama-3-8b")
    dense_cfg = ParallelConfig(dp=16, zero_stage=1, recompute="selective")
    assert estimate(dense, cluster, _job(global_batch_size=64, recompute_modules=("moe",)),
                    dense_cfg).peak_memory_bytes == \
        estimate(dense, cluster, _job(global_batch_size=64), dense_cfg).peak_memory_bytes
    combined = ParallelConfig(dp=16, ep=16, zero_stage=1, recompute="selective",
                              pipeline_schedule="combined-1f1b")
    with pytest.raises(SpecError, match="refuses the recompute module moe"):
        estimate(lite, cluster, _job(global_batch_size=64, recompute_modules=("moe",)), combined)
    from planner.space import COLUMNS, build_space
    from planner.space import Constraints as Cons

    space = build_space(lite, cluster, _job(global_batch_size=64, recompute_modules=("moe",)),
                        Cons(fixed={"pp": 1, "ep": 16}))
    rows = space.expand(np.repeat(np.arange(len(space.cores)), space.sizes[1]),
                        np.concatenate([np.arange(k) for k in space.sizes[1]]))
    sched, rec = rows[:, COLUMNS.index("schedule")], rows[:, COLUMNS.index("recompute")]
    from costmodel.formulas.arrays import RECOMPUTE_CODES, SCHEDULE_CODES

    assert (sched == SCHEDULE_CODES["combined-1f1b"]).any()
    assert not ((sched == SCHEDULE_CODES["combined-1f1b"])
                & (rec == RECOMPUTE_CODES["selective"])).any()
    ns = megatron_parser().parse_args(parse_array(emit(
        Plan(model=lite, cluster=cluster, job=_job(global_batch_size=64,
                                                   recompute_modules=("moe",)),
             config=cfg, estimate=whole), "megatron").text))
    assert ns.recompute_granularity == "selective" and ns.recompute_modules == ["moe"]


def test_mlp_recompute_drops_the_fused_swiglus_three_widths() -> None:
    """Megatron-LM's fused bias-SwiGLU keeps the fc1 output (gate and up: 2 ffn widths) and
    the fc2 input (1 width) per token, in bf16, split over tp; --recompute-modules mlp
    checkpoints the whole dense MLP (transformer_layer.py), so exactly those go, on every
    layer the stage holds."""
    llama = ModelSpec.preset("llama-3-8b")
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    cfg = ParallelConfig(dp=4, tp=2, zero_stage=1, sequence_parallel=True, micro_batch_size=1,
                         recompute="selective")
    job = _job(global_batch_size=64, seq_len=4096)
    base = estimate(llama, cluster, job, cfg)
    mlp = estimate(llama, cluster, dataclasses.replace(job, recompute_modules=("core_attn",
                                                                               "mlp")), cfg)
    per_layer = 3 * 2 * 4096 * llama.ffn_hidden_size / 2
    assert base.memory.activations_bytes - mlp.memory.activations_bytes == \
        pytest.approx(llama.num_layers * per_layer, rel=1e-9)
    with pytest.raises(SpecError, match="no multi-head latent attention"):
        estimate(llama, cluster, dataclasses.replace(job, recompute_modules=("mla_up_proj",)),
                 cfg)


def test_the_search_folds_experts_where_it_pays_and_equals_brute_force() -> None:
    """Under Megatron-LM the search covers the experts' own TP degree with tp, cp and ep
    (etp dividing tp; etp * ep dividing tp * cp * dp): on a small MoE space every row,
    folded ones included, is costed as estimate() costs it and the plan is the brute-force
    fastest that fits (tests/brute.py)."""
    from brute import search_equals_brute_force

    from planner.space import COLUMNS, Constraints

    model = dataclasses.replace(ModelSpec.preset("qwen3-30b-a3b"), num_layers=4, name="qwen-4l")
    cluster = Cluster.preset("dgx-h100")
    job = _job(global_batch_size=16, seq_len=2048, moe_load_imbalance=1.0)
    cons = Constraints(fixed={"tp": 2, "pp": 1, "cp": 1, "offload": "none"},
                       allowed={"recompute": ["none"], "zero_stage": [1]})
    space = search_equals_brute_force(model, cluster, job, cons)
    t = space.table
    etp, tp = t[:, COLUMNS.index("etp")], t[:, COLUMNS.index("tp")]
    assert (etp < tp).any() and (etp == tp).any()
    # torchtitan folds to etp 1 only (parallel_dims.py), with FSDP; it too is the
    # brute-force fastest.
    tt = Constraints(fixed={"tp": 2, "pp": 1, "cp": 1, "offload": "none"},
                     allowed={"recompute": ["none"], "zero_stage": [2]})
    o = search_equals_brute_force(model, cluster, dataclasses.replace(job, framework="torchtitan"),
                                  tt).table
    etp, tp = o[:, COLUMNS.index("etp")], o[:, COLUMNS.index("tp")]
    assert set(etp[etp != tp]) == {1} and (etp == tp).any()


def test_a_deepep_file_says_which_deepep_build_the_gpu_runs() -> None:
    # deepseek-ai/DeepEP builds for CUDA only; ROCm/DeepEP installs the same deep_ep module.
    for preset, build, other in (("dgx-h100", "deepseek-ai/DeepEP", "ROCm/DeepEP"),
                                 ("mi300x-8", "ROCm/DeepEP", "over NVSHMEM")):
        cluster = Cluster.preset(preset, num_nodes=2)
        for fw, zero in (("megatron", 1), ("torchtitan", 2)):
            cfg = ParallelConfig(dp=16, ep=8, zero_stage=zero)
            job = _job(framework=fw, moe_dispatcher="deepep")
            plan = Plan(model=QWEN, cluster=cluster, job=job, config=cfg,
                        estimate=estimate(QWEN, cluster, job, cfg))
            head = [line for line in emit(plan, fw).text.splitlines() if "DeepEP" in line]
            assert len(head) == 1 and head[0].startswith("#")
            assert build in head[0] and other not in head[0]
        job, cfg = _job(moe_dispatcher="alltoall"), ParallelConfig(dp=16, ep=8, zero_stage=1)
        plan = Plan(model=QWEN, cluster=cluster, job=job, config=cfg,
                    estimate=estimate(QWEN, cluster, job, cfg))
        assert "DeepEP" not in emit(plan, "megatron").text


def test_torchtitan_files_say_how_the_experts_split_and_dispatch() -> None:
    """torchtitan 0.2.2 splits the experts over TP only when its
    expert_tensor_parallel_degree says so (default 1), so the file states the plan's (the
    estimate's experts split as tp); a file without it reads back as torchtitan runs it.
    DeepEP is its expert_parallel_comm_backend, which it refuses without expert parallel or
    with the experts split over TP: there the file falls back to its all-to-all, says so,
    and is estimated so; it has no all-gather dispatcher."""
    from planner.emit import read_back

    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    split = ParallelConfig(dp=8, tp=2, ep=8, zero_stage=2, sequence_parallel=True)
    whole = ParallelConfig(dp=16, ep=8, zero_stage=2)
    for cfg, dispatcher, backend, fell_back in ((split, "alltoall", None, False),
                                                (split, "deepep", None, True),
                                                (whole, "deepep", "deepep", False),
                                                (whole, "allgather", None, True)):
        job = _job(framework="torchtitan", moe_dispatcher=dispatcher)
        plan = Plan(model=QWEN, cluster=cluster, job=job, config=cfg,
                    estimate=estimate(QWEN, cluster, job, cfg))
        out = emit(plan, "torchtitan")
        text = out.text
        assert f"expert_tensor_parallel_degree = {cfg.tp}" in text
        assert (f'expert_parallel_comm_backend = "{backend}"' in text) == (backend is not None)
        assert any("all-to-all" in w for w in out.warnings) == fell_back
        assert out.job.moe_dispatcher == ("alltoall" if fell_back else dispatcher)
        back = read_back("torchtitan", text, QWEN).config
        assert back.expert_tp == cfg.tp and back.ep == cfg.ep
    default = emit(Plan(model=QWEN, cluster=cluster, job=_job(framework="torchtitan"),
                        config=split, estimate=estimate(QWEN, cluster,
                                                        _job(framework="torchtitan"), split)),
                   "torchtitan").text.replace("expert_tensor_parallel_degree = 2\n", "")
    assert read_back("torchtitan", default, QWEN).config.etp == 1


def test_torchtitans_per_op_ac_re_runs_a_moe_layers_routed_experts() -> None:
    # torchtitan v0.2.2's per-op selective AC saves aten.mm, the fused attention kernels and
    # the all-to-all, not torch._grouped_mm (torchtitan/models/deepseek_v3/infra/
    # parallelize.py _op_sac_save_list): backward re-runs the routed experts' matmuls, so
    # op SAC's recompute of a MoE layer covers their FLOPs.
    from costmodel.formulas.compute import layer_compute

    spec = ModelSpec.preset("deepseek-v2-lite")
    gpu = Cluster.preset("dgx-h100", num_nodes=1).gpu
    job = Job(global_batch_size=64, seq_len=4096, framework="torchtitan",
              moe_load_imbalance=1.0)
    one = np.array([1])
    lc = layer_compute(spec, gpu, job, one, one, np.array([8]), np.array([0]), moe=True,
                       ep=np.array([8]), etp=one)
    routed_flops = 2 * 3 * 8 * 4096 * spec.top_k * spec.hidden_size \
        * float(spec.moe_ffn_hidden_size)
    assert lc.selective_flops[0] >= routed_flops
    assert lc.selective[0] > lc.forward[0] / 3  # the experts are most of a MoE layer

"""The search: its space against validate(), its result against brute force, plans as data."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from brute import fastest_that_fits, half_fitting
from inprocess import run_planner

from costmodel import Cluster, Infeasible, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.config import OFFLOADS, RECOMPUTE, SCHEDULES, V_SCHEDULES
from costmodel.formulas.checks import validate
from costmodel.formulas.tables import evaluate
from costmodel.formulas.vschedules import v_split
from costmodel.frameworks import framework
from planner.plan import TERM_LABELS, plan
from planner.result import Plan
from planner.search import search
from planner.space import (
    COLUMNS,
    PRESETS,
    Constraints,
    arrays,
    build_space,
    config_row,
    row_config,
)

# A small decoder (8 layers) on 2 nodes of 4 GPUs: spaces of a few thousand rows.
TINY = ModelSpec(name="tiny", num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=4,
                 ffn_hidden_size=1536, vocab_size=8000, gated_mlp=True)
CLUSTER = Cluster(gpu="a100-80gb", num_nodes=2, gpus_per_node=4)
FRAMEWORKS = ("torchtitan", "megatron", "deepspeed")


def job(fw: str = "torchtitan", batch: int = 8, seq: int = 1024) -> Job:
    return Job(global_batch_size=batch, seq_len=seq, framework=fw)


def _key(peak: np.ndarray, step: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Brute-force order: step time, peak memory, columns ascending."""
    return np.lexsort((*table.T[::-1], peak, step))


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_space_is_exactly_the_valid_configurations(fw: str) -> None:
    """Every configuration that validate() accepts (in canonical form, tp x cp tiling the
    nodes) is in the space once, and nothing else is."""
    j = job(fw)
    space = build_space(TINY, CLUSTER, j)
    got = {tuple(r) for r in space.table}
    assert len(got) == space.rows
    want = set()
    degrees = [1, 2, 4, 8]
    for dp, tp, pp, cp in itertools.product(degrees, repeat=4):
        if dp * tp * pp * cp != CLUSTER.num_gpus or ((tp * cp) % 4 and 4 % (tp * cp)):
            continue
        for zero, sp, mbs, sched, rec, off in itertools.product(
                range(4), (False, True), (1, 2, 4, 8), SCHEDULES, RECOMPUTE, OFFLOADS):
            for v in (1, 2, 4):
                for group in [None] + [g for g in (1, 2, 4) if g < dp]:
                    for n in [None, *range(1, 8)]:
                        try:
                            cfg = ParallelConfig(
                                dp=dp, tp=tp, pp=pp, cp=cp, zero_stage=zero,
                                sharding_group=group, sequence_parallel=sp,
                                micro_batch_size=mbs, pipeline_schedule=sched,
                                virtual_pipeline_stages=v, recompute=rec,
                                recompute_num_layers=n, offload=off)
                            validate(TINY, CLUSTER, j, cfg)
                        except SpecError:
                            continue
                        if pp == 1 and sched != "1f1b":
                            continue  # canonical: no schedule without a pipeline
                        if pp > 1 and sched in framework(fw).unsearched_schedules:
                            continue  # estimated when given, not searched (its launcher)
                        if pp > 1 and sched in framework(fw).costed_schedules:
                            continue  # another trainer's (DualPipe): costed, not searched
                        if sp and not framework(fw).sequence_parallel:
                            continue  # estimated when given, not searched (DeepSpeed AutoTP)
                        # A V schedule's chunks are torchtitan's split, the largest the
                        # one N may cover.
                        chunk = max(v_split(TINY.num_layers, pp)) if sched in V_SCHEDULES \
                            else TINY.num_layers // (pp * v)
                        if n is not None and n >= chunk:
                            continue  # canonical: N covering the chunk is plain "full"
                        if group is not None and zero not in framework(fw).hybrid_shard_stages:
                            continue
                        want.add(tuple(int(x) for x in config_row(cfg)))
    assert got == want


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_search_equals_a_full_pass(fw: str) -> None:
    """Branch and bound returns exactly the top of the fully evaluated space, under a memory
    capacity that leaves part of the space out."""
    j = job(fw)
    space = build_space(TINY, CLUSTER, j)
    table = space.table
    full = evaluate(TINY, CLUSTER, j, arrays(TINY, table))
    cap = float(np.quantile(full.peak_memory, 0.3))
    fit = full.peak_memory <= cap
    order = [i for i in _key(full.peak_memory, full.step_time, table) if fit[i]]
    want, seen = [], set()
    for i in order:  # distinct (time, memory), as the search reports them
        tag = (full.step_time[i], full.peak_memory[i])
        if tag not in seen:
            seen.add(tag)
            want.append(tuple(int(x) for x in table[i]))
    res = search(TINY, CLUSTER, j, top_k=5, capacity=cap)
    assert [f.row for f in res.top] == want[:5]
    assert res.counts["space"] == space.rows
    assert res.counts["evaluated"] + res.counts["bounded"] == space.rows
    assert res.counts["bounded"] > 0  # the bound did prune


@pytest.mark.parametrize("fw", ["torchtitan", "megatron"])
def test_search_by_value_equals_a_full_pass_per_value(fw: str) -> None:
    """``search(by=...)``: for every value of every column asked, the fastest row with it that
    fits (the search's order breaking ties) and, where none fits, the row with it needing the
    least memory, both as the fully evaluated space gives them; and it still prunes."""
    j = job(fw)
    table = build_space(TINY, CLUSTER, j).table
    full = evaluate(TINY, CLUSTER, j, arrays(TINY, table))
    cols = ["tp", "pp", "zero", "mbs", "v", "recompute", "offload"]
    # A capacity under which some values fit nowhere: the median of each value's least need.
    needs = [full.peak_memory[table[:, COLUMNS.index(c)] == v].min()
             for c in cols for v in np.unique(table[:, COLUMNS.index(c)])]
    cap = float(np.median(needs))
    fit = full.peak_memory <= cap
    res = search(TINY, CLUSTER, j, top_k=1, capacity=cap, by=cols)
    fastest = [i for i in _key(full.peak_memory, full.step_time, table) if fit[i]]
    least = np.lexsort((*table.T[::-1], full.peak_memory))
    missing = 0
    for c in cols:
        col = table[:, COLUMNS.index(c)]
        assert set(res.best_by[c]) | set(res.least_by[c]) == {int(v) for v in np.unique(col)}
        for v in np.unique(col):
            want = next((i for i in fastest if col[i] == v), None)
            got = res.best_by[c].get(int(v))
            if want is None:
                missing += 1
                assert got is None
                low = next(i for i in least if col[i] == v)
                assert res.least_by[c][int(v)].row == tuple(int(x) for x in table[low])
            else:
                assert got is not None and got.row == tuple(int(x) for x in table[want])
                assert got.step_time == full.step_time[want]
    assert missing > 0  # some value fits nowhere
    assert res.counts["bounded"] > 0
    with pytest.raises(ValueError, match="not a column"):
        search(TINY, CLUSTER, j, by=["colour"])


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_search_equals_brute_force_over_scalar_estimates() -> None:
    """On a constrained space, the plan is the fastest of estimate() over every row."""
    cons = Constraints(max={"micro_batch_size": 1}, allowed={"recompute": ["none", "full"]},
                       fixed={"offload": "none"})
    j = job("megatron")
    space = build_space(TINY, CLUSTER, j, cons)
    assert 50 < space.rows < 1000
    small = half_fitting(TINY, CLUSTER, j, space)
    best = fastest_that_fits(TINY, small, j, space)
    p = plan(TINY, small, j, constraints=cons)
    assert best is not None
    assert p.estimate.step_time_s == best[0]
    assert p.config == row_config(np.array(best[2]))


def test_plan_is_deterministic_and_round_trips(tmp_path) -> None:
    a = plan(TINY, CLUSTER, job())
    b = plan(TINY, CLUSTER, job())
    da, db = a.to_dict(), b.to_dict()
    da.pop("search_seconds")
    db.pop("search_seconds")
    assert da == db
    path = tmp_path / "plan.json"
    a.to_json(path)
    back = Plan.from_json(path)
    assert back.config == a.config
    assert back.estimate.to_dict() == a.estimate.to_dict()
    assert back.alternatives == a.alternatives
    written = json.loads(path.read_text())
    assert written["schema_version"] == 2 and written["layer_costs"] is None
    # A version-1 file (a preset's plan, before module plans carried their layer costs)
    # reads the same.
    old = {k: v for k, v in written.items() if k != "layer_costs"}
    old["schema_version"] = 1
    assert Plan.from_json(json.dumps(old)).config == a.config


def test_plan_json_errors() -> None:
    with pytest.raises(SpecError, match="schema_version"):
        Plan.from_json('{"schema_version": 99}')
    with pytest.raises(SpecError, match="not valid JSON"):
        Plan.from_json("{nope")
    with pytest.raises(SpecError, match="does not exist"):
        Plan.from_json("/no/such/plan.json")


@pytest.mark.parametrize(("model", "nodes", "batch", "seq"), [
    ("llama-3-8b", 1, 64, 8192), ("gpt3-2.7b", 2, 512, 2048), ("mixtral-8x7b", 4, 256, 4096),
    ("llama-2-70b", 8, 512, 4096)])
def test_plan_fits_and_uses_every_gpu(model: str, nodes: int, batch: int, seq: int) -> None:
    m = ModelSpec.preset(model)
    c = Cluster(gpu="h100-sxm", num_nodes=nodes)
    p = plan(m, c, Job(global_batch_size=batch, seq_len=seq))
    cfg = p.config
    assert cfg.dp * cfg.tp * cfg.pp * cfg.cp == c.num_gpus
    assert p.estimate.fits
    runners = p.runners_up
    assert all(r.step_time_s >= p.estimate.step_time_s for r in runners)


def test_presets_and_constraints_narrow_the_search() -> None:
    j = job(batch=16)
    fsdp = plan(TINY, CLUSTER, j, constraints="fsdp").config
    assert (fsdp.tp, fsdp.pp, fsdp.cp, fsdp.zero_stage) == (1, 1, 1, 3)
    ddp = plan(TINY, CLUSTER, j, constraints="ddp").config
    assert (ddp.dp, ddp.zero_stage) == (8, 0)
    mg = plan(TINY, CLUSTER, j, constraints="megatron-3d")
    assert mg.job.framework == "megatron" and mg.config.zero_stage in (0, 1)
    capped = plan(TINY, CLUSTER, j, constraints={"max": {"tp": 1}, "fixed": {"pp": 2}})
    assert capped.config.tp == 1 and capped.config.pp == 2
    across = plan(TINY, CLUSTER, j, constraints=Constraints(frameworks=FRAMEWORKS))
    single = [plan(TINY, CLUSTER, job(fw, batch=16)).estimate.step_time_s for fw in FRAMEWORKS]
    assert across.estimate.step_time_s == min(single)
    assert set(PRESETS) >= {"ddp", "fsdp", "zero2", "megatron-3d", "torchtitan-default"}


@pytest.mark.parametrize("bad", [
    lambda: Constraints.preset("nope"), lambda: Constraints(fixed={"nope": 1}),
    lambda: Constraints(max={"tp": 0}), lambda: Constraints(frameworks=("jax",)),
    lambda: plan(TINY, CLUSTER, job(), top_k=0), lambda: plan(TINY, "x", job()),  # type: ignore
])
def test_bad_constraints_raise_spec_error(bad) -> None:
    with pytest.raises(SpecError):
        bad()


def test_a_schedule_the_fixed_pipeline_cannot_run_is_a_bad_question_not_an_empty_search(
) -> None:
    """A V schedule or interleaving fixed beside one pipeline rank (or the wrong number of
    chunks) is refused by name (exit 2), where the search used to report an unrelated
    'infeasible' list (exit 3)."""
    for fixed, match in (({"pipeline_schedule": "zbv", "pp": 1}, "pp .* of 2 or more"),
                         ({"pipeline_schedule": "dualpipev", "virtual_pipeline_stages": 3},
                          "must be 2, got 3"),
                         ({"pipeline_schedule": "interleaved-1f1b",
                           "virtual_pipeline_stages": 1}, "2 or more, got 1")):
        with pytest.raises(SpecError, match=match):
            Constraints(fixed=fixed)
    with pytest.raises(SpecError, match="of 2 or more, got pp=1"):
        Constraints.preset("ddp").merge(Constraints(fixed={"pipeline_schedule": "zbv"}))
    assert Constraints(fixed={"pipeline_schedule": "zbv", "pp": 2}).fixed["pp"] == 2


def test_infeasible_says_what_would_fit() -> None:
    m = ModelSpec.preset("llama-3-70b")
    c = Cluster(gpu="a100-40gb", num_nodes=1)
    with pytest.raises(Infeasible, match=r"least memory .* GiB per GPU.*GPUs"):
        plan(m, c, Job(global_batch_size=16, seq_len=4096))


def test_invalid_everything_is_infeasible_with_the_rule() -> None:
    with pytest.raises(Infeasible, match="tensor parallel stays inside a node"):
        plan(TINY, CLUSTER, job(), constraints={"fixed": {"tp": 8}})


def test_why_not_table_names_reasons() -> None:
    j = job(batch=16)
    p = plan(TINY, CLUSTER, j)
    verdicts = {a.verdict for a in p.alternatives}
    assert {"slower", "invalid", "bounded"} <= verdicts
    best = p.estimate
    for a in p.alternatives:
        if a.verdict == "slower":
            # By how much, and the term that grew most, re-derived from the two estimates.
            assert isinstance(a.config, ParallelConfig) and a.step_time_s is not None
            other = estimate(TINY, CLUSTER, j, a.config)
            assert other.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)
            pct = 100 * (a.step_time_s / best.step_time_s - 1)
            diff = {t: other.time_breakdown_s[t] - best.time_breakdown_s[t] for t in TERM_LABELS}
            worst = max(diff, key=lambda t: (diff[t], t))
            assert a.reason.startswith(f"slower by {pct:.1f}% ") or pct < 0.05, a.reason
            assert pct < 0.05 or f"mostly from {TERM_LABELS[worst]} " in a.reason, a.reason
        elif a.verdict == "bounded":
            # A bound slower than the plan, stated against the plan's step time.
            m = re.search(r"at least ([\d.]+) s .*\(([\d.]+)% over the plan\)", a.reason)
            assert m and float(m.group(1)) >= best.step_time_s * (1 - 1e-3), a.reason
        elif a.verdict == "invalid":
            # Names the values it covers and the rule they break.
            assert re.match(r"\d+ value\(s\) such as \S+=\S+.*: \S", a.reason), a.reason
    reasons = " ".join(a.reason for a in p.alternatives if a.verdict == "invalid")
    assert "tensor parallel stays inside a node" in reasons  # tp=8 on nodes of 4 GPUs
    assert "why not" in p.summary()


def test_table_columns_cover_parallel_config() -> None:
    cfg = ParallelConfig(dp=2, tp=2, pp=2, zero_stage=1, sharding_group=1, micro_batch_size=2,
                         pipeline_schedule="interleaved-1f1b", virtual_pipeline_stages=2,
                         recompute="full", recompute_num_layers=1, offload="optimizer")
    assert row_config(config_row(cfg)) == cfg
    folded = ParallelConfig(dp=8, tp=2, ep=16, etp=1, zero_stage=1)
    assert row_config(config_row(folded)) == folded
    assert len(COLUMNS) == 15


def test_cli_plan(tmp_path) -> None:
    out = tmp_path / "p.json"
    args = [sys.executable, "-m", "planner", "plan", "--model", "llama-3-8b", "--gpus", "8",
            "--gpu", "h100-sxm", "--global-batch-size", "64", "--seq-len", "4096", "--json",
            "-o", str(out)]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)
    assert {"config", "estimate"} <= set(d)
    assert d["estimate"]["step_time_s"] > 0
    assert Plan.from_json(out).config == ParallelConfig(**d["config"])
    for bad, status in ((["--model", "no-such-model", "--gpus", "8"], 2),
                        (["--model", "llama-3-70b", "--gpus", "8", "--gpu", "a100-40gb",
                          "--global-batch-size", "16", "--seq-len", "4096"], 3),
                        (["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "8",
                          "--seq-len", "512", "--max", "tp"], 2)):
        r = run_planner("plan", *bad)
        assert r.returncode == status, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        if status == 3:  # nothing fits: says what would
            assert "planner: infeasible:" in r.stderr and "GiB would fit" in r.stderr


def test_a_space_is_built_once_for_the_searches_that_share_it(monkeypatch) -> None:
    """A plan, its explanation and the explanation's searches with another dispatcher or
    routing load search the same space (``build_space`` reads none of those): it is built
    once and kept; a job whose space differs (another sequence length; the allgather
    dispatcher, which combined 1F1B refuses) gets its own, and a kept space is read-only."""
    import planner.space as space_mod

    built = []
    real = space_mod.build_space

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(space_mod, "build_space", counting)
    monkeypatch.setattr(space_mod, "_SPACES", {})
    moe = ModelSpec.preset("mixtral-8x7b")
    cluster = Cluster.preset("dgx-h100", num_nodes=2)
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    ((_, first),) = space_mod.spaces(moe, cluster, job)
    for same in (job, dataclasses.replace(job, moe_dispatcher="deepep"),
                 dataclasses.replace(job, moe_load_imbalance=1.0)):
        ((_, again),) = space_mod.spaces(moe, cluster, same)
        assert again is first
    assert len(built) == 1
    space_mod.spaces(moe, cluster, dataclasses.replace(job, seq_len=2048))
    ((_, gathered),) = space_mod.spaces(moe, cluster,
                                        dataclasses.replace(job, moe_dispatcher="allgather"))
    assert len(built) == 3
    # Combined 1F1B needs the alltoall or flex dispatcher: the allgather space lacks it.
    sched = COLUMNS.index("schedule")
    assert len(np.unique(first.table[:, sched])) > len(np.unique(gathered.table[:, sched]))
    with pytest.raises(ValueError):
        first.cores[0, 0] = 0

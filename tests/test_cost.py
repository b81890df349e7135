"""Rental prices: every shipped GPU profile has one with its source, an estimate turns it into
dollars per million tokens, and ``compare`` ranks candidates by it."""

import dataclasses
import json

import pytest
from inprocess import run_planner

import hardware_profiles
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.hardware import GPU
from planner import compare

JOB = Job(global_batch_size=512, seq_len=8192)
CFG = ParallelConfig(dp=64, zero_stage=3)


#: GPUs no public price list rents on demand; each profile says so in a comment.
UNPRICED = {"h800", "h20", "mi325x"}


def test_every_gpu_profile_has_a_sourced_price() -> None:
    for name in hardware_profiles.names("gpus"):
        data = hardware_profiles.load("gpus", name)
        price = data.get("price")
        if name in UNPRICED:
            assert price is None and GPU.preset(name).usd_per_gpu_hour is None, name
            text = (hardware_profiles._folder("gpus") / f"{name}.toml").read_text()
            assert "# No [price]: No public on-demand list price was found" in text, name
            continue
        assert isinstance(price, dict), name
        assert 0.5 < price["usd_per_gpu_hour"] < 50, name
        assert price["source"] and price["url"].startswith("https://"), name
        assert GPU.from_profile(data).usd_per_gpu_hour == price["usd_per_gpu_hour"]


def test_bad_price_is_named() -> None:
    data = hardware_profiles.load("gpus", "h100-sxm")
    for bad in ({"usd_per_gpu_hour": "cheap"}, {"usd_per_gpu_hour": True}, {},
                {"usd_per_gpu_hour": -1.0}, {"usd_per_gpu_hour": float("nan")},
                {"usd_per_gpu_hour": float("inf")}):
        with pytest.raises(SpecError, match=r"\[price\] usd_per_gpu_hour .* must be a finite "
                           r"number in \(0, 10000\]"):
            GPU.from_profile({**data, "price": bad})


def test_dollars_per_million_tokens() -> None:
    model = ModelSpec.preset("llama-3-8b")
    cluster = Cluster(gpu="h100-sxm", num_nodes=8, gpus_per_node=8)
    est = estimate(model, cluster, JOB, CFG)
    # AWS p5.48xlarge on demand, $55.04/h for 8 H100 (hardware_profiles/gpus/h100-sxm.toml):
    # 64 GPUs for one step, over the step's 512 x 8192 tokens.
    expected = 55.04 / 8 / 3600 * 64 * est.step_time_s / (512 * 8192) * 1e6
    assert est.usd_per_million_tokens == pytest.approx(expected, rel=1e-12)
    assert est.to_dict()["usd_per_million_tokens"] == est.usd_per_million_tokens
    assert "per million tokens" in est.summary()
    unpriced = dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu,
                                                                    usd_per_gpu_hour=None))
    bare = estimate(model, unpriced, JOB, CFG)
    assert bare.usd_per_million_tokens is None and bare.step_time_s == est.step_time_s
    assert "per million tokens" not in bare.summary()


def test_compare_ranks_by_cost_and_by_throughput() -> None:
    model = ModelSpec.preset("llama-3-8b")
    h100 = Cluster(gpu="h100-sxm", num_nodes=8, gpus_per_node=8)
    unpriced = dataclasses.replace(h100, gpu=dataclasses.replace(h100.gpu, name="mine",
                                                                 usd_per_gpu_hour=None))
    clusters = [Cluster(gpu=g, num_nodes=8, gpus_per_node=8)
                for g in ("a100-80gb", "h200", "b200")] + [unpriced]
    cmp = compare(model, clusters, JOB, ["dp=64 zero=3", "tp=3"])  # tp=3: cannot run
    by_cost = cmp.ranked("cost").candidates
    costs = [c.estimate.usd_per_million_tokens for c in by_cost if c.estimate is not None]
    assert costs[:3] == sorted(costs[:3]) and costs[3] is None  # unpriced after priced
    assert all(c.estimate is None for c in by_cost[4:]) and len(by_cost) == 8
    by_speed = cmp.ranked("throughput").candidates
    speeds = [c.estimate.tokens_per_s for c in by_speed[:4]]
    assert speeds == sorted(speeds, reverse=True)
    assert "$/Mtok" in cmp.table()
    with pytest.raises(SpecError, match="rank by"):
        cmp.ranked("price")


def test_cli_compare_rank_by_cost() -> None:
    r = run_planner("compare", "--model", "llama-3-8b", "--gpus", "64", "--gpu", "h100-sxm",
                    "--gpu", "h200", "--gpu", "a100-80gb", "--global-batch-size", "512",
                    "--seq-len", "8192", "--config", "dp=64 zero=3", "--rank-by", "cost",
                    "--json")
    assert r.returncode == 0, r.stderr
    costs = [c["estimate"]["usd_per_million_tokens"]
             for c in json.loads(r.stdout)["candidates"]]
    assert costs == sorted(costs) and len(costs) == 3

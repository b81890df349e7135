"""The host's launch time as a floor under Megatron-LM's MoE layers (steptime.host_floor).

Megatron-LM's token dispatchers wait on the host for each MoE layer's routing counts, so a
layer takes at least the host's time to launch it: hardware_profiles/software.toml [host]
megatron_moe_layer_ms, 8.8 ms per layer and micro-batch as measured on NVIDIA's
Megatron-Bridge 26.02 Qwen3-30B-A3B run on 8 DGX-B200 at micro-batch 1 (9,691 tokens/s per
GPU: NVIDIA-NeMo/Megatron-Bridge@067f987d docs/performance-summary-archive.md).
"""

from __future__ import annotations

import dataclasses

import pytest
from inprocess import run_planner

import hardware_profiles
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from planner import timeline

MOE = ModelSpec.preset("qwen3-30b-a3b")  # 48 MoE layers
B200 = Cluster.preset("dgx-b200", num_nodes=1)
# The published run's job and layout: 8 GPUs, EP8, micro-batch 1, global batch 512.
JOB = Job(global_batch_size=512, seq_len=4096, framework="megatron", precision="fp8",
          float8_recipe="mxfp8", moe_load_imbalance=1.0)
RUN = ParallelConfig(dp=8, ep=8, zero_stage=1, micro_batch_size=1)
PER_LAYER = float(hardware_profiles.load_software()["host"]["megatron_moe_layer_ms"]) * 1e-3


def test_the_published_host_bound_run_takes_its_layers_host_time() -> None:
    e = estimate(MOE, B200, JOB, RUN)
    bd = e.time_breakdown_s
    m = e.num_micro_batches
    assert m == 64
    assert bd["host"] > 0.3 * e.step_time_s  # the GPU's own work is about half of it
    after = bd["dp_comm"] + bd["optimizer"] + bd["offload"]
    assert e.step_time_s - after == pytest.approx(m * 48 * PER_LAYER, rel=1e-9)
    terms = sum(x for k, x in bd.items() if not k.endswith("_total"))
    assert terms == pytest.approx(e.step_time_s)
    # 9,691 tokens/s per GPU published; the planner's GPU work alone gave about 20,500.
    tokens = JOB.global_batch_size * JOB.seq_len / 8 / e.step_time_s
    assert tokens == pytest.approx(9691, rel=0.05)
    assert timeline(MOE, B200, JOB, RUN).makespan == pytest.approx(e.step_time_s - after,
                                                                   rel=1e-9)


def test_larger_micro_batches_are_gpu_bound() -> None:
    e = estimate(MOE, B200, JOB, dataclasses.replace(RUN, micro_batch_size=8))
    assert e.time_breakdown_s["host"] == 0.0
    slow = estimate(MOE, B200, JOB, RUN)
    assert e.step_time_s < 0.7 * slow.step_time_s


@pytest.mark.parametrize(("model", "framework"), [
    (MOE, "torchtitan"),  # its host time is not measured
    (ModelSpec.preset("llama-3-8b"), "megatron"),  # no MoE layer waits on the host
])
def test_no_floor_where_no_layer_waits_on_the_host(model: ModelSpec, framework: str) -> None:
    job = Job(global_batch_size=512, seq_len=4096, framework=framework)
    config = dataclasses.replace(RUN, zero_stage=3 if framework == "torchtitan" else 1,
                                 ep=8 if model.is_moe else 1)
    assert estimate(model, B200, job, config).time_breakdown_s["host"] == 0.0


def test_overlapped_pairs_do_not_take_a_stage_below_its_host_time() -> None:
    comb = dataclasses.replace(RUN, pipeline_schedule="combined-1f1b")
    a, c = estimate(MOE, B200, JOB, RUN), estimate(MOE, B200, JOB, comb)
    # Combined 1F1B hides expert all-to-alls behind compute, but the host still launches
    # every layer: the step does not drop below it.
    floor = c.num_micro_batches * 48 * PER_LAYER
    pipeline = c.step_time_s - c.time_breakdown_s["dp_comm"] - c.time_breakdown_s["optimizer"]
    assert pipeline == pytest.approx(floor, rel=1e-9)
    assert c.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)
    assert timeline(MOE, B200, JOB, comb).makespan == pytest.approx(pipeline, rel=1e-9)
    # Without the floor the pairs would have saved time: the GPU work alone is below it.
    assert c.time_breakdown_s["host"] > 0


@pytest.mark.parametrize(("mbs", "bound"), [("1", True), ("8", False)])
def test_the_estimate_says_when_it_is_host_bound(mbs: str, bound: bool) -> None:
    out = run_planner("estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200",
                      "--num-nodes", "1", "--global-batch-size", "512", "--seq-len", "4096",
                      "--framework", "megatron", "--dp", "8", "--ep", "8", "--zero", "1",
                      "--micro-batch-size", mbs)
    assert out.returncode == 0, out.stderr
    assert ("host     host-bound:" in out.stdout) is bound

"""Bad input raises SpecError whose message names the offending values (and what is allowed)."""

from __future__ import annotations

import re

import pytest

from planner import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return ModelSpec.preset("llama-3-8b")


@pytest.fixture(scope="module")
def mixtral() -> ModelSpec:
    return ModelSpec.preset("mixtral-8x7b")


@pytest.fixture(scope="module")
def node() -> Cluster:
    return Cluster.preset("dgx-h100", num_nodes=1)


def job(framework: str = "torchtitan", **kw: object) -> Job:
    return Job(global_batch_size=kw.pop("global_batch_size", 64), seq_len=2048,
               framework=framework, **kw)


# ------------------------------------------------------------------- against model/cluster/job
def test_degrees_must_multiply_to_the_gpu_count(llama: ModelSpec, node: Cluster) -> None:
    with pytest.raises(SpecError, match=r"3\*2\*1\*1 = 6 but the cluster has 8 GPUs"):
        estimate(llama, node, job(), ParallelConfig(dp=3, tp=2))


def test_heads_not_divisible_by_tp(node: Cluster) -> None:
    m = ModelSpec(num_layers=12, hidden_size=768, num_heads=12, vocab_size=50257)
    with pytest.raises(SpecError, match=r"tp=8 does not divide num_heads=12"):
        estimate(m, node, job(), ParallelConfig(tp=8))


def test_fewer_layers_than_pipeline_stages(node: Cluster) -> None:
    m = ModelSpec(num_layers=4, hidden_size=1024, num_heads=16, vocab_size=32000)
    with pytest.raises(SpecError, match=r"has 4 layers, fewer than pp\*virtual stages = 8"):
        estimate(m, node, job(), ParallelConfig(pp=8))


def test_global_batch_not_divisible_by_dp_times_micro_batch(llama: ModelSpec,
                                                            node: Cluster) -> None:
    with pytest.raises(SpecError, match=r"global_batch_size=20 is not divisible by "
                                        r"dp\*micro_batch_size = 4\*2"):
        estimate(llama, node, job(global_batch_size=20),
                 ParallelConfig(dp=4, tp=2, micro_batch_size=2))


def test_tp_larger_than_a_node(llama: ModelSpec) -> None:
    small_nodes = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=4)
    with pytest.raises(SpecError, match=r"tp=8 exceeds the 4 GPUs of a node"):
        estimate(llama, small_nodes, job(), ParallelConfig(tp=8))


def test_expert_parallel_on_a_dense_model(llama: ModelSpec, node: Cluster) -> None:
    with pytest.raises(SpecError, match=r"ep=2 needs a mixture-of-experts model; llama-3-8b"):
        estimate(llama, node, job(), ParallelConfig(dp=8, ep=2))


def test_ep_not_dividing_num_experts(mixtral: ModelSpec) -> None:
    twelve = Cluster(gpu="h100-sxm", num_nodes=3, gpus_per_node=4)
    with pytest.raises(SpecError, match=r"ep=3 does not divide num_experts=8"):
        estimate(mixtral, twelve, job(global_batch_size=12), ParallelConfig(dp=12, ep=3))


@pytest.mark.parametrize(("framework", "zero", "pp", "pattern"), [
    ("torchtitan", 1, 1, r"framework='torchtitan' cannot run zero_stage=1"),
    ("megatron", 2, 1, r"framework='megatron' cannot run zero_stage=2"),
    ("deepspeed", 2, 2,
     r"framework='deepspeed' cannot combine pipeline parallel \(pp=2\) with zero_stage=2"),
])
def test_zero_stage_the_framework_lacks(llama: ModelSpec, node: Cluster, framework: str,
                                        zero: int, pp: int, pattern: str) -> None:
    cfg = ParallelConfig(dp=8 // pp, pp=pp, zero_stage=zero)
    with pytest.raises(SpecError, match=pattern):
        estimate(llama, node, job(framework), cfg)


def test_param_offload_needs_zero3_on_deepspeed(llama: ModelSpec, node: Cluster) -> None:
    cfg = ParallelConfig(dp=8, zero_stage=1, offload="optimizer+params")
    with pytest.raises(SpecError, match=r"offload='optimizer\+params' with "
                                        r"framework='deepspeed' needs zero_stage >= 3"):
        estimate(llama, node, job("deepspeed"), cfg)


def test_offload_needs_the_distributed_optimizer_on_megatron(llama: ModelSpec,
                                                             node: Cluster) -> None:
    cfg = ParallelConfig(dp=8, zero_stage=0, offload="optimizer")
    with pytest.raises(SpecError, match=r"offload='optimizer' with framework='megatron' "
                                        r"needs zero_stage >= 1"):
        estimate(llama, node, job("megatron"), cfg)


def test_bf16_on_a_v100(llama: ModelSpec) -> None:
    v100 = Cluster(gpu="v100-32gb", num_nodes=1, gpus_per_node=8)
    with pytest.raises(SpecError, match=r"v100-32gb has no bf16 support"):
        estimate(llama, v100, job(precision="bf16"), ParallelConfig(dp=8))


def test_estimate_rejects_wrong_types(llama: ModelSpec, node: Cluster) -> None:
    with pytest.raises(SpecError, match=r"model must be a ModelSpec or LayerCosts, got dict"):
        estimate(llama.to_dict(), node, job(), ParallelConfig(dp=8))  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"config must be a ParallelConfig, got dict"):
        estimate(llama, node, job(), {"dp": 8})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- ParallelConfig
@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"pp": 2, "virtual_pipeline_stages": 2, "pipeline_schedule": "gpipe"},
     r"virtual_pipeline_stages=2 needs pipeline_schedule='interleaved-1f1b' \(got 'gpipe'\)"),
    ({"recompute": "selective", "recompute_num_layers": 2},
     r"recompute_num_layers=2 needs recompute='full' \(got 'selective'\)"),
    ({"sequence_parallel": True, "tp": 1}, r"sequence_parallel needs tp >= 2, got tp=1"),
    ({"dp": 8, "zero_stage": 1, "sharding_group": 3}, r"sharding_group=3 must divide dp=8"),
    ({"zero_stage": 5}, r"zero_stage must be 0, 1, 2 or 3, got 5"),
    ({"dp": 0}, r"ParallelConfig\.dp must be a positive integer, got 0"),
    ({"pp": 2, "stage_layers": (10, 12, 10)}, r"stage_layers has 3 entries but pp=2"),
], ids=["vpp-gpipe", "recompute-layers", "sp-tp1", "sharding-group", "zero5", "dp0",
        "stage-layers"])
def test_parallel_config_rejects(kwargs: dict, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        ParallelConfig(**kwargs)


def test_schedule_resolution() -> None:
    assert ParallelConfig(virtual_pipeline_stages=3, pp=8, tp=8).pipeline_schedule == \
        "interleaved-1f1b"
    assert ParallelConfig().pipeline_schedule == "1f1b"
    assert ParallelConfig(pp=4).pipeline_schedule == "1f1b"


# -------------------------------------------------------------------------------------- Job
@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("precision", "fp9", "bf16, fp16, fp8, nvfp4, mxfp4, fp32"),
    ("optimizer", "lion", "adamw, adam, adam8bit, sgd, adafactor"),
    ("framework", "jax", "megatron, deepspeed, torchtitan"),
])
def test_job_lists_allowed_values(key: str, value: str, allowed: str) -> None:
    pattern = re.escape(f"Job.{key}={value!r} is not one of: {allowed}")
    with pytest.raises(SpecError, match=pattern):
        Job(global_batch_size=8, seq_len=1024, **{key: value})


def test_job_overlap_flags_must_be_booleans() -> None:
    with pytest.raises(SpecError, match=r"Job\.overlap_tp_grad_comm must be true or false"):
        Job(global_batch_size=8, seq_len=1024, overlap_tp_grad_comm="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- preset names
def test_unknown_model_preset_suggests_the_close_one() -> None:
    with pytest.raises(SpecError, match=r"unknown model 'llama-3-80b'\. Did you mean .*"
                                        r"'llama-3-70b'") as info:
        ModelSpec.preset("llama-3-80b")
    assert "Known models:" in str(info.value)


def test_unknown_cluster_preset_suggests_selene() -> None:
    with pytest.raises(SpecError, match=r"unknown cluster 'selen'\. Did you mean 'selene'\?"):
        Cluster.preset("selen")


def test_unknown_gpu_lists_known_gpus() -> None:
    with pytest.raises(SpecError, match=r"unknown gpu 'h100'\..*Known gpus: .*h100-sxm") as info:
        Cluster(gpu="h100")
    for name in ("a100-80gb", "h100-pcie", "v100-32gb"):
        assert name in str(info.value)

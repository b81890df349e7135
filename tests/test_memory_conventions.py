"""Each trainer's bytes per parameter, offload, ZeRO/HSDP sharding, pipeline placement."""

import pytest

from planner import Cluster, Job, ModelSpec, ParallelConfig, estimate

MODEL = ModelSpec.preset("llama-3-8b")
CLUSTER = Cluster.preset("dgx-h100", num_nodes=2)  # 16 GPUs


def _states_per_param(framework: str, dp: int = 16, **cfg) -> float:
    job = Job(global_batch_size=64, seq_len=1024, framework=framework)
    est = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=dp, **cfg))
    return est.memory.model_states_bytes / MODEL.num_params()


def test_megatron_bytes_per_parameter() -> None:
    # Megatron-LM docs (distributed optimizer): bf16 params with fp32 grads keep 18 bytes per
    # parameter, and 6 + 12/d with the distributed optimizer; fp16: 20 and 4 + 16/d.
    assert _states_per_param("megatron") == pytest.approx(18)
    assert _states_per_param("megatron", zero_stage=1) == pytest.approx(6 + 12 / 16)
    job = Job(global_batch_size=64, seq_len=1024, framework="megatron", precision="fp16")
    est = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=16, zero_stage=1))
    assert est.memory.model_states_bytes / MODEL.num_params() == pytest.approx(4 + 16 / 16)


def test_deepspeed_bytes_per_parameter() -> None:
    # Rajbhandari et al. 2020, Sec. 3.1 / Fig. 1: (2 + 2 + K) psi, K = 12, sharded by stage.
    assert _states_per_param("deepspeed") == pytest.approx(16)
    assert _states_per_param("deepspeed", zero_stage=1) == pytest.approx(4 + 12 / 16)
    assert _states_per_param("deepspeed", zero_stage=2) == pytest.approx(2 + 14 / 16)
    assert _states_per_param("deepspeed", zero_stage=3) == pytest.approx(16 / 16)


def test_torchtitan_fsdp_bytes_per_parameter() -> None:
    # FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 sharded
    # parameters and gradients plus Adam's two fp32 states, 16 bytes per parameter, all
    # sharded; DDP keeps them whole plus the bf16 copies autocast saves for backward.
    assert _states_per_param("torchtitan", zero_stage=3) == pytest.approx(16 / 16)
    assert _states_per_param("torchtitan") == pytest.approx(16 + 2)


def test_optimizers() -> None:
    def opt_bytes(optimizer: str) -> float:
        job = Job(global_batch_size=16, seq_len=1024, framework="deepspeed", optimizer=optimizer)
        est = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=16))
        return est.memory.optimizer_bytes / MODEL.num_params()

    # fp32 master (4) plus: Adam 8; 8-bit Adam 2 (+ block absmax); SGD momentum 4.
    assert opt_bytes("adamw") == pytest.approx(12)
    assert opt_bytes("adam8bit") == pytest.approx(6, abs=0.05)
    assert opt_bytes("sgd") == pytest.approx(8)
    assert 4 < opt_bytes("adafactor") < 4.01


def test_hsdp_sharding_group() -> None:
    full = _states_per_param("torchtitan", zero_stage=3)
    hybrid = _states_per_param("torchtitan", zero_stage=3, sharding_group=8)
    assert hybrid == pytest.approx(16 / 8) and full == pytest.approx(16 / 16)


def test_offload_params_moves_states_to_cpu() -> None:
    job = Job(global_batch_size=64, seq_len=1024, framework="deepspeed")
    base = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=16, zero_stage=3))
    off = estimate(MODEL, CLUSTER, job,
                   ParallelConfig(dp=16, zero_stage=3, offload="optimizer+params"))
    assert off.memory.model_states_bytes == 0
    assert off.cpu_memory_bytes == pytest.approx(base.memory.model_states_bytes)
    assert off.memory.buffers_bytes == pytest.approx(base.memory.buffers_bytes)


def test_embedding_and_head_sit_on_first_and_last_stage() -> None:
    job = Job(global_batch_size=64, seq_len=1024, framework="megatron")
    est = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=4, pp=4))
    emb = [s.embedding_params for s in est.stages]
    v, h = MODEL.vocab_size, MODEL.hidden_size
    assert emb[0] == pytest.approx(v * h)
    assert emb[1] == emb[2] == 0
    assert emb[3] == pytest.approx(v * h + h)  # untied LM head and the final RMSNorm
    assert est.peak_stage == 0  # first stage: embedding and p micro-batches in flight


def test_uneven_layers_go_to_later_stages() -> None:
    model = ModelSpec(num_layers=10, hidden_size=256, num_heads=4, vocab_size=1000)
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=4)
    job = Job(global_batch_size=8, seq_len=128)
    est = estimate(model, cluster, job, ParallelConfig(pp=4))
    assert [s.num_layers for s in est.stages] == [2, 2, 3, 3]
    fixed = estimate(model, cluster, job, ParallelConfig(pp=4, stage_layers=(1, 3, 3, 3)))
    assert [s.num_layers for s in fixed.stages] == [1, 3, 3, 3]


def test_moe_expert_parallel_shards_experts() -> None:
    moe = ModelSpec.preset("mixtral-8x7b")
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    cluster = Cluster.preset("dgx-h100", num_nodes=4)
    e1 = estimate(moe, cluster, job, ParallelConfig(dp=8, tp=4, zero_stage=1))
    e8 = estimate(moe, cluster, job, ParallelConfig(dp=8, tp=4, ep=8, zero_stage=1))
    routed = moe.num_moe_layers * moe.routed_expert_params() / 4
    assert e1.stages[0].layer_params - e8.stages[0].layer_params == pytest.approx(routed * 7 / 8)


def test_context_parallel_divides_activations() -> None:
    job = Job(global_batch_size=8, seq_len=32768, framework="torchtitan")
    cluster = Cluster.preset("dgx-h100", num_nodes=1)
    a1 = estimate(MODEL, cluster, job, ParallelConfig(dp=8, zero_stage=3))
    a4 = estimate(MODEL, cluster, job, ParallelConfig(dp=2, cp=4, zero_stage=3))
    assert a4.stages[0].layer_activations_bytes == pytest.approx(
        a1.stages[0].layer_activations_bytes / 4)


def test_first_n_layer_recompute_is_between_none_and_full() -> None:
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    acts = {}
    for rc, n in (("none", None), ("full", 2), ("full", None)):
        cfg = ParallelConfig(dp=4, tp=4, recompute=rc, recompute_num_layers=n)
        acts[(rc, n)] = estimate(MODEL, CLUSTER, job, cfg).stages[0].layer_activations_bytes
    per_none = acts[("none", None)] / 32
    per_full = acts[("full", None)] / 32
    assert acts[("full", 2)] == pytest.approx(2 * per_full + 30 * per_none)


def test_fp8_saves_linear_inputs_in_one_byte() -> None:
    cluster = Cluster.preset("dgx-h100", num_nodes=1)
    b = estimate(MODEL, cluster, Job(global_batch_size=8, seq_len=4096, framework="megatron"),
                 ParallelConfig(dp=8))
    f = estimate(MODEL, cluster, Job(global_batch_size=8, seq_len=4096, framework="megatron",
                                     precision="fp8"), ParallelConfig(dp=8))
    assert f.stages[0].layer_activations_bytes < b.stages[0].layer_activations_bytes
    assert f.memory.optimizer_bytes == b.memory.optimizer_bytes


def test_distributed_saved_activations_keep_a_tp_slice_of_each_layer_input() -> None:
    # Megatron-LM --distribute-saved-activations (CheckpointFunction splits the saved layer
    # input over the TP group and all-gathers it before recomputing): under full recompute
    # without SP each rank keeps 1/tp of the 2sbh bytes per layer, and the backward gathers
    # it once per recomputed layer. Ignored with SP (the input is already split).
    cluster = Cluster.preset("dgx-h100", num_nodes=1)
    cfg = ParallelConfig(dp=1, tp=8, recompute="full", micro_batch_size=2)
    plain = Job(global_batch_size=8, seq_len=4096, framework="megatron")
    dist = Job(global_batch_size=8, seq_len=4096, framework="megatron",
               distribute_saved_activations=True)
    a, b = estimate(MODEL, cluster, plain, cfg), estimate(MODEL, cluster, dist, cfg)
    saved = 2 * 4096 * 2 * MODEL.hidden_size * MODEL.num_layers  # bf16 inputs, all layers
    in_flight = a.stages[0].in_flight_micro_batches
    assert (a.memory.activations_bytes - b.memory.activations_bytes) == pytest.approx(
        saved * (1 - 1 / 8) * in_flight, rel=1e-9)
    assert b.time_breakdown_s["tp_comm"] > a.time_breakdown_s["tp_comm"]
    sp = ParallelConfig(dp=1, tp=8, recompute="full", micro_batch_size=2, sequence_parallel=True)
    assert estimate(MODEL, cluster, dist, sp).to_dict() == estimate(MODEL, cluster, plain,
                                                                    sp).to_dict()

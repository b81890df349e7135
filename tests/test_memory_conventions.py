"""Each trainer's bytes per parameter, offload, ZeRO/HSDP sharding, pipeline placement."""

import pytest

from planner import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate

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


def _llama_layer_kept(compile: bool, recompute: str, precision: str = "bf16",
                      mbs: int = 1) -> float:
    """Bytes one Llama 3 8B layer keeps under torchtitan, one GPU, 8192 tokens a sequence."""
    job = Job(global_batch_size=mbs, seq_len=8192, framework="torchtitan", compile=compile,
              precision=precision)
    cfg = ParallelConfig(dp=1, micro_batch_size=mbs, recompute=recompute, zero_stage=3)
    est = estimate(MODEL, Cluster.preset("dgx-h100", num_nodes=1, gpus_per_node=1), job, cfg)
    return est.stages[0].layer_activations_bytes / MODEL.num_layers


def test_torchtitan_op_sac_keeps_what_was_measured() -> None:
    # Measured on an H200 (benchmarks/data/op-sac-h200-2026-11-27.json, torch 2.11,
    # benchmarks/op_sac_memory.py): torchtitan's per-op selective AC on Llama 3 8B's layer
    # keeps 497.0 MiB per layer eager and 433.0 MiB compiled (the second MLP matmul's output
    # is only read by the residual add, so the compiled graph does not keep it); full
    # recompute 64.0 MiB; twice that at two sequences.
    mib = 2.0 ** 20
    assert _llama_layer_kept(False, "selective") / mib == pytest.approx(497.0, rel=1e-3)
    assert _llama_layer_kept(True, "selective") / mib == pytest.approx(433.0, rel=1e-3)
    assert _llama_layer_kept(True, "selective", mbs=2) / mib == pytest.approx(866.0, rel=1e-3)
    assert _llama_layer_kept(True, "full") / mib == pytest.approx(64.0, rel=1e-3)


def test_torchao_float8_keeps_what_bf16_keeps() -> None:
    # torchtitan's per-op SAC policy sees a Float8Linear's matmul as aten.mm (the subclass
    # dispatch runs below the policy's mode), and torchao keeps the bf16 input for backward:
    # float8 and bf16 peaks were published equal (torchtitan benchmarks 202412: 61.8 vs 62.0
    # GiB; torchao float8 README: 47.77 vs 47.65 GiB).
    for compile in (False, True):
        for rc in ("none", "selective", "full"):
            assert _llama_layer_kept(compile, rc, "fp8") == _llama_layer_kept(compile, rc)


def test_compiled_loss_keeps_the_bf16_logits() -> None:
    # torchtitan compiles its loss with the model from April 2025 (loss_kind "compiled"):
    # it keeps the 2-byte logits and holds 1.5 more bytes per logit at its peak (measured,
    # software.toml [torch_compile]), where the eager F.cross_entropy(logits.float()) keeps
    # its 4-byte log-softmax and holds 8 more.
    cluster = Cluster.preset("dgx-h100", num_nodes=1)
    cfg = ParallelConfig(dp=8, zero_stage=3, recompute="full")
    peaks = {}
    for compile_loss in (False, True):
        job = Job(global_batch_size=8, seq_len=8192, framework="torchtitan", compile=True,
                  compile_loss=compile_loss)
        peaks[compile_loss] = estimate(MODEL, cluster, job, cfg).peak_memory_bytes
    logits = 8192 * MODEL.vocab_size
    assert peaks[False] - peaks[True] == pytest.approx((4 + 8 - 2 - 1.5) * logits, rel=1e-6)
    default = Job(global_batch_size=8, seq_len=8192, framework="torchtitan", compile=True)
    assert estimate(MODEL, cluster, default, cfg).peak_memory_bytes == peaks[True]


def test_megatron_gradients_in_bf16_when_asked() -> None:
    # NeMo's distributed_fused_adam with grad_sync_dtype bf16 keeps 2-byte gradients where
    # Megatron-LM's bf16 default keeps fp32 main gradients (6 + 12/d with the distributed
    # optimizer, Megatron-LM docs).
    job = Job(global_batch_size=64, seq_len=1024, framework="megatron",
              grad_reduce_in_fp32=False)
    est = estimate(MODEL, CLUSTER, job, ParallelConfig(dp=16, zero_stage=1))
    assert est.memory.model_states_bytes / MODEL.num_params() == pytest.approx(4 + 12 / 16)
    with pytest.raises(SpecError, match="grad_reduce_in_fp32"):
        Job(global_batch_size=64, seq_len=1024, grad_reduce_in_fp32="no")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="compile_loss"):
        Job(global_batch_size=64, seq_len=1024, compile_loss=1)  # type: ignore[arg-type]


def test_sac_policy_sees_a_tensor_subclass_matmul_as_mm() -> None:
    # The premise of test_torchao_float8_keeps_what_bf16_keeps: a selective-checkpoint
    # policy (a dispatch mode) sees the matmul of a tensor subclass, such as torchao's float8
    # tensors, as aten.mm, whatever kernel the subclass then runs for it.
    torch = pytest.importorskip("torch")
    from functools import partial

    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    class Wrapped(torch.Tensor):
        @staticmethod
        def __new__(cls, data):  # type: ignore[no-untyped-def]
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)

        def __init__(self, data):  # type: ignore[no-untyped-def]
            self.data_ = data

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            a, b = args
            return torch.ops.aten.addmm.default(torch.zeros(()), a.data_, b.data_)

    seen: list[object] = []

    def policy(ctx, func, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(func)
        return CheckpointPolicy.PREFER_RECOMPUTE

    def block(x, w):  # type: ignore[no-untyped-def]
        return torch.mm(Wrapped(x.sin()), Wrapped(w)).cos()

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3)
    checkpoint(block, x, w, use_reentrant=False,
               context_fn=partial(create_selective_checkpoint_contexts, policy))
    assert torch.ops.aten.mm.default in seen
    assert torch.ops.aten.addmm.default not in seen

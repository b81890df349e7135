"""The physics the published runs pointed at, and the uncertainty band every estimate carries."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.fitting.uncertainty import band_for, band_key, model_key
from costmodel.formulas.compute import layer_compute
from costmodel.formulas.eager import EAGER_RMSNORM_BYTES, eager_bytes
from costmodel.formulas.memory import ConfigArrays, memory_table
from costmodel.hardware import GPU
from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
LLAMA8 = ModelSpec.preset("llama-3-8b")
H100 = Cluster.preset("dgx-h100", num_nodes=1)


def _job(fw: str = "torchtitan", **kw: object) -> Job:
    return Job(global_batch_size=16, seq_len=8192, framework=fw, **kw)


def test_torchtitans_per_op_selective_ac_keeps_what_its_policy_saves() -> None:
    # torchtitan's "op" selective AC saves the block input, the outputs of wq, wv, w1, w2 and
    # the attention kernel (O and its fp32 log-sum-exp), and recomputes wk, wo, w3 and every
    # memory-bound op (torchtitan/models/llama3/infra/parallelize.py, _apply_ac_to_block).
    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    a = ConfigArrays.from_configs(LLAMA8, [cfg])
    tt = memory_table(LLAMA8, H100, _job(), a).layer_activations[0, 0] / LLAMA8.num_layers
    tokens = 2 * 8192
    h, q, kv, f = 4096, 4096, 1024, 14336
    expected = tokens * (2 * h + 2 * (2 * q + kv) + 4 * 32 + 2 * (f + h))
    assert tt == pytest.approx(expected)
    # Megatron-LM's selective recompute (Korthikanti et al. 2022) keeps far more: the MLP's
    # inner tensors and every norm input.
    mg = memory_table(LLAMA8, H100, _job("megatron"), a).layer_activations[0, 0] \
        / LLAMA8.num_layers
    assert mg > 2 * tt
    # ... and torchtitan re-runs those matmuls in backward: wk + wo + w3 of the forward.
    lc = layer_compute(LLAMA8, H100.gpu, _job(), np.array([1]), np.array([1]), np.array([2]),
                       np.array([0]), moe=False)
    assert lc.selective_flops[0] == pytest.approx(2 * tokens * (h * kv + q * h + h * f))
    assert lc.selective[0] > 0


def test_eager_torchtitan_moves_the_bytes_of_unfused_kernels_and_compile_fuses_them() -> None:
    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    eager = estimate(LLAMA8, H100, _job(), cfg)
    compiled = estimate(LLAMA8, H100, _job(compile=True), cfg)
    assert compiled.step_time_s < eager.step_time_s
    extra, kernels = eager_bytes(LLAMA8, np.array([1.0]), np.array([1.0]), np.array([1.0]), 2.0)
    # Two RMSNorms, the complex rotary embedding of q and k, SwiGLU's separate product.
    # RMSNorm eager: 28 + 4e bytes per element against a fused kernel's 2e (e = 2).
    assert extra[0] == pytest.approx(2 * (EAGER_RMSNORM_BYTES + 4.0) * 4096
                                     + 16.0 * (4096 + 1024) + 4.0 * 14336)
    assert kernels == 2 * 7 + 5 + 1
    # Megatron-LM runs fused kernels: compile changes nothing there.
    assert estimate(LLAMA8, H100, _job("megatron", compile=True), cfg).step_time_s == \
        estimate(LLAMA8, H100, _job("megatron"), cfg).step_time_s


def test_torchao_float8_casts_cost_time_and_compile_halves_their_reads() -> None:
    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    bf16 = estimate(LLAMA8, H100, _job(compile=True), cfg)
    fp8 = estimate(LLAMA8, H100, _job(compile=True, precision="fp8"), cfg)
    # Faster, but less than the fp8 peak's 2x: the casts and the bf16 attention remain.
    assert 1.0 < bf16.step_time_s / fp8.step_time_s < 1.6


def test_a_pipeline_keeps_fsdp_gradients_unsharded_until_the_last_micro_batch() -> None:
    # torch.distributed.pipelining turns FSDP's gradient sync off for every backward but the
    # last (stage.py, backward_maybe_with_nosync): the stage's gradients accumulate unsharded
    # in the reduce dtype (fp32), and are reduce-scattered once per step, each FSDP group's
    # into its shard after the last backward (post_backward, group by group): the shards
    # replace what they are made from, so the peak holds the whole gradient, not both.
    model = ModelSpec.preset("llama-3-70b")
    cl = Cluster.preset("dgx-h100", num_nodes=4)
    job = Job(global_batch_size=64, seq_len=4096)
    flat = ParallelConfig(dp=4, tp=8, zero_stage=3, micro_batch_size=1)
    piped = ParallelConfig(dp=2, tp=8, pp=2, zero_stage=3, micro_batch_size=1)
    e_flat = estimate(model, cl, job, flat)
    e_pp = estimate(model, cl, job, piped)
    stage_params = e_pp.stages[0].layer_params + e_pp.stages[0].embedding_params
    assert e_pp.stages[0].memory.gradients_bytes == pytest.approx(4.0 * stage_params, rel=1e-3)
    # Without the pipeline each GPU holds its fp32 shard of a layer's gradient, 1/dp of it:
    # a quarter of the tp-sharded model here against half of it for a stage.
    assert e_flat.memory.gradients_bytes == pytest.approx(
        e_pp.stages[0].memory.gradients_bytes / 2, rel=0.02)


def test_the_500_w_hbm2e_h100_is_its_own_profile() -> None:
    # torchtitan's H100 benchmarks ran on 96 GB HBM2e parts at 500 W
    # (benchmarks/llama3_h100_202412_torchtitan.md, Hardware).
    gpu = GPU.preset("h100-sxm-96gb")
    sxm = GPU.preset("h100-sxm")
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert gpu.architecture == sxm.architecture == "hopper"
    assert gpu.peak_flops("bf16") < sxm.peak_flops("bf16")
    assert gpu.memory_bytes > sxm.memory_bytes


def test_every_estimate_carries_the_band_of_published_runs_like_it() -> None:
    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    est = estimate(LLAMA8, H100, _job(), cfg)
    found = band_for("hopper", "torchtitan", 8, model=model_key(LLAMA8))
    assert found is not None
    assert est.step_time_band == pytest.approx(found[0]) and est.step_time_band > 0
    assert "published runs" in est.step_time_band_basis
    assert f"(± {100 * est.step_time_band:.0f} %)" in est.summary()
    d = est.to_dict()
    assert d["step_time_band"] == est.step_time_band
    # The band is looked up most specific first, broadest last.
    assert band_key("hopper", "torchtitan", 8) == ("hopper/torchtitan/1-8",
                                                   "hopper/torchtitan", "*/torchtitan", "*")
    bands = hardware_profiles.load_file(hardware_profiles.transfer_path())["bands"]
    assert "*" in bands


def test_a_mixture_of_experts_estimate_carries_at_least_the_band_of_published_moe_runs(
) -> None:
    # The fit file's "moe" band is the RMS leave-one-source-out error of the published MoE
    # runs, read back here from the same file's per-run errors.
    from costmodel.fitting.published import default_runs_path, load_runs

    fit = hardware_profiles.load_file(hardware_profiles.transfer_path())
    moe_ids = [r.id for r in load_runs(default_runs_path("published")) if r.model.num_experts]
    logs = [np.log1p(fit["runs"][i]["loso"]) for i in moe_ids]
    band = fit["bands"]["moe"]
    assert band["runs"] == len(moe_ids) >= 8
    assert band["band"] == pytest.approx(np.expm1(np.sqrt(np.mean(np.square(logs)))), abs=1e-3)
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(dp=8, ep=8, zero_stage=1, micro_batch_size=1)
    moe = estimate(ModelSpec.preset("mixtral-8x7b"), H100, job, cfg)
    cell = band_for("hopper", "megatron", 8)
    assert cell is not None and cell[0] < band["band"]
    assert moe.step_time_band == pytest.approx(band["band"])
    assert "mixture-of-experts" in moe.step_time_band_basis
    # A dense model on the same cluster keeps the band of its cell (and of its own shape's
    # runs there, where those were further off).
    dense = estimate(LLAMA8, H100, job, ParallelConfig(dp=8, zero_stage=1, micro_batch_size=1))
    own = band_for("hopper", "megatron", 8, model=model_key(LLAMA8))
    assert own is not None and dense.step_time_band == pytest.approx(own[0])
    assert "mixture-of-experts" not in dense.step_time_band_basis


def _own_runs_band(key: str, cell: str) -> tuple[float, list[float]]:
    """The RMS step-time error (and the errors) of the fit file's runs of shape ``key`` in
    ``cell``, each left out of the fit (leave-one-source-out, or a frontier run's held out)."""
    runs = hardware_profiles.load_file(hardware_profiles.transfer_path())["runs"]
    errs = [v["step"] for v in runs.values()
            if v.get("model") == key and v.get("cell") == cell and "step" in v]
    return float(np.expm1(np.sqrt(np.mean(np.square(np.log1p(errs)))))), errs


def test_a_model_the_fit_misses_more_than_its_cell_carries_the_band_of_its_own_runs() -> None:
    # GPT-OSS-120B under Megatron-Bridge 26.02 on Blackwell (the published runs of
    # costmodel/data/published_runs.json, NVIDIA-NeMo/Megatron-Bridge@067f987d
    # docs/performance-summary-archive.md) ran 1.24-1.81x slower than the planner predicts,
    # further off than the MoE runs' band: a plan of that model says so and widens its band.
    oss = ModelSpec.preset("gpt-oss-120b")
    key = model_key(oss)
    assert key is not None
    own, errs = _own_runs_band(key, "blackwell/megatron")
    # Each predicted step shorter than measured (a step error under 0).
    assert len(errs) >= 2 and max(errs) < 0
    rack = Cluster.preset("gb200-nvl72", num_nodes=16, gpus_per_domain=64)
    job = Job(global_batch_size=1280, seq_len=4096, framework="megatron")
    est = estimate(oss, rack, job, ParallelConfig(dp=64, ep=64, zero_stage=1,
                                                  micro_batch_size=4))
    moe = band_for("blackwell", "megatron", 64, moe=True)
    assert moe is not None and own > moe[0]
    assert est.step_time_band == pytest.approx(own, abs=1e-6)
    basis = est.step_time_band_basis
    assert f"the {len(errs)} published runs of this model's shape on blackwell" in basis
    slowest = max(1 / (1 + e) for e in errs)
    assert f"all ran {min(1 / (1 + e) for e in errs):.2f}x to {slowest:.2f}x slower" in basis
    assert "expect a longer step" in basis
    # The model's Hugging Face config.json is the same model.
    hf = ModelSpec.from_hf_config(ROOT / "tests/data/hf_configs/gpt-oss-120b.json")
    assert model_key(hf) == key
    # One run of the shape in a cell is evidence too: GPT-OSS-120B on 64 H100.
    one, [err] = _own_runs_band(key, "hopper/megatron")
    found = band_for("hopper", "megatron", 64, moe=True, model=key)
    assert found is not None and found[0] == pytest.approx(one, abs=1e-6)
    assert f"error of the one published run of this model's shape on hopper with megatron" \
        f" (1 source), left out of the fit (it ran {1 / (1 + err):.2f}x slower" in found[1]
    # A model whose own runs the fit predicts within its cell's band keeps the cell's band.
    llama70 = ModelSpec.preset("llama-3-70b")
    within, errs70 = _own_runs_band(model_key(llama70) or "", "hopper/torchtitan")
    cell = band_for("hopper", "torchtitan", 64)
    assert cell is not None and errs70 and within < cell[0]
    assert band_for("hopper", "torchtitan", 64, model=model_key(llama70)) == cell


def test_the_fit_file_records_each_runs_shape_and_the_frontier_runs_held_out_errors() -> None:
    from costmodel.fitting.published import default_runs_path, load_runs, predict_run, run_estimate

    runs = hardware_profiles.load_file(hardware_profiles.transfer_path())["runs"]
    shipped = load_runs(default_runs_path("published"))
    assert all(runs[r.id]["model"] == model_key(r.model) for r in shipped)
    frontier = load_runs(default_runs_path("frontier"))
    assert all("held_out" in runs[r.id] and "loso" not in runs[r.id] for r in frontier)
    # A held-out error is the run's error under the shipped fit (planner validate --frontier);
    # its step's error is the figure's where that is a time, else the inverse of the rate's.
    for one in (next(r for r in frontier if r.measure == "iteration_time_s"),
                next(r for r in frontier if r.measure == "tokens_per_s_per_gpu")):
        est = run_estimate(one)
        err = predict_run(one, est) / one.measured - 1.0
        assert runs[one.id]["held_out"] == pytest.approx(err, abs=1e-3)
        measured_step = one.measured if one.measure == "iteration_time_s" else \
            one.job.tokens_per_step / one.measured / one.cluster.num_gpus
        assert runs[one.id]["step"] == pytest.approx(est.step_time_s / measured_step - 1,
                                                     abs=1e-3)


def test_a_models_shape_ignores_its_depth_vocabulary_and_unused_dense_width() -> None:
    oss = ModelSpec.preset("gpt-oss-120b")
    assert model_key(dataclasses.replace(oss, num_layers=4, vocab_size=1000,
                                         ffn_hidden_size=123)) == model_key(oss)
    assert model_key(dataclasses.replace(oss, top_k=2)) != model_key(oss)
    assert model_key(dataclasses.replace(LLAMA8, ffn_hidden_size=123)) != model_key(LLAMA8)
    # A traced module's layers have no such fields: no shape, no runs of it.
    assert model_key(object()) is None
    # An encoder or a vision transformer of a decoder's widths is another model.
    gpt = model_key(ModelSpec.preset("gpt3-350m"))
    assert model_key(ModelSpec.preset("bert-large")) != gpt
    assert model_key(ModelSpec.preset("vit-large-16")) != gpt


def test_validate_names_the_models_whose_own_runs_widen_their_band(
        capsys: pytest.CaptureFixture[str]) -> None:
    from costmodel.fitting.uncertainty import own_bands

    found = {(key, cell): (band, runs, base) for key, cell, band, runs, base in own_bands()}
    oss = model_key(ModelSpec.preset("gpt-oss-120b"))
    band, runs, base = found[(oss, "blackwell/megatron")]
    assert band > base and runs >= 2
    assert band == pytest.approx(_own_runs_band(oss or "", "blackwell/megatron")[0], abs=1e-6)
    # A model whose runs are within its cell's band is not listed (Llama 3 70B under
    # torchtitan on Hopper: test above).
    assert (model_key(ModelSpec.preset("llama-3-70b")), "hopper/torchtitan") not in found
    # What planner validate --summary prints after its mixture-of-experts line, and its
    # --json has as own_bands.
    from planner.accuracy import _print_own_bands, own_band_rows

    rows = own_band_rows()
    assert {"shape": oss, "models": ["gpt-oss-120b"], "cell": "blackwell/megatron",
            "band": band, "runs": runs, "band_without": base} in rows
    _print_own_bands()
    out = capsys.readouterr().out
    assert f"  gpt-oss-120b on blackwell/megatron: ±{100 * band:.0f}% ({runs} runs; " \
        f"±{100 * base:.0f}% without them)" in out


def test_a_fit_written_before_the_run_shapes_widens_no_band_by_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    oss = model_key(ModelSpec.preset("gpt-oss-120b"))
    now = band_for("blackwell", "megatron", 64, moe=True, model=oss)
    text = hardware_profiles.transfer_path().read_text()
    old = tmp_path / "transfer.toml"
    old.write_text(re.sub(r', cell = "[^"]*", source = "[^"]*", model = "[^"]*"', "", text))
    monkeypatch.setattr(hardware_profiles, "transfer_path", lambda: old)
    before = band_for("blackwell", "megatron", 64, moe=True, model=oss)
    assert now is not None and before is not None and before[0] < now[0]
    assert before == band_for("blackwell", "megatron", 64, moe=True)


def test_a_fit_written_before_the_moe_band_leaves_moe_estimates_their_cells_band(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from costmodel.fitting import uncertainty

    text = hardware_profiles.transfer_path().read_text()
    old = tmp_path / "transfer.toml"
    old.write_text("\n".join(line for line in text.splitlines()
                             if not line.startswith("moe = ")) + "\n")
    monkeypatch.setattr(hardware_profiles, "transfer_path", lambda: old)
    assert uncertainty.moe_band() is None
    cell = band_for("hopper", "megatron", 8)
    assert cell is not None and band_for("hopper", "megatron", 8, moe=True) == cell


def test_two_estimates_within_each_others_band_are_called_so() -> None:
    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    a = estimate(LLAMA8, H100, _job(), cfg)
    b = dataclasses.replace(a, step_time_s=a.step_time_s * (1 + a.step_time_band / 2))
    c = dataclasses.replace(a, step_time_s=a.step_time_s * (1 + 2 * a.step_time_band))
    assert a.within_band(b) and b.within_band(a)
    assert not a.within_band(c)


def test_plan_estimate_and_compare_show_the_band(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
            "--global-batch-size", "16", "--seq-len", "8192"]
    assert main(["estimate", *args, "--zero", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["step_time_band"] > 0
    assert main(["plan", *args]) == 0
    assert "%)" in capsys.readouterr().out
    assert main(["compare", *args, "--config", "dp=8 zero=3", "--config",
                 "dp=8 zero=3 recompute=full"]) == 0
    text = capsys.readouterr().out
    assert "(±" in text


def test_a_plan_says_how_many_runners_up_its_band_cannot_tell_apart() -> None:
    from planner.plan import plan

    p = plan(LLAMA8, H100, Job(global_batch_size=16, seq_len=8192), top_k=8)
    band = p.estimate.step_time_band
    close = [a for a in p.runners_up
             if a.step_time_s is not None and a.step_time_s <= p.estimate.step_time_s * (1 + band)]
    assert p.runners_up_within_band() == len(close) > 0
    assert f"{len(close)} of the runners-up" in str(p)
    assert p.to_dict()["runners_up_within_band"] == len(close)


def test_a_fused_cross_entropy_keeps_less_and_the_emitter_says_when_it_differs() -> None:
    # llm-foundry's default loss (flash-attn's fused cross entropy) against torch's
    # F.cross_entropy, which holds a dense fp32 NLL gradient and log-softmax gradient.
    from planner.emit.common import to_framework

    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    torch_ce = estimate(LLAMA8, H100, _job(), cfg)
    fused = estimate(LLAMA8, H100, _job(fused_cross_entropy=True), cfg)
    logits = 2 * 8192 * LLAMA8.vocab_size
    assert torch_ce.memory.buffers_bytes - fused.memory.buffers_bytes == pytest.approx(
        (8.0 - 2.0) * logits)
    assert fused.step_time_s < torch_ce.step_time_s
    # torchtitan's file runs torch's cross entropy: the emitter drops the assumption, loudly.
    ch = to_framework(cfg, _job(fused_cross_entropy=True), "torchtitan", "torchtitan")
    assert ch.job.fused_cross_entropy is None
    assert any("cross entropy" in w for w in ch.warnings)
    with pytest.raises(Exception, match="fused_cross_entropy"):
        _job(fused_cross_entropy="yes")


def test_megatrons_cross_entropy_runs_op_by_op_unless_the_job_fuses_it() -> None:
    # Megatron-LM's vocabulary-parallel cross entropy works in place on one fp32 copy of the
    # logits either way (megatron/core/tensor_parallel/cross_entropy.py); without
    # --cross-entropy-loss-fusion it runs op by op: cast (2 + 4), max (4), subtract, exp and
    # divide in place (8 each), sum (4): 38 bytes a logit in 6 kernels where the fused one
    # moves 14 in 2; in backward the multiply in place and the cast back (8 + 6) against 6.
    from costmodel.formulas.headcompute import lm_head_compute
    from costmodel.formulas.roofline import memory_time
    from planner.emit.common import to_framework
    from planner.emit.megatron import arguments

    gpu = H100.gpu
    rows = (np.array([1]), np.array([1]), np.array([1]), np.array([0]))
    _, op = lm_head_compute(LLAMA8, gpu, _job("megatron"), *rows)
    _, fused = lm_head_compute(LLAMA8, gpu, _job("megatron", fused_cross_entropy=True), *rows)
    logits = 8192 * 128256  # the vocabulary is already a multiple of 128
    assert op.forward[0] - fused.forward[0] == pytest.approx(
        float(memory_time(gpu, 24.0 * logits, 4.0)), rel=1e-9)
    assert op.backward[0] - fused.backward[0] == pytest.approx(
        float(memory_time(gpu, 8.0 * logits, 0.0)), rel=1e-9)
    cfg = ParallelConfig(dp=8, zero_stage=1)
    slow = estimate(LLAMA8, H100, _job("megatron"), cfg)
    fast = estimate(LLAMA8, H100, _job("megatron", fused_cross_entropy=True), cfg)
    assert fast.step_time_s < slow.step_time_s
    assert fast.memory.buffers_bytes == slow.memory.buffers_bytes  # one fp32 copy both ways
    # The emitted Megatron-LM arguments carry the switch when the plan assumes it, and the
    # emitter keeps the assumption (the file runs what the plan priced).
    job = _job("megatron", fused_cross_entropy=True)
    assert "--cross-entropy-loss-fusion" in arguments(LLAMA8, job, cfg)
    assert "--cross-entropy-loss-fusion" not in arguments(LLAMA8, _job("megatron"), cfg)
    ch = to_framework(cfg, job, "megatron", "megatron")
    assert ch.job.fused_cross_entropy is True and not ch.warnings


def test_the_emitter_says_when_the_loss_or_gradient_dtype_differs_from_the_trainers(
        capsys: pytest.CaptureFixture[str]) -> None:
    # torchtitan compiles its loss with the model (from April 2025): a plan that assumed an
    # eager loss under compile is re-estimated with the compiled one; Megatron-LM keeps fp32
    # main gradients with bf16, so a plan with bf16 gradients (NeMo's grad_sync_dtype) is
    # re-estimated with fp32 ones, and one that says fp32 explicitly is left alone.
    from planner.emit.common import to_framework

    cfg = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    ch = to_framework(cfg, _job(compile=True, compile_loss=False), "torchtitan", "torchtitan")
    assert ch.job.compile_loss is None and any("its loss" in w for w in ch.warnings)
    ch = to_framework(cfg, _job(compile=True, compile_loss=True), "torchtitan", "torchtitan")
    assert ch.job.compile_loss is True and not any("its loss" in w for w in ch.warnings)
    # NeMo AutoModel's 16-bit cross entropy (Job.loss_upcast off) is no file's: torchtitan's
    # loss casts the logits to fp32 (pred.float()).
    ch = to_framework(cfg, _job(loss_upcast=False), "torchtitan", "torchtitan")
    assert ch.job.loss_upcast and any("16-bit loss" in w for w in ch.warnings)
    mcfg = ParallelConfig(dp=8, zero_stage=1)
    ch = to_framework(mcfg, _job("megatron", grad_reduce_in_fp32=False), "megatron",
                      "megatron")
    assert ch.job.grad_reduce_in_fp32 is None and any("main gradients" in w
                                                       for w in ch.warnings)
    ch = to_framework(mcfg, _job("megatron", grad_reduce_in_fp32=True), "megatron", "megatron")
    assert ch.job.grad_reduce_in_fp32 is True and not ch.warnings
    # and the command line sets both
    def peak(*flags: str) -> float:
        assert main(["estimate", "--model", "llama-3-8b", "--gpus", "8",
                     "--global-batch-size", "16", "--seq-len", "8192", "--json", *flags]) == 0
        return float(json.loads(capsys.readouterr().out)["estimate"]["peak_memory_bytes"])

    tt = ("--compile", "--zero", "3")
    assert peak(*tt, "--no-compile-loss") > peak(*tt)
    mg = ("--framework", "megatron", "--zero", "1")
    assert peak(*mg, "--no-grad-reduce-in-fp32") < peak(*mg)


def test_torchtitans_async_tp_is_emitted_compiled_and_estimated_so() -> None:
    # torchtitan runs async TP only under torch.compile: the emitted file compiles the model
    # and its header times the compiled model, not the eager one the job described.
    from planner.emit.torchtitan import lower, sections

    cfg = ParallelConfig(dp=1, tp=8, sequence_parallel=True, micro_batch_size=1)
    low = lower(LLAMA8, _job(tp_comm_overlap=True), cfg)
    assert low.job.compile and any("compile" in w for w in low.warnings)
    out = sections(LLAMA8, low.job, low.config)
    assert out["compile"]["enable"] and out["parallelism"]["enable_async_tensor_parallel"]
    # Without async TP nothing is compiled behind the job's back.
    plain = lower(LLAMA8, _job(), cfg)
    assert not plain.job.compile and "compile" not in sections(LLAMA8, plain.job, plain.config)


def test_each_trainer_runs_its_own_fused_attention_kernel_at_its_measured_rate() -> None:
    # Transformer Engine prefers cuDNN's fused attention on Hopper and later, FlashAttention
    # on Ampere (transformer_engine/pytorch/attention/dot_product_attention/utils.py);
    # torchtitan asks SDPA for cuDNN first (torchtitan/models/common/attention.py, since
    # October 2025); a Job may name the kernel. Transformer Engine's own benchmark on an
    # H100 measured cuDNN's forward and backward 1.59x as fast as flash-attn's (causal,
    # heads of 128, 8192 tokens; docs/examples/attention/attention.ipynb).
    from costmodel.formulas.roofline import attention_kernel, flash_attention_time

    h100, a100 = H100.gpu, GPU.preset("a100-80gb")
    assert attention_kernel(_job("megatron"), h100) == "cudnn"
    assert attention_kernel(_job("megatron"), a100) == "flash"
    assert attention_kernel(_job("torchtitan"), h100) == "cudnn"
    assert attention_kernel(_job("deepspeed"), h100) == "flash"
    assert attention_kernel(_job("megatron", attention_kernel="flash"), h100) == "flash"
    raw = GPU.from_profile(hardware_profiles.load("gpus", "h100-sxm", calibrated=False))
    assert raw.efficiency.attention_for("cudnn")[0] == pytest.approx(
        1.59 * raw.efficiency.attention_for("flash")[0], rel=1e-3)
    # The kernel's time goes with its fraction; a GPU without a cuDNN figure (the A100,
    # where Transformer Engine runs FlashAttention) times both alike.
    ovh = h100.efficiency.kernel_overhead_s
    cud = [t - ovh for t in flash_attention_time(h100, "bf16", 1e12, 8192, "cudnn")]
    fla = [t - ovh for t in flash_attention_time(h100, "bf16", 1e12, 8192, "flash")]
    assert fla[0] / cud[0] == pytest.approx(1.59, rel=1e-3)
    assert fla[1] / cud[1] == pytest.approx(1.59, rel=1e-3)
    assert flash_attention_time(a100, "bf16", 1e12, 8192, "cudnn") == \
        flash_attention_time(a100, "bf16", 1e12, 8192, "flash")
    # Through the layer: only the attention core changes, by that ratio.
    rows = (np.array([1]), np.array([1]), np.array([1]), np.array([0]), False)
    cudnn = layer_compute(LLAMA8, h100, _job("megatron"), *rows)
    flash = layer_compute(LLAMA8, h100, _job("megatron", attention_kernel="flash"), *rows)
    assert (flash.core_forward[0] - ovh) / (cudnn.core_forward[0] - ovh) == \
        pytest.approx(1.59, rel=1e-3)
    assert flash.forward[0] - cudnn.forward[0] == pytest.approx(
        flash.core_forward[0] - cudnn.core_forward[0], rel=1e-9)
    for bad, why in ((dict(attention_kernel="fa3"), "not one of"),
                     (dict(attention_kernel="cudnn", flash_attention=False),
                      "flash_attention is off")):
        with pytest.raises(SpecError, match=why):
            _job("megatron", **bad)


def test_a_narrow_head_runs_a_fused_attention_below_its_head_dim_128_rate() -> None:
    # planner profile's causal SDPA sweeps on an H100 and an H200 (cuDNN's kernel, head dims
    # 64 and 128, hardware_profiles/measured/): at head dim 64 the kernel runs at 0.72 of
    # its head-dim-128 rate forward and 0.78 backward (the joint fit of benchmarks/
    # attention_shape.py, software.toml [fused_attention]); wider heads run no faster than
    # 128 (Shah et al. 2024, Fig. 5: cuDNN 581 TFLOP/s at 256 against 605 at 128).
    from costmodel.formulas.roofline import flash_attention_time

    shape = hardware_profiles.load_software()["fused_attention"]
    gpu = H100.gpu
    ovh = gpu.efficiency.kernel_overhead_s
    base = [t - ovh for t in flash_attention_time(gpu, "bf16", 1e12, 4096, "cudnn")]
    narrow = [t - ovh for t in flash_attention_time(gpu, "bf16", 1e12, 4096, "cudnn", 64)]
    wide = [t - ovh for t in flash_attention_time(gpu, "bf16", 1e12, 4096, "cudnn", 192)]
    for got, ref, key in zip(narrow, base, ("forward", "backward"), strict=True):
        assert ref / got == pytest.approx(0.5 ** float(shape[f"{key}_head_dim_exponent"]))
    assert 0.70 < base[0] / narrow[0] < 0.75 and 0.75 < base[1] / narrow[1] < 0.80
    assert wide == pytest.approx(base)
    # The layer formulas pass the model's head dimension: GPT-OSS's 64 costs more per FLOP.
    job = _job("megatron")
    cfg = [np.array([1]), np.array([1]), np.array([1]), np.array([0])]
    hd64 = ModelSpec(name="hd64", num_layers=2, hidden_size=4096, num_heads=64,
                     num_kv_heads=8, ffn_hidden_size=8192, vocab_size=32000, head_dim=64)
    hd128 = ModelSpec(name="hd128", num_layers=2, hidden_size=4096, num_heads=32,
                      num_kv_heads=4, ffn_hidden_size=8192, vocab_size=32000, head_dim=128)
    lc64, lc128 = (layer_compute(m, gpu, job, *cfg, moe=False) for m in (hd64, hd128))
    assert lc64.forward_flops[0] == pytest.approx(lc128.forward_flops[0])  # same q width
    assert lc64.core_forward[0] > 1.3 * lc128.core_forward[0]


def test_a_fused_attentions_fixed_work_per_query_block_is_what_the_sweeps_measured() -> None:
    # hardware_profiles/software.toml [fused_attention] carries the fixed work of each query
    # block as key tokens, fitted by benchmarks/attention_shape.py to the causal SDPA
    # sweeps planner profile measured on an H100 and an H200 (512 to 8192 tokens): refitting
    # the shipped measurements gives the shipped constants back, and with them the fitted
    # profile reproduces the sweep far better than a constant rate (41 % -> 12 % backward).
    import tomllib

    from scipy.optimize import least_squares

    from costmodel.fitting.measured import Measurements, fit_profile
    from costmodel.formulas.roofline import flash_attention_time

    shape = hardware_profiles.load_software()["fused_attention"]
    k_f, k_b = float(shape["forward_fixed_keys"]), float(shape["backward_fixed_keys"])
    gpu = H100.gpu
    f, b = flash_attention_time(gpu, "bf16", 1e12, 1024)
    f0, b0 = flash_attention_time(gpu, "bf16", 1e12)
    ovh = gpu.efficiency.kernel_overhead_s
    assert (f - ovh) / (f0 - ovh) == pytest.approx(1 + k_f / 1024)
    assert (b - ovh) / (b0 - ovh) == pytest.approx(1 + k_b / 1024)
    spec = importlib.util.spec_from_file_location(
        "attention_shape", ROOT / "benchmarks" / "attention_shape.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, shipped in (("forward", k_f), ("backward", k_b)):
        mine = [s for s in mod._sweeps() if s[2] == name]
        assert len(mine) == 4  # two GPUs, head dims 64 and 128

        def resid(x: np.ndarray, mine: list = mine) -> np.ndarray:
            return np.concatenate([np.log(mod._model(x[1 + i], x[0], k, fl, p, o) / s)
                                   for i, (_, _, _, k, fl, s, p, o) in enumerate(mine)])

        fit = least_squares(resid, [300.0] + [0.5] * 4,
                            bounds=([0.0] + [0.01] * 4, [1e4] + [1.0] * 4))
        assert fit.x[0] == pytest.approx(shipped, rel=0.05)
    path = ROOT / "hardware_profiles" / "measured" / "h100-sxm-2026-11-22.toml"
    meas = Measurements.from_dict(tomllib.loads(path.read_text())["measured"])
    report = fit_profile(meas)["measured"]["fit"]
    # With the head dimension's term the two head dims of the sweep share one fraction:
    # 16 % and 12 % RMS error without it, 1.4 % and 2.5 % with it.
    assert report["attention_backward_error"] < 0.04
    assert report["attention_error"] < 0.03
    # The shipped profile holds that fit (its fractions as refitted with the fixed work).
    assert tomllib.loads(path.read_text())["efficiency"]["attention_backward"] == \
        pytest.approx(fit_profile(meas)["efficiency"]["attention_backward"], abs=1e-4)

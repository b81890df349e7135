"""Megatron-Core's ``activation_func_fp8_input_store``: a SwiGLU keeps its input, the first
linear's output, in fp8 for backward (megatron/core/transformer/transformer_config.py;
the DeepSeek-V3 report's Sec. 3.3.3 caches the MoE SwiGLU input in FP8 likewise).

Oracles: the bytes that input takes (two ffn-wide halves, gate and up, per token: one byte
each instead of two); Megatron-Core's own refusal ("Storing activation input in FP8 is
supported only for SwiGLU"); the DeepSeek-V3 report's recipe on 2,048 H800s, which trained
in 80 GB.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import SpecError
from costmodel.fitting.published import default_runs_path, load_runs, run_estimate
from planner import Plan
from tests.inprocess import run_planner

LLAMA = ModelSpec.preset("llama-3-8b")
H100 = Cluster.preset("dgx-h100")
JOB = Job(global_batch_size=64, seq_len=4096, framework="megatron")
CFG = ParallelConfig(dp=8, zero_stage=1, micro_batch_size=1)


def test_the_swiglu_input_is_kept_in_one_byte() -> None:
    plain = estimate(LLAMA, H100, JOB, CFG)
    store = estimate(LLAMA, H100, dataclasses.replace(JOB, activation_func_fp8_input_store=True),
                     CFG)
    # One micro-batch in flight, 32 layers, 4,096 tokens: the gate and up outputs
    # (2 x 14,336 a token) at 1 byte instead of bf16's 2.
    saved = LLAMA.num_layers * 4096 * 2 * LLAMA.ffn_hidden_size * (2 - 1)
    got = plain.stages[0].layer_activations_bytes - store.stages[0].layer_activations_bytes
    assert got == pytest.approx(saved)
    assert store.step_time_s == pytest.approx(plain.step_time_s)
    r = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--framework",
                    "megatron", "--global-batch-size", "64", "--seq-len", "4096", "--dp", "8",
                    "--activation-func-fp8-input-store")
    assert r.returncode == 0 and "SwiGLU input kept in fp8" in r.stdout


@pytest.mark.parametrize(("model", "framework"), [
    ("llama-3-8b", "torchtitan"), ("gpt3-6.7b", "megatron")])
def test_only_megatron_and_a_gated_mlp_take_it(model: str, framework: str) -> None:
    job = Job(global_batch_size=64, seq_len=2048, framework=framework,
              activation_func_fp8_input_store=True)
    with pytest.raises(SpecError, match="activation_func_fp8_input_store"):
        estimate(ModelSpec.preset(model), H100, job, CFG)
    r = run_planner("estimate", "--model", model, "--cluster", "dgx-h100", "--framework",
                    framework, "--global-batch-size", "64", "--seq-len", "2048", "--dp", "8",
                    "--activation-func-fp8-input-store")
    assert r.returncode == 2 and "leave it off" in r.stderr and "Traceback" not in r.stderr


def test_megatron_lm_has_no_flag_for_it_so_the_emitted_plan_goes_without() -> None:
    job = dataclasses.replace(JOB, activation_func_fp8_input_store=True)
    p = Plan(model=LLAMA, cluster=H100, job=job, config=CFG,
             estimate=estimate(LLAMA, H100, job, CFG))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = p.emit("megatron")
    assert any("no pretrain_gpt.py flag" in str(w.message) for w in caught)
    args = [x for x in text.splitlines() if not x.lstrip().startswith("#")]
    assert not any("fp8" in x for x in args)
    assert "re-estimated" in text  # the file says what it will use


def test_deepseeks_own_recipe_fits_its_h800s() -> None:
    """The DeepSeek-V3 report's pre-training (2,048 H800, DualPipe over 16 ranks, EP 64, its
    recomputes, FP8 SwiGLU-input cache and BF16 moments) ran in 80 GB; without the cache the
    memory model puts it over."""
    run = next(r for r in load_runs(default_runs_path("frontier"))
               if r.id == "deepseek-v3-2048xh800-fp8-dualpipe")
    assert run.job.activation_func_fp8_input_store
    assert run_estimate(run).fits
    off = dataclasses.replace(run, job=dataclasses.replace(
        run.job, activation_func_fp8_input_store=False))
    assert not run_estimate(off).fits

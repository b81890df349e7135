"""Plans that run: ``planner.apply`` on CPU processes (gloo) against one process.

The multi-process tests start torchrun once per world size (``runtime_worker.py`` trains every
case of that size in one process group) and check, per case:

- the loss of each of 5 steps equals a single-process run of the same model and data
  (``reference_losses``) within 1e-5 (fp32), for DP, ZeRO-2, FSDP, HSDP, TP, TP+SP, PP with
  1F1B, GPipe, interleaved and zero-bubble schedules, uneven stages, recompute, and
  TP x PP x DP on 8 processes;
- each rank's bytes of parameters, gradients and optimizer states after one step equal the
  memory estimator's prediction for its pipeline stage, exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate  # noqa: E402
from costmodel.trace.blockcosts import costs_from_graph  # noqa: E402
from planner.result import Plan  # noqa: E402
from planner.runtime.checks import check, unsupported  # noqa: E402
from planner.runtime.model import build_model  # noqa: E402

HERE = Path(__file__).parent
#: A Llama-style model small enough for 8 processes on 2 cores: GQA (8 query, 4 KV heads),
#: SwiGLU, RMSNorm, RoPE, untied head; every dimension divisible by the degrees below.
SPEC = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=64, num_heads=8, num_kv_heads=4,
                 ffn_hidden_size=128, vocab_size=128, gated_mlp=True)
#: GPT-style: LayerNorm, learned positions, biases (the row-parallel ones stay replicated
#: under TP), GELU MLP, multi-head attention.
GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                position_embedding="learned", max_position_embeddings=16, norm="layernorm",
                bias=True)
#: Llama-style with the LM head tied to the token embedding (Llama 3.2 1B and 3B are).
TIED = dataclasses.replace(SPEC, name="tiny-llama-tied", tied_embeddings=True)
#: DeepSeekMoE-style: a leading dense layer, then MoE layers of 4 routed experts (top 2) and
#: a shared expert.
MOE = dataclasses.replace(SPEC, name="tiny-moe", num_experts=4, top_k=2,
                          moe_ffn_hidden_size=64, num_shared_experts=1, first_dense_layers=1)
JOB = Job(global_batch_size=8, seq_len=16, precision="fp32", framework="torchtitan")
SGD = dataclasses.replace(JOB, optimizer="sgd")
BF16 = dataclasses.replace(JOB, precision="bf16")  # FSDP: bf16 compute, fp32 states
#: Learning rates at which 5 steps move the loss visibly. SGD (momentum 0.9) is the sharper
#: oracle: Adam's update is blind to a constant factor on the gradients (a sum where a mean
#: belongs), SGD's is not; AdamW cases check its sharded states.
LR = {"adamw": 1e-2, "sgd": 0.3}
TOL = 1e-5
#: fp32 AdamW: its update divides by the root of the second moment, so the last bits in which
#: a split run's gradients differ (TP's and PP's other order of summation) grow step by step:
#: tied_tp_pp_adamw measured 5e-7 at step 1 and 1.0e-5 at step 5 on one machine, under
#: 1e-5 on another. A wrong gradient moves the loss by 1e-2 and more.
TOL_ADAMW = 3e-5
#: bf16 against the fp32 run: 8 bits of mantissa in every op of the forward (FSDP's
#: param_dtype) drift the loss by a few hundredths over 5 AdamW steps at this rate.
TOL_BF16 = 5e-2

CASES_4 = {
    "ddp": ({"dp": 4}, SGD),
    "ddp_adamw": ({"dp": 4, "micro_batch_size": 1}, JOB),
    "zero2": ({"dp": 4, "zero_stage": 2}, SGD),
    "fsdp_adamw": ({"dp": 4, "zero_stage": 3, "micro_batch_size": 2}, JOB),
    "hsdp": ({"dp": 4, "zero_stage": 3, "sharding_group": 2}, SGD),
    # Tensor-parallel cases run few micro-batches: every DTensor collective costs milliseconds
    # on gloo, and a micro-batch issues dozens (gradient accumulation is tested without TP).
    "tp": ({"tp": 4, "micro_batch_size": 4}, SGD),
    "tp_sp_selective": ({"tp": 4, "sequence_parallel": True, "recompute": "selective",
                         "micro_batch_size": 4}, SGD),
    "pp_1f1b": ({"pp": 4}, SGD),
    "pp_gpipe": ({"pp": 4, "pipeline_schedule": "gpipe"}, SGD),
    "pp_interleaved_dp_zero2": ({"pp": 2, "dp": 2, "virtual_pipeline_stages": 2,
                                 "zero_stage": 2}, SGD),
    "pp_zero_bubble_tp_full": ({"pp": 2, "tp": 2, "pipeline_schedule": "zero-bubble",
                                "recompute": "full", "micro_batch_size": 2}, SGD),
    "pp_uneven_dp": ({"pp": 2, "dp": 2, "stage_layers": [1, 3], "recompute": "full",
                      "stage_recompute_layers": [1, 2]}, SGD),
    "tp_sp_pp_adamw": ({"tp": 2, "pp": 2, "sequence_parallel": True, "micro_batch_size": 2},
                       JOB),
    "gpt_tp_dp_fsdp": ({"tp": 2, "dp": 2, "zero_stage": 3, "micro_batch_size": 2}, JOB, GPT),
    "gpt_tp_pp": ({"tp": 2, "pp": 2, "micro_batch_size": 2}, JOB, GPT),
    "fsdp_bf16": ({"dp": 4, "zero_stage": 3}, BF16),
    # The plan of the traced module (its LayerCosts, not the preset), run on the module.
    "module_fsdp_adamw": ({"dp": 4, "zero_stage": 3, "micro_batch_size": 2}, JOB),
    "module_pp_zero2": ({"pp": 2, "dp": 2, "zero_stage": 2}, SGD),
    "module_pp_full": ({"pp": 4, "recompute": "full"}, SGD),
    # ... with the tensor-parallel layouts its ILP chose (LayerCosts.tp_plan).
    "module_tp": ({"tp": 4, "micro_batch_size": 4}, SGD),
    "module_tp_pp_zero2": ({"tp": 2, "pp": 2, "zero_stage": 2, "micro_batch_size": 2}, SGD),
    # ... and with sequence parallelism: its norms, block inputs and embedding read off the
    # layouts (LayerCosts.tp_plan of the sequence-parallel sharding).
    "module_tp_sp_pp": ({"tp": 2, "pp": 2, "sequence_parallel": True, "micro_batch_size": 2},
                        SGD),
    # A tied word embedding over pipeline stages: the last stage's copy is its head, the
    # copies' gradients summed each step (Megatron-LM's embedding group).
    "tied_pp_fsdp": ({"pp": 2, "dp": 2, "zero_stage": 3}, SGD, TIED),
    "tied_tp_pp_adamw": ({"pp": 2, "tp": 2, "micro_batch_size": 2}, JOB, TIED),
    "module_tied_pp": ({"pp": 4}, SGD, TIED),
    # Mixture-of-experts layers (expert parallel 1), over pipeline stages and FSDP.
    "moe_pp_fsdp": ({"pp": 2, "dp": 2, "zero_stage": 3}, SGD, MOE),
}
CASES_8 = {
    "tp_pp_dp_fsdp": ({"dp": 2, "tp": 2, "pp": 2, "zero_stage": 3, "sequence_parallel": True,
                       "micro_batch_size": 2}, SGD),
    "tp_pp_dp_ddp_adamw": ({"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 2}, JOB),
}
ALL_CASES = {**CASES_4, **CASES_8}
#: Traced modules that are not a decoder (issue 33), from ``planner.examples`` (or
#: ``runtime_models.py``): (class, arguments, traced input shape, token ids or not). Their
#: layers are the module paths the trace found (``blocks.*``; the encoder-decoder's
#: ``encoder.*``, ``encoder_norm``, ``decoder.*``), their pipeline stages cut by torch's
#: pipeline tracer.
MODULES = {
    "vit": ("ViT", {"dim": 32, "depth": 4, "heads": 4, "patch": 8, "image": 16, "classes": 10},
            [2, 3, 16, 16], False),
    "mixer": ("MLPMixer", {"dim": 32, "depth": 4, "patch": 8, "image": 16, "classes": 10},
              [2, 3, 16, 16], False),
    "t5": ("EncoderDecoder", {"vocab": 64, "dim": 32, "heads": 4, "encoder_layers": 2,
                              "decoder_layers": 2}, [2, 8], True),
    # ... its output layer the token embedding (T5's tied head): a weight two pipeline
    # stages use, each holding a copy.
    "t5_tied": ("EncoderDecoder", {"vocab": 64, "dim": 32, "heads": 4, "encoder_layers": 2,
                                   "decoder_layers": 2, "tied": True}, [2, 8], True),
    # nn.MultiheadAttention and an MLP module per block: sequence parallel runs on it.
    "attention_lm": ("runtime_models:AttentionLM", {"vocab": 64, "dim": 32, "heads": 4,
                                                    "layers": 2}, [2, 8], True),
    # ... its attention asked for its weights, so run unfused; traced on one sequence, where
    # the batched matmuls' batch loop is the heads.
    "attention_lm_weights": ("runtime_models:AttentionLM", {
        "vocab": 64, "dim": 32, "heads": 4, "layers": 2, "need_weights": True}, [1, 8], True),
}
#: SGD's learning rate for them: their losses move visibly, none diverges in 5 steps.
LR_MODULE = 0.05
#: (module, config) of the plans run on 4 processes against one process.
MODULE_CASES = {
    "vit_pp_dp_zero2": ("vit", {"pp": 2, "dp": 2, "zero_stage": 2}),
    "vit_ddp": ("vit", {"dp": 4}),
    "mixer_pp4_full": ("mixer", {"pp": 4, "recompute": "full"}),
    "mixer_fsdp_hsdp": ("mixer", {"dp": 4, "zero_stage": 3, "sharding_group": 2}),
    "t5_fsdp_full": ("t5", {"dp": 4, "zero_stage": 3, "recompute": "full"}),
    # Cut between the stacks (the decoder's embedding in the first stage, which reads the
    # tokens): the first stage holds the embedding twice over, the last its copy as head.
    "t5_tied_pp_dp": ("t5_tied", {"pp": 2, "dp": 2, "stage_layers": [3, 2]}),
    # Tensor parallel with the layouts the ILP chose: nn.MultiheadAttention split by heads
    # (self-attention, and the decoder's attention over the encoder with its causal mask),
    # the MLPs column- then row-wise, the embedding and head split.
    "vit_tp_dp": ("vit", {"tp": 2, "dp": 2, "micro_batch_size": 2}),
    "t5_tp": ("t5", {"tp": 4, "micro_batch_size": 4}),
    # ... with sequence parallelism: the attention gathers the sequence and reduce-scatters
    # its output, the norms split along it.
    "attention_lm_tp_sp_dp": ("attention_lm", {"tp": 2, "dp": 2, "sequence_parallel": True,
                                               "micro_batch_size": 2}),
    # nn.MultiheadAttention unfused (need_weights=True), split by heads all the same.
    "attention_lm_weights_tp_dp": ("attention_lm_weights", {"tp": 2, "dp": 2,
                                                            "micro_batch_size": 2}),
}


def _example_module(name: str) -> tuple[Any, Any, Job]:
    """(a function building the module, its traced input, the job) of ``MODULES[name]``."""
    from runtime_worker import module_class

    cls, kwargs, shape, tokens = MODULES[name]
    example = torch.zeros(shape, dtype=torch.long if tokens else torch.float32)
    job = dataclasses.replace(SGD, seq_len=shape[1] if tokens else 1)
    return (lambda: module_class(cls)(**kwargs)), example, job


def _module_plan(name: str) -> Plan:
    """The plan of ``MODULE_CASES[name]``'s config for its traced module (not searched)."""
    from costmodel.trace.graph import LayerGraph

    which, config = MODULE_CASES[name]
    make, example, job = _example_module(which)
    with torch.device("meta"):
        module = make()
    graph = LayerGraph.from_module(module, example, dtype=torch.float32)
    cfg = ParallelConfig(**config)
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=cfg.world_size)
    costs = costs_from_graph(graph, cluster, job, tp_degrees=sorted({1, cfg.tp}),
                                  sequence_parallel=cfg.sequence_parallel)
    return make_plan(config, costs, job)


def _traced(spec: ModelSpec, job: Job, tp_degrees: tuple[int, ...] = (1,)) -> Any:
    """The LayerCosts of ``spec``'s reference transformer, traced (not its formulas), with
    and without sequence parallelism."""
    from costmodel.trace.graph import LayerGraph

    graph = LayerGraph.from_module(build_model(spec, device="meta"),
                                   torch.zeros(1, job.seq_len, dtype=torch.long))
    return costs_from_graph(graph, Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=4),
                                 job, tp_degrees=tp_degrees, sequence_parallel="both")


def make_plan(config: dict[str, Any], model: ModelSpec | Any = SPEC, job: Job = JOB,
              nodes: int = 1) -> Plan:
    """A plan of ``config`` (not searched) on a cluster of exactly its GPUs."""
    cfg = ParallelConfig(**config)
    cluster = Cluster(gpu="h100-sxm", num_nodes=nodes, gpus_per_node=cfg.world_size // nodes,
                      inter_node_link="ib-ndr" if nodes > 1 else None)
    return Plan(model=model, cluster=cluster, job=job, config=cfg,
                estimate=estimate(model, cluster, job, cfg))


def _case(name: str) -> tuple[dict[str, Any], Job, ModelSpec]:
    config, job, *model = ALL_CASES[name]
    return config, job, (model[0] if model else SPEC)


def _run_cases(cases: dict[str, tuple[Any, ...]], world: int, tmp: Path) -> dict[str, Any]:
    path = tmp / f"cases{world}.json"
    rows = []
    for name in cases:
        config, job, model = _case(name)
        row = {"name": name, "plan": make_plan(config, model, job).to_json(),
               "lr": LR[job.optimizer]}
        if name.startswith("module_"):
            row["plan"] = make_plan(config, _traced(model, job, (1, 2, 4)), job).to_json()
            row["spec"] = model.to_dict()
        rows.append(row)
    for name in MODULE_CASES if world == 4 else ():
        cls, kwargs, shape, tokens = MODULES[MODULE_CASES[name][0]]
        rows.append({"name": name, "plan": _module_plan(name).to_json(), "lr": LR_MODULE,
                     "module": {"cls": cls, "kwargs": kwargs, "shape": shape,
                                "tokens": tokens}})
    path.write_text(json.dumps(rows))
    out = tmp / f"results{world}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(HERE / "runtime_worker.py"), str(path), str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str], list[float]]:
    from planner.runtime.train import reference_losses
    return {(m.name, j.optimizer): reference_losses(m, j, steps=5, lr=LR[j.optimizer])
            for j in (JOB, SGD) for m in (SPEC, GPT, TIED, MOE)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("runtime")
    return {**_run_cases(CASES_4, 4, tmp), **_run_cases(CASES_8, 8, tmp)}


def _rows(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    rows = results[name]
    errors = [r["error"] for r in rows if "error" in r]
    assert not errors, errors[0]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALL_CASES))
def test_loss_matches_one_process(results: dict[str, Any],
                                  reference: dict[tuple[str, str], list[float]],
                                  name: str) -> None:
    rows = _rows(results, name)
    _, job, model = _case(name)
    ref = reference[model.name, job.optimizer]
    assert ref[-1] < ref[0] - 0.1  # the reference does learn
    tol = TOL_BF16 if job.precision == "bf16" else TOL_ADAMW if job.optimizer == "adamw" \
        else TOL
    for r in rows:  # every rank reports the same global loss
        assert r["losses"] == pytest.approx(ref, abs=tol), (r["rank"], r["losses"])
        assert r["losses"] == rows[0]["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALL_CASES))
def test_state_bytes_equal_estimate(results: dict[str, Any], name: str) -> None:
    config, job, model = _case(name)
    est = make_plan(config, model, job).estimate
    for r in _rows(results, name):
        stage = est.stages[r["stage_ids"][0]]
        measured = r["state_bytes"]
        assert measured == {"weights": stage.resident_weights_bytes,
                            "gradients": stage.resident_gradients_bytes,
                            "optimizer": stage.memory.optimizer_bytes}, (r["rank"], stage)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODULE_CASES))
def test_a_modules_plan_trains_as_one_process(results: dict[str, Any], name: str) -> None:
    """A ViT, an MLP-Mixer and a T5-style encoder-decoder, each planned from its trace, run
    on 4 processes (pipeline stages cut at the traced layers, ZeRO-2/3, HSDP, recompute):
    the loss of every step equals one process training the same module on the same data
    within 1e-5, and each rank holds the parameter, gradient and optimizer bytes the
    estimate predicts for its stage (FSDP pads a shard to a whole row: within 1 %)."""
    from planner.runtime.train import module_reference_losses

    make, example, job = _example_module(MODULE_CASES[name][0])
    ref = module_reference_losses(make, example, job, steps=5, lr=LR_MODULE)
    frozen = module_reference_losses(make, example, job, steps=5, lr=0.0)
    assert max(abs(a - b) for a, b in zip(ref, frozen, strict=True)) > 20 * TOL  # it trains
    est = _module_plan(name).estimate
    rows = _rows(results, name)
    for r in rows:
        assert r["losses"] == pytest.approx(ref, abs=TOL), (r["rank"], r["losses"])
        stage = est.stages[r["stage_ids"][0]]
        want = {"weights": stage.resident_weights_bytes,
                "gradients": stage.resident_gradients_bytes,
                "optimizer": stage.memory.optimizer_bytes}
        assert r["state_bytes"] == pytest.approx(want, rel=0.01), (r["rank"], want)


@pytest.mark.slow
def test_multihead_attention_split_by_heads_equals_the_module(tmp_path: Path) -> None:
    """nn.MultiheadAttention split by heads over 2 processes (``HeadParallel``: the layout
    the ILP chooses for it, the ``heads`` style of a traced module's TP plan) computes what
    the module computes whole: output, attention weights and every gradient within 1e-5,
    for self- and cross-attention, batch first or not, with a causal mask or a boolean one
    per batch and head, and a key padding mask, its inputs whole or split along the sequence
    (sequence parallel: gathered in, the output reduce-scattered; ``attention_worker.py``)."""
    out = tmp_path / "attention.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(HERE / "attention_worker.py"), str(out)], capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    diffs = json.loads(out.read_text())
    assert len(diffs) == 48
    assert max(diffs.values()) < 1e-5, diffs


def test_heads_style_refuses_what_it_does_not_split() -> None:
    """The ``heads`` style splits an nn.MultiheadAttention whose key and value have its own
    width and whose heads the ranks divide; anything else is refused by name."""
    from torch import nn

    from planner.runtime.attention import HeadParallel

    class TwoRanks:
        def size(self) -> int:
            return 2

    mesh: Any = TwoRanks()
    with pytest.raises(SpecError, match=r"splits an nn\.MultiheadAttention, not a Linear"):
        HeadParallel()._apply(nn.Linear(4, 4), mesh)
    with pytest.raises(SpecError, match=r"key and value widths of their own"):
        HeadParallel()._apply(nn.MultiheadAttention(8, 2, kdim=4, vdim=4), mesh)
    with pytest.raises(SpecError, match="3 heads over 2 ranks"):
        HeadParallel()._apply(nn.MultiheadAttention(12, 3), mesh)


@pytest.mark.slow  # over 2 s: a search of a traced module / torch.distributed steps
def test_a_weight_two_pipeline_stages_use_is_tied(one_process: None) -> None:
    """Cut between its stacks, the encoder-decoder's token embedding, which both stacks
    read, falls in the first stage twice, one parameter; tied to its output layer too,
    torch's pipelining copies it into the last stage, and apply keeps the copies equal
    (``Tie``). Cut before the decoder's embedding, the last stage would read the
    model's input, which torch's pipelining does not pass on: refused by name."""
    from planner.runtime.modules import layer_paths
    from planner.runtime.stages import _cut_stages

    tied = {0: ["embed.weight"], 1: ["embed.weight"]}
    for name, ties in (("t5", []), ("t5_tied", [tied])):
        make, example, job = _example_module(name)
        module = make()
        plan = make_plan({"pp": 2, "stage_layers": [3, 2]}, _module_plan("t5_fsdp_full").model,
                         job)
        paths = layer_paths(plan.model, module)
        assert paths == ["encoder.0", "encoder.1", "encoder_norm", "decoder.0", "decoder.1"]
        parts, got = _cut_stages(module, plan.config, [(0, 3), (3, 5)], [0], torch.device("cpu"),
                                 False, paths, example[:1])
        assert got == ties and len(parts) == 1
        assert sum(n.startswith("embed") for n, _ in parts[0].named_parameters()) == 1
    with pytest.raises(SpecError, match="stage 1 of EncoderDecoder, cut at encoder_norm, reads "
                                        "the model's own input tokens"):
        _cut_stages(make(), plan.config, [(0, 2), (2, 5)], [0], torch.device("cpu"), False,
                    paths, example[:1])
    with pytest.raises(SpecError, match="pass example_inputs="):
        _cut_stages(module, plan.config, [(0, 3), (3, 5)], [0], torch.device("cpu"), False,
                    paths, None)
    with pytest.raises(SpecError, match="not modules of this"):
        layer_paths(plan.model, torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.slow
def test_ranks_hold_the_sharded_states(results: dict[str, Any]) -> None:
    # The oracle above could pass with nothing sharded if the estimator were wrong the same
    # way: check the sharding itself. FSDP over 4 ranks holds a quarter of the fp32
    # parameters and Adam states; DDP all of them; SGD one momentum buffer.
    n = SPEC.num_params()
    fsdp = _rows(results, "fsdp_adamw")[0]["state_bytes"]
    assert fsdp == {"weights": 4 * n // 4, "gradients": 4 * n // 4, "optimizer": 8 * n // 4}
    assert _rows(results, "ddp_adamw")[0]["state_bytes"]["optimizer"] == 8 * n
    assert _rows(results, "ddp")[0]["state_bytes"] == {"weights": 4 * n, "gradients": 4 * n,
                                                         "optimizer": 4 * n}


@pytest.fixture
def one_process() -> Any:
    """torch.distributed torn down after an in-process (world size 1) run."""
    import torch.distributed as dist

    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.slow  # over 2 s: a search of a traced module / torch.distributed steps
def test_plan_from_json_runs_without_search(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path, one_process: None) -> None:
    from planner.runtime.train import reference_losses, train
    text = make_plan({"recompute": "full", "micro_batch_size": 4}).to_json()

    def no_search(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the plan was searched again")

    monkeypatch.setattr(sys.modules["planner.plan"], "search", no_search)
    monkeypatch.setattr(sys.modules["planner.search"], "search", no_search)
    (tmp_path / "plan.json").write_text(text)
    res = train(Plan.from_json(tmp_path / "plan.json"), steps=3, lr=LR["adamw"])
    ref = reference_losses(SPEC, JOB, steps=3, lr=LR["adamw"])
    assert res.losses == pytest.approx(ref, abs=TOL)


@pytest.mark.slow  # over 2 s: a search of a traced module / torch.distributed steps
def test_bf16_ddp_runs_under_autocast(one_process: None) -> None:
    from planner.runtime.train import reference_losses, train
    job = dataclasses.replace(JOB, precision="bf16")
    res = train(make_plan({}, job=job), steps=3, lr=LR["adamw"])
    ref = reference_losses(SPEC, JOB, steps=3, lr=LR["adamw"])
    assert res.losses == pytest.approx(ref, abs=TOL_BF16)
    assert res.losses != pytest.approx(ref, abs=1e-6)  # it did compute in bf16


def test_meta_device_model_is_materialised(one_process: None) -> None:
    from planner.runtime.train import train
    res = train(make_plan({}), steps=2, lr=LR["adamw"], meta=True)
    # Random weights of N(0, 0.02): the first loss is close to ln(vocab).
    assert abs(res.losses[0] - float(torch.log(torch.tensor(128.0)))) < 0.1
    assert res.state_bytes["weights"] == 4 * SPEC.num_params()


def test_reference_model_matches_the_spec() -> None:
    for name in ("llama-2-7b", "llama-3-8b", "gpt3-125m", "llama-3.2-1b", "mixtral-8x7b",
                 "deepseek-moe-16b"):
        spec = ModelSpec.preset(name)
        m = build_model(spec, device="meta")
        assert sum(p.numel() for p in m.parameters()) == spec.num_params(), name
    for name in ("vit-large-16", "bert-large"):
        with pytest.raises(SpecError, match="does not build"):
            build_model(ModelSpec.preset(name), device="meta")


def test_rotary_embedding_rotates_and_rotates_back() -> None:
    """RoPE (Su et al. 2021, Eq. 34): the rotation keeps each vector's length, position 0 is
    not turned, its hand-written backward is autograd's, a low-precision input comes back in
    its dtype, and a layer given the model's angle table computes what it computes with its
    own."""
    from planner.runtime.model import Attention, _Rotary, rope_table

    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64, requires_grad=True)
    freqs = rope_table(5, 8, "cpu")
    y = _Rotary.apply(x, freqs)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(y[:, 0], x[:, 0])
    assert torch.autograd.gradcheck(lambda t: _Rotary.apply(t, freqs), (x,))
    z = torch.randn(1, 6, 2, 8, dtype=torch.bfloat16)
    assert _Rotary.apply(z, rope_table(6, 8, "cpu")).dtype == z.dtype
    attn = Attention(ModelSpec.preset("llama-3.2-1b")).double()
    h = torch.randn(1, 6, attn.wq.in_features, dtype=torch.float64)
    assert torch.allclose(attn(h), attn(h, rope=rope_table(6, attn.head_dim, "cpu")))


def test_the_angle_tables_are_computed_once_per_model() -> None:
    """The reference model computes RoPE's angle table once per forward, not in every layer
    (as torchtitan computes its freqs_cis once): its layers, traced, take no polar."""
    from costmodel.trace.graph import LayerGraph

    spec = dataclasses.replace(ModelSpec.preset("llama-3.2-1b"), num_layers=2)
    graph = LayerGraph.from_module(build_model(spec, device="meta"),
                                   torch.zeros(1, 16, dtype=torch.long))
    polar = [graph.node(i) for i in graph.graph.nodes
             if graph.node(i).op == "aten.polar.default"]
    assert len(polar) == 1 and not polar[0].layer.startswith("layers")


def test_synthetic_data_is_learnable_and_shared() -> None:
    from planner.runtime.modules import synthetic_batch
    x, y = synthetic_batch(JOB, 128, step=3)
    x2, _ = synthetic_batch(JOB, 128, step=3)
    assert torch.equal(x, x2) and x.shape == (8, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert set(((y - x) % 128).unique().tolist()) <= {1, 2, 3}


def test_stage_ranges_follow_the_cost_model() -> None:
    from planner.runtime.stages import stage_layer_ranges
    assert stage_layer_ranges(10, 4, 1) == [(0, 2), (2, 4), (4, 7), (7, 10)]  # even_split
    assert stage_layer_ranges(8, 2, 2) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_layer_ranges(4, 2, 1, [1, 3]) == [(0, 1), (1, 4)]


@pytest.mark.parametrize(("config", "job", "needle"), [
    ({"dp": 2, "cp": 2}, JOB, "context parallel"),
    ({"dp": 4, "zero_stage": 1}, Job(global_batch_size=8, seq_len=16, framework="deepspeed"),
     "ZeRO-1"),
    ({"dp": 2}, Job(global_batch_size=8, seq_len=16, precision="fp16", framework="deepspeed"),
     "loss scaling"),
    ({"dp": 2, "zero_stage": 2, "offload": "optimizer"},
     Job(global_batch_size=8, seq_len=16, framework="deepspeed"), "ZeRO-Offload"),
    ({"tp": 2}, JOB, "tied input and output embeddings split over tensor-parallel"),
    ({"tp": 2}, JOB, "tensor parallel of mixture-of-experts layers"),
    ({"dp": 2, "ep": 2, "zero_stage": 2}, JOB, r"expert parallel \(ep=2\)"),
    # Megatron's own schedule runs 2 micro-batches on 4 stages; torch's 1F1B does not.
    ({"pp": 4, "micro_batch_size": 4}, dataclasses.replace(JOB, framework="megatron"),
     "at least pp=4 micro-batches"),
    ({"pp": 2, "pipeline_schedule": "zbv", "virtual_pipeline_stages": 2}, JOB,
     "V-shaped zbv schedule"),
])
def test_unrunnable_features_are_refused(config: dict[str, Any], job: Job,
                                         needle: str) -> None:
    model = TIED if "tied" in needle else MOE if "expert" in needle else SPEC
    p = make_plan(config, model, job=job)
    with pytest.raises(SpecError, match=needle):
        check(p)
    assert unsupported(SPEC, JOB, ParallelConfig(dp=2, zero_stage=3)) == []


@pytest.mark.parametrize("precision", ["nvfp4", "mxfp4"])
def test_fp4_plans_are_refused_by_the_runtime(precision: str) -> None:
    """planner.apply runs bf16 and fp32 linears; an FP4 plan is Transformer Engine's."""
    job = Job(global_batch_size=8, seq_len=16, framework="megatron", precision=precision)
    assert any(f"{precision} matmuls need Transformer Engine's FP4 recipe" in m
               for m in unsupported(SPEC, job, ParallelConfig(dp=2)))


@pytest.mark.parametrize(("config", "job", "needle"), [
    ({"pp": 4, "micro_batch_size": 4}, JOB, "at least pp=4 micro-batches"),
    ({"pp": 2, "virtual_pipeline_stages": 2}, dataclasses.replace(JOB, global_batch_size=5),
     "multiple of micro-batches // pp = 2"),
])
def test_torch_pipelining_limits_are_refused_when_planning(config: dict[str, Any], job: Job,
                                                           needle: str) -> None:
    """What torch's schedules refuse, a torchtitan plan never holds: the cost model's
    validate() refuses it before any runtime check."""
    with pytest.raises(SpecError, match=needle):
        make_plan(config, job=job)


def test_apply_refuses_before_starting_processes(one_process: None) -> None:
    import torch.distributed as dist

    with pytest.raises(SpecError, match="context parallel"):
        planner.apply(make_plan({"cp": 2}), build_model(SPEC))
    with pytest.raises(SpecError, match="4 processes"):
        planner.apply(make_plan({"dp": 4}), build_model(SPEC))
    assert not dist.is_initialized()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow
def test_planner_run_trains(tmp_path: Path) -> None:
    from planner.runtime.train import reference_losses
    make_plan({"dp": 2, "zero_stage": 3}).to_json(tmp_path / "plan.json")
    r = _cli("run", "plan.json", "--", "--steps", "2", "--lr", str(LR["adamw"]), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "plan loaded, no search" in r.stdout
    losses = [float(line.split()[3]) for line in r.stdout.splitlines()
              if line.startswith("step")]
    assert losses == pytest.approx(reference_losses(SPEC, JOB, steps=2, lr=LR["adamw"]),
                                   abs=TOL)


@pytest.mark.slow  # over 2 s: a search of a traced module / torch.distributed steps
def test_planner_run_refuses_and_dry_runs(tmp_path: Path) -> None:
    make_plan({"dp": 2, "cp": 2}).to_json(tmp_path / "cp.json")
    r = _cli("run", "cp.json", cwd=tmp_path)
    assert r.returncode == 2 and "context parallel" in r.stderr and "Traceback" not in r.stderr
    make_plan({"tp": 2}).to_json(tmp_path / "tp.json")
    r = _cli("run", "tp.json", "--dry-run", "--", "--steps", "7", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--nproc-per-node=2 -m planner.runtime.train --steps 7" in r.stdout
    assert f"PLANNER_PLAN={tmp_path / 'tp.json'}" in r.stdout
    r = _cli("run", "tp.json", "--script", "missing.py", cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_multi_node_plan_writes_sbatch(tmp_path: Path) -> None:
    from planner.runtime.launch import prepare
    p = make_plan({"dp": 4, "tp": 4, "zero_stage": 3}, nodes=2)
    p.to_json(tmp_path / "plan.json")
    r = _cli("run", "plan.json", "-o", "job.sbatch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "export NCCL_IB_DISABLE=0" in text
    assert "--nnodes \"$SLURM_NNODES\" --nproc-per-node 8" in text
    assert text.rstrip().endswith("-m planner.runtime.train")
    embedded = text.split("<<'PLANNER_EOF'\n")[1].split("\nPLANNER_EOF")[0]
    assert Plan.from_json(embedded).config == p.config
    how = prepare(str(tmp_path / "plan.json"))
    assert how.command == () and how.sbatch is not None
    assert how.sbatch.splitlines()[-4:] == text.splitlines()[-4:]


def test_a_traced_modules_plan_is_checked_like_a_presets() -> None:
    """The runtime takes a traced module's plan (its LayerCosts) for data, pipeline, ZeRO,
    recompute and tensor parallel with the layouts its ILP chose, with or without sequence
    parallelism (nn.MultiheadAttention split by heads: ``planner.runtime.attention``); a
    layout no style runs (a sequence split inside the model's own forward, an unfused
    nn.MultiheadAttention's split) is refused by name."""
    from costmodel.trace.graph import LayerGraph
    from planner.runtime.apply import TP_PLAN

    traced = _traced(SPEC, SGD, (1, 2))
    check(make_plan({"dp": 2, "pp": 2, "zero_stage": 2}, traced, SGD))
    check(make_plan({"dp": 2, "tp": 2}, traced, SGD))
    assert traced.tp_plan(2)["layers.*.attention.wo"] == "rowwise"
    make, example, job = _example_module("vit")
    with torch.device("meta"):
        vit = LayerGraph.from_module(make(), example)
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=4)
    costs = costs_from_graph(vit, cluster, job, tp_degrees=(1, 2))
    assert costs.tp_plan(2)["blocks.*.self_attn"] == "heads"
    check(make_plan({"dp": 2, "tp": 2}, costs, job))
    make, example, job = _example_module("t5")
    with torch.device("meta"):
        t5 = LayerGraph.from_module(make(), example)
    costs = costs_from_graph(t5, cluster, job, tp_degrees=(1, 2))
    assert {costs.tp_plan(2)[m] for m in (
        "encoder.*.self_attn", "decoder.*.self_attn", "decoder.*.multihead_attn")} == {"heads"}
    check(make_plan({"dp": 2, "tp": 2}, costs, job))
    # Asked for its weights, nn.MultiheadAttention runs its attention unfused: batched
    # matmuls over [sequences x heads], which the ILP splits by heads where it was traced on
    # one sequence (runs: attention_lm_weights_tp_dp); traced on two, its split is not known
    # to be the heads': refused by name.
    from runtime_models import AttentionLM

    from planner.space import CORE, build_space

    for need_weights, batch, refused in ((False, 2, False), (True, 1, False), (True, 2, True)):
        tokens = torch.zeros(batch, 8, dtype=torch.long)
        with torch.device("meta"):
            lm = LayerGraph.from_module(AttentionLM(need_weights=need_weights), tokens)
        costs = costs_from_graph(lm, cluster, dataclasses.replace(job, seq_len=8),
                                      tp_degrees=(1, 2))
        if refused:
            with pytest.raises(SpecError, match=r"blocks\.\*\.attn runs more than one matmul "
                               r"itself.*one sequence"):
                check(make_plan({"dp": 2, "tp": 2}, costs, job))
        else:
            assert costs.tp_plan(2)["blocks.*.attn"] == "heads"
            check(make_plan({"dp": 2, "tp": 2}, costs, job))
        # The search offers only the TP layouts planner.apply runs.
        space = build_space(costs, cluster, dataclasses.replace(job, seq_len=8))
        tps = set(space.cores[:, CORE.index("tp")].tolist())
        assert tps == ({1} if refused else {1, 2})
        assert ("tp_runs" in space.rejected) == refused
    # Sequence parallel: the preset's TP plan, read off the layouts (but the embedding, which
    # the ILP splits by columns and hands on as sequence shards).
    sp = make_plan({"dp": 2, "tp": 2, "sequence_parallel": True}, traced, SGD)
    check(sp)
    want = {**TP_PLAN, "tok_embeddings": "gathered"}
    assert traced.variant(True).tp_plan(2) == want
    # Learned positions added in the model's own forward have no module boundary to
    # scatter the sequence on: refused by name.
    gpt = _traced(GPT, SGD, (1, 2))
    with pytest.raises(SpecError, match="no module boundary to scatter the sequence"):
        check(make_plan({"dp": 2, "tp": 2, "sequence_parallel": True}, gpt, SGD))

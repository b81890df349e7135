"""Emitters: round trips, each trainer's own parser, mapped features, the CLI.

The trainers' parsers: torchtitan 0.2.2's ``ConfigManager`` and DeepSpeed 0.19.8's
``DeepSpeedConfig`` (the ``[trainers]`` extra; skipped when not installed), and Megatron-LM's
argument definitions at the commit in ``tests/data/megatron_args.json`` rebuilt as an argparse
parser (Megatron-LM itself needs CUDA-only packages).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import shutil
import subprocess
import sys
import tomllib
import types
import warnings
from pathlib import Path

import pytest
from inprocess import run_planner

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from planner.cli import main
from planner.emit import TRAINING_TARGETS, emit, read_back
from planner.emit.megatron import parse_array
from planner.result import Plan

DATA = Path(__file__).parent / "data"


def make_plan(model: str, nodes: int, cfg: ParallelConfig, framework: str,
              **job: object) -> Plan:
    """A plan for ``cfg`` as ``plan()`` would return it (no search)."""
    m = ModelSpec.preset(model)
    c = Cluster.preset("dgx-h100", num_nodes=nodes)
    j = Job(global_batch_size=512, seq_len=4096, framework=framework, **job)  # type: ignore[arg-type]
    return Plan(model=m, cluster=c, job=j, config=cfg, estimate=estimate(m, c, j, cfg))


PC = ParallelConfig
#: Configurations each trainer runs as they are: (id, model, nodes, framework, config, job).
NATIVE = [
    ("tt-fsdp", "llama-3-8b", 2, "torchtitan", PC(dp=16, zero_stage=3), {}),
    ("tt-hsdp-tp", "llama-3-70b", 8, "torchtitan",
     PC(dp=8, tp=8, zero_stage=3, sharding_group=4, sequence_parallel=True,
        recompute="selective"), {}),
    ("tt-pp-half-recompute", "llama-3-70b", 8, "torchtitan",
     PC(dp=4, tp=8, pp=2, zero_stage=2, sequence_parallel=True, micro_batch_size=2,
        recompute="full", recompute_num_layers=20), {}),
    ("tt-interleaved", "llama-3-70b", 8, "torchtitan",
     PC(dp=2, tp=8, pp=4, virtual_pipeline_stages=5, zero_stage=2, sequence_parallel=True,
        recompute="full"), {}),
    ("tt-zbv", "llama-3-8b", 2, "torchtitan",
     PC(dp=4, pp=4, pipeline_schedule="zbv", virtual_pipeline_stages=2, recompute="full"), {}),
    ("tt-dualpipev", "qwen3-30b-a3b", 2, "torchtitan",
     PC(dp=4, pp=4, ep=4, zero_stage=2, pipeline_schedule="dualpipev",
        virtual_pipeline_stages=2), {}),
    ("tt-gpipe-stages", "llama-3-8b", 2, "torchtitan",
     PC(dp=4, pp=4, pipeline_schedule="gpipe", stage_layers=(7, 9, 9, 7), recompute="full"),
     {}),
    ("tt-offload", "llama-3-8b", 2, "torchtitan",
     PC(dp=16, zero_stage=3, offload="optimizer+params"), {}),
    ("tt-moe-cp-fp8", "mixtral-8x7b", 4, "torchtitan",
     PC(dp=8, tp=2, cp=2, ep=4, zero_stage=3, sequence_parallel=True, recompute="full"),
     {"precision": "fp8"}),
    ("tt-fp8-float8-gather", "llama-3-8b", 2, "torchtitan",
     PC(dp=16, zero_stage=3, recompute="selective"),
     {"precision": "fp8", "fp8_param_gather": True, "compile": True}),
    ("tt-fp8-rowwise", "llama-3-8b", 2, "torchtitan",
     PC(dp=8, tp=2, zero_stage=3, sequence_parallel=True, recompute="selective"),
     {"precision": "fp8", "float8_recipe": "rowwise", "compile": True}),
    ("mg-zero1-tp-pp", "llama-3-70b", 8, "megatron",
     PC(dp=4, tp=8, pp=2, zero_stage=1, sequence_parallel=True, recompute="selective"), {}),
    ("mg-tp-overlap", "llama-3-70b", 8, "megatron",
     PC(dp=8, tp=4, pp=2, zero_stage=1, sequence_parallel=True), {"tp_comm_overlap": True}),
    ("mg-interleaved-blocking-p2p", "llama-3-70b", 8, "megatron",
     PC(dp=2, tp=8, pp=4, virtual_pipeline_stages=5, zero_stage=1, sequence_parallel=True,
        recompute="full"), {"overlap_p2p_comm": False}),
    ("mg-interleaved-block", "llama-3-70b", 8, "megatron",
     PC(dp=2, tp=8, pp=4, virtual_pipeline_stages=5, zero_stage=1, sequence_parallel=True,
        recompute="full", recompute_num_layers=2), {}),
    ("mg-layout", "llama-3-70b", 8, "megatron",
     PC(dp=2, tp=8, pp=4, sequence_parallel=True, stage_layers=(19, 21, 21, 19),
        recompute="full"), {}),
    ("mg-fsdp", "llama-3-8b", 2, "megatron", PC(dp=16, zero_stage=3), {}),
    # Combined 1F1B: Megatron-LM's expert all-to-all overlap, interleaved and without a pipeline.
    ("mg-combined-1f1b", "qwen3-30b-a3b", 4, "megatron",
     PC(dp=8, pp=4, ep=8, zero_stage=1, pipeline_schedule="combined-1f1b",
        virtual_pipeline_stages=2, recompute="selective"), {}),
    ("mg-combined-pp1", "qwen3-30b-a3b", 2, "megatron",
     PC(dp=16, ep=8, zero_stage=1, pipeline_schedule="combined-1f1b"), {}),
    ("mg-moe-offload-fp8", "mixtral-8x7b", 4, "megatron",
     PC(dp=8, tp=2, pp=2, ep=4, zero_stage=1, sequence_parallel=True, offload="optimizer"),
     {"precision": "fp8"}),
    ("mg-hybrid", "llama-3-8b", 4, "megatron",
     PC(dp=16, tp=2, zero_stage=1, sharding_group=8, sequence_parallel=True,
        recompute="full"), {}),
    # Qwen3: query and key norms, head width 128 apart from hidden / heads (--qk-layernorm,
    # --kv-channels; torchtitan's qwen3 flavors), 128 fine-grained experts, top-8.
    ("mg-qwen3-dense", "qwen3-32b", 8, "megatron",
     PC(dp=4, tp=8, pp=2, zero_stage=1, sequence_parallel=True, recompute="selective"), {}),
    ("tt-qwen3-moe", "qwen3-30b-a3b", 4, "torchtitan",
     PC(dp=16, tp=2, ep=8, zero_stage=3, sequence_parallel=True, recompute="full"), {}),
    ("ds-zero2", "llama-3-8b", 2, "deepspeed", PC(dp=16, zero_stage=2, micro_batch_size=2), {}),
    ("ds-zero3-offload-fp16", "llama-3-8b", 2, "deepspeed",
     PC(dp=16, zero_stage=3, offload="optimizer+params", recompute="full"),
     {"precision": "fp16"}),
    ("ds-pp-tp", "llama-3-70b", 8, "deepspeed",
     PC(dp=2, tp=8, pp=4, zero_stage=1, recompute="full"), {}),
]


@pytest.fixture(scope="module", params=NATIVE, ids=[c[0] for c in NATIVE])
def case(request: pytest.FixtureRequest) -> Plan:
    _, model, nodes, fw, cfg, job = request.param
    return make_plan(model, nodes, cfg, fw, **job)


@pytest.mark.parametrize("target", TRAINING_TARGETS)
def test_round_trip(case: Plan, target: str) -> None:
    """Reading an emitted file back gives what was emitted; for the plan's own trainer (and
    Slurm, which starts it) that is the plan's configuration, with no warning."""
    out = emit(case, target)
    back = read_back(target, out.text, case.model)
    assert back.config == out.config
    assert back.global_batch_size == case.job.global_batch_size
    if back.num_gpus is not None:
        assert back.num_gpus == case.cluster.num_gpus
    if back.seq_len is not None:
        assert back.seq_len == case.job.seq_len
    if target in ("slurm", case.job.framework):
        assert out.warnings == ()
        assert out.config == case.config
        assert out.estimate == case.estimate


@pytest.mark.parametrize("target", TRAINING_TARGETS)
def test_header_has_predictions_and_command(case: Plan, target: str) -> None:
    out = emit(case, target, command=f"planner emit plan.json --target {target}")
    e = out.estimate
    head = out.text[:4000]
    assert f"step {e.step_time_s:.3f} s" in head
    assert f"peak memory {e.peak_memory_bytes / 1024**3:.1f} of " \
        f"{e.memory_capacity_bytes / 1024**3:.1f} GiB per GPU" in head
    assert f"command: planner emit plan.json --target {target}" in head
    for w in out.warnings:
        assert f"WARNING: {w}" in out.text


# ---- mapped and refused features ------------------------------------------------------------

def test_megatron_maps_gpipe_and_stage_recompute_with_warnings() -> None:
    p = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, pipeline_schedule="gpipe",
                                      stage_layers=(7, 9, 9, 7), recompute="full",
                                      stage_recompute_layers=(7, 5, 3, 1)), "torchtitan")
    out = emit(p, "megatron")
    assert out.config.pipeline_schedule == "1f1b"
    assert out.config.stage_layers == (7, 9, 9, 7)
    assert out.config.recompute_num_layers == 7 and out.config.stage_recompute_layers is None
    text = " ".join(out.warnings)
    assert "gpipe" in text and "[7, 5, 3, 1]" in text and "searched for torchtitan" in text
    # The header's prediction is for what the file runs, not for the plan.
    assert out.estimate == estimate(p.model, p.cluster, out.job, out.config)
    with pytest.raises(SpecError, match="--strict"):
        emit(p, "megatron", strict=True)


def test_deepspeed_maps_non_uniform_stages_to_uniform() -> None:
    p = make_plan("llama-3-70b", 8, PC(dp=2, tp=8, pp=4, zero_stage=1, recompute="full",
                                       stage_layers=(19, 21, 21, 19)), "deepspeed")
    out = emit(p, "deepspeed")
    assert out.config == dataclasses.replace(p.config, stage_layers=None)
    assert any("uniform split" in w for w in out.warnings)
    assert any(f"(plan {p.estimate.step_time_s:.3f} s)" in w for w in out.warnings)


def test_torchtitan_maps_partial_recompute_to_every_kth_layer() -> None:
    # 8 layers per stage, 3 recomputed: torchtitan checkpoints every 2nd block, i.e. 4.
    p = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, recompute="full", recompute_num_layers=3),
                  "torchtitan")
    out = emit(p, "torchtitan")
    assert out.config.recompute_num_layers == 4
    assert 'selective_ac_option = "2"' in out.text
    assert any("every 2-th" in w for w in out.warnings)


def test_zero_stage_mapping_follows_framework_capabilities() -> None:
    # torchtitan has no ZeRO-1: the next stage up (2); Megatron has no ZeRO-2 with PP: 1.
    p = make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=1), "deepspeed")
    assert emit(p, "torchtitan").config.zero_stage == 2
    q = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, zero_stage=2), "torchtitan")
    assert emit(q, "megatron").config.zero_stage == 1


@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_encoder_models_are_refused_by_decoder_trainers(target: str) -> None:
    p = make_plan("bert-large", 1, PC(dp=8), "deepspeed")
    with pytest.raises(SpecError, match="decoder-only"):
        emit(p, target)
    assert emit(p, "deepspeed").warnings == ()


def test_torchtitan_flavor_needs_the_preset_shape() -> None:
    p = make_plan("llama-3-8b", 1, PC(dp=8), "torchtitan")
    assert 'flavor = "8B"' in emit(p, "torchtitan").text
    other = dataclasses.replace(p, model=dataclasses.replace(p.model, num_layers=16))
    text = emit(other, "torchtitan").text
    assert 'flavor = "llama-3-8b"' in text and "is not a torchtitan built-in flavor" in text


def test_unknown_target() -> None:
    p = make_plan("llama-3-8b", 1, PC(dp=8), "torchtitan")
    with pytest.raises(SpecError, match="unknown emit target 'nemo'"):
        emit(p, "nemo")


def test_plan_emit_warns() -> None:
    p = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, pipeline_schedule="gpipe"), "torchtitan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = p.emit("megatron")
    assert any(str(w.message).startswith("megatron: Megatron-LM has no gpipe")
               for w in caught)
    assert "MEGATRON_ARGS=(" in text
    assert p.emit("torchtitan").startswith("# Generated by autoparallel-planner")


def test_distributed_saved_activations_reach_megatron_and_not_torchtitan() -> None:
    p = make_plan("llama-3-8b", 1, PC(dp=1, tp=8, recompute="full"), "megatron",
                  distribute_saved_activations=True)
    assert "--distribute-saved-activations" in p.emit("megatron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.emit("torchtitan")
    assert any("no distributed saved activations" in str(w.message) for w in caught)
    plain = make_plan("llama-3-8b", 1, PC(dp=1, tp=8, recompute="full"), "megatron")
    assert "--distribute-saved-activations" not in plain.emit("megatron")


def test_torchtitan_gets_the_jobs_float8_recipe() -> None:
    for recipe in ("tensorwise", "rowwise"):
        p = make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=3), "torchtitan", precision="fp8",
                      float8_recipe=recipe)
        assert f'recipe_name = "{recipe}"' in p.emit("torchtitan")
        # The output layer stays in bf16, as the cost model times it
        # (costmodel.formulas.headcompute.lm_head_compute); a MoE model's router gates too.
        assert 'filter_fqns = ["output"]' in p.emit("torchtitan")
    moe = make_plan("mixtral-8x7b", 4, PC(dp=32, zero_stage=3), "torchtitan", precision="fp8")
    assert 'filter_fqns = ["output", "router.gate"]' in moe.emit("torchtitan")
    # FSDP's float8 all-gather (Job.fp8_param_gather), which the cost model counts at 1 byte
    # per weight: written for the tensor-wise recipe under FSDP, never row-wise (torchao
    # gathers in bf16 there) nor without sharded parameters.
    on = "enable_fsdp_float8_all_gather = true"
    assert on in make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=3), "torchtitan",
                           precision="fp8", fp8_param_gather=True).emit("torchtitan")
    assert on not in make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=3), "torchtitan",
                               precision="fp8", fp8_param_gather=True,
                               float8_recipe="rowwise").emit("torchtitan")
    assert on not in make_plan("llama-3-8b", 2, PC(dp=2, tp=8, sequence_parallel=True),
                               "torchtitan", precision="fp8",
                               fp8_param_gather=True).emit("torchtitan")
    assert on not in make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=3), "torchtitan",
                               precision="fp8").emit("torchtitan")


# ---- the trainers' own parsers --------------------------------------------------------------

@functools.cache
def _load_torchtitan_config_manager() -> type | str:
    """torchtitan 0.2's ConfigManager, imported without torchtitan/__init__.py (which loads
    Triton kernels this CPU machine does not have); or why it cannot be."""
    if importlib.util.find_spec("tyro") is None:
        return "tyro is not installed"
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.submodule_search_locations is None:
        return "torchtitan is not installed (pip install -e '.[trainers]')"
    from importlib.metadata import version

    if not version("torchtitan").startswith("0.2."):
        return f"torchtitan {version('torchtitan')} reads no TOML job configs"
    stub = types.ModuleType("torchtitan")
    stub.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = stub
    try:
        from torchtitan.config.manager import ConfigManager
    finally:
        sys.modules.pop("torchtitan", None)
    return ConfigManager  # type: ignore[no-any-return]


def _torchtitan_config_manager() -> type:
    found = _load_torchtitan_config_manager()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def test_torchtitan_config_manager_reads_emitted_toml(case: Plan, tmp_path: Path) -> None:
    manager = _torchtitan_config_manager()
    if not case.model.causal:
        pytest.skip("encoder")
    out = emit(case, "torchtitan")
    path = tmp_path / "job.toml"
    path.write_text(out.text)
    jc = manager().parse_args(["--job.config_file", str(path)])
    cfg, par = out.config, jc.parallelism
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == cfg.dp
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree,
            par.context_parallel_degree, par.expert_parallel_degree) == (
        cfg.tp, cfg.pp, cfg.cp, cfg.ep)
    assert jc.training.global_batch_size == case.job.global_batch_size
    assert jc.training.seq_len == case.job.seq_len
    if cfg.pp > 1:
        # torchtitan's batch per rank splits into micro-batches of the plan's size.
        assert jc.training.local_batch_size % par.pipeline_parallel_microbatch_size == 0
        assert (jc.training.local_batch_size // par.pipeline_parallel_microbatch_size
                == out.estimate.num_micro_batches)
        layers = [n for part in par.module_fqns_per_model_part for n in part
                  if n.startswith("layers.")]
        assert layers == [f"layers.{i}" for i in range(case.model.num_layers)]
        from torch.distributed.pipelining.schedules import get_schedule_class

        get_schedule_class(par.pipeline_parallel_schedule)
    assert jc.activation_checkpoint.mode in ("none", "selective", "full")
    if case.job.precision == "fp8":
        # torchtitan reads the recipe and the layers it leaves in bf16 (its output layer).
        f8 = jc.quantize.linear.float8
        assert f8.recipe_name == case.job.float8_recipe and "output" in f8.filter_fqns


def _deepspeed_config(text: str, dp: int) -> object:
    pytest.importorskip("deepspeed", reason="pip install -e '.[trainers]'")
    import deepspeed.runtime.config as ds_config

    class DataParallel:  # the mpu DeepSpeed asks for the data-parallel size
        @staticmethod
        def get_data_parallel_world_size() -> int:
            return dp

    mp = pytest.MonkeyPatch()
    mp.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    try:
        return ds_config.DeepSpeedConfig(json.loads(text), mpu=DataParallel())
    finally:
        mp.undo()


def test_deepspeed_config_reads_emitted_json(case: Plan) -> None:
    out = emit(case, "deepspeed")
    cfg = out.config
    ds = _deepspeed_config(out.text, cfg.dp)
    assert ds.train_batch_size == case.job.global_batch_size  # type: ignore[attr-defined]
    assert ds.train_micro_batch_size_per_gpu == cfg.micro_batch_size  # type: ignore[attr-defined]
    assert ds.gradient_accumulation_steps == out.estimate.num_micro_batches  # type: ignore[attr-defined]
    assert ds.zero_optimization_stage == cfg.zero_stage  # type: ignore[attr-defined]
    zc = ds.zero_config  # type: ignore[attr-defined]
    assert (zc.offload_optimizer is not None) == (cfg.offload != "none")
    assert (zc.offload_param is not None) == (cfg.offload == "optimizer+params")


def test_deepspeed_config_rejects_a_wrong_batch() -> None:
    """The check above can fail: DeepSpeed refuses a batch that does not divide."""
    p = make_plan("llama-3-8b", 2, PC(dp=16, zero_stage=2), "deepspeed")
    d = json.loads(emit(p, "deepspeed").text)
    d["gradient_accumulation_steps"] += 1
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        _deepspeed_config(json.dumps(d), 16)


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's pretrain_gpt.py parser, rebuilt from its dumped argument definitions."""
    doc = json.loads((DATA / "megatron_args.json").read_text())
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False,
                                exit_on_error=False)
    types_ = {"int": int, "float": float}
    for a in doc["actions"]:
        kw: dict[str, object] = {"dest": a["dest"]}
        if a["kind"] in ("storetrue", "storefalse"):
            kw["action"] = "store_" + a["kind"][5:]
        elif a["kind"] == "booleanoptional":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = types_.get(a["type"], str)
            if a["nargs"] is not None:
                kw["nargs"] = a["nargs"]
            if a["choices"] is not None:
                kw["choices"] = [str(c) if kw["type"] is str else c for c in a["choices"]]
        p.add_argument(*a["flags"], **kw)  # type: ignore[arg-type]
    return p


def test_megatron_parser_reads_emitted_arguments(case: Plan) -> None:
    if not case.model.causal:
        pytest.skip("encoder")
    out = emit(case, "megatron")
    ns = megatron_parser().parse_args(parse_array(out.text))
    cfg = out.config
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size,
            ns.context_parallel_size, ns.expert_model_parallel_size) == (
        cfg.tp, cfg.pp, cfg.cp, cfg.ep)
    assert ns.micro_batch_size == cfg.micro_batch_size
    assert ns.global_batch_size == case.job.global_batch_size
    assert ns.sequence_parallel == cfg.sequence_parallel
    assert ns.tp_comm_overlap == (case.job.tp_comm_overlap and cfg.sequence_parallel)
    assert ns.overlap_p2p_comm == (case.job.overlap_p2p_comm or cfg.virtual_pipeline_stages == 1)
    assert ns.num_layers == case.model.num_layers and ns.seq_length == case.job.seq_len
    assert ns.use_distributed_optimizer == (cfg.zero_stage in (1, 3))
    assert ns.recompute_granularity == (None if cfg.recompute == "none" else cfg.recompute)


def test_megatron_parser_rejects_a_wrong_choice() -> None:
    """The check above can fail: a value outside Megatron's choices is refused."""
    with pytest.raises(argparse.ArgumentError, match="recompute-granularity"):
        megatron_parser().parse_args(["--recompute-granularity", "partial"])


def test_megatron_args_data_names_its_source() -> None:
    doc = json.loads((DATA / "megatron_args.json").read_text())
    assert doc["commit"].startswith("4666de7a28") and doc["version"].startswith("0.16")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("target", ["megatron", "slurm"])
def test_shell_files_parse_in_bash(case: Plan, target: str, tmp_path: Path) -> None:
    out = emit(case, target)
    path = tmp_path / out.filename
    path.write_text(out.text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    if target == "megatron":
        # bash sees the same words as the reader.
        words = subprocess.run(["bash", "-c", f'source {path}; printf "%s\\n" '
                                '"${MEGATRON_ARGS[@]}"'], check=True, capture_output=True,
                               text=True).stdout.splitlines()
        assert words == parse_array(out.text)


# ---- CLI ------------------------------------------------------------------------------------

def test_cli_emit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, pipeline_schedule="gpipe"), "torchtitan")
    plan_path = tmp_path / "plan.json"
    p.to_json(plan_path)
    out = tmp_path / "args.sh"
    # GPipe holds all 128 micro-batches' activations: the plan does not fit, and a saved plan
    # is re-checked before it is emitted (exit 3), unless --force.
    assert main(["emit", str(plan_path), "--target", "megatron", "-o", str(out)]) == 3
    err = capsys.readouterr().err
    assert "does not fit" in err and "--force" in err and not out.exists()
    assert main(["emit", str(plan_path), "--target", "megatron", "-o", str(out),
                 "--force"]) == 0
    err = capsys.readouterr().err
    assert "planner: warning: Megatron-LM has no gpipe" in err
    assert "used anyway (--force)" in err
    assert f"command: planner emit {plan_path} --target megatron -o {out}" in out.read_text()
    assert main(["emit", str(plan_path), "--target", "torchtitan", "--force"]) == 0
    assert "[parallelism]" in capsys.readouterr().out
    assert main(["emit", str(plan_path), "--target", "megatron", "--strict", "--force"]) == 2
    assert "--strict" in capsys.readouterr().err
    assert main(["emit", str(tmp_path / "missing.json"), "--target", "slurm"]) == 2
    assert "plan file" in capsys.readouterr().err


def test_cli_emit_bad_target_exits_2(tmp_path: Path) -> None:
    r = run_planner("emit", "plan.json", "--target", "nemo", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'nemo'" in r.stderr
    assert "Traceback" not in r.stderr


def test_torchtitan_config_manager_rejects_an_unknown_field(tmp_path: Path) -> None:
    """The check above can fail: torchtitan refuses a field its JobConfig does not have."""
    manager = _torchtitan_config_manager()
    path = tmp_path / "job.toml"
    path.write_text("[parallelism]\ntensor_parallel_size = 8\n")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        manager().parse_args(["--job.config_file", str(path)])


def test_qwen3_is_written_with_its_query_and_key_norms_and_head_width() -> None:
    """Megatron-LM's --qk-layernorm and --kv-channels 128 (64 heads of 128 in a 5120-wide
    model), and torchtitan's own qwen3 flavor (torchtitan/models/qwen3/__init__.py)."""
    dense = make_plan("qwen3-32b", 8, PC(dp=4, tp=8, pp=2, zero_stage=1,
                                        sequence_parallel=True), "megatron")
    text = dense.emit("megatron")
    assert "--qk-layernorm" in text and "--kv-channels 128" in text
    moe = make_plan("qwen3-30b-a3b", 4, PC(dp=16, tp=2, ep=8, zero_stage=3,
                                           sequence_parallel=True), "torchtitan")
    toml = tomllib.loads(moe.emit("torchtitan"))
    assert toml["model"]["name"] == "qwen3" and toml["model"]["flavor"] == "30B-A3B"
    # A Qwen3-shaped model of another size names torchtitan's qwen3 model, not llama3.
    other = ModelSpec(**{**ModelSpec.preset("qwen3-32b").to_dict(), "name": "my-qwen",
                         "num_layers": 32})
    cluster = Cluster.preset("dgx-h100", num_nodes=4)
    job = Job(global_batch_size=64, seq_len=4096, framework="torchtitan")
    cfg = PC(dp=16, tp=2, zero_stage=3, sequence_parallel=True)
    mine = Plan(model=other, cluster=cluster, job=job, config=cfg,
                estimate=estimate(other, cluster, job, cfg)).emit("torchtitan")
    assert tomllib.loads(mine)["model"]["name"] == "qwen3"
    assert "for model 'qwen3' (Qwen3ModelArgs" in mine and "qk_norm=True" in mine


def test_deepspeed_takes_per_stage_recompute_before_dropping_the_stage_split() -> None:
    """A plan recomputing a different number of layers per stage of an explicit split (the
    docs' quick DeepSpeed plan, llama-3-70b on 64 H100s) is emitted: the counts become the
    largest, then the split the uniform one. Before, dropping the split first left per-stage
    counts without one, and emit stopped with an invalid configuration."""
    cfg = ParallelConfig(dp=4, tp=4, pp=2, cp=2, zero_stage=1, recompute="full",
                         stage_layers=(40, 40), stage_recompute_layers=(1, 0),
                         offload="optimizer")
    out = emit(make_plan("llama-3-70b", 8, cfg, "deepspeed"), "deepspeed")
    assert out.config.stage_layers is None and out.config.stage_recompute_layers is None
    assert any("recomputes the same number of layers" in w for w in out.warnings)


def test_torchtitan_runs_zero_bubble_as_the_v_schedule() -> None:
    """torchtitan 0.2.2 refuses one stage per rank for a multi-stage schedule, so the
    one-stage ZB-H1 the plan timed is emitted as ZBVZeroBubble, re-estimated as ``zbv``
    with its two stages per rank (torchtitan/distributed/pipeline_parallel.py)."""
    p = make_plan("llama-3-8b", 2, PC(dp=4, pp=4, pipeline_schedule="zero-bubble"), "torchtitan")
    out = emit(p, "torchtitan")
    assert out.config.pipeline_schedule == "zbv" and out.config.virtual_pipeline_stages == 2
    assert any("ZBVZeroBubble" in w for w in out.warnings)
    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in out.text
    back = read_back("torchtitan", out.text, p.model)
    assert back.config == out.config

"""Faulty input that must end in one line and no traceback, and the rough edges a new user
hits (issue 57, parts 3 and 4). Each case is one a user met or one of its kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from inprocess import run_planner

import hardware_profiles
import planner
from costmodel import Cluster, InferenceJob, Job, ModelSpec, SpecError
from costmodel.fitting.published import load_runs
from costmodel.units import count, plural
from hardware_profiles.files import loads_json, read_toml

JOB = ["--model", "llama-3-8b", "--global-batch-size", "32", "--seq-len", "1024"]
SMALL = [*JOB, "--gpus", "8", "--gpu", "h100-sxm"]


def _one_line(r: object) -> None:
    err = r.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**os.environ, **env})


# ---- files nested too deep, numbers too large ---------------------------------------------

@pytest.mark.parametrize("text", ["[" * 10_000 + "]" * 10_000, '{"a":' * 5_000 + "1" + "}" * 5_000,
                                  "[" + "1" * 4_400 + "]", '{"counts": {"space": 1e400}}',
                                  '{"a": NaN}', '{"a": -Infinity}', "[" * 70 + "]" * 70])
def test_json_that_breaks_the_parser_is_one_error(text: str) -> None:
    with pytest.raises(SpecError, match=r"plan file 'x\.json'"):
        loads_json(text, "x.json", "plan file")


def test_toml_nested_deep_is_one_error(tmp_path: Path) -> None:
    for text in ("a = " + "[" * 5_000 + "]" * 5_000, "a = " + "{b = " * 3_000 + "1" + "}" * 3_000,
                 "[" + ".".join(["t"] * 200) + "]\nx = 1\n"):
        (tmp_path / "deep.toml").write_text(text)
        with pytest.raises(SpecError, match=r"deep\.toml"):
            read_toml(tmp_path / "deep.toml", "profile file")
        r = run_planner("estimate", *JOB, "--cluster", str(tmp_path / "deep.toml"), "--tp",
                        "8")
        assert r.returncode == 2 and "deep.toml" in r.stderr, r.stderr
        _one_line(r)


def test_a_plan_file_of_huge_numbers_is_one_line(tmp_path: Path) -> None:
    assert run_planner("plan", *SMALL, "-o", "p.json", cwd=tmp_path).returncode == 0
    text = (tmp_path / "p.json").read_text()
    d = json.loads(text)
    for bad in ('{"space": 1e400}', '{"space": ' + "9" * 5_000 + "}"):
        (tmp_path / "q.json").write_text(text.replace(json.dumps(d["counts"], indent=2)
                                                      .replace("\n", "\n  "), bad, 1))
        r = run_planner("explain", "q.json", cwd=tmp_path)
        assert r.returncode == 2, r.stdout[-300:]
        _one_line(r)
    # A file named like JSON text is a file.
    (tmp_path / "{x}.json").write_text(text)
    r = run_planner("emit", "{x}.json", "--target", "megatron", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# ---- Hugging Face config fields of the wrong kind -------------------------------------------

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 1000, "max_position_embeddings": 2048}
DEEPSEEK = {**LLAMA, "model_type": "deepseek", "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 128, "n_shared_experts": 1, "first_k_dense_replace": 1}
BERT = {"model_type": "bert", "hidden_size": 256, "intermediate_size": 1024,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
        "max_position_embeddings": 512}
VIT = {"model_type": "vit", "hidden_size": 256, "intermediate_size": 1024,
       "num_hidden_layers": 2, "num_attention_heads": 4, "patch_size": 16, "image_size": 224,
       "id2label": {"0": "cat", "1": "dog"}}


@pytest.mark.parametrize("config,field,value", [
    (DEEPSEEK, "moe_layer_freq", "x"), (DEEPSEEK, "n_shared_experts", "two"),
    (DEEPSEEK, "first_k_dense_replace", 1.5), (BERT, "type_vocab_size", "2"),
    (VIT, "id2label", 5), (VIT, "num_channels", "rgb"), (LLAMA, "tie_word_embeddings", "false"),
    (LLAMA, "attention_bias", "no"), (LLAMA, "vocab_size", 0), (LLAMA, "vocab_size", -5)])
def test_a_config_field_of_the_wrong_kind_is_named(config: dict, field: str, value: object
                                                   ) -> None:
    with pytest.raises(SpecError, match=field):
        ModelSpec.from_hf_config({**config, field: value})


def test_null_optional_fields_take_their_defaults() -> None:
    assert ModelSpec.from_hf_config({**BERT, "type_vocab_size": None}).num_token_types == 2
    assert ModelSpec.from_hf_config({**DEEPSEEK, "n_shared_experts": None}).num_shared_experts \
        == 0
    assert ModelSpec.from_hf_config({**LLAMA, "tie_word_embeddings": True}).tied_embeddings


@pytest.mark.parametrize("field", ["gated_mlp", "tied_embeddings", "bias", "causal"])
def test_api_switches_are_booleans(field: str) -> None:
    with pytest.raises(SpecError, match=field):
        ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, **{field: "no"})


def test_a_sequence_longer_than_a_learned_position_table_is_said() -> None:
    gpt2 = ModelSpec.from_hf_config({"model_type": "gpt2", "n_embd": 256, "n_layer": 2,
                                     "n_head": 4, "vocab_size": 1000, "n_positions": 1024})
    p = planner.plan(gpt2, Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1),
                     Job(global_batch_size=4, seq_len=4096))
    assert any("learned position table (1,024)" in w for w in p.warnings)
    assert "learned position table" in p.summary()
    p = planner.plan(gpt2, Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1),
                     Job(global_batch_size=4, seq_len=1024))
    assert not any("position table" in w for w in p.warnings)


# ---- profile files, runs files, the user's fit ----------------------------------------------

@pytest.mark.parametrize("edit,named", [
    (("[peak_tflops]", "peak_tflops = 5\n[x]"), "peak_tflops"),
    (("gemm = 0.803", 'gemm = "fast"'), "efficiency.gemm"),
    (("tdp_w = 700", 'tdp_w = 700\nsource = "me"'), "source")])
def test_a_gpu_profile_of_the_wrong_shape_is_named(edit: tuple[str, str], named: str,
                                                   tmp_path: Path) -> None:
    text = Path(hardware_profiles.__file__).parent.joinpath("gpus/h100-sxm.toml").read_text()
    assert edit[0] in text
    path = tmp_path / "gpu.toml"
    path.write_text(text.replace(edit[0], edit[1], 1).replace('[source]\ndocument', "[src]\nd"))
    r = run_planner("estimate", *SMALL[:2], "--gpus", "8", "--gpu", str(path),
                    "--global-batch-size", "8", "--seq-len", "1024", "--tp", "8")
    assert r.returncode == 2 and named in r.stderr, r.stderr
    _one_line(r)


@pytest.mark.parametrize("runs,message", [
    ([5], "run #1"), (["x"], "run #1"), ([None], "run #1"), ([], "holds no runs"),
    ("unknown-measure", "measured holds none of"), ("model-list", "malformed")])
def test_a_runs_file_of_bad_rows_is_one_line(runs: object, message: str, tmp_path: Path) -> None:
    rows = json.loads(Path(planner.__file__).parent.parent.joinpath(
        "costmodel/data/published_runs.json").read_text())["runs"]
    if runs == "unknown-measure":
        runs = [{**rows[0], "measured": {"seconds": 1.0}}]
    elif runs == "model-list":
        runs = [{**rows[0], "model": [1, 2]}]
    (tmp_path / "runs.json").write_text(json.dumps({"runs": runs}))
    with pytest.raises(SpecError, match=message):
        load_runs(tmp_path / "runs.json")
    for command in (["validate", "--runs", "runs.json"],
                    ["calibrate", "--runs", "runs.json", "-o", "t.toml"]):
        r = run_planner(*command, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr, r.stderr
        _one_line(r)


@pytest.mark.slow
@pytest.mark.parametrize("text", ["[transfer]\nmemory = 1.0\n", "[transfer]\ngemm = nan\n",
                                  "[transfer]\ngemm = 'x'\nkernel_overhead_us = 5\n",
                                  "transfer = 3\n", "not toml [", ""])
def test_a_broken_fit_of_the_users_says_which_file_and_how_to_reset(text: str,
                                                                    tmp_path: Path) -> None:
    fit = tmp_path / "config" / "calibrated" / "transfer.toml"
    fit.parent.mkdir(parents=True)
    fit.write_text(text)
    env = {"PLANNER_CONFIG_DIR": str(tmp_path / "config")}
    r = _cli("estimate", *SMALL, "--tp", "8", cwd=tmp_path, **env)
    assert r.returncode == 2 and str(fit) in r.stderr and "--reset" in r.stderr, r.stderr
    _one_line(r)
    r = _cli("calibrate", "--reset", cwd=tmp_path, **env)
    assert r.returncode == 0 and not fit.exists()
    assert _cli("estimate", *SMALL, "--tp", "8", cwd=tmp_path, **env).returncode == 0


@pytest.mark.slow
def test_the_users_fit_is_named_in_every_header_and_reset_removes_it(tmp_path: Path) -> None:
    config = tmp_path / "config"
    env = {"PLANNER_CONFIG_DIR": str(config)}
    r = _cli("calibrate", "--groups", "korthikanti2022", cwd=tmp_path, **env)
    assert r.returncode == 0 and "every later estimate uses it" in r.stdout, r.stderr
    fit = config / "calibrated" / "transfer.toml"
    r = _cli("estimate", *SMALL, "--tp", "8", cwd=tmp_path, **env)
    assert r.stdout.startswith(f"fit      your own calibration {fit}")
    assert _cli("plan", *SMALL, "-o", "p.json", cwd=tmp_path, **env).returncode == 0
    r = _cli("emit", "p.json", "--target", "torchtitan", cwd=tmp_path, **env)
    assert f"# fit: your own calibration {fit}" in r.stdout
    r = _cli("calibrate", "--reset", cwd=tmp_path, **env)
    assert r.returncode == 0 and f"removed {fit}" in r.stdout and not fit.exists()
    r = _cli("estimate", *SMALL, "--tp", "8", cwd=tmp_path, **env)
    assert "fit " not in r.stdout.splitlines()[0]
    r = _cli("calibrate", "--reset", "-o", "x.toml", cwd=tmp_path, **env)
    assert r.returncode == 2


# ---- interrupted, unwritable, unencodable ----------------------------------------------------

def test_ctrl_c_in_a_command_is_one_line_and_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.cli.plan as plan_cli

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_cli, "plan", interrupted)
    r = run_planner("plan", *SMALL)
    assert r.returncode == 130 and r.stderr.strip() == "planner: interrupted"


def test_output_to_a_full_disk_or_an_ascii_terminal(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "planner", "plan", *SMALL], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 2 and "cannot write the output" in r.stderr
    _one_line(r)
    r = _cli("plan", *SMALL, cwd=tmp_path, PYTHONIOENCODING="ascii", LC_ALL="C")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "? " in r.stdout


# ---- the API ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_explain_and_apply_take_only_what_they_can(tmp_path: Path) -> None:
    p = planner.plan(ModelSpec.preset("gpt3-125m"),
                     Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1),
                     Job(global_batch_size=4, seq_len=128))
    p.to_json(tmp_path / "plan.json")
    assert planner.explain(str(tmp_path / "plan.json")).plan.config == p.config
    for bad in (None, 5, {"config": {}}):
        with pytest.raises(SpecError, match="explain takes a Plan"):
            planner.explain(bad)  # type: ignore[arg-type]
    pytest.importorskip("torch")
    from planner.runtime.model import build_model

    with pytest.raises(SpecError, match="apply takes a Plan"):
        planner.apply(p.to_dict(), build_model(ModelSpec.preset("gpt3-125m")))  # type: ignore[arg-type]
    other = ModelSpec(name="wider", num_layers=12, hidden_size=1024, num_heads=16,
                      vocab_size=50257, position_embedding="learned",
                      max_position_embeddings=2048, norm="layernorm", bias=True)
    with pytest.raises(SpecError, match="not the model the plan was made for"):
        planner.apply(p, build_model(other))


def test_constraints_of_the_wrong_kind_are_named() -> None:
    for fixed in ({"tp": "2"}, {"tp": 2.0}, {"sequence_parallel": "on"}, {"recompute": 1}):
        with pytest.raises(SpecError, match="constraint fixed"):
            planner.Constraints(fixed=fixed)
    with pytest.raises(SpecError, match="constraint allowed"):
        planner.Constraints(allowed={"pp": [1, "2"]})


def test_top_k_is_capped_and_says_so() -> None:
    r = run_planner("plan", *SMALL, "--top-k", "100000")
    assert r.returncode == 2 and "at most" in r.stderr
    with pytest.raises(SpecError, match="from 1 to 100"):
        planner.plan(ModelSpec.preset("llama-3-8b"), Cluster(gpu="h100-sxm"),
                     Job(global_batch_size=32, seq_len=1024), top_k=100_000)


def test_messages_name_the_real_cause(tmp_path: Path) -> None:
    r = run_planner("plan", *SMALL, "--tp", "16")
    assert r.returncode == 2 and "tp=16 = 16 GPUs does not divide the cluster's 8" in r.stderr
    (tmp_path / "tiny.toml").write_text('gpu = "h100-sxm"\ngpus_per_node = 8\n'
                                        "host_memory_gib = 1\n")
    r = run_planner("plan", "--model", "llama-3-70b", "--cluster", str(tmp_path / "tiny.toml"),
                    "--global-batch-size", "32", "--seq-len", "4096", "--offload",
                    "optimizer+params", "--zero", "3")
    assert r.returncode == 3 and "nothing fits in host memory" in r.stderr, r.stderr
    assert "host_memory_gib" in r.stderr
    os.mkfifo(tmp_path / "fifo.toml")
    r = run_planner("estimate", *JOB, "--cluster", str(tmp_path / "fifo.toml"))
    assert r.returncode == 2 and "not a regular file" in r.stderr


# ---- the model's own code --------------------------------------------------------------------

USER_CODE = textwrap.dedent("""
    import sys
    import torch

    print("imported")


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(8, 8)

    class Loops(Block):
        def forward(self, x):
            while True:
                pass

    class Exits(Block):
        def forward(self, x):
            sys.exit(3)

    class Prints(Block):
        def forward(self, x):
            print("forward ran")
            return self.up(x)
""")
MODULE = ["--gpus", "2", "--gpu", "h100-sxm", "--global-batch-size", "4", "--seq-len", "1",
          "--input-shape", "8"]


@pytest.mark.slow
def test_a_models_own_code_cannot_end_hang_or_garble_the_planner(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "usermodels.py").write_text(USER_CODE)
    for model in ("sys:exit", "usermodels:Exits"):
        r = run_planner("plan", "--model", model, *MODULE, cwd=tmp_path)
        assert r.returncode == 2 and "called sys.exit" in r.stderr, (model, r.stderr)
    r = run_planner("plan", "--model", "usermodels:Prints", *MODULE, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["dp"] >= 1 and "forward ran" in r.stderr
    r = _cli("plan", "--model", "usermodels:Loops", *MODULE, "--trace-timeout", "2",
             cwd=tmp_path)
    assert r.returncode == 2 and "ran for more than 2 s" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_planner_run_refuses_a_plan_it_cannot_build_before_starting(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(2)])

        def forward(self, x: object) -> object:
            for layer in self.layers:
                x = layer(x)
            return x

    p = planner.plan(Net(), Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=2),
                     Job(global_batch_size=4, seq_len=1), example_inputs=torch.zeros(1, 16),
                     constraints={"fixed": {"dp": 2}})
    p.to_json(tmp_path / "plan.json")
    r = _cli("run", "plan.json", cwd=tmp_path)
    assert r.returncode == 2 and "--model module:attr" in r.stderr, r.stderr
    _one_line(r)
    r = _cli("run", "plan.json", "--model", "x:y", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "one input tensor" in r.stderr


# ---- what a new user reads -----------------------------------------------------------------

def test_counts_read_as_people_write_them() -> None:
    assert [count(n) for n in (512, 12_300, 125_226_240, 8.03e9)] == [
        "512 parameters", "12.3K parameters", "125.2M parameters", "8.03B parameters"]
    assert plural(1, "micro-batch") == "1 micro-batch"
    assert plural(4, "micro-batch") == "4 micro-batches" and plural(2, "run") == "2 runs"


def test_reports_say_what_they_show(tmp_path: Path) -> None:
    r = run_planner("--version")
    assert r.returncode == 0 and "0.1.0" in r.stdout
    r = run_planner("gpus")
    widths = {line.index("GiB") for line in r.stdout.splitlines()[1:]}
    assert len(widths) == 1, r.stdout
    r = run_planner("estimate", *SMALL, "--tp", "8")
    assert "inside the node (one node)" in r.stdout and "ib-ndr" not in r.stdout
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "1", "--inference",
                    "--prompt-len", "128", "--output-len", "128", "--tp", "1", "--batch-size",
                    "4", "--dtype", "fp16")
    assert "batch=4 fp16" in r.stdout and "bf16" not in r.stdout.split("\n")[1]
    p = planner.plan(ModelSpec.preset("llama-3-70b"), Cluster(gpu="h100-sxm", num_nodes=8),
                     Job(global_batch_size=256, seq_len=4096),
                     constraints={"frameworks": ["megatron", "deepspeed"]})
    text = p.summary()
    why_not = text.split("why not")[1].split("invalid")[0].strip().splitlines()
    assert all(line.rstrip().split("  ")[0].endswith(("(megatron)", "(deepspeed)"))
               or "(megatron)" in line or "(deepspeed)" in line for line in why_not), why_not
    invalid = text.split("\ninvalid\n")[1].strip().splitlines()
    assert all(line.strip().startswith(("megatron: ", "deepspeed: ")) for line in invalid)
    assert len(repr(p)) < 300 and repr(p).startswith("Plan(model='llama-3-70b'")


def test_a_slow_serving_plan_is_warned() -> None:
    model, cluster = ModelSpec.preset("llama-3-70b"), Cluster(gpu="h100-sxm", num_nodes=1)
    p = planner.plan(model, cluster, InferenceJob(prompt_len=32_000, output_len=128,
                                                  batch_size=8))
    assert any("first token takes" in w for w in p.warnings)
    assert "warning  the first token takes" in p.summary()
    p = planner.plan(model, cluster, InferenceJob(prompt_len=512, output_len=128, batch_size=8))
    assert not p.warnings


def test_a_band_borrowed_from_other_runs_says_extrapolated() -> None:
    job = Job(global_batch_size=8, seq_len=1024)
    tiny = ModelSpec(name="tiny", num_layers=2, hidden_size=256, num_heads=4, vocab_size=1000)
    cfg = planner.ParallelConfig(dp=8)
    for model, gpu in ((tiny, "h100-sxm"), (ModelSpec.preset("llama-3-8b"), "mi355x")):
        est = planner.estimate(model, Cluster(gpu=gpu), job, cfg)
        assert est.step_time_band_extrapolated and "extrapolated" in est.step_time_text
    est = planner.estimate(ModelSpec.preset("llama-3-8b"), Cluster(gpu="h100-sxm"), job, cfg)
    assert not est.step_time_band_extrapolated and "extrapolated" not in est.step_time_text


def test_an_mi300x_plan_under_torchtitan_has_a_band_of_its_own_runs() -> None:
    """Two sources publish MI300X runs under a PyTorch-native trainer (ROCm/TransformerEngine
    issues 78/79, torchao's float8 README, pytorch/ao@853f87d1): the cell's band is its own
    left-out error, not the extrapolated one; and the profile's fused attention is measured
    on an MI300X, not an H100's."""
    job, cfg = Job(global_batch_size=8, seq_len=1024), planner.ParallelConfig(dp=8)
    est = planner.estimate(ModelSpec.preset("llama-3-8b"), Cluster(gpu="mi300x"), job, cfg)
    assert not est.step_time_band_extrapolated
    assert "cdna3, torchtitan" in est.step_time_band_basis
    assert "2 sources" in est.step_time_band_basis
    assert hardware_profiles.provenance("mi300x")["efficiency"]["attention"] == "measured"


def test_the_plot_says_how_much_of_the_timeline_it_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from planner.plots import plot_timeline
    from planner.timeline import timeline

    model, cluster = ModelSpec.preset("llama-3-8b"), Cluster(gpu="h100-sxm", num_nodes=1)
    job, cfg = Job(global_batch_size=64, seq_len=1024), planner.ParallelConfig(pp=4, dp=2)
    tl = timeline(model, cluster, job, cfg)
    ax = plot_timeline(tl, max_micro_batches=4)
    assert f"(the first 4 micro-batches' time of {tl.num_micro_batches})" in ax.get_title()
    assert "first" not in plot_timeline(tl).get_title()


def test_install_hints_fit_a_source_checkout() -> None:
    from costmodel.errors import install_hint

    root = Path(planner.__file__).resolve().parent.parent
    expected = f"pip install -e '{root}[plots]'" if (root / "pyproject.toml").is_file() \
        else "pip install 'autoparallel-planner[plots]'"
    assert install_hint("plots") == expected

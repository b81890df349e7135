"""Property-based fuzzing of the command line (hypothesis): whatever the arguments and files,
the planner exits 0, 2 (bad input) or 3 (nothing fits), never with a traceback, and never
prints a NaN, an infinity or a negative number."""

import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from fastloop import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main


def mostly(good: list, bad: list) -> st.SearchStrategy:
    """A good value nine times in ten, else a bad one: most runs get far enough to print."""
    return st.integers(0, 9).flatmap(lambda i: st.sampled_from(bad if i == 0 else good))


MODELS = mostly(["llama-3-8b", "gpt3-2.7b", "mixtral-8x7b", "gpt3-760m", "llama-3-70b",
                 "deepseek-moe-16b", "bert-large"],
                ["no-such", "", "x:y", "os:getcwd", "json:loads", "../../etc/passwd",
                 "model.json"])
GPUS = mostly(["h100-sxm", "a100-80gb", "a100-40gb", "h200"], ["v100-32gb", "h100", "", "🙂"])
DEGREE = mostly(["1", "2", "4", "8"], ["-3", "0", "3", "64", str(2**40), str(10**30), "x",
                                       "1.5", "", "nan", "-0", "1e3", "0x10"])
FLAGS = {
    "--tp": DEGREE, "--pp": DEGREE, "--cp": DEGREE, "--dp": DEGREE, "--ep": DEGREE,
    "--zero": mostly(["0", "1", "2", "3"], ["4", "-1", "x"]),
    "--micro-batch-size": DEGREE, "--virtual-stages": DEGREE,
    "--recompute": mostly(["none", "selective", "full"], ["all"]),
    "--schedule": mostly(["1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"], ["x"]),
    "--offload": mostly(["none", "optimizer", "optimizer+params"], ["disk"]),
    "--precision": mostly(["bf16", "fp16", "fp8", "fp32"], ["int4"]),
    "--optimizer": mostly(["adamw", "sgd", "adafactor", "adam8bit"], ["lion"]),
    "--framework": mostly(["torchtitan", "megatron", "deepspeed"], ["jax"]),
    "--gpus-per-node": mostly(["8", "4"], ["0", "-1", "3", "x"]),
    "--num-nodes": mostly(["1", "2", "4"], ["0", "-1", "x", str(10**9)]),
    "--inter-node": mostly(["ib-ndr", "roce-400g", "ib-hdr"], ["carrier-pigeon"]),
    "--moe-capacity-factor": mostly(["1.25", "1.0", "2"], ["0", "-1", "nan", "inf", "x"]),
    "--max": mostly(["tp=4", "pp=2", "mbs=2"], ["tp", "x=1", "tp=-1", "tp=x"]),
    "--preset": mostly(["ddp", "zero2", "fsdp", "megatron-3d", "torchtitan-default"], ["nope"]),
    "--frameworks": mostly(["megatron,deepspeed", "torchtitan"], ["", "jax"]),
    "--sequence-parallel": mostly(["on", "off"], ["maybe"]),
    "--config": mostly(["tp=2", "tp=8 pp=2 zero=1 sp", "dp=1 tp=1 pp=1", "tp=2 pp=2 mbs=2",
                        "stage_layers=[16,16] pp=2"], ["tp=", "tp=3", "x", ""]),
}
# Flags each command takes (plan and explain share the search's; compare has its own).
SEARCH = ["--tp", "--pp", "--cp", "--dp", "--ep", "--zero", "--micro-batch-size",
          "--virtual-stages", "--recompute", "--schedule", "--offload", "--max", "--preset",
          "--frameworks", "--sequence-parallel"]
COMMON = ["--precision", "--optimizer", "--framework", "--gpus-per-node", "--num-nodes",
          "--inter-node", "--moe-capacity-factor"]
ACCEPTS = {"estimate": [f for f in SEARCH if f not in ("--max", "--preset", "--frameworks",
                                                       "--sequence-parallel")] + COMMON,
           "plan": SEARCH + COMMON, "compare": ["--config", "--max", "--preset",
                                                "--frameworks", *COMMON]}
#: A NaN, an infinity or a negative number in output; not AMD's "Infinity Fabric" (the
#: interconnect's name, also the link profile ``infinity-fabric``).
BAD_NUMBER = re.compile(r"(?i)(?<![\w.])(nan|-?inf(inity)?)(?![\w-]| fabric)"
                        r"|(?<![\w.=:/+-])-\d")


def _invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _check(argv: list[str], numbers: bool = True) -> None:
    """Exit 0, 2 or 3, no traceback, a failure said in one line; with ``numbers``, no NaN,
    infinity or negative number in the output (``validate`` prints signed errors)."""
    code, out, err = _invoke(argv)
    assert code in (0, 2, 3), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code:
        assert err.strip(), argv  # a failure says why
        assert len(err.strip().splitlines()) == 1, (argv, err)
    elif numbers:
        assert not BAD_NUMBER.search(out), (argv, BAD_NUMBER.search(out), out[:2000])


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(sorted(ACCEPTS)))
    argv = [cmd, "--model", draw(MODELS)]
    if draw(st.integers(0, 4)):
        argv += ["--gpus", draw(mostly(["8", "16", "64"], ["0", "-8", "12", str(2**21)]))]
        argv += ["--gpu", draw(GPUS)]
    else:
        argv += ["--cluster", draw(mostly(["selene", "dgx-h100"], ["nowhere", "x.toml"]))]
    for flag, size in (("--global-batch-size", mostly(["16", "64", "512"],
                                                      ["0", "-1", "3", str(10**12)])),
                       ("--seq-len", mostly(["512", "2048", "8192"], ["0", "1", str(10**9)]))):
        if draw(st.integers(0, 19)):  # usually present
            argv += [flag, draw(size)]
    for flag in draw(st.lists(st.sampled_from(ACCEPTS[cmd]), max_size=3, unique=True)):
        argv += [flag, draw(FLAGS[flag])]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
@settings(max_examples=examples(300), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_fuzz_command_lines(argv: list[str]) -> None:
    # Searches on the biggest clusters are kept small by the batch sizes drawn.
    _check(argv)


TOML_VALUES = st.one_of(st.integers(-2, 10**7), st.floats(allow_nan=True),
                        st.text(max_size=12), st.booleans(), st.just("h100-sxm"),
                        st.just("ib-ndr"))


@settings(max_examples=examples(60), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["gpu", "num_nodes", "gpus_per_node", "intra_node_link",
                                        "inter_node_link", "nics_per_node", "host_memory_gib",
                                        "colour"]), TOML_VALUES, max_size=6),
       st.booleans())
def test_fuzz_cluster_files(data: dict, garble: bool) -> None:
    lines = []
    for k, v in data.items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, float) else repr(v)}")
    text = "\n".join(lines)
    if garble:
        text = text.replace("=", "", 1) + "\n[[["
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cluster.toml"
        path.write_text(text)
        _check(["estimate", "--model", "gpt3-760m", "--cluster", str(path),
                "--global-batch-size", "16", "--seq-len", "2048"])


def _saved_plan() -> dict:
    code, out, _ = _invoke(["plan", "--model", "gpt3-760m", "--gpus", "8",
                            "--global-batch-size", "16", "--seq-len", "2048", "--json"])
    assert code == 0
    return json.loads(out)


PLAN = _saved_plan()


@settings(max_examples=examples(60), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["config", "model", "cluster", "job",
                                           "schema_version", "estimate", "alternatives"]),
                          st.one_of(st.none(), st.integers(-5, 10**6), st.text(max_size=8),
                                    st.sampled_from(["dp", "tp", "num_layers", "gpu",
                                                     "seq_len", "hidden_size"]))),
                max_size=3),
       st.sampled_from(["emit", "explain", "compare"]), st.booleans())
def test_fuzz_plan_files(edits: list, command: str, truncate: bool) -> None:
    d = json.loads(json.dumps(PLAN))
    for key, value in edits:
        if isinstance(d.get(key), dict) and isinstance(value, str) and value in d[key]:
            d[key][value] = -1  # mangle one field of the section
        else:
            d[key] = value
    text = json.dumps(d)
    if truncate:
        text = text[: len(text) // 2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(text)
        argv = {"emit": ["emit", str(path), "--target", "deepspeed"],
                "explain": ["explain", str(path), "--json"],
                "compare": ["compare", "--plan", str(path)]}[command]
        _check(argv)


# ------------------------------------------------------------------ files of every kind
# Each file-taking flag of each subcommand, fed what a user might point it at by mistake.
BAD_CONTENTS = {
    "binary": bytes(range(256)) * 4,
    "json list": b"[1, 2, 3]",
    "json number": b"42",
    "json string": b'"llama"',
    "truncated json": b'{"runs": [{"id": "x", ',
    "toml table": b"[gpu]\nname = 1\n",
    "empty": b"",
}
FILE_COMMANDS = {
    "model": lambda f: ["estimate", "--model", f, "--gpus", "8", "--global-batch-size", "16",
                        "--seq-len", "2048"],
    "profile": lambda f: ["plan", "--model", "gpt3-760m", "--gpus", "8", "--profile", f,
                          "--global-batch-size", "16", "--seq-len", "2048"],
    "cluster": lambda f: ["estimate", "--model", "gpt3-760m", "--cluster", f,
                          "--global-batch-size", "16", "--seq-len", "2048"],
    "runs (validate)": lambda f: ["validate", "--runs", f],
    "runs (calibrate)": lambda f: ["calibrate", "--runs", f, "-o", f + ".out.toml"],
    "plan (emit)": lambda f: ["emit", f, "--target", "torchtitan"],
    "plan (explain)": lambda f: ["explain", f],
    "plan (compare)": lambda f: ["compare", "--plan", f],
    "plan (plot)": lambda f: ["plot", f, "-o", f + ".png"],
    "plan (run)": lambda f: ["run", f, "--dry-run"],
}


@pytest.mark.parametrize("content", sorted(BAD_CONTENTS))
@pytest.mark.parametrize("flag", sorted(FILE_COMMANDS))
def test_a_wrong_file_is_one_line_exit_2(tmp_path: Path, flag: str, content: str) -> None:
    """A binary file, a JSON list or number, a truncated JSON, a TOML where JSON belongs or
    an empty file, given to any file-taking flag: exit 2 with one line naming the file."""
    path = tmp_path / "input.json"
    path.write_bytes(BAD_CONTENTS[content])
    code, out, err = _invoke(FILE_COMMANDS[flag](str(path)))
    assert code == 2, (flag, content, code, err)
    assert "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1 and "input.json" in err, (flag, content, err)


def test_output_into_a_missing_directory_is_created(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "plan.json"
    code, _, err = _invoke(["plan", "--model", "gpt3-760m", "--gpus", "8",
                            "--global-batch-size", "16", "--seq-len", "2048", "-o",
                            str(target)])
    assert code == 0, err
    assert json.loads(target.read_text())["config"]["dp"] >= 1
    emitted = tmp_path / "other" / "job.toml"
    code, _, err = _invoke(["emit", str(target), "--target", "torchtitan", "-o", str(emitted)])
    assert code == 0 and "[parallelism]" in emitted.read_text(), err
    # A path that cannot be a directory is one line, exit 2.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _invoke(["emit", str(target), "--target", "torchtitan", "-o",
                            str(blocker / "job.toml")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot write" in err


def test_a_very_long_model_name_is_one_short_line() -> None:
    code, _, err = _invoke(["plan", "--model", "x" * 5000, "--gpus", "8",
                            "--global-batch-size", "16", "--seq-len", "2048"])
    assert code == 2 and "unknown model" in err and "5,000 characters" in err
    assert len(err) < 1000


def test_expert_parallel_on_a_dense_model_is_a_usage_error() -> None:
    for cmd in ("plan", "estimate"):
        code, _, err = _invoke([cmd, "--model", "llama-3-8b", "--gpus", "8", "--ep", "2",
                                "--global-batch-size", "16", "--seq-len", "2048"])
        assert code == 2 and "ep=2" in err and "dense" in err, (cmd, err)


def test_negative_why_rows_are_refused() -> None:
    code, _, err = _invoke(["plan", "--model", "gpt3-760m", "--gpus", "8", "--why", "-1",
                            "--global-batch-size", "16", "--seq-len", "2048"])
    assert code == 2 and "--why" in err


def test_a_batch_too_small_for_the_gpus_is_warned_with_the_batch_that_is_not() -> None:
    """One sequence on 64 GPUs: the plan is made, and says its GPUs mostly wait (about a fifth
    of the step computing) and which global batch would keep them computing."""
    code, out, _ = _invoke(["plan", "--model", "llama-3-8b", "--gpus", "64",
                            "--global-batch-size", "1", "--seq-len", "8192", "--json"])
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert any("compute for" in w and "a global batch of" in w for w in warnings), warnings
    code, out, _ = _invoke(["plan", "--model", "llama-3-8b", "--gpus", "64",
                            "--global-batch-size", "512", "--seq-len", "8192", "--json"])
    assert code == 0 and json.loads(out)["warnings"] == []


def test_run_dry_run_writes_nothing_and_run_keeps_an_existing_script(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    plan = tmp_path / "plan.json"
    assert _invoke(["plan", "--model", "gpt3-760m", "--gpus", "16", "--global-batch-size",
                    "32", "--seq-len", "2048", "--preset", "fsdp", "-o", str(plan)])[0] == 0
    script = tmp_path / "train.sbatch"
    script.write_text("mine\n")
    code, out, _ = _invoke(["run", str(plan), "--dry-run", "-o", str(script)])
    assert code == 0 and "#SBATCH" in out and script.read_text() == "mine\n"
    assert "PLANNER_FORCE" not in out
    code, _, err = _invoke(["run", str(plan), "-o", str(script)])
    assert code == 2 and "exists" in err and script.read_text() == "mine\n"
    assert _invoke(["run", str(plan), "-o", str(script), "--force"])[0] == 0
    # --force reaches the processes the script starts (planner.apply would refuse otherwise).
    assert "#SBATCH" in script.read_text() and "export PLANNER_FORCE=1" in script.read_text()


def test_an_edited_plan_is_rechecked_before_use(tmp_path: Path) -> None:
    """Degrees that no longer multiply to the GPUs: refused by every command (exit 3); one
    that no longer fits: refused unless --force."""
    d = json.loads(json.dumps(PLAN))
    bad = tmp_path / "bad.json"
    d["config"]["dp"] = 3
    bad.write_text(json.dumps(d))
    for argv in (["emit", str(bad), "--target", "deepspeed"], ["explain", str(bad)],
                 ["compare", "--plan", str(bad)], ["emit", str(bad), "--target", "megatron",
                                                   "--force"]):
        code, _, err = _invoke(argv)
        assert code == 3 and "multiply" in err, (argv, err)
    d = json.loads(json.dumps(PLAN))
    d["model"]["num_layers"] *= 100  # a hundred times the layers: no longer fits
    big = tmp_path / "big.json"
    big.write_text(json.dumps(d))
    code, _, err = _invoke(["explain", str(big)])
    assert code == 3 and "does not fit" in err and "--force" in err
    code, _, err = _invoke(["emit", str(big), "--target", "torchtitan", "--force"])
    assert code == 0 and "used anyway" in err


# ------------------------------------------------------------------------ every subcommand
SUBCOMMANDS = ["plan", "estimate", "explain", "compare", "emit", "plot", "run", "validate",
               "calibrate", "models", "gpus", "clusters"]
RANDOM_FILE = st.one_of(
    st.binary(max_size=64),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                     max_size=3),
                 max_leaves=6).map(lambda v: json.dumps(v).encode()),
    st.sampled_from(list(BAD_CONTENTS.values())),
    st.just(json.dumps(PLAN).encode()).map(lambda b: b[: len(b) // 3]),
)
WORDS = st.one_of(st.text(max_size=10), st.integers(-10**12, 10**12).map(str),
                  st.sampled_from(["--json", "--force", "-o", "--target", "torchtitan", "nan",
                                   "--model", "llama-3-8b", "--gpus", "8", "--runs",
                                   "--profile", "--plan", "FILE", "--dry-run", "--why",
                                   "--global-batch-size", "16", "--seq-len", "2048"]))


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
@settings(max_examples=examples(150), deadline=None,
          derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SUBCOMMANDS), st.lists(WORDS, max_size=8), RANDOM_FILE)
def test_fuzz_every_subcommand(command: str, words: list, content: bytes) -> None:
    """Any subcommand with random words, where FILE is a random file: exit 0, 2 or 3, no
    traceback, and a failure says why in one line. (``profile`` measures hardware and
    ``run`` without --dry-run starts processes: both are given --dry-run or refused.)"""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.json"
        path.write_bytes(content)
        argv = [command] + [str(path) if w == "FILE" else w for w in words]
        if command == "run" and "--dry-run" not in argv:
            argv.append("--dry-run")
        if command == "calibrate" and ("--runs" not in argv or "-o" not in argv):
            argv += ["--runs", str(path), "-o", str(Path(tmp) / "out.toml")]
        cwd = os.getcwd()
        os.chdir(tmp)  # anything written lands in the temporary directory
        try:
            _check(argv, numbers=command not in ("validate", "calibrate"))
        finally:
            os.chdir(cwd)


# ------------------------------------------------------------------------- the Python API
ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                       st.lists(st.integers(-2, 4), max_size=3))


@settings(max_examples=examples(150), deadline=None,
          derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["Job", "ParallelConfig", "estimate", "plan"]),
       st.sampled_from(["global_batch_size", "seq_len", "precision", "framework",
                        "memory_reserve", "moe_capacity_factor", "overlap_grad_reduce",
                        "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size",
                        "pipeline_schedule", "virtual_pipeline_stages", "recompute",
                        "recompute_num_layers", "offload", "stage_layers", "top_k"]),
       ODD_VALUES)
def test_the_python_api_names_the_bad_field(target: str, field: str, value: object) -> None:
    """One odd value in one field of the API: a SpecError (or Infeasible, or TypeError for a
    wrong type) naming the field, never an internal error."""
    import dataclasses as dc

    from costmodel import Cluster, Infeasible, Job, ModelSpec, ParallelConfig, SpecError
    from planner import estimate, plan

    model, cluster = ModelSpec.preset("gpt3-760m"), Cluster.preset("dgx-h100", num_nodes=1)
    job_kw = {"global_batch_size": 16, "seq_len": 2048}
    cfg_kw = {"dp": 8}
    job_fields = {f.name for f in dc.fields(Job)}
    cfg_fields = {f.name for f in dc.fields(ParallelConfig)}
    try:
        if target == "Job" and field in job_fields:
            Job(**{**job_kw, field: value})
        elif target == "ParallelConfig" and field in cfg_fields:
            ParallelConfig(**{**cfg_kw, field: value})
        elif target == "estimate" and field in cfg_fields:
            estimate(model, cluster, Job(**job_kw), ParallelConfig(**{**cfg_kw, field: value}))
        elif target == "plan" and field == "top_k":
            plan(model, cluster, Job(**job_kw), top_k=value)  # type: ignore[arg-type]
        elif target == "plan" and field in job_fields:
            plan(model, cluster, Job(**{**job_kw, field: value}), top_k=1)
    except (SpecError, Infeasible) as e:
        assert field in str(e) or field.replace("_", " ") in str(e) or \
            isinstance(e, Infeasible) or _names_the_value(str(e), field), (field, value, e)
    except TypeError as e:  # a wrong type where Python itself says so
        assert field in str(e) or "argument" in str(e), (field, value, e)


def _names_the_value(message: str, field: str) -> bool:
    """Some fields are named in the message by their short form (zero for zero_stage, ...)."""
    short = {"zero_stage": "zero", "micro_batch_size": "micro", "virtual_pipeline_stages":
             "virtual", "pipeline_schedule": "schedule", "recompute_num_layers": "recompute",
             "stage_layers": "stage", "global_batch_size": "batch", "memory_reserve":
             "reserve", "moe_capacity_factor": "capacity", "dp": "dp", "tp": "tp", "pp": "pp",
             "cp": "cp", "ep": "ep"}
    return short.get(field, field) in message

"""Property-based fuzzing of the command line (hypothesis): whatever the arguments and files,
the planner exits 0, 2 (bad input) or 3 (nothing fits), never with a traceback, and never
prints a NaN, an infinity or a negative number."""

import contextlib
import io
import json
import re
import tempfile
from pathlib import Path

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
BAD_NUMBER = re.compile(r"(?i)(?<![\w.])(nan|-?inf(inity)?)(?![\w])|(?<![\w.=:/+-])-\d")


def _invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _check(argv: list[str]) -> None:
    code, out, err = _invoke(argv)
    assert code in (0, 2, 3), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code:
        assert err.strip(), argv  # a failure says why
        assert len(err.strip().splitlines()) == 1, (argv, err)
    else:
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


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_fuzz_command_lines(argv: list[str]) -> None:
    # Searches on the biggest clusters are kept small by the batch sizes drawn.
    _check(argv)


TOML_VALUES = st.one_of(st.integers(-2, 10**7), st.floats(allow_nan=True),
                        st.text(max_size=12), st.booleans(), st.just("h100-sxm"),
                        st.just("ib-ndr"))


@settings(max_examples=60, deadline=None, derandomize=True,
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


@settings(max_examples=60, deadline=None, derandomize=True,
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

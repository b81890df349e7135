"""The command line: real estimates, JSON schema, and one clear line (exit 2) on bad input."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import Result, run_planner

from planner.cli import main

HF = Path(__file__).parent / "data" / "hf_configs"
BASE = ["estimate", "--global-batch-size", "64", "--seq-len", "2048"]


def run(args: list[str]) -> Result:
    return run_planner(*args)


def test_estimate_json_schema(capsys) -> None:
    rc = main([*BASE, "--model", "gpt3-175b", "--cluster", "selene", "--num-nodes", "8",
               "--framework", "megatron", "--tp", "8", "--pp", "8", "--sequence-parallel",
               "--recompute", "selective", "--virtual-stages", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"config", "estimate"} <= set(out)
    est = out["estimate"]
    for key in ("step_time_s", "peak_memory_bytes", "mfu", "tokens_per_s"):
        assert key in est
    step = est["step_time_s"]
    assert step > 0 and 0 < est["mfu"] < 1
    assert est["tokens_per_s"] == pytest.approx(64 * 2048 / step)
    parts = {k: v for k, v in est["time_breakdown_s"].items() if not k.endswith("_total")}
    assert sum(parts.values()) == pytest.approx(step)
    assert out["config"]["dp"] == 1 and out["config"]["pipeline_schedule"] == "interleaved-1f1b"
    assert 40 * 2**30 < est["peak_memory_bytes"] < 80 * 2**30
    assert len(est["stages"]) == 8


def test_estimate_short_cluster_form_and_hf_config(capsys) -> None:
    rc = main([*BASE, "--model", str(HF / "llama-3-8b.json"), "--gpus", "16", "--gpu",
               "h100-sxm", "--gpus-per-node", "8", "--zero", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["dp"] == 16 and out["cluster"]["num_nodes"] == 2
    assert out["model"]["num_params"] == 8_030_261_248


def test_human_report() -> None:
    res = run([*BASE, "--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--tp",
               "8", "--pp", "4", "--zero", "1", "--framework", "megatron"])
    assert res.returncode == 0, res.stderr
    assert "memory per GPU" in res.stdout and "GiB" in res.stdout and "fits" in res.stdout


def test_cluster_toml_file(tmp_path: Path, capsys) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('gpu = "a100-40gb"\nnum_nodes = 2\ngpus_per_node = 4\n'
                 'inter_node_link = "roce-400g"\n')
    assert main([*BASE, "--model", "gpt3-2.7b", "--cluster", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["gpu"] == "a100-40gb"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--model", "no-such-model", "--gpus", "8"], "unknown model 'no-such-model'"),
     (["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100"], "unknown gpu 'h100'"),
     (["--model", "llama-3-8b", "--gpus", "8", "--tp", "3"], "tp*pp*cp = 3"),
     (["--model", "llama-3-8b", "--gpus", "8", "--dp", "2"], "dp*tp*pp*cp"),
     (["--model", "llama-3-8b"], "say which GPUs"),
     (["--model", "llama-3-8b", "--cluster", "selene", "--gpus", "8"], "not both"),
     (["--model", "llama-3-8b", "--gpus", "12", "--gpus-per-node", "8"], "not a multiple"),
     (["--model", "llama-3-8b", "--gpus", "8", "--gpu", "v100-32gb"], "no bf16 support")],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    res = run([*BASE, *args])
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_flag_value_exits_2() -> None:
    res = run([*BASE, "--model", "llama-3-8b", "--gpus", "8", "--recompute", "some"])
    assert res.returncode == 2 and "Traceback" not in res.stderr


@pytest.mark.parametrize("command", ["models", "gpus", "clusters"])
def test_listings(command: str, capsys) -> None:
    assert main([command]) == 0
    text = capsys.readouterr().out
    assert main([command, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["name"] in text for r in rows)


def test_every_command_help_has_an_example() -> None:
    from planner.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) >= {"plan", "estimate", "explain", "compare", "emit", "validate",
                                "calibrate", "models", "gpus", "clusters"}
    for command in sub.choices:
        res = run([command, "--help"])
        assert res.returncode == 0 and re.search(r"examples?:\n  planner ", res.stdout), command


def test_import_planner_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import planner, planner.cli; "
            "import costmodel, hardware_profiles; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_estimate_header_names_the_float8_all_gather_only_where_fsdp_runs(capsys) -> None:
    # torchtitan's float8 FSDP all-gather (--fp8-param-gather, tensor-wise) applies where
    # FSDP holds the weights (ZeRO-2/3), as the cost model counts it
    # (costmodel.formulas.eager.float8_gathered_rows); under DDP the header does not claim it.
    args = ["estimate", "--model", "llama-3-8b", "--gpus", "16", "--gpu", "h100-sxm",
            "--global-batch-size", "64", "--seq-len", "8192", "--framework", "torchtitan",
            "--precision", "fp8", "--fp8-param-gather"]
    assert main([*args, "--zero", "3"]) == 0
    assert "float8 FSDP all-gather" in capsys.readouterr().out
    assert main([*args, "--zero", "0"]) == 0
    assert "float8 FSDP all-gather" not in capsys.readouterr().out


def test_the_attention_kernel_is_a_job_flag_the_header_names_and_megatron_emits(
        capsys, tmp_path) -> None:
    # --attention-kernel picks the fused attention the estimate times; without it the
    # trainer's own (Transformer Engine: cuDNN's on Hopper, FlashAttention on Ampere). The
    # Megatron-LM file holds a named kernel by turning Transformer Engine's other backend off
    # (NVTE_FUSED_ATTN / NVTE_FLASH_ATTN); torchtitan's file cannot pick one, so the plan is
    # re-estimated with torchtitan's own. A kernel with --no-flash-attention is refused.
    base = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "16",
            "--seq-len", "8192", "--framework", "megatron"]
    assert main(["estimate", *base, "--gpu", "h100-sxm"]) == 0
    assert "cuDNN attention" in capsys.readouterr().out
    assert main(["estimate", *base, "--gpu", "a100-80gb"]) == 0
    assert "FlashAttention-2" in capsys.readouterr().out
    assert main(["estimate", *base, "--gpu", "h100-sxm", "--attention-kernel", "flash"]) == 0
    assert "FlashAttention-2" in capsys.readouterr().out
    assert main(["estimate", *base, "--gpu", "h100-sxm", "--no-flash-attention"]) == 0
    assert "unfused attention" in capsys.readouterr().out
    assert main(["estimate", *base, "--gpu", "h100-sxm", "--no-flash-attention",
                 "--attention-kernel", "cudnn"]) == 2
    err = capsys.readouterr().err
    assert "flash_attention is off" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["estimate", *base, "--attention-kernel", "fa3"])
    assert e.value.code == 2
    capsys.readouterr()
    plan = tmp_path / "plan.json"
    assert main(["plan", *base, "--gpu", "h100-sxm", "--attention-kernel", "flash",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    out = tmp_path / "m.sh"
    assert main(["emit", str(plan), "--target", "megatron", "-o", str(out)]) == 0
    text = out.read_text()
    assert "export NVTE_FUSED_ATTN=0" in text and "NVTE_FLASH_ATTN" not in text
    tt = tmp_path / "t.toml"
    assert main(["emit", str(plan), "--target", "torchtitan", "-o", str(tt)]) == 0
    assert "leaves the fused attention kernel" in tt.read_text()
    # Naming the kernel torchtitan runs there anyway (cuDNN's on an H100) is no change:
    # no warning, and --strict emits it.
    same = tmp_path / "same.json"
    assert main(["plan", *base[:-2], "--framework", "torchtitan", "--gpu", "h100-sxm",
                 "--attention-kernel", "cudnn", "-o", str(same)]) == 0
    capsys.readouterr()
    assert main(["emit", str(same), "--target", "torchtitan", "--strict", "-o", str(tt)]) == 0
    assert "leaves the fused attention kernel" not in tt.read_text()

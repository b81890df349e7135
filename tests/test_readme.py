"""The README's commands work as written: every `planner ...` line of its bash blocks (the
quick start included) runs, in order, in a fresh directory, exits 0 and prints (or writes)
what that command is for; the quick start prints the plan and step time the README quotes."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    """The planner commands of the README's bash blocks, continuation lines joined and
    comments removed; placeholders (``...``) and installs skipped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #")[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                words = shlex.split(part) if part else []
                if words[:3] == ["python", "-m", "planner"]:
                    words = words[2:]
                if words[:1] == ["planner"] and "..." not in words:
                    out.append(shlex.join(words[1:]))
    return out


def test_the_readme_has_the_quick_start_and_the_main_commands() -> None:
    cmds = readme_commands()
    quick = ("plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 "
             "--global-batch-size 512 --seq-len 8192")
    assert cmds[0] == quick
    for name in ("plan", "estimate", "explain", "compare", "emit", "validate", "calibrate",
                 "profile", "models", "gpus", "clusters"):
        assert any(c.split()[0] == name for c in cmds), name


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: What each subcommand prints (a regex its stdout must match), beyond exiting 0.
PRINTS = {
    "plan": r"(?m)^plan +dp=\d+ tp=\d+ pp=\d+.*\n +step [\d.]+ m?s",
    "plan --inference": r"(?m)^serve +tp=\d+ pp=\d+ .*\n^latency +first token [\d.]+ m?s",
    "plan --json": r'"config"',
    # A torch module of the user's, traced, then planned as a preset is.
    "plan module": (r"(?m)^model +\w+: .*\(traced: .*\n"
                    r"^plan +dp=\d+ tp=\d+ pp=\d+.*\n +step [\d.]+ m?s"),
    "estimate": r"step",
    "estimate --inference": r"(?m)^latency +first token [\d.]+ m?s",
    "explain": r"(?m)^(plan|serve) ",
    "compare": r"(?m)^candidate .*step",
    "validate": r"leave-one-source-out",
    "calibrate": r"leave-one-source-out|mean \|error\|",
    "profile": r"",
    # A module's blocks and their costs per TP degree (LayerCosts).
    "graph": r"(?m)^block +kind +x +params",
    "models": r"(?m)^llama-3-70b ",
    "gpus": r"(?m)^h100-sxm ",
    "clusters": r"(?m)^selene ",
    "plot": r"",
    "emit": r"written to",
    "run": r"",
}
#: What a file a command writes (``-o``) must hold, by its suffix or target.
WRITES = {
    "torchtitan": "[parallelism]",
    "megatron": "--tensor-model-parallel-size",
    "slurm": "#SBATCH",
    "deepspeed": '"zero_optimization"',
    "vllm": "vllm serve",
    ".json": '"config"',
    ".toml": "[",
    ".sbatch": "#SBATCH",
    ".dot": "digraph",
}


def _kind(words: list[str]) -> str:
    """The ``PRINTS`` key of a command line."""
    model = words[words.index("--model") + 1] if "--model" in words else ""
    if words[0] == "plan" and ":" in model and "--json" not in words:
        return "plan module"
    for flag in ("--inference", "--json"):
        if words[0] in ("plan", "estimate") and flag in words and f"{words[0]} {flag}" in PRINTS:
            return f"{words[0]} {flag}"
    return words[0]


def _check_written(words: list[str], cwd: Path) -> None:
    """A file the command wrote with ``-o`` (or ``--dot``) exists and holds what its kind of
    file holds."""
    flag = "-o" if "-o" in words else "--dot" if "--dot" in words else None
    if flag is None:
        return
    path = cwd / words[words.index(flag) + 1]
    assert path.is_file() and path.stat().st_size > 0, words
    if path.suffix == ".png":
        return
    text = path.read_text()
    target = words[words.index("--target") + 1] if "--target" in words else ""
    marker = WRITES.get(target) or WRITES.get(path.suffix)
    if marker is None and target:
        return  # another serving engine's launch script: written and non-empty
    assert marker is not None and marker in text, (words, text[:400])


def _quoted_quick_start() -> tuple[str, str]:
    """The configuration and step time the README quotes for the quick-start plan (the
    header of its emitted torchtitan file)."""
    config = re.search(r"# configuration: (.+?) \(torchtitan\)", README)
    step = re.search(r"# predicted: step ([\d.]+ s),", README)
    assert config and step, "the README quotes the quick start's emitted header"
    return config.group(1), step.group(1)


@pytest.mark.slow
def test_readme_commands_run(tmp_path: Path) -> None:
    (tmp_path / "path" / "to").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "hf_configs" / "llama-3-8b.json",
                tmp_path / "path" / "to" / "config.json")
    # The files the README asks the reader to save (a python block headed "# NAME.py").
    for block in re.findall(r"```python\n(# (\w+\.py)\n.*?)```", README, flags=re.S):
        (tmp_path / block[1]).write_text(block[0])
    config, step = _quoted_quick_start()
    seen: set[str] = set()
    for i, cmd in enumerate(readme_commands()):
        if cmd in seen:
            continue  # shown twice (in the quick start and again in its section): run once
        seen.add(cmd)
        words = shlex.split(cmd)
        if words[0] == "calibrate" and "-o" not in words:
            words += ["-o", str(tmp_path / "calibrated.toml")]  # leave the profile alone
        if words[0] == "profile" and "--quick" not in words:
            words += ["--quick"]  # the smoke sweep: the command, not the measurement, is tested
        if words[0] == "validate" and "--profile" in words and not _cuda():
            # Without a GPU the profile above measured the CPU, and no published run was
            # measured on a CPU (tests/test_profile.py validates with an H100 profile).
            continue
        # 600 s: 'planner run' trains on several processes, which a loaded 2-core machine
        # slows past 300 s (seen once in a CI run beside other work).
        r = subprocess.run([sys.executable, "-m", "planner", *words], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and (r.stdout + r.stderr).strip(), cmd
        # emit and the progress lines say what they did on stderr, the results go to stdout
        assert re.search(PRINTS[_kind(words)], r.stdout + r.stderr), (cmd, r.stdout[:1000])
        if _kind(words) == "plan --json":
            assert {"config", "estimate"} <= set(json.loads(r.stdout)), cmd
        _check_written(words, tmp_path)
        if i == 0:  # the quick start prints the plan and the step time the README quotes
            assert re.search(rf"(?m)^plan +{re.escape(config)} ", r.stdout), r.stdout[:500]
            assert f"step {step} " in r.stdout, r.stdout[:500]


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_the_readme_shows_what_planner_validate_prints(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    # The step-time validation table in the README is the command's current output.
    from planner.cli import main

    assert main(["validate", "--summary"]) == 0
    table = capsys.readouterr().out.rstrip("\n")
    assert f"```\n{table}\n```" in README

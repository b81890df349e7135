"""The commands of the README and of docs/*.md work as written: every `planner ...` line of
their bash blocks, and every command of the README's "Common tasks" table, runs, in order, in
a fresh directory per document, exits 0 and prints (or writes) what that command is for; the
quick start prints the plan and step time the documentation quotes. (That every quoted
output and figure is what its command prints now is tests/test_docs.py.)"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import Result, run_planner

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
STEP_TIME = (ROOT / "docs" / "step-time.md").read_text()
EMIT = (ROOT / "docs" / "emit.md").read_text()

#: A bash block, or a row of a Markdown table (whose `planner ...` code spans are commands).
_BLOCK_OR_ROW = re.compile(r"```bash\n(?P<bash>.*?)```|^(?P<row>\|[^\n]*\|)[ \t]*$", re.S | re.M)


def _planner_words(part: str) -> list[str] | None:
    """The words of a ``planner ...`` (or ``python -m planner ...``) command, or None."""
    words = shlex.split(part) if part.strip() else []
    if words[:3] == ["python", "-m", "planner"]:
        words = words[2:]
    if words[:1] == ["planner"] and "..." not in words:
        return words
    return None


def commands(text: str, tables: bool = False) -> list[str]:
    """The planner commands of a document's bash blocks (continuation lines joined, comments
    removed) and, with ``tables``, of its tables' code spans, in document order;
    placeholders (``...``) and installs skipped."""
    out = []
    for m in _BLOCK_OR_ROW.finditer(text):
        if m["row"] is not None and not tables:
            continue
        if m["row"] is not None:
            parts = re.findall(r"`(planner [^`]+)`", m["row"])
        else:
            parts = [part for line in m["bash"].replace("\\\n", " ").splitlines()
                     for part in line.split(" #")[0].split("&&")]
        for part in parts:
            words = _planner_words(part.strip())
            if words is not None:
                out.append(shlex.join(words[1:]))
    return out


def readme_commands() -> list[str]:
    """The README's commands: its bash blocks and its "Common tasks" table."""
    return commands(README, tables=True)


def test_the_readme_has_the_quick_start_and_the_main_commands() -> None:
    cmds = readme_commands()
    quick = ("plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 "
             "--global-batch-size 512 --seq-len 8192")
    assert cmds[0] == quick
    for name in ("plan", "estimate", "explain", "compare", "emit", "validate", "calibrate",
                 "profile", "models", "gpus", "clusters", "run"):
        assert any(c.split()[0] == name for c in cmds), name


def test_each_common_task_is_one_command() -> None:
    """Every row of the README's "Common tasks" table names one planner command, and the
    table covers what the README promises: will it fit, plan, compare GPUs, emit for my
    trainer, my own module, serving, calibrate on my hardware."""
    section = README.split("## Common tasks", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| Task")]
    assert len(rows) >= 7
    for row in rows:
        assert len(re.findall(r"`planner [^`]+`", row)) == 1, row
    table = "\n".join(rows)
    for promised in (r"`planner estimate ", r"`planner plan --model llama", r"--gpu h200",
                     r"`planner emit ", r"--model mymodels:", r"`planner plan --inference ",
                     r"`planner profile "):
        assert re.search(promised, table), promised


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """The README's second command is, in effect, .ci/run: the same torch pin, the same extras,
    then the whole suite (CI adds ruff and mypy, which the README names)."""
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(line for line in README.splitlines()
                    if line.startswith("pip install torch=="))
    steps = [s.strip() for s in test_cmd.split("&&")]
    assert steps[0].replace("pip", "python3 -m pip") in ci
    assert steps[1].replace("pip", "python3 -m pip") in ci
    assert steps[2].replace("python", "python3") in ci
    assert "ruff check ." in README and "mypy" in README


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
    "serve": r"(?m)^planner explorer on http://127\.0\.0\.1:\d+/",
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
    """The configuration and step time the documentation quotes for the quick-start plan
    (the header of its emitted torchtitan file, in docs/emit.md)."""
    config = re.search(r"# configuration: (.+?) \(torchtitan\)", EMIT)
    step = re.search(r"# predicted: step ([\d.]+ s),", EMIT)
    assert config and step, "docs/emit.md quotes the quick start's emitted header"
    return config.group(1), step.group(1)


def _saved_files(tmp_path: Path) -> None:
    """The files the documentation asks the reader to save (a python block headed
    "# NAME.py", in the README or a doc), and the Hugging Face config it names."""
    (tmp_path / "path" / "to").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "hf_configs" / "llama-3-8b.json",
                tmp_path / "path" / "to" / "config.json")
    for text in (README, *(p.read_text() for p in DOCS)):
        for block in re.findall(r"```python\n(# (\w+\.py)\n.*?)```", text, flags=re.S):
            (tmp_path / block[1]).write_text(block[0])


#: Commands run in a new interpreter, as typed: those that start processes or measure.
#: The others run in this process (``inprocess.run_planner``: the same ``main``, without
#: a second of interpreter start and imports per command).
_OWN_PROCESS = ("run", "profile")


def _serve(words: list[str], cwd: Path, env: dict[str, str]) -> Result:
    """``planner serve``, which runs until stopped: started in its own process (on any free
    port unless the command names one), its page fetched once, then stopped. Its output is
    the address line and what the page's first bytes were."""
    import urllib.request

    if "--port" not in words:
        words = [*words, "--port", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "planner", *words], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        address = re.search(r"http://\S+/", line)
        assert address, line
        with urllib.request.urlopen(address.group(0), timeout=30) as page:
            body = page.read().decode()
        assert "planner explorer" in body
        return Result(0, line, "")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _planner(words: list[str], cwd: Path, env: dict[str, str], alone: bool = False
             ) -> subprocess.CompletedProcess[str] | Result:
    """``planner WORDS`` in ``cwd`` with ``env``: in a new interpreter where ``alone`` or the
    command starts processes, else in this one (``inprocess.run_planner``); ``serve`` is
    started, asked for its page and stopped."""
    if words[0] == "serve":
        return _serve(words, cwd, env)
    if alone or words[0] in _OWN_PROCESS:
        # 600 s: 'planner run' trains on several processes, which a loaded 2-core machine
        # slows past 300 s (seen once in a CI run beside other work).
        return subprocess.run([sys.executable, "-m", "planner", *words], cwd=cwd,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, **env})
    return run_planner(*words, cwd=cwd, env=env)


def _run_all(cmds: list[str], tmp_path: Path, quick_start: bool = False) -> None:
    """Run each command in order in ``tmp_path`` and check what it printed and wrote."""
    _saved_files(tmp_path)
    config, step = _quoted_quick_start()
    env = {"PLANNER_CONFIG_DIR": str(tmp_path / ".config")}
    seen: set[str] = set()
    for i, cmd in enumerate(cmds):
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
        r = _planner(words, tmp_path, env, alone=quick_start and i == 0)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and (r.stdout + r.stderr).strip(), cmd
        # emit and the progress lines say what they did on stderr, the results go to stdout
        assert re.search(PRINTS[_kind(words)], r.stdout + r.stderr), (cmd, r.stdout[:1000])
        if _kind(words) == "plan --json":
            assert {"config", "estimate"} <= set(json.loads(r.stdout)), cmd
        _check_written(words, tmp_path)
        if quick_start and i == 0:  # the quick start prints the plan and step the docs quote
            assert re.search(rf"(?m)^plan +{re.escape(config)} ", r.stdout), r.stdout[:500]
            assert f"step {step} " in r.stdout, r.stdout[:500]


@pytest.mark.slow
def test_readme_commands_run(tmp_path: Path) -> None:
    _run_all(readme_commands(), tmp_path, quick_start=True)


@pytest.mark.slow
@pytest.mark.parametrize("doc", [p.name for p in DOCS if commands(p.read_text())])
def test_docs_commands_run(doc: str, tmp_path: Path) -> None:
    _run_all(commands((ROOT / "docs" / doc).read_text()), tmp_path)


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_the_docs_show_what_planner_validate_prints(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    # The step-time validation table in docs/step-time.md is the command's current output.
    from planner.cli import main

    assert main(["validate", "--summary"]) == 0
    table = capsys.readouterr().out.rstrip("\n")
    assert f"```\n{table}\n```" in STEP_TIME

"""Regenerate every command output that README.md and docs/*.md quote.

A quoted output is a fenced block after a marker naming the command that prints it::

    <!-- output: planner gpus -->
    ```
    ...what `planner gpus` prints now...
    ```

A figure quoted in prose is wrapped in a pair of markers naming an entry of ``FIGURES`` (a
command and the part of its output to quote)::

    <!--fig:loso-mean-->8.30%<!--/fig-->

Both render as plain text. The command of a marker is ``planner ARGS`` (run in this process,
as ``python -m planner ARGS`` runs it) or ``python benchmarks/NAME.py ARGS`` (a subprocess
from the repository root). Several commands joined by `` && `` run in order in one scratch
folder and the block shows what the last one printed. Options follow the command after
`` | ``, separated by spaces:

- ``lines A-B,C`` keeps those lines of the output (1-based), ``...`` between pieces;
- ``tail N`` keeps its last N lines;
- ``stderr`` shows what the command printed on standard error instead of standard output;
- ``exit N``: the command exits with status N (default 0);
- ``slow``: the test runs this block with the slow tests (a command that takes seconds).

Each marker's commands run in a fresh scratch folder holding ``path/to/config.json`` (a
Hugging Face config) and every file a document asks the reader to save (a ``python`` block
whose first line is ``# NAME.py``), with ``$PLANNER_CONFIG_DIR`` pointing at an empty folder
(so that no calibration of your own changes what is printed) and ``$COLUMNS`` at 80.

What varies from run to run (wall-clock times, scratch paths) is masked by ``mask`` on both
sides of every comparison, so a block is rewritten only when something else changed.

    python docs/regenerate.py           # rewrite README.md and docs/*.md in place
    python docs/regenerate.py --check   # print what differs; exit 1 if anything does

``tests/test_docs.py`` runs the same commands and fails with the same differences.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HF_CONFIG = ROOT / "tests" / "data" / "hf_configs" / "llama-3-8b.json"

BLOCK = re.compile(r"<!-- output: (?P<spec>.+?) -->\n```(?P<lang>[\w-]*)\n(?P<body>.*?)```",
                   re.S)
FIG = re.compile(r"<!--fig:(?P<name>[\w-]+)-->(?P<text>.*?)<!--/fig-->", re.S)
SAVED_FILE = re.compile(r"```python\n(# (\w+\.py)\n.*?)```", re.S)

#: What varies from run to run, and what it is masked as (both sides of a comparison).
MASKS: list[tuple[re.Pattern[str], str]] = [
    # the search's wall time: "searched 673,517 configurations in 0.36 s"
    (re.compile(r"(configurations in )[\d.]+ m?s\b"), r"\1<time>"),
    # benchmarks/search_speed.py: the wall time and tracemalloc peak columns ("0.52s    1.0s
    # 0.04G", right-aligned: the padding before it goes too), and "wall 1.23 s (target 1.5 s),
    # the three spaces 0.07 s of it"
    (re.compile(r" +\d+\.\d+s(?= +\d+\.\d+s +\d+\.\d+G )"), "  <time>"),
    (re.compile(r"(?<= )\d+\.\d+G(?= )"), "<mem>"),
    (re.compile(r"\b(wall )[\d.]+ s\b"), r"\1<time>"),
    (re.compile(r"\b[\d.]+ s( of it)"), r"<time>\1"),
    # benchmarks/step_time_accuracy.py: "(prediction and leave-one-source-out in 3.4 s)"
    (re.compile(r"(leave-one-source-out in )[\d.]+ s\b"), r"\1<time>"),
    # scratch folders and this interpreter's path
    (re.compile(r"/tmp/[^\s'\"]*"), "<tmp>"),
    (re.compile(re.escape(sys.executable)), "python"),
]


def mask(text: str) -> str:
    """``text`` with everything that varies from run to run replaced by a placeholder."""
    for pattern, repl in MASKS:
        text = pattern.sub(repl, text)
    return text


# ---------------------------------------------------------------------------------------------
# Figures quoted in prose


@dataclass(frozen=True)
class Figure:
    """A figure quoted in prose: the command that prints it and what to quote of its output
    (standard output, or standard error with ``stderr``): ``pattern``'s first group, or
    ``pick(output)``."""

    command: str
    pattern: str = ""
    pick: Callable[[str], str] | None = None
    stderr: bool = False

    def value(self, output: str) -> str:
        if self.pick is not None:
            return self.pick(output)
        m = re.search(self.pattern, output, flags=re.M)
        if m is None:
            raise LookupError(f"{self.pattern!r} not in the output of {self.command!r}")
        return m.group(1)


def _count_sources(output: str) -> str:
    """The number of sources in ``planner validate --summary``'s table: its rows between the
    header and the ``all`` row."""
    rows = output.split("\n")[1:]
    return str(next(i for i, row in enumerate(rows) if row.startswith("all ")))


def _row(source: str, column: int) -> Callable[[str], str]:
    """Column ``column`` (0 = the source's name) of a row of ``validate --summary``."""
    def pick(output: str) -> str:
        for line in output.splitlines():
            if line.split()[:1] == [source]:
                return line.split()[column]
        raise LookupError(f"no row {source!r} in planner validate --summary")
    return pick


VALIDATE = "planner validate --summary"
MLPERF = "python benchmarks/heldout_runs.py"
QUICK = ("planner plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 "
         "--global-batch-size 512 --seq-len 8192")
KORTHIKANTI = (
    "planner estimate --model gpt3-175b --cluster selene --num-nodes 8 "
    "--global-batch-size 64 --seq-len 2048 --framework megatron --tp 8 --pp 8 "
    "--micro-batch-size 1 --sequence-parallel --recompute selective --virtual-stages 3 "
    "--precision fp16 --optimizer adam --no-flash-attention --no-overlap-grad-reduce "
    "--no-overlap-p2p-communication")
SINGLE_GPU = ("python benchmarks/single_gpu_accuracy.py --rows "
              "benchmarks/data/h100-sxm-steps-2026-11-22.json --profile "
              "hardware_profiles/measured/h100-sxm-2026-11-22.toml")
STEP_TARGETS = "python benchmarks/step_time_accuracy.py"
# GPT-OSS-120B as Megatron-Bridge 26.02 ran it on 64 GB200 (costmodel/data/published_runs.json).
OSS = ("planner estimate --model gpt-oss-120b --cluster gb200-nvl72 --num-nodes 16 "
       "--gpus-per-domain 64 --global-batch-size 1280 --seq-len 4096 --framework megatron "
       "--dp 64 --ep 64 --zero 1 --micro-batch-size 4")

FIGURES: dict[str, Figure] = {
    # step time against published training runs (planner validate --summary)
    "runs": Figure(VALIDATE, r"^all +(\d+) "),
    "sources": Figure(VALIDATE, pick=_count_sources),
    "loso-mean": Figure(VALIDATE, r"mean \|error\| ([\d.]+%), median"),
    "loso-median": Figure(VALIDATE, r"mean \|error\| [\d.]+%, median ([\d.]+%)"),
    "korthikanti-fit": Figure(VALIDATE, pick=_row("korthikanti2022", 2)),
    "megatron2021-fit": Figure(VALIDATE, pick=_row("megatron2021", 2)),
    "mtnlg-loso": Figure(VALIDATE, pick=_row("mtnlg-530b", 4)),
    "mbridge-loso": Figure(VALIDATE, pick=_row("megatron-bridge-perf", 4)),
    # the mixture-of-experts line of planner validate --summary
    "moe-loso": Figure(VALIDATE, r"^mixture-of-experts runs .*mean \|error\| ([\d.]+%)"),
    "moe-band": Figure(VALIDATE, r"^mixture-of-experts runs .*band is at least (±\d+%)"),
    # the band of a model whose own published runs were further off than its cell's
    "oss-band": Figure(OSS, r"^ +step +[\d.]+ m?s +(± \d+ %)"),
    "oss-step": Figure(OSS, r"^ +step +([\d.]+ m?s) "),
    # the frontier MoE runs held out of the fit (planner validate --frontier)
    "frontier-mean": Figure("planner validate --frontier", pick=_row("all", 2)),
    # per GPU generation and trainer (the cells table of planner validate --summary)
    **{f"cell-{c.replace('/', '-')}-{what}": Figure(VALIDATE, pick=_row(c, col))
       for c in ("hopper/megatron", "hopper/torchtitan", "ampere/megatron",
                 "ampere/torchtitan", "ampere/deepspeed", "blackwell/megatron",
                 "blackwell/torchtitan", "cdna3/megatron", "cdna3/torchtitan",
                 "cdna4/megatron")
       for what, col in (("runs", 1), ("sources", 2), ("loso", 4), ("band", 5))},
    "mlperf-held-runs": Figure(MLPERF, pick=_row("all", 1)),
    "mlperf-held-mean": Figure(MLPERF, pick=_row("all", 2)),
    "peak-runs": Figure(VALIDATE, r"^peak memory, (\d+) runs"),
    "peak-mean": Figure(VALIDATE, r"^peak memory, .*mean \|error\| ([\d.]+%)"),
    "peak-max": Figure(VALIDATE, r"^peak memory, .*max ([\d.]+%)"),
    "not-fit": Figure(VALIDATE, r"^published runs predicted not to fit: (\d+ of \d+)"),
    "hopper-matmul": Figure(VALIDATE, r"hopper ([\d.]+) \(others"),
    "kernel-overhead": Figure(VALIDATE, r"kernel overhead ([\d.]+ us)"),
    "slowdown": Figure(VALIDATE, r"overlapped communication ([\d.]+)$"),
    "korthikanti-max": Figure(STEP_TARGETS, r"Table 5 max \|error\| .*? ([\d.]+%)"),
    # the quick start (planner plan, the README's first command)
    "qs-config": Figure(QUICK, r"^plan +(.+?)  \("),
    "qs-step": Figure(QUICK, r"^ +step ([\d.]+ s) "),
    "qs-band": Figure(QUICK, r"^ +step [\d.]+ s \((± \d+ %)\)"),
    "qs-peak": Figure(QUICK, r"peak memory ([\d.]+ of [\d.]+ GiB) per GPU"),
    "qs-headroom": Figure(QUICK, r"\(headroom ([\d.]+ GiB)\)"),
    "qs-searched": Figure(QUICK, r"^searched ([\d,]+) configurations"),
    # Korthikanti et al. 2022 Table 5's 175B run (published: 13.75 s)
    "korthikanti-step": Figure(KORTHIKANTI, r"^ +step +([\d.]+ s) "),
    "korthikanti-band": Figure(KORTHIKANTI, r"^ +step +[\d.]+ s +(± \d+ %)"),
    # memory against published figures
    "mem-cases": Figure("python benchmarks/memory_accuracy.py", r"^(\d+) cases"),
    "mem-mean": Figure("python benchmarks/memory_accuracy.py", r"mean \|error\| ([\d.]+%)"),
    "mem-max": Figure("python benchmarks/memory_accuracy.py", r"max \|error\| ([\d.]+%)"),
    # serving against published measurements
    "serve-within": Figure("python benchmarks/inference_accuracy.py",
                           r"^(\d+ of \d+) configurations within 15 %"),
    "serve-total": Figure("python benchmarks/inference_accuracy.py",
                          r"^\d+ of (\d+) configurations within 15 %"),
    "serve-median": Figure("python benchmarks/inference_accuracy.py",
                           r"median \|error\| ([\d.]+%)"),
    # one H100, measured (benchmarks/data/h100-sxm-steps-2026-11-22.json)
    "h100-cases": Figure(SINGLE_GPU, r"over (\d+) cases", stderr=True),
    "h100-mem-mean": Figure(SINGLE_GPU, r"^peak memory: mean \|error\| ([\d.]+%)", stderr=True),
    "h100-mem-max": Figure(SINGLE_GPU, r"^peak memory: .*max ([\d.]+%)", stderr=True),
    "h100-step-mean": Figure(SINGLE_GPU, r"^step time: mean \|error\| ([\d.]+%)", stderr=True),
}


# ---------------------------------------------------------------------------------------------
# Markers


@dataclass(frozen=True)
class Spec:
    """A marker: its commands (run in order) and how to show the last one's output."""

    commands: tuple[str, ...]
    lines: tuple[tuple[int, int], ...] = ()
    tail: int = 0
    stderr: bool = False
    exit: int = 0
    slow: bool = False

    @classmethod
    def parse(cls, text: str) -> Spec:
        command, _, options = " ".join(text.split()).partition(" | ")
        words = options.split()
        lines: list[tuple[int, int]] = []
        if "lines" in words:
            for piece in words[words.index("lines") + 1].split(","):
                a, _, b = piece.partition("-")
                lines.append((int(a), int(b or a)))
        commands = tuple(c.strip() for c in command.split(" && "))
        return cls(commands=commands,
                   lines=tuple(lines), stderr="stderr" in words,
                   tail=int(words[words.index("tail") + 1]) if "tail" in words else 0,
                   exit=int(words[words.index("exit") + 1]) if "exit" in words else 0,
                   slow="slow" in words or any(map(is_benchmark, commands)))

    def show(self, out: Output) -> str:
        """What the block holds: the output (or the lines asked for), ending in a newline."""
        text = (out.stderr if self.stderr else out.stdout).rstrip("\n")
        if self.lines:
            rows = text.split("\n")
            pieces = ["\n".join(rows[a - 1:b]) for a, b in self.lines]
            text = "\n...\n".join(pieces)
        if self.tail:
            text = "\n".join(text.split("\n")[-self.tail:])
        return text + "\n"


#: ``planner`` commands that refit the efficiencies over every published run (seconds).
REFITS = ("planner validate", "planner calibrate")


def is_benchmark(command: str) -> bool:
    """Whether ``command`` takes seconds: a benchmark script (a new interpreter) or a refit
    over the published runs (``REFITS``). Its blocks and figures are checked with the slow
    tests, the other commands' in the fast loop."""
    if command.startswith(REFITS):
        return True
    return command.split(" ", 1)[0] in ("python", "python3") and " benchmarks/" in command


def slow_figure(name: str) -> bool:
    """Whether figure ``name`` comes from a benchmark script (``is_benchmark``)."""
    return name in FIGURES and is_benchmark(FIGURES[name].command)


def markers(text: str) -> tuple[list[Spec], list[str]]:
    """The output markers and the figure names of a document."""
    return ([Spec.parse(m["spec"]) for m in BLOCK.finditer(text)],
            [m["name"] for m in FIG.finditer(text)])


def documents() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def saved_files(paths: Iterable[Path] | None = None) -> dict[str, str]:
    """The files the documents ask the reader to save: name -> text."""
    files: dict[str, str] = {}
    for path in paths if paths is not None else documents():
        for body, name in SAVED_FILE.findall(path.read_text()):
            files[name] = body
    return files


# ---------------------------------------------------------------------------------------------
# Running the commands


@dataclass(frozen=True)
class Output:
    """What a command left: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def _planner(args: list[str], cwd: Path) -> Output:
    """``planner ARGS`` in this process, in ``cwd``, as ``python -m planner ARGS`` runs it."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    before, path = Path.cwd(), list(sys.path)
    for source in cwd.glob("*.py"):  # a module of that name another test imported first
        sys.modules.pop(source.stem, None)
    os.chdir(cwd)
    try:
        with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
              warnings.catch_warnings()):
            warnings.simplefilter("always")
            try:
                code = main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(before)
        sys.path[:] = path
        # the scratch folder's modules (mymodels.py): not cached for the next command
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(cwd)):
                del sys.modules[name]
    return Output(code, out.getvalue(), err.getvalue())


def run_command(command: str, cwd: Path) -> Output:
    """Run one command of a marker (``planner ...`` or ``python benchmarks/...``)."""
    words = shlex.split(command)
    if words[:3] == ["python", "-m", "planner"]:
        words = words[2:]
    if words[:1] == ["planner"]:
        return _planner(words[1:], cwd)
    if words[:1] in (["python"], ["python3"]) and words[1].startswith("benchmarks/"):
        r = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env=dict(os.environ))
        return Output(r.returncode, r.stdout, r.stderr)
    raise ValueError(f"a marker runs 'planner ...' or 'python benchmarks/...', not {command!r}")


def run_spec(spec: Spec, files: dict[str, str]) -> Output:
    """Run a marker's commands in order in a fresh scratch folder; the last one's output."""
    with tempfile.TemporaryDirectory(prefix="planner-docs-") as tmp:
        cwd = Path(tmp)
        (cwd / "path" / "to").mkdir(parents=True)
        shutil.copy(HF_CONFIG, cwd / "path" / "to" / "config.json")
        for name, body in files.items():
            (cwd / name).write_text(body)
        with _environment(PLANNER_CONFIG_DIR=str(cwd / ".config"), COLUMNS="80"):
            for i, command in enumerate(spec.commands):
                out = run_command(command, cwd)
                want = spec.exit if i == len(spec.commands) - 1 else 0
                if out.returncode != want:
                    raise RuntimeError(f"{command!r} exited with {out.returncode}, not {want}:"
                                       f"\n{out.stderr[-2000:]}")
    return out


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set for the duration (``COLUMNS``: help text wraps at 80, as
    without a terminal, whatever the terminal this runs in)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Outputs:
    """Each distinct marker's output, run once."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self.done: dict[Spec, Output] = {}

    def __call__(self, spec: Spec) -> Output:
        key = Spec(commands=spec.commands, exit=spec.exit)
        if key not in self.done:
            self.done[key] = run_spec(key, self.files)
        return self.done[key]

    def figure(self, name: str) -> str:
        if name not in FIGURES:
            raise KeyError(f"<!--fig:{name}-->: no such figure in docs/regenerate.py FIGURES")
        fig = FIGURES[name]
        out = self(Spec.parse(fig.command))
        return fig.value(out.stderr if fig.stderr else out.stdout)


# ---------------------------------------------------------------------------------------------
# Rendering and comparing


def render(text: str, outputs: Outputs, slow: bool | None = None) -> str:
    """``text`` with every marked block and figure rewritten from what its command prints
    now. ``slow`` True or False renders only the blocks and figures of that speed
    (``Spec.slow``, ``slow_figure``); None renders everything."""
    def block(m: re.Match[str]) -> str:
        spec = Spec.parse(m["spec"])
        if slow is not None and spec.slow != slow:
            return m.group(0)
        return f"<!-- output: {m['spec']} -->\n```{m['lang']}\n{spec.show(outputs(spec))}```"

    def figure(m: re.Match[str]) -> str:
        if slow is not None and slow_figure(m["name"]) != slow:
            return m.group(0)
        return f"<!--fig:{m['name']}-->{outputs.figure(m['name'])}<!--/fig-->"

    return FIG.sub(figure, BLOCK.sub(block, text))


def differences(path: Path, text: str, new: str) -> str:
    """A unified diff of the masked old and new text of a document ('' when equal)."""
    name = str(path.relative_to(ROOT))
    return "".join(difflib.unified_diff(
        mask(text).splitlines(keepends=True), mask(new).splitlines(keepends=True),
        f"{name} (as written)", f"{name} (what the commands print now)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="print what differs and exit 1 if anything does; write nothing")
    parser.add_argument("files", nargs="*", type=Path, help="default: README.md and docs/*.md")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.files] or documents()
    outputs = Outputs(saved_files())
    stale = 0
    for path in paths:
        text = path.read_text()
        new = render(text, outputs)
        diff = differences(path, text, new)
        if not diff:
            continue
        stale += 1
        if args.check:
            sys.stdout.write(diff)
        else:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print(f"\n{stale} document(s) quote outputs that changed: run python docs/regenerate.py")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

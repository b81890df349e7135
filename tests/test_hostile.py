"""Hostile and faulty input: nothing injected into emitted files, nothing written where it
should not be, nothing lost when a write fails, nothing left running when ``planner run`` is
stopped (issue 57, part 1).

Each class is tried with several inputs of its kind, not only the one that was reported."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from fastloop import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess import run_planner

import hardware_profiles
import planner
from costmodel import Cluster, InferenceJob, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.hardware import GPU
from hardware_profiles.files import printable, write_text
from planner.emit import SERVING_TARGETS, TRAINING_TARGETS, emit, read_back
from planner.result import Plan

#: Names that break a format if written raw: a newline that starts a command, command
#: substitution, backticks, quotes, TOML's table brackets, NUL and other control characters,
#: Unicode line separators and a bidirectional override, a lone surrogate (an undecodable
#: byte of a file name).
HOSTILE = [
    "llama\ntouch PWNED\n#",
    "x\r\ntouch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "a'; touch PWNED; echo '",
    'a"; touch PWNED; echo "',
    "]]\n[model]\nname = 'evil'",
    "nul\x00\ntouch PWNED",
    "sep\u2028touch PWNED\u2029\x85\x0b\x0c",
    "bidi\u202etouch PWNED",
    "surrogate\udc80\ntouch PWNED",
    "PLANNER_EOF\ntouch PWNED\nPLANNER_EOF",
]

SHELL_TARGETS = ("megatron", "slurm")
#: Commands the emitted scripts call, as stubs that only print their arguments.
STUBS = ("scontrol", "srun", "torchrun", "vllm", "mpirun", "trtllm-build", "trtllm-serve",
         "python", "ray", "sbatch")


def _training_plan(name: str, framework: str) -> Plan:
    model = dataclasses.replace(ModelSpec.preset("llama-3-8b"), name=name)
    gpu = dataclasses.replace(GPU.preset("h100-sxm"), name=name)
    cluster = Cluster(gpu=gpu, num_nodes=2, gpus_per_node=8, inter_node_link="ib-ndr")
    cluster = dataclasses.replace(cluster, name=name)
    job = Job(global_batch_size=64, seq_len=2048, framework=framework)  # type: ignore[arg-type]
    cfg = ParallelConfig(dp=4, tp=4, zero_stage=2 if framework == "torchtitan" else 1,
                         sequence_parallel=True)
    return Plan(model=model, cluster=cluster, job=job, config=cfg,
                estimate=estimate(model, cluster, job, cfg))


def _serving_plan(name: str) -> Plan:
    model = dataclasses.replace(ModelSpec.preset("llama-3-8b"), name=name)
    cluster = dataclasses.replace(Cluster(gpu="h100-sxm", num_nodes=1), name=name)
    return planner.plan(model, cluster, InferenceJob(prompt_len=512, output_len=128))


def _stub_path(folder: Path) -> str:
    """A PATH whose first folder holds a stub for each command the scripts call."""
    bin_ = folder / "bin"
    bin_.mkdir(exist_ok=True)
    for name in STUBS:
        (bin_ / name).write_text("#!/bin/sh\necho \"$0 $*\"\n")
        (bin_ / name).chmod(0o755)
    return f"{bin_}:{os.environ['PATH']}"


def _execute(text: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run a shell script the planner wrote, with stubs for the programs it starts."""
    script = folder / "script.sh"
    script.write_bytes(text.encode("utf-8", "surrogateescape"))
    env = {**os.environ, "PATH": _stub_path(folder), "SLURM_JOB_NODELIST": "n1",
           "SLURM_NNODES": "2", "SLURM_JOB_ID": "1", "MODEL": "m", "HF_MODEL": "m",
           "NODE_RANK": "0", "MASTER_ADDR": "localhost"}
    return subprocess.run(["bash", str(script)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_names_stay_inert_in_every_training_target(name: str, tmp_path: Path) -> None:
    """A hostile model, GPU and cluster name and command line through every training target:
    comments stay comments, each file parses as its format and reads back to the plan's
    configuration, and running the shell scripts creates nothing."""
    for framework in ("megatron", "torchtitan", "deepspeed"):
        plan = _training_plan(name, framework)
        for target in TRAINING_TARGETS:
            if target not in ("slurm", framework):
                continue
            out = emit(plan, target, command=f"planner emit {shlex.quote(name)}")
            text = out.text
            assert "\x00" not in text and "\u2028" not in text and "\r" not in text
            assert all(line.isprintable() for line in text.split("\n"))
            comments = ([json.loads(text)["_comment"][0]] if target == "deepspeed" else
                        [line for line in text.split("\n") if line.startswith("#")])
            assert any(printable(name) in line for line in comments), target
            back = read_back(target, text, ModelSpec.preset("llama-3-8b"))
            assert back.config == out.config, (target, framework)
            if target == "torchtitan":
                assert tomllib.loads(text)["model"]["name"] == "llama3"
            elif target == "deepspeed":
                assert json.loads(text)["train_batch_size"] == 64
            else:
                run = tmp_path / f"{framework}-{target}"
                run.mkdir()
                r = _execute(text, run)
                assert r.returncode == 0, r.stderr
                assert not (run / "PWNED").exists(), (target, framework)
            if target == "slurm":
                _sbatch_directives_are_read(text)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=40), command=st.text(max_size=40))
def test_any_name_stays_one_comment_line(name: str, command: str) -> None:
    """Property: whatever a model, GPU and cluster name and the command line hold (any
    Unicode, control and format characters, lone surrogates), every emitted file is lines of
    printable text, parses as its format and reads back to the plan's configuration."""
    plans = {fw: _training_plan(name, fw) for fw in ("megatron", "torchtitan")}
    for target, fw in (("megatron", "megatron"), ("torchtitan", "torchtitan"),
                       ("slurm", "megatron")):
        out = emit(plans[fw], target, command=command)
        assert all(line.isprintable() for line in out.text.split("\n")), target
        back = read_back(target, out.text, ModelSpec.preset("llama-3-8b"))
        assert back.config == out.config
        if target == "torchtitan":
            tomllib.loads(out.text)


def _sbatch_directives_are_read(text: str) -> None:
    """sbatch reads ``#SBATCH`` lines until the first line that is neither a comment nor
    blank (sbatch(1)): every line above the last directive must be one."""
    lines = text.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert all(line.startswith("#") or not line.strip() for line in lines[:last])
    assert lines[0] == "#!/bin/bash"


@pytest.mark.parametrize("name", HOSTILE[:4] + HOSTILE[7:9], ids=range(6))
@pytest.mark.parametrize("target", SERVING_TARGETS)
def test_hostile_names_stay_inert_in_serving_scripts(name: str, target: str,
                                                     tmp_path: Path) -> None:
    out = emit(_serving_plan(name), target, command=f"planner emit {shlex.quote(name)}")
    assert all(line.isprintable() for line in out.text.split("\n"))
    r = _execute(out.text, tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "PWNED").exists()


def test_a_config_file_name_cannot_inject_a_command(tmp_path: Path) -> None:
    """The reported case, end to end: a config.json whose file name holds a newline and a
    command, planned and emitted through the CLI, then executed."""
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 1000, "max_position_embeddings": 2048}
    hostile = tmp_path / "llama\ntouch PWNED\n#.json"
    hostile.write_text(json.dumps(config))
    common = ["--gpus", "16", "--gpu", "h100-sxm", "--global-batch-size", "32", "--seq-len",
              "1024", "--frameworks", "megatron"]
    r = run_planner("plan", "--model", str(hostile), *common, "-o", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for target in ("megatron", "slurm"):
        r = run_planner("emit", "p.json", "--target", target, "-o", f"{target}.sh",
                        cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert _execute((tmp_path / f"{target}.sh").read_text(), tmp_path).returncode == 0
    assert not (tmp_path / "PWNED").exists()


def test_a_here_document_marker_is_never_a_line_of_its_text() -> None:
    from planner.emit.slurm import EOF_MARK, here_document

    text = f"a\n{EOF_MARK}\n{EOF_MARK}_1\nb"
    lines = here_document("f.txt", text)
    assert lines[-1] == f"{EOF_MARK}_2" and lines[0] == f"cat > f.txt <<'{EOF_MARK}_2'"


# ---- names used as paths ------------------------------------------------------------------

PATHS = ["../../x", "/etc/passwd", "some/dir/victim", "..", ".hidden", "a\nb", "x\x00",
         "~root/x", "C:\\x", "h100-sxm/../h100-sxm", "", " ", "a" * 300]


@pytest.mark.parametrize("kind", hardware_profiles.KINDS)
@pytest.mark.parametrize("name", PATHS, ids=range(len(PATHS)))
def test_a_preset_name_never_reaches_a_file_outside_the_presets(kind: str, name: str) -> None:
    with pytest.raises(SpecError, match=r"preset name|unknown"):
        hardware_profiles.load(kind, name)


@pytest.mark.parametrize("name", PATHS, ids=range(len(PATHS)))
def test_a_fit_name_is_a_preset_name(name: str) -> None:
    with pytest.raises(SpecError, match="preset name"):
        hardware_profiles.user_calibrated_path(name)
    with pytest.raises(SpecError, match="preset name"):
        hardware_profiles.calibrated_path(name)


def test_calibrate_writes_nothing_for_a_gpu_given_as_a_path(tmp_path: Path) -> None:
    victim = tmp_path / "victim.toml"
    victim.write_text("keep = 1\n")
    config = tmp_path / "config"
    for gpu in (str(tmp_path / "victim"), "../victim", str(victim)):
        r = subprocess.run([sys.executable, "-m", "planner", "calibrate", "--gpu", gpu],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300,
                           env={**os.environ, "PLANNER_CONFIG_DIR": str(config)})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "preset name" in r.stderr
    assert victim.read_text() == "keep = 1\n" and not config.exists()


def test_a_path_is_read_as_a_file_and_checked(tmp_path: Path) -> None:
    """``--cluster`` / ``--gpu`` with a path separator or ``.toml`` go through the file
    checks: a folder, a file that is not TOML, one that is no profile."""
    base = ["estimate", "--model", "llama-3-8b", "--global-batch-size", "8", "--seq-len",
            "1024"]
    (tmp_path / "notes").write_text("hello")
    cases = [(["--cluster", str(tmp_path)], "is a folder"),
             (["--cluster", "/etc/passwd"], "not valid TOML"),
             (["--cluster", str(tmp_path / "notes")], "not valid TOML"),
             (["--gpus", "8", "--gpu", "../../x"], "does not exist"),
             (["--gpus", "8", "--gpu", str(tmp_path)], "is a folder")]
    for flags, message in cases:
        r = run_planner(*base, *flags, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr, (flags, r.stderr)


def test_a_file_named_like_a_preset_does_not_shadow_it_silently(tmp_path: Path) -> None:
    (tmp_path / "h100-sxm").write_text('name = "fake"\n')
    (tmp_path / "dgx-h100.toml").write_text('gpu = "a100-80gb"\ngpus_per_node = 8\n')
    base = ["estimate", "--model", "llama-3-8b", "--global-batch-size", "8", "--seq-len",
            "1024", "--tp", "8"]
    r = run_planner(*base, "--gpus", "8", "--gpu", "h100-sxm", cwd=tmp_path)
    assert r.returncode == 0 and "shipped gpu preset" in r.stderr and "./h100-sxm" in r.stderr
    assert "h100-sxm (79.2 GiB)" in r.stdout
    r = run_planner(*base, "--cluster", "dgx-h100", "--num-nodes", "1", cwd=tmp_path)
    assert r.returncode == 0 and "shipped cluster preset" in r.stderr
    assert "h100-sxm" in r.stdout
    r = run_planner(*base, "--cluster", "./dgx-h100.toml", cwd=tmp_path)
    assert r.returncode == 0 and "a100-80gb" in r.stdout and "preset" not in r.stderr


# ---- writes that fail leave the old file --------------------------------------------------

def _limited(size: int) -> None:
    """In the child: files may grow to ``size`` bytes (a full disk, to the writer)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_full_disk_leaves_the_existing_plan_whole(tmp_path: Path) -> None:
    args = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
            "--global-batch-size", "32", "--seq-len", "1024"]
    r = run_planner("plan", *args, "-o", "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = (tmp_path / "plan.json").read_bytes()
    assert len(before) > 4096
    r2 = subprocess.run([sys.executable, "-m", "planner", "plan", *args, "--tp", "2", "-o",
                         "plan.json"], capture_output=True, text=True, cwd=tmp_path,
                        preexec_fn=lambda: _limited(4096), timeout=300)
    assert r2.returncode == 2 and "cannot write plan file" in r2.stderr, r2.stderr
    assert "Traceback" not in r2.stderr
    assert (tmp_path / "plan.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.slow
def test_calibrate_on_a_full_disk_leaves_the_fit_whole(tmp_path: Path) -> None:
    config = tmp_path / "config"
    fit = config / "calibrated" / "transfer.toml"
    fit.parent.mkdir(parents=True)
    shipped = Path(hardware_profiles.calibrated_path("transfer")).read_text()
    fit.write_text(shipped)
    r = subprocess.run([sys.executable, "-m", "planner", "calibrate", "--groups",
                        "korthikanti2022"], capture_output=True,
                       text=True, cwd=tmp_path, preexec_fn=lambda: _limited(256),
                       env={**os.environ, "PLANNER_CONFIG_DIR": str(config)}, timeout=600)
    assert r.returncode == 2 and "cannot write calibration" in r.stderr, r.stderr[-2000:]
    assert fit.read_text() == shipped
    assert [p.name for p in fit.parent.iterdir()] == ["transfer.toml"]


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o640)
    real = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 10:
            real(fd, bytes(data[:10]))
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(SpecError, match=r"cannot write out file .* No space left"):
        write_text(target, "new text that is long", "out file")
    monkeypatch.undo()
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    write_text(target, "new", "out file")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file keeps its permissions


def test_outputs_through_symlinks_and_onto_inputs_are_refused(tmp_path: Path) -> None:
    args = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
            "--global-batch-size", "32", "--seq-len", "1024"]
    assert run_planner("plan", *args, "-o", "p.json", cwd=tmp_path).returncode == 0
    plan = (tmp_path / "p.json").read_bytes()
    (tmp_path / "elsewhere.txt").write_text("keep")
    (tmp_path / "link.sh").symlink_to("elsewhere.txt")
    (tmp_path / "plan-link.json").symlink_to("p.json")
    cases = [(["emit", "p.json", "--target", "megatron", "-o", "p.json"], "this command reads"),
             (["emit", "p.json", "--target", "megatron", "-o", "plan-link.json"],
              "this command reads"),
             (["emit", "p.json", "--target", "megatron", "-o", "link.sh"], "symbolic link"),
             (["emit", "p.json", "--target", "megatron", "-o", "."], "is a folder"),
             (["plan", *args, "-o", "link.sh"], "symbolic link")]
    for argv, message in cases:
        r = run_planner(*argv, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr, (argv, r.stderr)
    assert (tmp_path / "p.json").read_bytes() == plan
    assert (tmp_path / "elsewhere.txt").read_text() == "keep"
    assert (tmp_path / "link.sh").is_symlink()
    # A device is written in place: -o /dev/stdout is the file's text on standard output.
    r = subprocess.run([sys.executable, "-m", "planner", "emit", "p.json", "--target",
                        "megatron", "-o", "/dev/stdout"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "MEGATRON_ARGS=(" in r.stdout, r.stderr


# ---- planner run stopped: nothing left running --------------------------------------------

def _tagged(tag: str) -> list[int]:
    """The live processes whose environment holds ``PLANNER_TEST_TAG=tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"PLANNER_TEST_TAG={tag}".encode() in env.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _wait_for(predicate: object, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds the processes through /proc")


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_planner_run_leaves_no_process(sig: int, tmp_path: Path) -> None:
    r = run_planner("plan", "--model", "gpt3-125m", "--gpus", "2", "--gpu", "h100-sxm",
                    "--global-batch-size", "4", "--seq-len", "128", "--preset", "fsdp", "-o",
                    "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    tag = f"{os.getpid()}-{sig}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "planner", "run", "plan.json", "--",
                             "--steps", "100000"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PLANNER_TEST_TAG": tag,
                                 "PYTHONWARNINGS": "ignore"})
    try:
        # planner run, torchrun and its two workers
        assert _wait_for(lambda: len(_tagged(tag)) >= 4, 120), _tagged(tag)
        time.sleep(2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"planner: {signal.Signals(sig).name}: stopping" in err
    assert _wait_for(lambda: not _tagged(tag), 10), _tagged(tag)


ORPHANING_LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher that does not stop
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(600)"], start_new_session=True)
    print("started", flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
@needs_proc
def test_supervise_kills_a_launcher_that_does_not_stop_and_its_workers(tmp_path: Path) -> None:
    """A launcher that ignores SIGTERM, with a worker in a session of its own that ignores
    it too: after the grace period both are killed, and the worker is gone even though it
    was never in the launcher's process group."""
    (tmp_path / "launcher.py").write_text(ORPHANING_LAUNCHER)
    driver = ("import sys; from planner.runtime.supervise import supervise; "
              f"sys.exit(supervise([sys.executable, {str(tmp_path / 'launcher.py')!r}], "
              "__import__('os').environ, grace_s=1.0))")
    tag = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", driver], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PLANNER_TEST_TAG": tag})
    try:
        assert _wait_for(lambda: len(_tagged(tag)) >= 3, 60), _tagged(tag)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert _wait_for(lambda: not _tagged(tag), 10), _tagged(tag)


# ---- values that are not numbers (part 2) -------------------------------------------------

#: Values no float field may take: not a number, infinite, of the wrong kind.
NOT_NUMBERS = ["nan", "inf", "-inf", '"fast"', "true", "1e400"]
#: GPU profile fields (TOML key path) and a value out of their physical range.
GPU_FIELDS = {"memory_gib": "-80", "usable_memory_gib": "1000", "memory_bandwidth_gb_per_s": "0",
              "peak_tflops.bf16": "-1", "efficiency.gemm": "2.0", "efficiency.memory": "0",
              "efficiency.attention": "1.5", "efficiency.attention_backward": "-0.3",
              "efficiency.kernel_overhead_us": "-5", "efficiency.comm_slowdown": "3",
              "efficiency.gemm_fp8": "7", "price.usd_per_gpu_hour": "-6"}


def _gpu_profile(tmp_path: Path, key: str, value: str) -> Path:
    """The shipped h100-sxm profile with one field set to ``value`` (TOML text)."""
    text = Path(hardware_profiles.__file__).parent.joinpath("gpus/h100-sxm.toml").read_text()
    table, _, field = key.rpartition(".")
    lines, section, done = [], "", False
    for line in text.split("\n"):
        if line.startswith("["):
            if section == table and not done:  # the table lacks the field: add it
                lines.append(f"{field} = {value}")
                done = True
            section = line.strip("[] ")
        if section == table and line.split("=")[0].strip() == field:
            line, done = f"{field} = {value}", True
        lines.append(line)
    assert done, key
    path = tmp_path / "gpu.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.mark.parametrize("key", GPU_FIELDS)
def test_every_float_of_a_gpu_profile_is_finite_and_in_range(key: str, tmp_path: Path) -> None:
    for value in [*NOT_NUMBERS, GPU_FIELDS[key]]:
        path = _gpu_profile(tmp_path, key, value)
        if value == "1e400":  # not even TOML's: a float too large to read
            with pytest.raises(SpecError):
                GPU.from_file(path)
            continue
        with pytest.raises(SpecError, match=key.rpartition(".")[2]):
            GPU.from_file(path)


def test_an_estimate_never_prints_nan_from_a_plan_file(tmp_path: Path) -> None:
    """A saved plan whose cluster carries NaN, infinite or absurd numbers is refused by name
    when it is read, not estimated as "step nan s"."""
    args = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
            "--global-batch-size", "32", "--seq-len", "1024"]
    assert run_planner("plan", *args, "-o", "p.json", cwd=tmp_path).returncode == 0
    good = json.loads((tmp_path / "p.json").read_text())
    paths = [("gpu", "memory_bandwidth_bytes_per_s"), ("gpu", "memory_bytes"),
             ("inter_node_link", "bandwidth_bytes_per_s"), ("intra_node_link", "latency_s")]
    for where, key in paths:
        for bad in ("NaN", "Infinity", "-1", "1e400", "1e300"):
            d = json.loads(json.dumps(good))
            d["cluster"][where][key] = "@@"
            (tmp_path / "bad.json").write_text(json.dumps(d).replace('"@@"', bad))
            for command in (["explain", "bad.json"], ["emit", "bad.json", "--target", "megatron"]):
                r = run_planner(*command, cwd=tmp_path)
                assert r.returncode in (2, 3), (where, key, bad, r.stdout[-500:])
                assert "nan" not in (r.stdout + r.stderr).lower().split(), (where, key, bad)
                assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("field,value", [
    ("memory_reserve", float("nan")), ("memory_reserve", float("inf")), ("memory_reserve", 0.95),
    ("memory_reserve", "0.05"), ("moe_capacity_factor", float("nan")),
    ("moe_capacity_factor", float("inf")), ("moe_capacity_factor", 0.0)])
def test_job_numbers_are_finite_and_in_range(field: str, value: object) -> None:
    with pytest.raises(SpecError, match=field):
        Job(global_batch_size=8, seq_len=128, **{field: value})  # type: ignore[arg-type]


def test_numpy_numbers_are_numbers() -> None:
    import numpy as np

    job = Job(global_batch_size=8, seq_len=128, memory_reserve=np.float32(0.05))
    assert isinstance(job.memory_reserve, float) and job.memory_reserve == pytest.approx(0.05)
    cons = planner.Constraints(fixed={"tp": np.int64(2)})
    assert cons.fixed["tp"] == 2 and type(cons.fixed["tp"]) is int


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, "1"])
def test_cluster_and_serving_numbers_are_finite(value: object) -> None:
    with pytest.raises(SpecError, match="host_memory_gib"):
        Cluster(gpu="h100-sxm", host_memory_gib=value)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="max_ttft_s"):
        InferenceJob(prompt_len=8, output_len=8, max_ttft_s=value)  # type: ignore[arg-type]
    link = hardware_profiles.load("links", "nvlink4")
    with pytest.raises(SpecError, match=r"bandwidth_gb_per_s"):
        from costmodel.hardware import Link

        Link.from_profile({**link, "bandwidth_gb_per_s": value})


def test_a_profile_fraction_above_one_is_not_clamped(tmp_path: Path) -> None:
    """gemm = 2.0 was scaled by the fitted ratio and clamped to 1: now it is an error."""
    path = _gpu_profile(tmp_path, "efficiency.gemm", "2.0")
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", str(path),
                    "--global-batch-size", "8", "--seq-len", "1024", "--tp", "8")
    assert r.returncode == 2 and "efficiency.gemm" in r.stderr and str(path) in r.stderr


def test_the_smallest_published_model_is_the_band_threshold() -> None:
    from costmodel.fitting.published import shipped_runs
    from costmodel.fitting.uncertainty import SMALLEST_PUBLISHED_PARAMS

    assert min(r.model.num_params() for r in shipped_runs()) == SMALLEST_PUBLISHED_PARAMS

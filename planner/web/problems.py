"""What the explorer page asks, turned into the CLI's own words: a form becomes the argument
list of ``planner plan`` (``form_argv``), parsed by the CLI's parser and loaded by the CLI's
loaders (``load``), so the page's plan is the CLI's plan for the same inputs and a bad value
gets the CLI's one-line message, attributed to the form field whose flag it names.

The page never names code or server files: the model is a preset or an uploaded
``config.json`` (parsed as JSON data, size-limited, written to a private temporary folder),
the cluster and GPU are shipped profile names, and a saved plan is read as JSON text.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import shlex
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hardware_profiles
from costmodel import Cluster, Infeasible, Job, ModelSpec, SpecError
from costmodel.formulas.layercosts import LayerCosts
from planner.cli import plan as plan_command
from planner.cli.common import load_constraints, load_problem, one_line
from planner.cli.parser import command_parser
from planner.result import Plan
from planner.space import Constraints

__all__ = ["FIELDS", "MAX_UPLOAD_BYTES", "FormError", "Problem", "field_of", "form_argv",
           "from_plan", "load"]

#: Form field -> the ``planner plan`` flag it sets (in the order the command line shows).
FIELDS: dict[str, str] = {
    "model": "--model", "cluster": "--cluster", "num_nodes": "--num-nodes", "gpu": "--gpu",
    "gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "gpus_per_domain": "--gpus-per-domain",
    "global_batch_size": "--global-batch-size", "seq_len": "--seq-len",
    "precision": "--precision", "framework": "--framework", "frameworks": "--frameworks",
    "preset": "--preset", "tp": "--tp", "pp": "--pp", "cp": "--cp", "ep": "--ep",
    "zero": "--zero", "recompute": "--recompute", "schedule": "--schedule", "max": "--max",
}
_FLAG_FIELD = {flag: name for name, flag in FIELDS.items()}
#: The largest config.json or plan the page takes (bytes): a model's config is a few KiB, a
#: plan with its why-not table tens of KiB.
MAX_UPLOAD_BYTES = 2 * 1024 * 1024
_PARSE_LOCK = threading.Lock()


class FormError(Exception):
    """Bad input: ``message`` is the line the CLI prints for it; ``field`` the form field it
    names (``""``: the form as a whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class Problem:
    """One question the page asked: the CLI ``argv`` it stands for (``None`` for a plan
    read from JSON), the model, cluster, job and constraints, and what has been found so far
    (the ``plan``, the ``frontier`` and the ``whatif`` points, filled as they are)."""

    key: str
    argv: list[str] | None
    model: ModelSpec | LayerCosts
    cluster: Cluster
    job: Job
    constraints: Constraints
    top_k: int = 5
    plan: Plan | None = None
    frontier: Any = None
    whatif: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def command(self) -> str:
        """The equivalent command line."""
        return "planner " + shlex.join(self.argv) if self.argv else ""


def _text(form: dict[str, Any], name: str) -> str:
    value = form.get(name)
    if value is None:
        return ""
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return str(value).strip()


def _check_name(form: dict[str, Any], name: str, known: list[str], what: str) -> None:
    """A field naming a shipped profile or preset must be one: the page never reads a path."""
    value = _text(form, name)
    if value and value.lower() not in known:
        raise FormError(name, f"planner: error: {value[:80]!r} is not a {what}; choose one of "
                        f"{', '.join(known)}")


def form_argv(form: dict[str, Any], model_path: str | None = None) -> list[str]:
    """The ``planner plan`` arguments of a form (field -> value, strings; empty fields are
    left out); ``model_path``: an uploaded config.json's path, used as ``--model``."""
    if model_path is None:
        _check_name(form, "model", ModelSpec.preset_names(), "model preset (or upload its "
                    "config.json)")
        if not _text(form, "model"):
            raise FormError("model", "planner: error: --model is required: choose a preset "
                            "or upload a config.json")
    _check_name(form, "cluster", hardware_profiles.names("clusters"), "cluster preset")
    _check_name(form, "gpu", hardware_profiles.names("gpus"), "GPU profile")
    argv = ["plan"]
    for name, flag in FIELDS.items():
        value = model_path if name == "model" and model_path else _text(form, name)
        if not value:
            continue
        if name == "max":
            for item in re.split(r"[\s,]+", value):
                if item:
                    argv += [flag, item]
        else:
            argv += [flag, value]
    return argv


def field_of(message: str, default: str = "") -> str:
    """The form field whose flag ``message`` names first (``--seq-len``), else the degree
    it names as the search does (``tp=3``), else ``default``."""
    for flag in re.findall(r"--[a-z][a-z-]*", message):
        if flag in _FLAG_FIELD:
            return _FLAG_FIELD[flag]
    found = re.search(r"\b(tp|pp|cp|ep|zero)=", message)
    return found.group(1) if found else default


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the CLI's parser; its one-line error as a ``FormError``."""
    err = io.StringIO()
    with _PARSE_LOCK, contextlib.redirect_stderr(err):
        try:
            args = command_parser((plan_command,)).parse_args(argv)
        except SystemExit:
            line = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else \
                "planner plan: error: invalid arguments"
            raise FormError(field_of(line, ""), line) from None
    return args


def _upload(form: dict[str, Any], folder: str) -> str | None:
    """Write an uploaded ``config.json`` (form field ``config_json``: its text) into
    ``folder`` after checking it is a JSON object of at most ``MAX_UPLOAD_BYTES``; its path."""
    text = form.get("config_json")
    if not text:
        return None
    if not isinstance(text, str) or len(text.encode("utf-8", "replace")) > MAX_UPLOAD_BYTES:
        raise FormError("model", f"planner: error: the uploaded config.json is over "
                        f"{MAX_UPLOAD_BYTES // 1024} KiB; a model's config.json is a few KiB")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormError("model", f"planner: error: the uploaded config.json is not JSON: "
                        f"{e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict):
        raise FormError("model", "planner: error: the uploaded config.json is not a JSON "
                        "object (a Hugging Face config is one {...})")
    path = Path(folder) / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _key(argv: list[str], upload: str | None) -> str:
    return hashlib.sha256(json.dumps([argv, upload]).encode()).hexdigest()[:16]


def load(form: dict[str, Any]) -> Problem:
    """The problem a form asks, loaded as ``planner plan`` loads it (``FormError`` naming
    the field for bad input)."""
    with tempfile.TemporaryDirectory(prefix="planner-serve-") as folder:
        path = _upload(form, folder)
        argv = form_argv(form, path)
        args = parse(argv)
        stage = "model"
        try:
            model, cluster, job = load_problem(args)
            stage = "max"
            cons = load_constraints(args)
        except SpecError as e:
            msg = f"planner: error: {one_line(e)}"
            if path:
                msg = msg.replace(path, "config.json")
            raise FormError(field_of(msg, stage if stage == "max" else _stage_field(msg)),
                            msg) from None
    assert isinstance(job, Job)
    if path:  # the command line names the file the user uploaded
        argv[argv.index(path)] = str(form.get("config_name") or "config.json")
    return Problem(key=_key(argv, form.get("config_json")), argv=argv, model=model,
                   cluster=cluster, job=job, constraints=cons, top_k=args.top_k)


def _stage_field(message: str) -> str:
    """Where a loading error without a flag belongs: the model's or the cluster's field."""
    low = message.lower()
    if "gpu" in low or "cluster" in low or "node" in low:
        return "gpus"
    if "batch" in low:
        return "global_batch_size"
    return "model"


def from_plan(text: str) -> Problem:
    """A saved training plan (JSON text, re-validated and re-estimated) as a problem whose
    plan is already found."""
    if len(text.encode("utf-8", "replace")) > MAX_UPLOAD_BYTES:
        raise FormError("plan_json", f"planner: error: the plan is over "
                        f"{MAX_UPLOAD_BYTES // 1024} KiB")
    # Read from a private file, never as a string: Plan.from_json takes a string that names a
    # file as that file's path.
    with tempfile.TemporaryDirectory(prefix="planner-serve-") as folder:
        path = Path(folder) / "plan.json"
        path.write_text(text, encoding="utf-8", errors="replace")
        try:
            found = Plan.from_json(path)
        except (SpecError, Infeasible) as e:
            words = one_line(e).replace(f"plan file {str(path)!r}", "the plan")
            raise FormError("plan_json", f"planner: error: {words}") from None
    if found.is_inference:
        raise FormError("plan_json", "planner: error: this is a serving plan; the explorer "
                        "shows training plans ('planner explain PLAN' shows a serving one)")
    job, _, _ = found.training()
    return Problem(key=hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16],
                   argv=None, model=found.model, cluster=found.cluster, job=job,
                   constraints=found.constraints, plan=found)

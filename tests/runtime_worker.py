"""Runs a list of plans in one set of processes (started by torchrun from test_runtime.py).

``python tests/runtime_worker.py CASES.json OUT.json``: CASES is a list of
``{"name", "plan", "lr"}`` (plan JSON text, learning rate; ``"spec"``: the ModelSpec whose
reference transformer a traced module's plan was traced from; ``"module"``: the
``planner.examples`` class (or ``runtime_models``', named ``runtime_models:Class``), its
arguments and the traced input's shape of a module's plan) for
this world size; every case is trained with ``planner.runtime.train.train`` (a module's with
``train_module``) and OUT gets, per case, each rank's losses and state bytes (or the error).
One process group serves all cases, so the processes start once.
"""

from __future__ import annotations

import datetime
import json
import sys
import traceback

import runtime_models
import torch
import torch.distributed as dist

import planner.examples
from costmodel import ModelSpec
from planner.result import Plan
from planner.runtime.train import exit_process, train, train_module


def module_class(name: str) -> type[torch.nn.Module]:
    """A ``planner.examples`` class by name, or ``runtime_models:Class``."""
    if name.startswith("runtime_models:"):
        return getattr(runtime_models, name.split(":", 1)[1])
    return getattr(planner.examples, name)


def main() -> None:
    cases_path, out_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    with open(cases_path) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        try:
            plan = Plan.from_json(case["plan"])
            if case.get("module"):
                m = case["module"]
                example = torch.zeros(m["shape"],
                                      dtype=torch.long if m["tokens"] else torch.float32)
                res = train_module(plan, lambda m=m: module_class(m["cls"])(**m["kwargs"]),
                                   example, steps=5, lr=case["lr"])
            else:
                spec = ModelSpec(**case["spec"]) if case.get("spec") else None
                res = train(plan, steps=5, lr=case["lr"], spec=spec)
            row: dict[str, object] = {"rank": dist.get_rank(), **res.__dict__}
        except Exception:  # recorded per case; the test shows the traceback
            row = {"rank": dist.get_rank(), "error": traceback.format_exc()}
        rows: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        results[case["name"]] = rows
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)

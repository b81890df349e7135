"""Runs a list of plans in one set of processes (started by torchrun from test_runtime.py).

``python tests/runtime_worker.py CASES.json OUT.json``: CASES is a list of
``{"name", "plan", "lr"}`` (plan JSON text, learning rate; ``"spec"``: the ModelSpec whose
reference transformer a traced module's plan was traced from) for this world size; every case
is trained with ``planner.runtime.train.train`` and OUT gets, per case, each rank's losses
and state bytes (or the error). One process group serves all cases, so the processes start once.
"""

from __future__ import annotations

import datetime
import json
import sys
import traceback

import torch.distributed as dist

from costmodel import ModelSpec
from planner.plan import Plan
from planner.runtime.train import train


def main() -> None:
    cases_path, out_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    with open(cases_path) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        try:
            spec = ModelSpec(**case["spec"]) if case.get("spec") else None
            res = train(Plan.from_json(case["plan"]), steps=5, lr=case["lr"], spec=spec)
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

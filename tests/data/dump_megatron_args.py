"""Write ``megatron_args.json``: the argument definitions of Megatron-LM's ``pretrain_gpt.py``.

Run from a Megatron-LM checkout (it imports ``megatron.training.arguments``, which needs torch,
triton and einops), with this file's directory as the output::

    git -C Megatron-LM checkout 4666de7a28
    cd Megatron-LM && python /path/to/tests/data/dump_megatron_args.py /path/to/tests/data

Each option of Megatron's own parser (``add_megatron_arguments``) is recorded with its flags,
destination, action kind, nargs, type name and choices, so ``tests/test_emit.py`` can rebuild
an equivalent ``argparse`` parser and parse the emitted argument list with it, on machines
where Megatron-LM cannot be imported. With ``--validate FILE...`` it instead parses emitted
``MEGATRON_ARGS`` files with the real parser and runs Megatron's ``validate_args`` on them
(world size from the file's torchrun line; the GPU architecture is taken as an H100's
when no GPU is present).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys


def dump(out_dir: str) -> None:
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    actions = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        kind = type(a).__name__.strip("_").replace("Action", "").lower()
        typ = getattr(a.type, "__name__", None) if a.type is not None else None
        choices = None
        if a.choices is not None:
            choices = [getattr(c, "name", c) for c in a.choices]
            choices = [c if isinstance(c, str | int | float) else str(c) for c in choices]
        actions.append({"flags": list(a.option_strings), "dest": a.dest, "kind": kind,
                        "nargs": a.nargs, "type": typ, "choices": choices})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    date = subprocess.run(["git", "log", "-1", "--format=%cs"], capture_output=True, text=True,
                          check=False).stdout.strip()
    from megatron.core import package_info

    doc = {"source": "NVIDIA/Megatron-LM megatron/training/arguments.py "
                     "(add_megatron_arguments), dumped by tests/data/dump_megatron_args.py",
           "commit": commit, "commit_date": date, "version": package_info.__version__,
           "actions": actions}
    with open(os.path.join(out_dir, "megatron_args.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(actions)} options from Megatron-LM {commit[:10]} ({date})")


def validate(paths: list[str]) -> None:
    import megatron.training.arguments as margs
    from megatron.training.arguments import parse_args, validate_args

    # validate_args asks the first CUDA device for its architecture; without a GPU, answer
    # as an H100 (compute capability 9.x) would.
    margs.get_device_arch_version = lambda: 9
    margs.torch.cuda.get_device_capability = lambda *a: (9, 0)

    for path in paths:
        with open(path) as f:
            text = f.read()
        words = shlex.split(re.search(r"^MEGATRON_ARGS=\((.*?)^\)", text, re.S | re.M)
                            .group(1), comments=True)
        for key, value in re.findall(r"^export (\w+)=(\S+)", text, re.M):
            os.environ[key] = value
        run = re.search(r"--nproc-per-node (\d+) --nnodes (\d+)", text)
        os.environ["WORLD_SIZE"] = str(int(run.group(1)) * int(run.group(2)))
        os.environ["RANK"] = "0"
        sys.argv = ["pretrain_gpt.py", *words, "--mock-data", "--train-iters", "10",
                    "--lr", "1e-4"]
        args = parse_args()
        validate_args(args, {})
        print(f"{path}: valid (dp={args.data_parallel_size}, tp="
              f"{args.tensor_model_parallel_size}, pp={args.pipeline_model_parallel_size})")


if __name__ == "__main__":
    if sys.argv[1] == "--validate":
        validate(sys.argv[2:])
    else:
        dump(sys.argv[1])

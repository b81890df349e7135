"""A Slurm ``sbatch`` script that starts the plan's trainer with ``torchrun`` on every node.

One task per node runs ``torchrun`` with the c10d rendezvous on the first node of the
allocation (torchrun docs, "Launching multi-node jobs"); the trainer's file (torchtitan TOML,
ds_config.json or the Megatron-LM argument array) is written next to the script by a
here-document, so the script is self-contained. The NCCL environment follows the cluster's
inter-node link; the variables are documented in the NCCL user guide, "Environment Variables"
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.estimate import Estimate
from costmodel.model import ModelSpec
from planner.emit import deepspeed, megatron, torchtitan
from planner.emit.common import Lowered, ReadBack, Target, commented, header_lines

TRAINERS: dict[str, Target] = {t.name: t for t in (torchtitan.TARGET, deepspeed.TARGET,
                                                   megatron.TARGET)}
#: What each trainer runs under torchrun, after the rendezvous flags.
ENTRY = {"torchtitan": "-m torchtitan.train --job.config_file torchtitan.toml",
         "deepspeed": "train.py --deepspeed --deepspeed_config ds_config.json",
         "megatron": 'pretrain_gpt.py "${MEGATRON_ARGS[@]}"'}
#: NCCL environment by inter-node link family (the link profile's name prefix).
NCCL_ENV: dict[str, list[tuple[str, str, str]]] = {
    "ib": [("NCCL_IB_DISABLE", "0", "InfiniBand verbs transport"),
           ("NCCL_NET_GDR_LEVEL", "PHB", "GPUDirect RDMA when GPU and NIC share a PCI host "
            "bridge")],
    "roce": [("NCCL_IB_DISABLE", "0", "RoCE runs on the IB verbs transport"),
             ("NCCL_IB_GID_INDEX", "3", "the RoCE v2 GID (check with show_gids)")],
    "eth": [("NCCL_IB_DISABLE", "1", "TCP sockets, no RDMA"),
            ("NCCL_SOCKET_NTHREADS", "4", "more socket threads for 100G+ links"),
            ("NCCL_NSOCKS_PERTHREAD", "4", "more sockets per thread")],
}
EOF_MARK = "PLANNER_EOF"


def here_document(filename: str, text: str) -> list[str]:
    """Shell lines that write ``text`` to ``filename`` with a quoted here-document (nothing
    in it is expanded), ended by a marker that no line of ``text`` equals (``EOF_MARK``, or
    it with a number), so no line of the text can end it early and run as a command."""
    taken = set(text.split("\n"))
    marks = (EOF_MARK if i == 0 else f"{EOF_MARK}_{i}" for i in range(len(taken) + 1))
    mark = next(m for m in marks if m not in taken)
    return [f"cat > {shlex.quote(filename)} <<'{mark}'", text.rstrip("\n"), mark]


def lower(model: ModelSpec, job: Job, cfg: ParallelConfig) -> Lowered:
    """The plan's trainer runs the plan: lowered as that trainer's own target lowers it."""
    return TRAINERS[job.framework].lower(model, job, cfg)


def _link_family(name: str) -> str | None:
    return next((f for f in NCCL_ENV if name.startswith(f + "-")), None)


def _segment(c: Any) -> list[str]:
    """On NVLink domains of several nodes (an NVL72 rack's trays), ask Slurm's block topology
    for whole domains (``--segment``: allocate the job in segments of that many nodes of one
    block, Slurm's topology guide, topology/block): the plan keeps its tensor, context and
    data parallel groups inside a domain, which holds only if rank order follows the racks."""
    per = c.scale_up // c.gpus_per_node
    if per <= 1 or c.num_nodes <= per:
        return []
    return [f"# whole {c.scale_up}-GPU NVLink domains (needs TopologyPlugin=topology/block)",
            f"#SBATCH --segment={per}"]


def sbatch_preamble(plan: Any, head: list[str]) -> list[str]:
    """The lines every planner sbatch script starts with: the header of predictions as
    comments, the allocation (nodes, one task per node, the node's GPUs), the NCCL
    environment of the cluster's inter-node link, and the rendezvous address."""
    c = plan.cluster
    lines = ["#!/bin/bash", commented(head),
             f"#SBATCH --job-name={re.sub(r'[^A-Za-z0-9._-]', '-', plan.model.name)}",
             f"#SBATCH --nodes={c.num_nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={c.gpus_per_node}",
             "#SBATCH --exclusive",
             "#SBATCH --output=%x-%j.out",
             *_segment(c),
             "set -euo pipefail", "",
             "# NCCL (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
             "export NCCL_DEBUG=WARN"]
    link = c.inter_node_link
    family = _link_family(link.name) if c.num_nodes > 1 and link is not None else None
    for key, value, why in NCCL_ENV.get(family or "", []):
        lines.append(f"export {key}={value}  # {why}")
    if family:
        lines.append(f"# {link.name}: set NCCL_SOCKET_IFNAME (and NCCL_IB_HCA) to this "
                     "cluster's interfaces if NCCL picks the wrong ones")
    lines.append("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    lines += ["", 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "MASTER_PORT=29500"]
    return lines


def srun_torchrun(gpus_per_node: int, entry: str) -> list[str]:
    """``srun`` starting one ``torchrun`` per node with the c10d rendezvous on the first."""
    return ["srun --kill-on-bad-exit=1 torchrun \\",
            f'    --nnodes "$SLURM_NNODES" --nproc-per-node {gpus_per_node} \\',
            '    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d '
            '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\',
            f"    {entry}"]


def render(*, plan: Any, config: ParallelConfig, job: Job, estimate: Estimate, command: str,
           warnings: tuple[str, ...]) -> str:
    """The sbatch script."""
    trainer = TRAINERS[job.framework]
    inner = trainer.render(plan=plan, config=config, job=job, estimate=estimate,
                           command=command, warnings=warnings)
    head = header_lines(plan, config, job, estimate, command, warnings)
    lines = sbatch_preamble(plan, head)
    lines += ["", *here_document(trainer.filename, inner)]
    if job.framework == "megatron":
        lines.append(f"source {trainer.filename}")
    lines += ["", *srun_torchrun(plan.cluster.gpus_per_node, ENTRY[job.framework])]
    return "\n".join(lines) + "\n"


def read(text: str, model: ModelSpec) -> ReadBack:
    """The configuration of the trainer file embedded in an sbatch script, and the GPUs."""
    nodes = re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M)
    gpn = re.search(r"^#SBATCH --gpus-per-node=(\d+)$", text, re.M)
    inner = re.search(rf"^cat > (\S+) <<'({EOF_MARK}\w*)'\n(.*?)^\2$", text, re.S | re.M)
    if not (nodes and gpn and inner):
        raise SpecError("not an sbatch script written by the planner (no --nodes, "
                        "--gpus-per-node or embedded trainer file)")
    trainer = next(t for t in TRAINERS.values() if t.filename == inner.group(1))
    back = trainer.read(inner.group(3), model)
    return ReadBack(config=back.config, global_batch_size=back.global_batch_size,
                    seq_len=back.seq_len, num_gpus=int(nodes.group(1)) * int(gpn.group(1)))


TARGET = Target(name="slurm", filename="train.sbatch", lower=lower, render=render, read=read)

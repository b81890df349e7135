"""The validity rules of the training search space (``planner.space``), as data: each
rule's name and what it requires, and the option generators that apply them field by field
(``Filter``): the expert meshes, shardings, schedules and recomputes a set of degrees
admits. The search counts every value each rejects (``Space.rejected``), and
``planner.alternatives`` and ``planner.advice`` quote them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from costmodel.config import V_SCHEDULES, Job, accounted_split
from costmodel.formulas.arrays import divisors
from costmodel.formulas.checks import combined_job_problem
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import OFFLOAD_CODES, RECOMPUTE_CODES, SCHEDULE_CODES
from costmodel.formulas.vschedules import v_split
from costmodel.frameworks import Framework, experts_fit
from costmodel.model import ModelSpec

__all__ = ["RULES", "Filter", "Rejections", "combined_runs", "expert_meshes",
           "recompute_options", "schedule_options", "sharding_options", "tp_rules"]

#: Rule name -> what it requires. Each rejected value is counted under its rule.
RULES: dict[str, str] = {
    "tp_node": "tensor parallel stays inside a node or NVLink domain: tp divides its GPUs",
    "tp_heads": "tp divides the attention heads and the KV heads",
    "tp_ffn": "tp divides the MLP (and expert MLP) hidden size",
    "tp_traced": "a traced graph is costed at the TP degrees its blocks were sharded at",
    "cp_traced": "context parallel splits a traced graph's sequences only where its layers "
                 "mix tokens in fused attention alone (ring attention)",
    "sp_traced": "a traced graph is costed with the sequence parallelism its blocks were "
                 "sharded with (LayerCosts.sp_options)",
    "tp_runs": "a traced graph's TP layout runs: no module split in a layout no TP style "
               "runs, no sequence split inside the model's own forward "
               "(LayerCosts.tp_refusal)",
    "pp_layers": "a pipeline stage holds at least one layer: pp <= layers",
    "pp_inputs": "the first pipeline stage (chunk) holds the layers before the model's last "
                 "op that reads its own inputs: torch.distributed.pipelining gives a later "
                 "stage only the previous stage's outputs (LayerCosts.first_stage_layers)",
    "cp_seq": "context parallel splits the sequence: cp divides seq_len",
    "mesh_nodes": "the tp x cp block tiles the nodes (NVLink domains): it divides, or is a "
                  "multiple of, the GPUs per node (domain)",
    "dp_batch": "every data-parallel rank gets whole sequences: dp divides the global batch",
    "ep_dense": "expert parallel needs a mixture-of-experts model",
    "ep_experts": "ep divides the number of experts",
    "etp_ffn": "the experts' own tensor parallel degree (Megatron-Core's MoE parallel folding) "
               "divides tp and the expert MLP hidden size",
    "ep_shard_group": "the trainer's expert parallel borrows its FSDP shard group, which DDP "
                      "(zero_stage 0) leaves at 1 rank",
    "zero_folded": "experts folded over the TP ranks run with the ZeRO stages the trainer folds "
                   "with (Megatron-LM's distributed optimizer: 0 or 1)",
    "shard_folded": "experts folded over the TP ranks shard over all data-parallel ranks "
                    "(Megatron-LM)",
    "ep_ranks": "expert parallel reuses data- and context-parallel ranks: ep divides dp * cp",
    "zero_framework": "the trainer runs this ZeRO stage",
    "zero_pipeline": "the trainer combines this ZeRO stage with pipeline parallel",
    "shard_hybrid": "the trainer shards over part of the data-parallel ranks (HSDP) at "
                    "this ZeRO stage",
    "shard_experts": "expert states shard evenly: ep divides the shard degree",
    "sp_seq": "sequence parallel splits seq_len / cp over tp",
    "sp_framework": "the trainer has sequence parallelism (DeepSpeed's AutoTP has none; its "
                    "Ulysses sequence split is the planner's cp)",
    "mbs_batch": "dp * micro_batch_size divides the global batch",
    "schedule_costed": "a trainer the planner emits runs the schedule (DeepSeek's DualPipe "
                       "runs in none: 'planner estimate --schedule dualpipe' costs it, the "
                       "search does not offer it)",
    "schedule_framework": "the trainer has this pipeline schedule",
    "schedule_launcher": "the trainer's launcher runs the schedule as estimated (torchtitan "
                         "0.2.2 runs multi-stage schedules only with 2 or more stages per "
                         "rank, torchtitan/distributed/pipeline_parallel.py, so not one-stage "
                         "zero bubble; estimate it explicitly for 'planner run')",
    "virtual_layers": "interleaving splits the layers evenly: pp * virtual stages divides "
                      "them, or them with the embedding and the loss counted as layers "
                      "(Megatron-LM's --account-for-embedding/loss-in-pipeline-split)",
    "schedule_micro_batches": "the trainer's schedule runs this many micro-batches "
                              "(torch.distributed.pipelining: 1F1B needs at least pp, "
                              "interleaved and zero bubble a multiple of micro-batches // pp, "
                              "DualPipeV at least 2 * pp; "
                              "Megatron-LM's interleaved schedule a multiple of pp, "
                              "megatron/core/pipeline_parallel/schedules.py)",
    "schedule_combined": "Megatron-LM's combined 1F1B (--overlap-moe-expert-parallel-comm) "
                         "needs a mixture of experts, the alltoall or deepep dispatcher, bf16 "
                         "or fp16 training and at most one MTP module "
                         "(megatron/core/transformer/transformer_config.py)",
    "combined_ep": "combined 1F1B overlaps expert-parallel all-to-alls: ep >= 2",
    "combined_recompute": "combined 1F1B refuses full recompute and the moe module",
    "offload_framework": "the trainer offloads this to the CPU at this ZeRO stage",
    "constraint": "excluded by the constraints given",
}


class Allows(Protocol):
    """What ``Filter`` asks of the constraints (``planner.space.Constraints``)."""

    def allows(self, key: str, value: Any) -> bool: ...


@dataclass
class Rejections:
    """Values each rule rejected: rule -> (count, first example)."""

    counts: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, rule: str, example: str, n: int = 1) -> None:
        entry = self.counts.setdefault(rule, [0, example])
        entry[0] += n



class Filter:
    """Keeps the values of one field that pass the rules, counting what each rule rejects."""

    def __init__(self, cons: Allows, rej: Rejections) -> None:
        self.cons = cons
        self.rej = rej

    def keep(self, key: str, values: Iterable[Any],
             rules: Sequence[tuple[str, Any]] = (), show: Any = None,
             canon: Any = None) -> list[Any]:
        """The values passing every rule and the constraints; ``show`` labels a rejected
        value, ``canon`` maps it to the value the constraints name."""
        out = []
        for v in values:
            label = show(v) if show else f"{key}={v}"
            failed = next((name for name, ok in rules if not ok(v)), None)
            if failed:
                self.rej.add(failed, label)
            elif not self.cons.allows(key, canon(v) if canon else v):
                self.rej.add("constraint", label)
            else:
                out.append(v)
        return out


def expert_meshes(model: ModelSpec | LayerCosts, fw: Framework, f: Filter, dp: int, tp: int,
                   pp: int, cp: int) -> list[tuple[int, int]]:
    """(ep, etp) options of one set of degrees: ep dividing the experts and, with the experts
    split as tp, borrowing dp * cp; a preset's experts may also fold over the TP ranks with
    their own etp (``Framework.expert_tp``: under Megatron-LM any etp dividing tp,
    Megatron-Core's MoE parallel folding; under torchtitan etp 1), etp * ep dividing
    tp * cp * dp."""
    if not model.is_moe:
        return [(e, tp) for e in f.keep("ep", [1])]
    experts = model.moe_routing()[1] if isinstance(model, LayerCosts) else model.num_experts
    folds = fw.expert_tp != "tp" and isinstance(model, ModelSpec) and tp > 1
    options = [t for t in sorted(divisors(tp), reverse=True) if fw.runs_expert_tp(tp, t)]
    etps = f.keep("etp", options if folds else [tp], [
        ("etp_ffn", lambda t: (model.moe_ffn_hidden_size or 0) % t == 0
         if isinstance(model, ModelSpec) else True)],
        show=lambda t: f"tp={tp} etp={t}")
    out = []
    for etp in etps:
        eps = f.keep("ep", divisors(dp * cp * tp // etp), [
            ("ep_experts", lambda e: experts % e == 0)],
            show=lambda e, etp=etp: f"tp={tp} pp={pp} cp={cp} ep={e} etp={etp}")
        out += [(ep, etp) for ep in eps if etp == tp or ep * etp > 1]
    return out


def sharding_options(fw: Framework, f: Filter, dp: int, pp: int, cp: int, ep: int,
                     tp: int = 1, etp: int = 1) -> np.ndarray:
    """(zero, group, offload) options of one set of degrees; the experts fold over the TP
    ranks when ``etp < tp``, which only the ZeRO stages ``Framework.folded_zero_max``
    allows, over the whole data-parallel group unless the trainer's expert parallel lives in
    its FSDP shard group (``Framework.ep_in_shard_group``: there ep * etp divides that
    group x cp x tp, the group 1 without sharding)."""
    folded = etp < tp
    zeros = f.keep("zero_stage", range(4), [
        ("zero_framework", lambda z: z in fw.zero_stages),
        ("zero_pipeline", lambda z: pp == 1 or z in fw.zero_with_pp),
        ("zero_folded", lambda z: not folded or z <= fw.folded_zero_max),
        ("ep_shard_group", lambda z: not fw.ep_in_shard_group or ep == 1 or z > 0
         or experts_fit(1, cp, tp, ep, etp))],
        show=lambda z: f"pp={pp} zero_stage={z}")
    least = dict(fw.offloads)
    out = []
    for z in zeros:
        groups = [dp] if z == 0 else f.keep(
            "sharding_group", sorted(divisors(dp), reverse=True),
            [("shard_hybrid", lambda g, z=z: g == dp or z in fw.hybrid_shard_stages),
             ("shard_experts", lambda g: experts_fit(g, cp, tp, ep, etp) if folded
              or fw.ep_in_shard_group else (g * cp) % ep == 0),
             ("shard_folded", lambda g: not folded or fw.ep_in_shard_group or g == dp)],
            show=lambda g, z=z: f"zero_stage={z} sharding_group={g}",
            canon=lambda g: None if g == dp else g)
        offs = f.keep("offload", list(OFFLOAD_CODES), [
            ("offload_framework", lambda o, z=z: o in least and z >= least[o])],
            show=lambda o, z=z: f"zero_stage={z} offload={o}")
        out += [(z, g, OFFLOAD_CODES[o]) for g in groups for o in offs]
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def schedule_options(fw: Framework, f: Filter, num_layers: int, pp: int, need: int = 0,
               mtp: int = 0, combined: bool = False) -> list[tuple[int, int]]:
    """(schedule, virtual stages) options of a pipeline degree; ``need``: the layers the
    first chunk must hold (``LayerCosts.first_stage_layers``); ``mtp``: the model's
    multi-token prediction modules, which an accounted split counts with the loss;
    ``combined``: whether the model and job may run Megatron-LM's combined 1F1B
    (``_combined_runs``)."""
    rules = [("schedule_costed", lambda s: s not in fw.costed_schedules),
             ("schedule_framework", lambda s: s in fw.schedules),
             ("schedule_launcher", lambda s: s not in fw.unsearched_schedules),
             ("schedule_combined", lambda s: s != "combined-1f1b" or combined)]
    if pp == 1:
        # Without a pipeline the schedule means nothing (its canonical form is 1F1B, v = 1)
        # but for combined 1F1B, which pairs micro-batches on one stage too.
        out = []
        if f.cons.allows("pipeline_schedule", "1f1b") and \
                f.cons.allows("virtual_pipeline_stages", 1):
            out.append((SCHEDULE_CODES["1f1b"], 1))
        if "combined-1f1b" in fw.schedules and combined and \
                f.cons.allows("pipeline_schedule", "combined-1f1b") and \
                f.cons.allows("virtual_pipeline_stages", 1):
            out.append((SCHEDULE_CODES["combined-1f1b"], 1))
        if not out:
            f.rej.add("constraint", "pp=1 with the pipeline schedule constrained")
        return out
    out = []
    names = f.keep("pipeline_schedule", list(SCHEDULE_CODES), rules)
    for s in names:
        if s in V_SCHEDULES:
            # Two stages per rank as a V, torchtitan's split (vschedules.v_split), at least
            # a layer per stage on average (costmodel.formulas.checks).
            if f.cons.allows("virtual_pipeline_stages", 2) and num_layers >= 2 * pp \
                    and v_split(num_layers, pp)[0] >= need:
                out.append((SCHEDULE_CODES[s], 2))
            continue
        if s not in ("interleaved-1f1b", "combined-1f1b"):
            if f.cons.allows("virtual_pipeline_stages", 1):
                out.append((SCHEDULE_CODES[s], 1))
            continue
        vs = f.keep("virtual_pipeline_stages", range(2, num_layers // pp + 1), [
            ("virtual_layers", lambda v: num_layers % (pp * v) == 0
             or (not need and accounted_split(num_layers, pp, v, mtp=mtp) is not None)),
            ("pp_inputs", lambda v: num_layers // (pp * v) >= need)],
            show=lambda v: f"pp={pp} virtual_pipeline_stages={v}")
        out += [(SCHEDULE_CODES[s], v) for v in vs]
    return out


def combined_runs(model: ModelSpec | LayerCosts, job: Job) -> bool:
    """Whether the model and job meet what combined 1F1B needs beyond the configuration
    (``costmodel.formulas.checks.combined_job_problem``)."""
    return combined_job_problem(model, job) is None


def recompute_options(f: Filter, chunk: int, full: bool = True,
                      selective: bool = True) -> np.ndarray:
    """(recompute, recompute_layers) options for chunks of ``chunk`` layers: none first;
    ``full``: whether full recompute is one (combined 1F1B refuses it); ``selective``: whether
    selective recompute is (combined 1F1B refuses it when it re-runs the ``moe`` module)."""
    out = []
    for r in f.keep("recompute", list(RECOMPUTE_CODES)):
        if r == "full" and not full:
            f.rej.add("combined_recompute", "pipeline_schedule=combined-1f1b recompute=full")
            continue
        if r == "selective" and not selective:
            f.rej.add("combined_recompute", "pipeline_schedule=combined-1f1b recompute=selective "
                      "with the recompute module moe")
            continue
        code = RECOMPUTE_CODES[r]
        if r != "full":
            out.append((code, 0))
            continue
        if f.cons.allows("recompute_num_layers", None):
            out.append((code, 0))
        out += [(code, n) for n in range(1, chunk)
                if f.cons.allows("recompute_num_layers", n)]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def tp_rules(model: ModelSpec | LayerCosts) -> list[tuple[str, Callable[[int], bool]]]:
    """What a TP degree must divide in a preset (the heads, the MLP); for a traced graph,
    the degrees its blocks were sharded at."""
    if isinstance(model, LayerCosts) and model.spec is None:
        return [("tp_traced", lambda t: t in model.tp_degrees)]
    spec = model.spec if isinstance(model, LayerCosts) else model
    assert spec is not None
    ffn = [spec.ffn_hidden_size or 0] + ([spec.moe_ffn_hidden_size or 0] if spec.is_moe
                                         else [])
    return [("tp_heads", lambda t: spec.num_heads % t == 0
             and int(spec.num_kv_heads or spec.num_heads) % t == 0),
            ("tp_ffn", lambda t: all(x % t == 0 for x in ffn))]

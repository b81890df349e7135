"""The validity rules of the training search space (``planner.space``), as data: each
rule's name and what it requires. The search counts every value each rejects
(``Space.rejected``), and ``planner.alternatives`` and ``planner.advice`` quote them."""

from __future__ import annotations

__all__ = ["RULES"]

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
    "zero_folded": "experts folded over the TP ranks are costed with the distributed optimizer "
                   "(ZeRO 0 or 1)",
    "shard_folded": "experts folded over the TP ranks shard over all data-parallel ranks",
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
    "offload_framework": "the trainer offloads this to the CPU at this ZeRO stage",
    "constraint": "excluded by the constraints given",
}

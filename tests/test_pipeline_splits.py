"""Uneven pipeline splits: Megatron-LM's accounted split (the embedding, the loss and any MTP
module counted as layers), explicit layers per interleaved chunk, what the cost model does
with them, what the search offers and what the emitters write.

Published layouts: Llama 3.1 405B, 126 layers on pp 8 x virtual 8 with the embedding and the
loss counted (NVIDIA-NeMo/Megatron-Bridge's llama3 405B recipe,
``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``);
DeepSeek-V3, 61 layers and one MTP module on pp 8 x virtual 4 as ``Et|(tt|)*30mL``
(Megatron-Bridge 25.09's H100 recipe, docs/performance-summary.md).
"""

from __future__ import annotations

import pytest
from inprocess import run_planner

import planner
from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.config import accounted_split
from costmodel.formulas.arrays import ConfigArrays
from costmodel.formulas.memory import memory_table
from planner.emit.megatron import layout, layout_layers


def test_accounted_splits() -> None:
    assert accounted_split(126, 8, 8) == (1,) + (2,) * 62 + (1,)
    assert accounted_split(61, 8, 4, mtp=1) == (1,) + (2,) * 30 + (0,)
    assert accounted_split(126, 8) == (15,) + (16,) * 6 + (15,)  # no interleaving
    assert accounted_split(126, 8, 4) == (3,) + (4,) * 30 + (3,)  # 128 units, 4 a chunk
    assert accounted_split(125, 8, 8) is None  # 127 units do not divide over 64 chunks
    assert accounted_split(6, 8) is None  # a stage without a layer


def test_chunks_are_checked() -> None:
    s = accounted_split(126, 8, 8)
    with pytest.raises(SpecError, match="64 chunks"):
        ParallelConfig(pp=8, virtual_pipeline_stages=8, stage_layers=s[:8])
    with pytest.raises(SpecError, match="without layers"):
        ParallelConfig(pp=2, virtual_pipeline_stages=2, stage_layers=(3, 0, 3, 0))
    with pytest.raises(SpecError, match="positive"):
        ParallelConfig(pp=2, stage_layers=(3, 0))  # a stage holds a layer
    cfg = ParallelConfig(pp=8, virtual_pipeline_stages=8, stage_layers=s)
    assert cfg.rank_layers == (15,) + (16,) * 6 + (15,) and cfg.chunk_layers == s
    model = ModelSpec.preset("llama-3-405b")
    job = Job(global_batch_size=1024, seq_len=8192, framework="megatron")
    cluster = Cluster(gpu="h100-sxm", num_nodes=128, gpus_per_node=8)
    with pytest.raises(SpecError, match="explicit layers per chunk"):
        estimate(model, cluster, job, ParallelConfig(dp=16, tp=8, pp=8,
                                                     virtual_pipeline_stages=8))


def test_a_ranks_layers_of_each_kind_follow_its_chunks() -> None:
    """DeepSeek-V3's three dense layers under ``Et|(tt|)*30mL``: layer 0 in rank 0's first
    chunk, layers 1 and 2 in rank 1's; the MTP module's MoE layer on the last rank."""
    spec = ModelSpec.preset("deepseek-v3")
    cfg = ParallelConfig(dp=64, tp=2, pp=8, ep=64, virtual_pipeline_stages=4,
                         stage_layers=layout_layers("Et|(tt|)*30mL"), zero_stage=1,
                         sequence_parallel=True)
    a = ConfigArrays.from_configs(spec, [cfg])
    assert list(a.stage_layers[0]) == [7, 8, 8, 8, 8, 8, 8, 6]
    mem = memory_table(spec, Cluster(gpu="h100-sxm", num_nodes=128, gpus_per_node=8),
                       Job(global_batch_size=8192, seq_len=4096, framework="megatron"), a)
    dense, moe = mem.kind_layers[:, :, 0]
    assert list(dense) == [1, 2, 0, 0, 0, 0, 0, 0]
    assert list(moe) == [6, 6, 8, 8, 8, 8, 8, 7]


def test_the_search_offers_the_accounted_split(tmp_path) -> None:
    """Llama 3.1 405B on pp 8 x virtual 8: refused before (126 does not divide by 64),
    searched now with Megatron-LM's accounted split, emitted as its pipeline layout, which
    Megatron-Core's parser reads back to the same chunks."""
    from test_emit import megatron_parser

    from planner.emit.megatron import parse_array

    out = tmp_path / "plan.json"
    r = run_planner("plan", "--model", "llama-3-405b", "--gpus", "1024", "--gpu", "h100-sxm",
                    "--global-batch-size", "2048", "--seq-len", "8192", "--frameworks",
                    "megatron", "--pp", "8", "--virtual-stages", "8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "stage_layers=[1, 2x62, 1]" in r.stdout
    got = planner.Plan.from_json(out.read_text())
    assert got.config.stage_layers == accounted_split(126, 8, 8)
    r = run_planner("emit", str(out), "--target", "megatron", "-o", str(tmp_path / "m.sh"))
    assert r.returncode == 0, r.stderr
    ns = megatron_parser().parse_args(parse_array((tmp_path / "m.sh").read_text()))
    assert ns.num_layers_per_virtual_pipeline_stage is None
    assert layout_layers(ns.pipeline_model_parallel_layout) == got.config.stage_layers
    assert ns.pipeline_model_parallel_layout.startswith("E,t*1|t*2")
    assert ns.pipeline_model_parallel_layout.endswith("|t*1,L")
    back = planner.emit.read_back("megatron", (tmp_path / "m.sh").read_text(), got.model)
    assert back.config.virtual_pipeline_stages == 8
    assert back.config.stage_layers == got.config.stage_layers


def test_layouts_round_trip_with_mtp() -> None:
    s = accounted_split(61, 8, 4, mtp=1)
    text = layout(s, mtp=1)
    assert text.endswith("|m,L") and layout_layers(text) == s
    assert layout_layers("Et|(tt|)*30mL") == s


def test_estimate_cli_reads_a_layout_and_defaults_to_the_accounted_split() -> None:
    args = ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "h100-sxm",
            "--global-batch-size", "8192", "--seq-len", "4096", "--framework", "megatron",
            "--tp", "2", "--pp", "8", "--virtual-stages", "4", "--ep", "64", "--zero", "1",
            "--sequence-parallel", "--json"]
    import json

    given = run_planner(*args, "--stage-layers", "Et|(tt|)*30mL")
    assert given.returncode == 0, given.stderr
    default = run_planner(*args)
    assert default.returncode == 0 and "accounted split [1, 2x30, 0]" in default.stderr
    a, b = json.loads(given.stdout), json.loads(default.stdout)
    assert a["config"]["stage_layers"] == b["config"]["stage_layers"] == [1] + [2] * 30 + [0]
    assert a["estimate"]["step_time_s"] == b["estimate"]["step_time_s"]
    bad = run_planner(*args, "--stage-layers", "Ex|tt")
    assert bad.returncode == 2 and "not a pipeline layout" in bad.stderr

"""Golden numbers: published per-GPU memory figures and formulas, each with its source."""

import pytest

from costmodel.fitting.validation import evaluate, memory_cases
from planner import Cluster, Job, ModelSpec, ParallelConfig, estimate

CASES = memory_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_published_memory_figures(case) -> None:
    # Sources and tolerances per case: costmodel/data/memory_golden.toml (ZeRO paper Fig. 1;
    # Korthikanti et al. 2022 Fig. 1 with their Table 3 configurations).
    assert evaluate(case) == pytest.approx(case.published, rel=case.tolerance)


def test_golden_file_covers_the_papers() -> None:
    ids = {c.id for c in CASES}
    assert {"zero-fig1-baseline", "zero-fig1-stage1", "zero-fig1-stage2",
            "zero-fig1-stage3"} <= ids
    for size in ("22b", "175b", "530b", "1t"):
        for q in ("model-states", "activations-tp", "activations-sp-selective"):
            assert f"korthikanti-fig1-{size}-{q}" in ids


# Korthikanti et al. 2022, Table 2: activation bytes per transformer layer per micro-batch.
S, B = 2048, 2


def _per_layer(model: ModelSpec, tp: int, sp: bool, recompute: str) -> float:
    job = Job(global_batch_size=B, seq_len=S, framework="megatron", flash_attention=False)
    cluster = Cluster(gpu="a100-80gb", num_nodes=1, gpus_per_node=tp)
    cfg = ParallelConfig(tp=tp, micro_batch_size=B, sequence_parallel=sp, recompute=recompute)
    stage = estimate(model, cluster, job, cfg).stages[0]
    assert stage.in_flight_micro_batches == 1
    return stage.layer_activations_bytes / model.num_layers


@pytest.mark.parametrize("preset", ["megatron-22b", "megatron-175b"])
def test_korthikanti_table2_formulas(preset: str) -> None:
    m = ModelSpec.preset(preset)
    s, b, h, a, t = S, B, m.hidden_size, m.num_heads, 8
    sbh = s * b * h
    assert _per_layer(m, 1, False, "none") == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    assert _per_layer(m, t, False, "none") == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert _per_layer(m, t, True, "none") == pytest.approx(
        sbh / t * (34 + 5 * a * s / h), rel=1e-12)
    assert _per_layer(m, t, False, "selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert _per_layer(m, t, True, "selective") == pytest.approx(34 * sbh / t, rel=1e-12)
    assert _per_layer(m, 1, False, "full") == pytest.approx(2 * sbh, rel=1e-12)


def test_interleaved_first_stage_multiplier() -> None:
    # Korthikanti et al. 2022, Sec. 4.2.3: the first stage of an interleaved schedule holds
    # L * (1 + (p - 1) / (p v)) layers' activations; plain 1F1B holds L (p micro-batches of
    # L/p layers).
    m = ModelSpec.preset("megatron-175b")
    job = Job(global_batch_size=64, seq_len=2048, framework="megatron", flash_attention=False)
    cluster = Cluster.preset("selene", num_nodes=8)
    per_layer = _per_layer(m, 8, True, "selective") / B  # per sample, mbs = 1 below
    for v in (1, 3):
        cfg = ParallelConfig(tp=8, pp=8, virtual_pipeline_stages=v, sequence_parallel=True,
                             recompute="selective")
        first = estimate(m, cluster, job, cfg).stages[0]
        factor = 1 + (8 - 1) / (8 * v) if v > 1 else 1.0
        assert first.layer_activations_bytes == pytest.approx(96 * factor * per_layer, rel=1e-12)

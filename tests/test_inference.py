"""Inference planning: memory goldens, properties, the search against brute force, plans,
emitters and the CLI (issue 10)."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from inprocess import Result, run_planner

import planner
from costmodel import Cluster, Infeasible, ModelSpec, SpecError
from costmodel.fitting.published_inference import compare_inference, load_inference_runs
from costmodel.serving.inference import (
    WEIGHT_PRECISIONS,
    InferenceConfig,
    InferenceJob,
    estimate_inference,
    kv_cache_bytes_per_token,
    validate_inference,
    weight_bytes,
)
from planner.emit import emit
from planner.emit.serving import read_serving
from planner.inference import explain_inference, search_inference
from planner.space import Constraints

GB = 1e9
L7 = ModelSpec.preset("llama-2-7b")
L13 = ModelSpec.preset("llama-2-13b")
L70 = ModelSpec.preset("llama-2-70b")
NODE = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)


# ---- golden memory figures -----------------------------------------------------------------

def test_llama2_7b_fp16_weights_are_the_published_checkpoint() -> None:
    # meta-llama/Llama-2-7b-hf model.safetensors.index.json: "total_size": 13476839424, which
    # also holds 32 layers x 64 fp32 rotary inv_freq entries (8,192 bytes) that are buffers.
    assert weight_bytes(L7, "fp16") == pytest.approx(13_476_839_424 - 8192, rel=1e-9)


def test_llama2_7b_int8_is_about_6_7_gb() -> None:
    # Issue 10: int8 ~ 6.7 GB (one byte per parameter). The embedding and LM head stay 16-bit
    # and each group of 128 weights keeps an fp16 scale, so a served int8 model is ~6% more:
    # TheBloke/LLaMa-7B-GPTQ branch gptq-8bit-128g-actorder_True, model.safetensors 7.16 GB
    # (LLaMA-1 7B, the same tensor shapes as Llama-2-7B).
    int8 = weight_bytes(L7, "int8")
    assert 6.7 * GB < int8 < 6.7 * GB * 1.07
    assert int8 == pytest.approx(7.16 * GB, rel=0.02)


def test_llama2_7b_int4_matches_published_gptq_checkpoint() -> None:
    # TinyLamda/llama-2-7b-4bit-128g (AutoGPTQ, 4 bits, group 128):
    # gptq_model-4bit-128g.safetensors 3.89 GB; TheBloke/Llama-2-7B-GPTQ main: 3.9 GB.
    assert weight_bytes(L7, "int4") == pytest.approx(3.89 * GB, rel=0.01)


def test_kv_cache_per_token_gqa_vs_mha() -> None:
    # Kwon et al. 2023 (vLLM), Sec. 3: 800 KB per token for OPT-13B (40 layers, hidden 5120,
    # fp16), the shape of Llama-2-13B: 2 x 5120 x 40 x 2 = 819,200 bytes.
    assert kv_cache_bytes_per_token(L13) == 819_200
    # Llama-2-70B config.json: 80 layers, 8 KV heads of 128 -> 2 x 80 x 8 x 128 x 2 bytes; a
    # llama.cpp allocation of 640 MiB for 2,048 tokens of Llama-3-70B (same attention shape)
    # is the same 327,680 bytes per token.
    assert kv_cache_bytes_per_token(L70) == 327_680
    assert kv_cache_bytes_per_token(L70, "fp8") == 163_840
    assert kv_cache_bytes_per_token(L70) < kv_cache_bytes_per_token(L13)


# ---- properties ----------------------------------------------------------------------------

def _est(model: ModelSpec, cfg: InferenceConfig, **job: object) -> planner.Estimate:
    j = InferenceJob(**{"prompt_len": 512, "output_len": 128, **job})  # type: ignore[arg-type]
    return estimate_inference(model, NODE, j, cfg)


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-70b", "llama-3-8b", "mixtral-8x7b",
                                  "gpt3-6.7b"])
def test_more_tp_never_increases_weights_per_gpu(name: str) -> None:
    model = ModelSpec.preset(name)
    last = None
    for tp in (1, 2, 4, 8):
        try:
            w = _est(model, InferenceConfig(tp=tp)).memory.weights_bytes
        except SpecError:
            continue
        assert last is None or w <= last
        last = w


def test_narrower_weights_are_smaller_and_faster() -> None:
    sizes = [weight_bytes(L70, p) for p in ("int4", "int8", "fp16")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    tpot = [_est(L70, InferenceConfig(tp=8, weight_precision=p)).tpot_s
            for p in ("int4", "int8", "bf16")]
    assert tpot == sorted(tpot)


def test_decode_time_rises_with_context() -> None:
    tpots = [_est(L70, InferenceConfig(tp=4, batch_size=8), prompt_len=p).tpot_s
             for p in (128, 1024, 4096, 16384)]
    assert all(a < b for a, b in itertools.pairwise(tpots))


def test_kv_heads_replicate_beyond_their_count() -> None:
    # 8 KV heads: tp=8 holds one per GPU; a 16-GPU-wide tp is refused, and tp must divide
    # or be a multiple of the KV heads (vLLM QKVParallelLinear).
    kv = [_est(L70, InferenceConfig(tp=t, batch_size=4)).memory.kv_cache_bytes
          for t in (2, 4, 8)]
    assert kv[0] == 2 * kv[1] == 4 * kv[2]
    tiny = ModelSpec(num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=2, vocab_size=128)
    one = _est(tiny, InferenceConfig(tp=2)).memory.kv_cache_bytes
    assert _est(tiny, InferenceConfig(tp=8)).memory.kv_cache_bytes == one
    with pytest.raises(SpecError, match="tp=16 exceeds"):
        validate_inference(L70, Cluster(gpu="h100-sxm", num_nodes=2), InferenceJob(
            prompt_len=8, output_len=8), InferenceConfig(tp=16))


def test_max_batch_is_the_last_that_fits() -> None:
    e = _est(L70, InferenceConfig(tp=4), prompt_len=4096, output_len=512)
    b = e.max_batch_size
    assert _est(L70, InferenceConfig(tp=4, batch_size=b), prompt_len=4096, output_len=512).fits
    assert not _est(L70, InferenceConfig(tp=4, batch_size=b + 1), prompt_len=4096,
                    output_len=512).fits


def test_chunked_prefill_bounds_the_activations() -> None:
    whole = _est(L7, InferenceConfig(batch_size=64), prompt_len=2048)
    chunked = _est(L7, InferenceConfig(batch_size=64), prompt_len=2048,
                   prefill_chunk_tokens=4096)
    assert chunked.memory.activations_bytes < whole.memory.activations_bytes / 10
    assert chunked.max_batch_size > whole.max_batch_size
    b = chunked.max_batch_size
    assert _est(L7, InferenceConfig(batch_size=b), prompt_len=2048,
                prefill_chunk_tokens=4096).fits
    assert not _est(L7, InferenceConfig(batch_size=b + 1), prompt_len=2048,
                    prefill_chunk_tokens=4096).fits


def test_pipeline_keeps_latency_and_adds_throughput_with_micro_batches() -> None:
    one = _est(L70, InferenceConfig(tp=4, pp=1, batch_size=16))
    two = _est(L70, InferenceConfig(tp=4, pp=2, batch_size=16))
    assert two.memory.weights_bytes < one.memory.weights_bytes
    assert len(two.stage_memory) == 2
    # Batch 1 cannot be split into micro-batches: a token crosses both stages in turn.
    b1 = _est(L70, InferenceConfig(tp=4, pp=2))
    assert b1.tpot_s > _est(L70, InferenceConfig(tp=4)).tpot_s
    assert two.decode_terms["pp_comm"] > 0 and one.decode_terms["pp_comm"] == 0


def test_terms_add_up() -> None:
    e = _est(L70, InferenceConfig(tp=8, pp=1, batch_size=8))
    assert sum(e.prefill_terms.values()) == pytest.approx(e.ttft_s)
    assert sum(e.decode_terms.values()) == pytest.approx(e.tpot_s)
    assert e.latency_s == pytest.approx(e.ttft_s + 127 * e.tpot_s)
    assert 0 < e.mbu < 1 and 0 < e.prefill_mfu < 1


def test_moe_decode_reads_only_the_routed_experts() -> None:
    mix = ModelSpec.preset("mixtral-8x7b")
    dense_equiv = weight_bytes(mix, "bf16")
    e = _est(mix, InferenceConfig(tp=2))
    # Batch 1 reads 2 of 8 experts per layer: far less than all the weights per token.
    read_bw = e.mbu * e.tpot_s * NODE.gpu.memory_bandwidth_bytes_per_s * 2
    assert read_bw < 0.5 * dense_equiv


# ---- the search ------------------------------------------------------------------------------

def _brute(model: ModelSpec, cluster: Cluster, job: InferenceJob) -> InferenceConfig:
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        for pp in range(1, cluster.num_gpus // tp + 1):
            for p in job.weight_precisions:
                batches = [job.batch_size or 1] if job.objective == "latency" else None
                cfg0 = InferenceConfig(tp=tp, pp=pp, replicas=cluster.num_gpus // (tp * pp),
                                       weight_precision=p)
                try:
                    e0 = estimate_inference(model, cluster, job, cfg0)
                except SpecError:
                    continue
                if batches is None:
                    top = max(1, min(e0.max_batch_size, 4096))
                    batches = sorted({2**k for k in range(top.bit_length())} | {top})
                for b in batches:
                    cfg = InferenceConfig(tp=tp, pp=pp, replicas=cfg0.replicas, batch_size=b,
                                          weight_precision=p)
                    e = estimate_inference(model, cluster, job, cfg)
                    ok = e.fits and (job.max_tpot_s is None or e.tpot_s <= job.max_tpot_s)
                    if not ok:
                        continue
                    key = (e.latency_s, -e.tokens_per_s) if job.objective == "latency" else \
                        (-e.tokens_per_s, e.latency_s)
                    if best is None or key < best[0]:
                        best = (key, cfg)
    assert best is not None
    return best[1]


@pytest.mark.parametrize("objective,bound", [("latency", None), ("throughput", 0.03),
                                             ("throughput", None)])
def test_search_equals_brute_force(objective: str, bound: float | None) -> None:
    cluster = Cluster(gpu="a100-80gb", num_nodes=1, gpus_per_node=4)
    job = InferenceJob(prompt_len=1024, output_len=256, objective=objective, max_tpot_s=bound,
                       weight_precision=("bf16", "int8", "int4"))
    p = planner.plan(L13, cluster, job)
    assert p.config == _brute(L13, cluster, job)
    assert p.estimate == estimate_inference(L13, cluster, job, p.config)


def test_search_table_equals_scalar_estimates() -> None:
    job = InferenceJob(prompt_len=256, output_len=64, objective="throughput")
    res = search_inference(L7, NODE, job)
    assert res.table is not None
    for i in range(0, len(res.configs), max(1, len(res.configs) // 25)):
        e = estimate_inference(L7, NODE, job, res.configs[i])
        assert e.tokens_per_s == pytest.approx(float(res.table.tokens_per_s[i]), rel=1e-12)
        assert e.peak_memory_bytes == pytest.approx(float(res.table.peak[i]), rel=1e-12)


def test_plan_round_trips_and_explains() -> None:
    job = InferenceJob(prompt_len=2048, output_len=256, objective="throughput",
                       max_tpot_s=0.05, weight_precision=("bf16", "fp8"), kv_cache_precision="fp8")
    p = planner.plan(L70, NODE, job)
    assert p.is_inference and p.config.weight_precision == "fp8"
    assert p.estimate.tpot_s <= 0.05
    q = planner.Plan.from_json(p.to_json())
    assert (q.config, q.job, q.estimate) == (p.config, p.job, p.estimate)
    assert [a.to_dict() for a in q.alternatives] == [a.to_dict() for a in p.alternatives]
    assert "why not" in p.summary() and p.config.describe() in p.summary()
    why = planner.explain(p)
    by = {c.field: c for c in why.choices}
    assert by["weight_precision"].options[0].value == "bf16"
    assert all(o.verdict in ("slower", "misses the bound", "does not fit")
               for c in why.choices for o in c.options)
    assert json.loads(json.dumps(explain_inference(p).to_dict()))["framework"] == "inference"
    with pytest.raises(SpecError, match="serving plan"):
        planner.check(p)


def test_infeasible_says_what_would_fit() -> None:
    job = InferenceJob(prompt_len=2048, output_len=256)
    with pytest.raises(Infeasible, match=r"least memory .* GiB per GPU.*or 2 nodes of 8 GPUs "
                       r"\(16 GPUs\).*narrower"):
        planner.plan(ModelSpec.preset("llama-3-405b"), Cluster(gpu="a100-80gb"), job)
    with pytest.raises(Infeasible, match=r"over the bound 1\.00 ms"):
        planner.plan(L7, NODE, InferenceJob(prompt_len=64, output_len=64, max_tpot_s=1e-3))


def test_constraints_are_checked_per_kind() -> None:
    job = InferenceJob(prompt_len=64, output_len=64)
    p = planner.plan(L70, NODE, job, constraints={"fixed": {"tp": 4, "replicas": 1}})
    assert (p.config.tp, p.config.replicas) == (4, 1)
    with pytest.raises(SpecError, match="zero_stage apply to training"):
        planner.plan(L70, NODE, job, constraints={"fixed": {"zero_stage": 3}})
    with pytest.raises(SpecError, match="apply to serving"):
        planner.plan(L70, NODE, planner.Job(global_batch_size=8, seq_len=128),
                     constraints=Constraints(fixed={"replicas": 2}))
    with pytest.raises(SpecError, match="training preset"):
        planner.plan(L70, NODE, job, constraints="fsdp")


@pytest.mark.parametrize("bad,match", [
    ({"prompt_len": 0, "output_len": 8}, "prompt_len must be a positive integer"),
    ({"prompt_len": 8, "output_len": 8, "weight_precision": "int3"}, "int3"),
    ({"prompt_len": 8, "output_len": 8, "weight_precision": ()}, "empty"),
    ({"prompt_len": 8, "output_len": 8, "kv_cache_precision": "int4"}, "kv_cache_precision"),
    ({"prompt_len": 8, "output_len": 8, "objective": "fast"}, "objective"),
    ({"prompt_len": 8, "output_len": 8, "max_tpot_s": -1}, "max_tpot_s"),
])
def test_bad_jobs_are_named(bad: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        InferenceJob(**bad)  # type: ignore[arg-type]


def test_encoders_are_refused() -> None:
    with pytest.raises(SpecError, match="decoder-only"):
        planner.plan(ModelSpec.preset("bert-large"), NODE,
                     InferenceJob(prompt_len=8, output_len=8))


# ---- emit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,kv", [
    (InferenceConfig(tp=8), "bf16"),
    (InferenceConfig(tp=2, pp=2, replicas=2, batch_size=32, weight_precision="int4"), "fp8"),
    (InferenceConfig(tp=1, replicas=8, batch_size=4, weight_precision="fp8"), "bf16"),
])
@pytest.mark.parametrize("target", ["vllm", "tensorrt-llm"])
def test_serving_emit_round_trips(cfg: InferenceConfig, kv: str, target: str) -> None:
    model = L13 if cfg.tp == 1 else L70
    job = InferenceJob(prompt_len=1000, output_len=200, kv_cache_precision=kv,
                       weight_precision=cfg.weight_precision)
    est = estimate_inference(model, NODE, job, cfg)
    p = planner.Plan(model=model, cluster=NODE, job=job, config=cfg, estimate=est)
    out = emit(p, target, command="planner emit serve.json")
    back = read_serving(target, out.text)
    assert (back["tp"], back["pp"], back["batch_size"]) == (cfg.tp, cfg.pp, cfg.batch_size)
    assert back.get("max_model_len", back.get("max_seq_len")) == 1200
    quant = {"vllm": {"bf16": None, "int4": "awq", "fp8": "fp8"},
             "tensorrt-llm": {"bf16": None, "int4": "int4_awq", "fp8": "fp8"}}[target]
    assert back["quantization"] == quant[cfg.weight_precision]
    assert f"{1e3 * est.tpot_s:.2f} ms per output token" in out.text
    assert "command: planner emit serve.json" in out.text
    if target == "vllm":
        assert back["kv_cache_dtype"] == ("fp8" if kv == "fp8" else None)
        assert "for slot in $(seq 0" in out.text
    else:
        assert f"tensor_para_size={cfg.tp} pipeline_para_size={cfg.pp}" in out.text
        assert back["replica_ranks"] == cfg.tp * cfg.pp
    with pytest.raises(SpecError, match="serving plan"):
        emit(p, "torchtitan")


def test_training_plan_is_not_emitted_for_a_serving_engine() -> None:
    p = planner.plan(ModelSpec.preset("gpt3-125m"), Cluster(gpu="h100-sxm", gpus_per_node=2),
                     planner.Job(global_batch_size=8, seq_len=256))
    with pytest.raises(SpecError, match="training plan"):
        emit(p, "vllm")


def test_bash_syntax_of_emitted_scripts(tmp_path: Path) -> None:
    job = InferenceJob(prompt_len=100, output_len=100)
    for cfg, cluster in ((InferenceConfig(tp=2, replicas=4), NODE),
                         (InferenceConfig(tp=8, pp=2),
                          Cluster(gpu="h100-sxm", num_nodes=2))):
        est = estimate_inference(L70, cluster, job, cfg)
        p = planner.Plan(model=L70, cluster=cluster, job=job, config=cfg, estimate=est)
        for target in ("vllm", "tensorrt-llm"):
            f = tmp_path / f"{target}.sh"
            f.write_text(emit(p, target).text)
            assert subprocess.run(["bash", "-n", str(f)]).returncode == 0


# ---- CLI -------------------------------------------------------------------------------------

def _cli(*args: str) -> Result:
    return run_planner(*args)


def test_cli_plan_emit_and_errors(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    r = _cli("plan", "--inference", "--model", "llama-2-70b", "--gpus", "8", "--gpu",
             "h100-sxm", "--prompt-len", "2048", "--output-len", "256", "--objective",
             "throughput", "--max-tpot-ms", "40", "--weight-precision", "bf16,int8",
             "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "why not" in r.stdout and "tokens/s" in r.stdout
    r = _cli("emit", str(out), "--target", "vllm")
    assert r.returncode == 0 and "vllm serve" in r.stdout
    r = _cli("explain", str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["choices"]
    r = _cli("estimate", "--inference", "--model", "llama-2-7b", "--gpus", "1", "--prompt-len",
             "128", "--output-len", "128", "--json")
    assert r.returncode == 0
    est = json.loads(r.stdout)["estimate"]
    assert {"ttft_s", "tpot_s", "tokens_per_s", "peak_memory_bytes"} <= set(est)
    for args, code, text in (
            (("--prompt-len", "128"), 2, "--output-len"),
            (("--prompt-len", "128", "--output-len", "8", "--zero", "3"), 2, "zero_stage"),
            (("--prompt-len", "128", "--output-len", "8", "--weight-precision", "int2"), 2,
             "int2"),
            (("--prompt-len", "128", "--output-len", "8", "--max-tpot-ms", "0.01"), 3,
             "latency bounds")):
        r = _cli("plan", "--inference", "--model", "llama-2-7b", "--gpus", "8", *args)
        assert r.returncode == code and text in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", str(out), "--dry-run")
    assert r.returncode == 2 and "serving plan" in r.stderr


# ---- published runs --------------------------------------------------------------------------

def test_published_serving_runs() -> None:
    """Issue 10's target: at least three published configurations predicted within 15 %; all
    runs listed by benchmarks/inference_accuracy.py, whose sources are in the data file."""
    comps = compare_inference(load_inference_runs())
    errs = np.abs([c.error for c in comps])
    assert len(comps) >= 20
    assert (errs <= 0.15).sum() >= 3
    assert float(np.median(errs)) < 0.15
    for c in comps:
        assert c.run.source and c.run.quote
        assert abs(c.error) <= 0.15 or c.run.note


def test_every_weight_precision_runs() -> None:
    for p in WEIGHT_PRECISIONS:
        e = _est(L7, InferenceConfig(weight_precision=p))
        assert e.fits and e.tokens_per_s > 0

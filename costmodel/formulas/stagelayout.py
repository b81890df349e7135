"""What each pipeline stage of a table of configurations holds: the layers of each kind
(``stage_layout``) and the micro-batches whose activations it keeps at its peak under its
schedule (``stage_in_flight``). Arrays are stage-major ``[P, rows]``, as in
``costmodel.formulas.memory``, which sizes each stage's memory from them.
"""

from __future__ import annotations

import numpy as np

from costmodel.config import V_SCHEDULES
from costmodel.formulas.arrays import (
    SCHEDULE_CODES,
    ChunkPatterns,
    ConfigArrays,
    Stages,
    distinct_rows,
    is_v,
)
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.vschedules import in_flight as v_in_flight


def stage_in_flight(a: ConfigArrays, stage: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, ...]:
    """Micro-batches whose activations a stage holds at its peak, per schedule.

    Returns (layers factor ``[P, rows]``, embedding count, head count), the two counts
    ``[rows]``, those of the first and the last stage. The layers factor is in units of "all of
    this stage's layers for one micro-batch".

    1F1B (Narayanan et al. 2021, Sec. 2.2; DAPPLE): stage i holds min(p - i, m); Megatron-LM's
    combined 1F1B one chunk-micro-batch more than interleaving (one more warm-up forward;
    without a pipeline, two micro-batches). The V
    schedules' counts are played from their op orders (``vschedules.in_flight``): ZB-V holds
    1F1B's p on every rank (Qi et al. 2024, Sec. 6), DualPipeV p + 1/2 (2p + 1 chunks:
    DeepSeek-V3 report Table 2, "PP + 1"). Zero bubble
    ZB-H1 keeps the 1F1B peak (Qi et al. 2024, Sec. 3). GPipe holds all m. Interleaved 1F1B
    (``costmodel.formulas.pipeline.rank_orders``: micro-batches in rounds of k = m // max(1, m // p)
    per chunk, k = p in Megatron-LM): stage i runs (v - 1)k + 2(p - i - 1) warm-up forwards of
    chunks of L/(pv) layers, so it holds min(that + 1, m v) chunk-micro-batches; with k = p on
    the first stage this is L(1 + (p - 1)/(pv)) layers' worth (Korthikanti et al. 2022,
    Sec. 4.2.3).
    """
    p, v, sched = a.pp, a.v, a.schedule
    k = m // np.maximum(1, m // p)  # micro-batches per round of interleaving

    def warm(i: np.ndarray | int) -> np.ndarray:
        """Chunk-micro-batches stage ``i`` holds under interleaving:
        min((v - 1)k + 2(p - i - 1) + 1, m v)."""
        return np.minimum((v - 1) * k + 2 * (p - i - 1) + 1, m * v)

    def chunk_count(w: np.ndarray, chunk: np.ndarray | int) -> np.ndarray:
        # Forwards run in rounds of k micro-batches per chunk, chunks 0..v-1 in turn.
        full, rest = np.divmod(w, v * k)
        return np.minimum(k * full + np.clip(rest - chunk * k, 0, k), m)

    # Combined 1F1B runs one warm-up forward more, and each pair holds its forward's
    # activations before its backward frees the other's (``pipeline._combined_order``).
    comb = sched == SCHEDULE_CODES["combined-1f1b"]

    def held(i: np.ndarray | int) -> np.ndarray:
        return np.where(comb, np.minimum(warm(i) + 1, m * v), warm(i))

    layers = np.where((sched == 1) | comb, held(stage) / v,
                      np.where(sched == 2, m, np.minimum(p - stage, m))).astype(float)
    # The embedding sits on the first stage in chunk 0, the head on the last in chunk v - 1;
    # without interleaving they are held like the layers of their stage.
    emb = np.where((sched == 1) | comb, chunk_count(held(0), 0),
                   np.where(sched == 2, m, np.minimum(p, m))).astype(float)
    head = np.where((sched == 1) | comb, chunk_count(held(p - 1), v - 1),
                    np.where(sched == 2, m, 1)).astype(float)
    vshaped = is_v(sched)
    if vshaped.any():  # played from the V schedules' op orders (vschedules.in_flight)
        _v_in_flight(layers, emb, head, vshaped, p, m, sched, stage)
    return layers, emb, head


_V_NAMES = {SCHEDULE_CODES[s]: s for s in V_SCHEDULES}


def _v_in_flight(layers: np.ndarray, emb: np.ndarray, head: np.ndarray, vshaped: np.ndarray,
                 p: np.ndarray, m: np.ndarray, sched: np.ndarray, stage: np.ndarray) -> None:
    """``stage_in_flight`` of the V-shaped rows, written into its arrays (the embedding and the
    head both on rank 0)."""
    rows = np.flatnonzero(vshaped)
    groups = distinct_rows(p[rows], m[rows], sched[rows])
    for g, i in enumerate(groups.first.tolist()):
        sel = rows[groups.inverse == g]
        pp, mm, code = int(p[rows[i]]), int(m[rows[i]]), int(sched[rows[i]])
        per_rank, e, h = v_in_flight(pp, mm, _V_NAMES[code])
        table = np.array(per_rank)
        layers[:, sel] = table[np.clip(stage[:, sel], 0, len(table) - 1)]
        emb[sel], head[sel] = e, h


def stage_layout(costs: LayerCosts, a: ConfigArrays, st: Stages) -> np.ndarray:
    """Layers of each kind (``LayerCosts.layer_kinds``) per pipeline rank,
    ``[kinds, P, rows]``.

    Rank i holds chunks i, i + p, ..., i + (v - 1)p of L/(pv) layers when interleaved, else a
    contiguous run of ``stage_layers`` from ``stage_start``. A preset's multi-token
    prediction modules (``ModelSpec.mtp_layers``) are layers of its last layer's kind more on
    the last rank, beside the output layer they share (Megatron-Core builds them into the
    last pipeline stage's post-processing).
    """
    out = _stage_kinds(costs, a, st)
    spec = costs.spec
    if spec is not None and spec.mtp_layers:
        out = out.copy()
        kind = spec.layer_kinds[-1]
        out[kind] = out[kind] + np.where((st.index == a.head_rank) & (st.count > 0),
                                         spec.mtp_layers, 0)
    return out


def _stage_kinds(costs: LayerCosts, a: ConfigArrays, st: Stages) -> np.ndarray:
    """``stage_layout`` of the pipeline's layers alone."""
    layers = st.layers
    if costs.kinds == 1:
        return layers[None]
    prefix = costs.kind_prefix  # [kinds, L + 1]
    L = costs.num_layers

    def between(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return prefix[:, np.clip(j, 0, L)] - prefix[:, np.clip(i, 0, L)]

    contig = between(st.start, st.start + layers)
    if not np.any(a.v > 1):
        return contig
    p, v = a.pp, a.v
    pat = a.chunks
    even = (v > 1) if pat is None else (v > 1) & (pat.of < 0)  # interleaved, even chunks
    chunk = np.where(v > 1, L // (p * v), 0)
    il = np.zeros_like(contig)
    for k in range(int(v[even].max()) if even.any() else 0):
        g = k * p + st.index
        il = il + np.where(k < v, between(g * chunk, (g + 1) * chunk), 0)
    out = np.where(v > 1, il, contig)
    if pat is not None:  # explicit chunks: each pattern's ranks, gathered by row
        table = _pattern_kinds(prefix, pat)
        got = table[np.maximum(pat.of, 0)[None, :], np.clip(st.index, 0, table.shape[1] - 1)]
        out = np.where((pat.of >= 0)[None, None, :], np.moveaxis(got, -1, 0), out)
    return out


def _pattern_kinds(prefix: np.ndarray, pat: ChunkPatterns) -> np.ndarray:
    """Layers of each kind each rank holds under each chunk pattern, ``[patterns, ranks,
    kinds]`` (``prefix``: ``LayerCosts.kind_prefix``)."""
    table = np.zeros((len(pat.pp), int(pat.pp.max()), prefix.shape[0]), dtype=prefix.dtype)
    for u in range(len(pat.pp)):
        p, n = int(pat.pp[u]), int(pat.count[u])
        chunks = pat.layers[u, :n]
        ends = np.cumsum(chunks)
        per_chunk = prefix[:, ends] - prefix[:, ends - chunks]  # [kinds, chunks]
        table[u, :p] = per_chunk[:, pat.rank_chunks(u)].sum(axis=2).T
    return table

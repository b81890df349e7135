"""The fast space gives what the straightforward one gave: divisors by factorization against
the definition, the enumerated spaces, their expanded rows and cost-model columns against
the earlier per-table masks, and the search's grouping helpers against ``np.unique``.
Behaviour only; ``benchmarks/search_speed.py`` times them."""

from __future__ import annotations

import itertools
from dataclasses import fields

import numpy as np
import pytest

from costmodel import GPU, Cluster, Job, ModelSpec
from costmodel.formulas.arrays import (
    ChunkPatterns,
    ConfigArrays,
    accounted_columns,
    divisors,
    input_split,
    is_v,
)
from planner import search as search_mod
from planner import space as space_mod
from planner.space import COLUMNS, CORE, RECOMPUTATION, SHARDING, Constraints, Space, arrays

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")
TINY = ModelSpec(name="tiny", num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=4,
                 ffn_hidden_size=1536, vocab_size=8000, gated_mlp=True)
# A MoE whose first 3 of 8 layers are dense: stage classes are not exact, so the space's
# columns take every stage (``ConfigArrays.every_stage``), and expert parallel is searched.
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden_size=512, num_heads=8,
                     num_kv_heads=4, ffn_hidden_size=1536, moe_ffn_hidden_size=512,
                     num_experts=8, top_k=2, first_dense_layers=3, vocab_size=8000,
                     gated_mlp=True)
PROBLEMS = [
    (TINY, Cluster(gpu=GPU.preset("a100-80gb"), num_nodes=2, gpus_per_node=4), 8, 1024),
    (TINY_MOE, Cluster(gpu=GPU.preset("h100-sxm"), num_nodes=4, gpus_per_node=4), 48, 2048),
    (ModelSpec.preset("llama-3-8b"),
     Cluster(gpu=GPU.preset("h100-sxm"), num_nodes=6, gpus_per_node=8), 96, 4096),
]


def divisors_by_definition(n: int) -> list[int]:
    """Every d in 1..n dividing n (the earlier implementation)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def fill_by_masks(out: np.ndarray, which: np.ndarray, tables: tuple[np.ndarray, ...],
                  pick: np.ndarray, names: tuple[str, ...]) -> None:
    """The earlier ``space._fill``: one boolean mask over every row per table."""
    for k in np.unique(which):
        sel = which == k
        rows = tables[k][pick[sel]]
        for i, name in enumerate(names):
            out[sel, COLUMNS.index(name)] = rows[:, i]


def expand_by_masks(space: Space, core: np.ndarray, rec: np.ndarray | None) -> np.ndarray:
    """The earlier ``Space.expand`` (and ``core_rows``) over ``fill_by_masks``."""
    nz = np.array([len(t) for t in space.shardings], dtype=np.int64)[space.shard_of][core]
    pair = np.repeat(np.arange(len(core)), nz)
    within = space_mod.positions(nz)
    base = np.zeros((len(core), len(COLUMNS)), dtype=np.int64)
    c = space.cores[core]
    for i, name in enumerate(CORE):
        base[:, COLUMNS.index(name)] = c[:, i]
    base[:, COLUMNS.index("group")] = c[:, CORE.index("dp")]
    if rec is not None:
        fill_by_masks(base, space.recompute_of[core], space.recomputes, rec, RECOMPUTATION)
    out = base[pair]
    fill_by_masks(out, space.shard_of[core[pair]], space.shardings, within, SHARDING)
    return out


def arrays_by_rows(model: ModelSpec, table: np.ndarray) -> ConfigArrays:
    """The earlier ``space.arrays``: column views of ``table``, stage columns row by row."""
    c = {name: table[:, i] for i, name in enumerate(COLUMNS)}
    L, need = model.num_layers, model.first_stage_layers
    heavy = {int(p): s for p in np.unique(c["pp"])
             if (s := input_split(L, int(p), need))} if need else {}
    # V-shaped rows (zbv, dualpipev) take a column per stage and their V split's chunks.
    vee = is_v(c["schedule"])
    exact = not heavy and ConfigArrays.classes_exact(model, c["pp"], c["v"]) and not vee.any()
    index, count, layers, start = (ConfigArrays.uniform_stages if exact else
                                   ConfigArrays.every_stage)(L, c["pp"])
    chunks = accounted_columns(L, model.mtp_layers, c["pp"], c["v"], index, layers, start,
                               c["schedule"])
    shard = np.where(c["zero"] > 0, c["group"] * c["cp"], 1)
    return ConfigArrays(
        dp=c["dp"], tp=c["tp"], pp=c["pp"], cp=c["cp"], ep=c["ep"], etp=c["etp"],
        zero=c["zero"], shard=shard, sp=c["sp"], mbs=c["mbs"], schedule=c["schedule"], v=c["v"],
        recompute=c["recompute"], recompute_layers=c["recompute_layers"],
        offload=c["offload"], stage_layers=layers, stage_index=index, stage_count=count,
        stage_start=start, chunks=chunks)


def firsts_by_unique(group: np.ndarray, rows: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """The earlier ``search._firsts``: groups numbered by ``np.unique``, minima by
    ``np.minimum.at``."""
    _, inv = np.unique(group, return_inverse=True)
    cand = np.arange(len(group))
    for k in keys:
        kc = np.asarray(k, dtype=float)[cand]
        low = np.full(int(inv.max()) + 1, np.inf)
        np.minimum.at(low, inv[cand], kc)
        cand = cand[kc == low[inv[cand]]]
    o = cand[np.lexsort((*rows[cand].T[::-1], inv[cand]))]
    return o[np.r_[True, inv[o][1:] != inv[o][:-1]]]


def test_divisors_are_the_divisors() -> None:
    """Sorted, exact, Python ints in a new list: 1..5000, powers of two, primes, squares."""
    for n in range(1, 5001):
        assert divisors(n) == divisors_by_definition(n), n
    for n in (2**20, 131072, 3 * 2**17, 2**17 - 1, 65537, 999983, 1000003, 997**2,
              2 * 3 * 5 * 7 * 11 * 13 * 17, 16384 * 8 * 3):
        assert divisors(n) == divisors_by_definition(n), n
    assert divisors(0) == [] and divisors(-6) == []
    got = divisors(np.int64(12))  # type: ignore[arg-type]
    assert got == [1, 2, 3, 4, 6, 12] and all(type(d) is int for d in got)
    got.append(99)  # the caller's list: the cache is untouched
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(TypeError):
        divisors(12.0)  # type: ignore[arg-type]


#: The problems each equivalence test runs: the fast loop leaves out the largest (CI runs it).
CASES = [0, 1, pytest.param(2, marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", CASES)
def test_space_is_the_one_enumerated_by_definition(case: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trainer's space (cores, option tables, rejections) is the one the divisors by
    definition give; its rows and cost-model columns are those of the per-table masks."""
    model, cluster, batch, seq = PROBLEMS[case]
    cons = Constraints(frameworks=FRAMEWORKS)
    job = Job(global_batch_size=batch, seq_len=seq)
    fast = space_mod.spaces(model, cluster, job, cons)
    monkeypatch.setattr(space_mod, "divisors", divisors_by_definition)
    slow = space_mod.spaces(model, cluster, job, cons)
    for (_, a), (_, b) in zip(fast, slow, strict=True):
        assert a.framework == b.framework and a.rejected == b.rejected
        for name in ("cores", "shard_of", "recompute_of"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        for ta, tb in itertools.chain(zip(a.shardings, b.shardings, strict=True),
                                      zip(a.recomputes, b.recomputes, strict=True)):
            assert ta.dtype == tb.dtype and np.array_equal(ta, tb)
        assert len(a.cores) and a.rows > 0
        _same_rows(model, a)


def _same_rows(model: ModelSpec, space: Space) -> None:
    """``expand``, ``core_rows``, ``table`` and ``arrays`` against the earlier code."""
    n = len(space.cores)
    nz = np.array([len(t) for t in space.shardings], dtype=np.int64)[space.shard_of]
    nr = np.array([len(t) for t in space.recomputes], dtype=np.int64)[space.recompute_of]
    assert np.array_equal(space.sizes[0], nz) and np.array_equal(space.sizes[1], nr)
    rng = np.random.default_rng(0)
    perm = rng.permutation(int(nr.sum()))  # every (core, recompute) pair, shuffled
    core, rec = np.repeat(np.arange(n), nr)[perm], space_mod.positions(nr)[perm]
    for c, r in ((core, rec), (core, None), (np.arange(n), None)):
        want = expand_by_masks(space, c, r)
        assert np.array_equal(space.expand(c, r), want)
    table = space.table
    want = expand_by_masks(space, np.repeat(np.arange(n), nr), space_mod.positions(nr))
    assert np.array_equal(table, want) and len(table) == space.rows
    assert len({tuple(r) for r in table}) == len(table)
    got, ref = arrays(model, table), arrays_by_rows(model, table)
    for f in fields(ConfigArrays):
        x, y = getattr(got, f.name), getattr(ref, f.name)
        assert (x is None) == (y is None), f.name
        if isinstance(x, ChunkPatterns):
            for g in fields(ChunkPatterns):
                assert np.array_equal(getattr(x, g.name), getattr(y, g.name)), g.name
        elif x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
            assert x.flags.c_contiguous, f.name


def test_stage_columns_cover_every_stage_and_none() -> None:
    """The per-degree stage columns equal ``uniform_stages`` / ``every_stage`` row by row,
    an empty table included."""
    pp = np.array([1, 2, 3, 4, 5, 7, 8, 1, 16, 6, 2], dtype=np.int64)
    for uniform in (True, False):
        columns = ConfigArrays.uniform_stages if uniform else ConfigArrays.every_stage
        for p in (pp, pp[:0]):
            got, want = space_mod._stage_columns(16, p, uniform), columns(16, p)
            for x, y in zip(got, want, strict=True):
                assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)


def test_grouping_helpers_match_unique() -> None:
    """Mesh numbers are ``np.unique``'s of the mesh keys; the first row of each group in the
    order of its keys (ties, infinities and NaN included) is the earlier ``_firsts``'."""
    rng = np.random.default_rng(1)
    for n, spread in ((1, 2), (7, 2), (500, 3), (20000, 4), (3000, 12)):
        rows = np.zeros((n, len(COLUMNS)), dtype=np.int64)
        for c in search_mod._MESH_COLS:
            rows[:, c] = 2 ** rng.integers(0, spread, n)
        rows[:, COLUMNS.index("mbs")] = rng.integers(1, 4, n)
        ids, count = search_mod._mesh_ids(rows)
        _, inv = np.unique(search_mod._mesh_key(rows), return_inverse=True)
        assert count == inv.max() + 1 and np.array_equal(ids, inv.ravel())
        peak = rng.integers(0, 5, n).astype(float)
        peak[rng.random(n) < 0.05] = np.inf
        flag = rng.random(n) < 0.5
        for k in ((peak,), (flag, peak), ()):
            want = firsts_by_unique(search_mod._mesh_key(rows), rows, *k)
            assert np.array_equal(search_mod._firsts(search_mod._mesh_key(rows), rows, *k),
                                  want)
            assert np.array_equal(search_mod._group_firsts(ids, count, rows, k), want)
            sub = rng.permutation(n)[: max(1, n // 2)]
            want = sub[firsts_by_unique(search_mod._mesh_key(rows[sub]), rows[sub],
                                        *(x[sub] for x in k))]
            got = sub[search_mod._group_firsts(ids[sub], count, rows,
                                               tuple(x[sub] for x in k), sub)]
            assert np.array_equal(got, want)
        peak[rng.random(n) < 0.01] = np.nan
        low = np.full(count, np.inf)
        with np.errstate(invalid="ignore"):
            np.minimum.at(low, ids, peak)
            assert np.array_equal(search_mod._group_min(ids, count, peak), low, equal_nan=True)
    assert search_mod._mesh_ids(np.zeros((0, len(COLUMNS)), dtype=np.int64))[1] == 0


def _mesh_nearest_by_unique(self: search_mod._State, fw: str, rows: np.ndarray,
                            missed: np.ndarray, peak: np.ndarray,
                            found: search_mod.Callable[[int], search_mod.Found]) -> None:
    """The earlier ``_State._mesh_nearest``."""
    if not len(missed):
        return
    key = search_mod._mesh_key(rows[missed])
    for i in missed[firsts_by_unique(key, rows[missed], peak[missed])]:
        out = self.mesh(fw, rows[i])
        cur = out.nearest
        if cur is None or (float(peak[i]), *rows[i]) < (cur.peak_memory, *cur.row):
            out.nearest = found(i)


@pytest.mark.parametrize("case", CASES[1:])
def test_search_result_is_the_earlier_one(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search over all three trainers returns the same plans, per-mesh outcomes (in the
    same order), counts and least-memory row as with the earlier columns and grouping."""
    model, cluster, batch, seq = PROBLEMS[case]
    job = Job(global_batch_size=batch, seq_len=seq)
    cons = Constraints(frameworks=FRAMEWORKS)
    got = search_mod.search(model, cluster, job, cons, top_k=5, by=("pp", "zero"))
    monkeypatch.setattr(search_mod, "arrays", arrays_by_rows)
    monkeypatch.setattr(search_mod._State, "_mesh_nearest", _mesh_nearest_by_unique)
    want = search_mod.search(model, cluster, job, cons, top_k=5, by=("pp", "zero"))
    assert got.top and got.counts == want.counts
    # (repr: a row that did not fit has NaN terms, and NaN != NaN)
    for name in ("top", "meshes", "least_memory", "best_by", "least_by"):
        a, b = getattr(got, name), getattr(want, name)
        assert repr(list(a.items()) if isinstance(a, dict) else a) == \
            repr(list(b.items()) if isinstance(b, dict) else b), name

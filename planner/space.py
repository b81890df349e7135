"""The search space: every valid way to split one training job, as columns.

A configuration is a ``costmodel.ParallelConfig``: degrees ``dp * tp * pp * cp`` = GPUs
(``ep`` carved out of ``dp * cp``), ZeRO stage and its sharding group (HSDP), sequence
parallel, micro-batch size, pipeline schedule with its virtual stages, recompute (none,
selective, full, or full on the first N layers of each chunk) and offload.

Validity is data: ``RULES`` maps each rule's name to the sentence a user reads when it rejects
a value. Enumeration applies each rule where its fields are known and counts what it rejected,
so a plan can say why a degree never appeared. Each configuration appears once, in canonical
form: without pipeline parallel the schedule is ``1f1b`` with one virtual stage; a sharding
group equal to ``dp`` is ``None``; ``recompute_num_layers`` is ``None`` when it would cover
every layer of a chunk.

Users narrow the space with ``Constraints``: fix a field, allow a set of values, cap a degree,
pick the trainers, or start from a preset (``PRESETS``), which is nothing but a Constraints.
"""

from __future__ import annotations

import functools
import itertools
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from costmodel.config import FRAMEWORK_NAMES, V_SCHEDULES, Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.arrays import (
    accounted_columns,
    divisors,
    input_split,
    interleaved_split,
    is_v,
)
from costmodel.formulas.checks import job_problem
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import OFFLOAD_CODES, RECOMPUTE_CODES, SCHEDULE_CODES, ConfigArrays
from costmodel.formulas.vschedules import v_split
from costmodel.frameworks import framework, schedule_problem
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from planner.space_rules import (
    RULES,
    Filter,
    Rejections,
    combined_runs,
    expert_meshes,
    recompute_options,
    schedule_options,
    sharding_options,
    tp_rules,
)

__all__ = ["FIELDS", "INFERENCE_FIELDS", "PRESETS", "RULES", "Constraints", "Space", "build_space",
           "divisors"]

#: ParallelConfig fields a constraint may name.
FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "zero_stage", "sharding_group", "sequence_parallel",
          "micro_batch_size", "pipeline_schedule", "virtual_pipeline_stages", "recompute",
          "recompute_num_layers", "offload")
#: Fields of an inference search (``costmodel.serving.inference.InferenceConfig``).
INFERENCE_FIELDS = ("tp", "pp", "replicas", "batch_size", "weight_precision")
#: Fields a ``max`` constraint may cap.
CAPPABLE = ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages",
            "sharding_group", "recompute_num_layers", "replicas", "batch_size")



#: Fields whose values are whole numbers (``None`` allowed: the trainer's own), booleans,
#: or names; every other field is a whole number.
_OPTIONAL_INTS = ("sharding_group", "recompute_num_layers")
_BOOLS = ("sequence_parallel",)
_NAMES = ("pipeline_schedule", "recompute", "offload", "weight_precision")


def _field_value(what: str, key: str, value: Any) -> Any:
    """``value`` of configuration field ``key`` as a constraint holds it (a numpy integer as
    an ``int``), or a ``SpecError`` naming ``what`` when it is of the wrong kind (``"2"``
    for a degree would match no configuration, not fail)."""
    if key in _BOOLS:
        if not isinstance(value, bool | np.bool_):
            raise SpecError(f"{what} must be true or false, got {value!r}")
        return bool(value)
    if key in _NAMES:
        if not isinstance(value, str) and not (key == "pipeline_schedule" and value is None):
            raise SpecError(f"{what} must be a name (a string), got {value!r}")
        return value
    if value is None and key in _OPTIONAL_INTS:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SpecError(f"{what} must be a whole number, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Constraints:
    """What the user fixes: ``fixed`` field -> value, ``allowed`` field -> values, ``max``
    field -> cap (degrees, micro-batch, virtual stages), ``frameworks`` the trainers to search
    (default: the job's). Fields are ``ParallelConfig`` names (``FIELDS``), or for a serving
    search ``InferenceConfig`` names (``INFERENCE_FIELDS``); each search refuses the other's.
    """

    fixed: Mapping[str, Any] = field(default_factory=dict)
    allowed: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    max: Mapping[str, int] = field(default_factory=dict)
    frameworks: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for kind, keys in (("fixed", self.fixed), ("allowed", self.allowed)):
            for k in keys:
                if k not in FIELDS and k not in INFERENCE_FIELDS:
                    raise SpecError(f"constraint {kind}[{k!r}]: unknown field; use one of "
                                    f"{', '.join(FIELDS)} (training) or "
                                    f"{', '.join(INFERENCE_FIELDS)} (inference)")
        object.__setattr__(self, "fixed", {k: _field_value(f"constraint fixed[{k!r}]", k, v)
                                           for k, v in self.fixed.items()})
        for k, v in self.max.items():
            if k not in CAPPABLE:
                raise SpecError(f"constraint max[{k!r}]: only {', '.join(CAPPABLE)} can be "
                                "capped")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"constraint max[{k!r}] must be a positive integer, got {v!r}")
        for k, vals in self.allowed.items():
            if isinstance(vals, str) or not isinstance(vals, Iterable):
                raise SpecError(f"constraint allowed[{k!r}] must be a list of values, got "
                                f"{vals!r}")
        object.__setattr__(self, "allowed", {
            k: [_field_value(f"constraint allowed[{k!r}]", k, v) for v in vals]
            for k, vals in self.allowed.items()})
        if self.frameworks is not None:
            fws = tuple(self.frameworks)
            object.__setattr__(self, "frameworks", fws)
            for f in fws:
                if f not in FRAMEWORK_NAMES:
                    raise SpecError(f"unknown framework {f!r}; choose from "
                                    f"{', '.join(FRAMEWORK_NAMES)}")
            if not fws:
                raise SpecError("constraints name no framework; give at least one")
        self._check_schedule()

    def _check_schedule(self) -> None:
        """A fixed schedule that runs several model chunks on every pipeline rank against a
        fixed (or capped) pipeline of one rank or chunk count it cannot run: a contradiction
        in what was asked, said as one, not a search that finds nothing."""
        schedule = self.fixed.get("pipeline_schedule")
        if schedule not in (*V_SCHEDULES, "interleaved-1f1b"):
            return
        what = (f"pipeline_schedule={schedule!r} (--schedule) places "
                + ("two model chunks" if schedule in V_SCHEDULES else "several model chunks")
                + " on every pipeline rank")
        pp = self.fixed.get("pp", self.max.get("pp"))
        if pp == 1:
            raise SpecError(f"{what}: it needs pp (--pp) of 2 or more, got pp=1")
        v = self.fixed.get("virtual_pipeline_stages")
        if schedule in V_SCHEDULES and v not in (None, 2):
            raise SpecError(f"{what}: virtual_pipeline_stages (--virtual-stages) must be 2, "
                            f"got {v}")
        if v == 1 or self.max.get("virtual_pipeline_stages") == 1:
            raise SpecError(f"{what}: it needs virtual_pipeline_stages (--virtual-stages) of "
                            "2 or more, got 1")

    def allows(self, key: str, value: Any) -> bool:
        """Whether ``value`` of field ``key`` passes the constraints."""
        if key in self.fixed and self.fixed[key] != value:
            return False
        if key in self.allowed and value not in list(self.allowed[key]):
            return False
        cap = self.max.get(key)
        return not (cap is not None and value is not None and value > cap)

    def merge(self, other: Constraints) -> Constraints:
        """Both sets at once (``other`` wins where both fix a field or name frameworks)."""
        caps = dict(self.max)
        for k, v in other.max.items():
            caps[k] = min(v, caps.get(k, v))
        return Constraints(fixed={**self.fixed, **other.fixed},
                           allowed={**self.allowed, **other.allowed}, max=caps,
                           frameworks=other.frameworks or self.frameworks)

    @classmethod
    def preset(cls, name: str) -> Constraints:
        """The constraints of a named preset (``PRESETS``)."""
        if name not in PRESETS:
            raise SpecError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        return PRESETS[name]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Constraints:
        """From ``{"preset": ..., "fixed": {...}, "allowed": {...}, "max": {...},
        "frameworks": [...]}`` (every key optional)."""
        unknown = set(data) - {"preset", "fixed", "allowed", "max", "frameworks"}
        if unknown:
            raise SpecError(f"constraints have unknown keys {sorted(unknown)}; allowed: preset, "
                            "fixed, allowed, max, frameworks")
        own = cls(fixed=dict(data.get("fixed") or {}),
                  allowed={k: list(v) for k, v in (data.get("allowed") or {}).items()},
                  max=dict(data.get("max") or {}),
                  frameworks=tuple(data["frameworks"]) if data.get("frameworks") else None)
        return cls.preset(data["preset"]).merge(own) if data.get("preset") else own

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict that ``from_dict`` reads back."""
        return {"fixed": dict(self.fixed), "allowed": {k: list(v) for k, v in
                                                        self.allowed.items()},
                "max": dict(self.max),
                "frameworks": list(self.frameworks) if self.frameworks else None}


_ONE = {"tp": 1, "pp": 1, "cp": 1, "ep": 1}
#: Named starting points: each is only a Constraints on the one search.
PRESETS: dict[str, Constraints] = {
    # PyTorch DDP: replicated model, data parallel only.
    "ddp": Constraints(fixed={**_ONE, "zero_stage": 0, "offload": "none"}),
    # ZeRO-2 (DeepSpeed stage 2; FSDP SHARD_GRAD_OP): data parallel only.
    "zero2": Constraints(fixed={**_ONE, "zero_stage": 2}),
    # FSDP / ZeRO-3, full or hybrid sharding: data parallel only.
    "fsdp": Constraints(fixed={**_ONE, "zero_stage": 3}),
    # Megatron-LM 3D parallelism: TP x PP x DP with its distributed optimizer or DDP.
    "megatron-3d": Constraints(fixed={"cp": 1, "offload": "none"},
                               allowed={"zero_stage": [0, 1]}, frameworks=("megatron",)),
    # torchtitan's recipe: FSDP2 (HSDP) composed with TP, PP and CP, no offload.
    "torchtitan-default": Constraints(fixed={"zero_stage": 3, "offload": "none"},
                                      frameworks=("torchtitan",)),
}

# Row layout of ``Space.table`` (int64 columns).
COLUMNS = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "group", "sp", "mbs", "schedule", "v",
           "recompute", "recompute_layers", "offload")
_SCHEDULE_NAMES = {v: k for k, v in SCHEDULE_CODES.items()}
_RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
_OFFLOAD_NAMES = {v: k for k, v in OFFLOAD_CODES.items()}


# Columns of a core (what sets the compute and the pipeline) and of the two option tables.
CORE = ("dp", "tp", "pp", "cp", "ep", "etp", "sp", "mbs", "schedule", "v")
SHARDING = ("zero", "group", "offload")
RECOMPUTATION = ("recompute", "recompute_layers")


@dataclass(frozen=True)
class Space:
    """The valid configurations of one trainer, factored: each row of ``cores`` (``CORE``)
    combines with every row of its sharding table ``shardings[shard_of[i]]`` (``SHARDING``)
    and of its recompute table ``recomputes[recompute_of[i]]`` (``RECOMPUTATION``; the first
    row is ``none`` whenever the constraints allow it). ``table`` lists the product as rows
    of ``COLUMNS``; the search expands only the parts it needs.

    ``rejected``: rule -> (values rejected, an example), see ``RULES``.
    """

    framework: str
    cores: np.ndarray
    shard_of: np.ndarray
    recompute_of: np.ndarray
    shardings: tuple[np.ndarray, ...]
    recomputes: tuple[np.ndarray, ...]
    rejected: dict[str, tuple[int, str]]

    @cached_property
    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """(sharding options, recompute options) per core."""
        nz = self.sharding_stack[1][self.shard_of]
        nr = self.recompute_stack[1][self.recompute_of]
        nz.flags.writeable = nr.flags.writeable = False
        return nz, nr

    @cached_property
    def sharding_stack(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``shardings`` stacked into one table (``_stack``)."""
        return _stack(self.shardings, len(SHARDING))

    @cached_property
    def recompute_stack(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``recomputes`` stacked into one table (``_stack``)."""
        return _stack(self.recomputes, len(RECOMPUTATION))

    @property
    def rows(self) -> int:
        """Configurations in the space."""
        nz, nr = self.sizes
        return int((nz * nr).sum())

    @property
    def table(self) -> np.ndarray:
        """Every configuration as a row of ``COLUMNS``."""
        nr = self.sizes[1]
        return self.expand(np.repeat(np.arange(len(self.cores)), nr), positions(nr))

    def core_rows(self, core: np.ndarray, rec: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``COLUMNS`` for each core with recompute option ``rec`` (default: none)
        and no ZeRO, no offload (these rows need not be in the space)."""
        core = np.asarray(core, dtype=np.int64)
        out = np.zeros((len(core), len(COLUMNS)), dtype=np.int64)
        c = self.cores[core]
        for i, name in enumerate(CORE):
            out[:, COLUMNS.index(name)] = c[:, i]
        out[:, COLUMNS.index("group")] = c[:, CORE.index("dp")]
        if rec is not None:
            _fill(out, self.recompute_of[core], self.recompute_stack,
                  np.asarray(rec, dtype=np.int64), RECOMPUTATION)
        return out

    def expand(self, core: np.ndarray, rec: np.ndarray | None) -> np.ndarray:
        """Rows of ``COLUMNS`` for each (core, recompute option) pair times every sharding
        option of the core, in order: pairs as given, shardings in table order. ``rec=None``:
        no recompute (rows that bound the search; they need not be in the space)."""
        core = np.asarray(core, dtype=np.int64)
        nz = self.sizes[0][core]
        pair = np.repeat(np.arange(len(core)), nz)
        within = positions(nz)
        out = self.core_rows(core, rec)[pair]
        _fill(out, self.shard_of[core[pair]], self.sharding_stack, within, SHARDING)
        return out

    def contains(self, cfg: ParallelConfig) -> bool:
        """Whether ``cfg`` (canonical form, uniform stages) is a configuration of the space."""
        if cfg.stage_layers is not None:
            return False
        row = config_row(cfg)
        core = np.array([row[COLUMNS.index(c)] for c in CORE])
        hit = np.flatnonzero(np.all(self.cores == core, axis=1))
        if not len(hit):
            return False
        z = np.array([row[COLUMNS.index(c)] for c in SHARDING])
        r = np.array([row[COLUMNS.index(c)] for c in RECOMPUTATION])
        i = int(hit[0])
        return bool(np.any(np.all(self.shardings[self.shard_of[i]] == z, axis=1))
                    and np.any(np.all(self.recomputes[self.recompute_of[i]] == r, axis=1)))


def column_values(space: Space, column: str) -> np.ndarray:
    """The value codes column ``column`` (of ``COLUMNS``) takes anywhere in ``space``,
    sorted."""
    if column in CORE:
        codes = space.cores[:, CORE.index(column)]
    else:
        names, tables, used = (SHARDING, space.shardings, space.shard_of) \
            if column in SHARDING else (RECOMPUTATION, space.recomputes, space.recompute_of)
        codes = np.concatenate([tables[i][:, names.index(column)] for i in np.unique(used)]
                               or [np.zeros(0, dtype=np.int64)])
    return np.unique(codes)


def _stack(tables: tuple[np.ndarray, ...], width: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Option tables of ``width`` columns as one: (every row, table after table; each
    table's length; the row each table starts at)."""
    lengths = np.array([len(t) for t in tables], dtype=np.int64)
    rows = np.concatenate([*tables, np.zeros((0, width), dtype=np.int64)])
    start = np.cumsum(lengths) - lengths
    for a in (rows, lengths, start):
        a.flags.writeable = False
    return rows, lengths, start


def _fill(out: np.ndarray, which: np.ndarray, stacked: tuple[np.ndarray, ...],
          pick: np.ndarray, names: tuple[str, ...]) -> None:
    """Write into the ``names`` columns of ``out`` row ``pick[j]`` of table ``which[j]``,
    the tables ``stacked`` as ``_stack`` gives them: one gather reads every row."""
    rows, start = stacked[0], stacked[2]
    out[:, [COLUMNS.index(name) for name in names]] = rows[start[which] + pick]


def positions(sizes: np.ndarray) -> np.ndarray:
    """For consecutive groups of ``sizes[i]`` items, each item's position in its group."""
    return np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def _stage_columns(num_layers: int, pp: np.ndarray, uniform: bool
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``ConfigArrays.uniform_stages`` (``uniform``) or ``every_stage`` of each row's
    ``pp``: computed once per degree from 1 to the largest, then gathered by row (a table of
    a million rows holds a few dozen degrees)."""
    columns = ConfigArrays.uniform_stages if uniform else ConfigArrays.every_stage
    if not len(pp):
        return columns(num_layers, pp)
    per_degree = columns(num_layers, np.arange(1, int(pp.max()) + 1, dtype=np.int64))
    at = np.asarray(pp, dtype=np.int64) - 1
    index, count, layers, start = (np.take(x, at, axis=0) for x in per_degree)
    return index, count, layers, start


def arrays(model: ModelSpec | LayerCosts, table: np.ndarray) -> ConfigArrays:
    """The cost model's columns of rows of ``COLUMNS``, uniform stage split (a traced
    graph's first stage given the layers that read its inputs, ``input_split``): four
    representative stage columns where they are exact, else every stage its own. Each
    column is contiguous (one transposed copy of ``table``): the cost model takes chunks of
    its rows, and ``np.take`` of a strided column is tens of times slower."""
    columns = np.ascontiguousarray(table.T)
    c = dict(zip(COLUMNS, columns, strict=True))
    L, need = model.num_layers, model.first_stage_layers
    heavy = {int(p): s for p in np.unique(c["pp"])
             if (s := input_split(L, int(p), need))} if need else {}
    # An accounted split's chunks hold one layer fewer at the ends: the classes of
    # uniform_stages hold for it when the layers are all of one kind.
    uneven = (c["v"] > 1) & (L % np.maximum(c["pp"] * c["v"], 1) != 0)
    # A V-shaped schedule's ranks differ one by one (its split, the output layer on rank 0,
    # what each holds in flight): every stage its own column.
    vshaped = is_v(c["schedule"]) & (c["pp"] > 1)
    exact = not heavy and ConfigArrays.classes_exact(model, c["pp"], c["v"]) and (
        not uneven.any() or len(set(model.layer_kinds)) == 1) and not vshaped.any()
    index, count, layers, start = _stage_columns(L, c["pp"], exact)
    for p, split in heavy.items():
        rows = (c["pp"] == p) & (c["v"] == 1)
        layers[rows, :p] = split
        start[rows, :p] = np.cumsum(split) - np.array(split)
    chunks = accounted_columns(L, model.mtp_layers, c["pp"], c["v"], index, layers, start,
                               c["schedule"])
    shard = np.where(c["zero"] > 0, c["group"] * c["cp"], 1)
    return ConfigArrays(
        dp=c["dp"], tp=c["tp"], pp=c["pp"], cp=c["cp"], ep=c["ep"], etp=c["etp"],
        zero=c["zero"], shard=shard, sp=c["sp"], mbs=c["mbs"], schedule=c["schedule"], v=c["v"],
        recompute=c["recompute"], recompute_layers=c["recompute_layers"],
        offload=c["offload"], stage_layers=layers, stage_index=index, stage_count=count,
        stage_start=start, chunks=chunks)


def row_config(r: np.ndarray, model: ModelSpec | LayerCosts | None = None) -> ParallelConfig:
    """One row of a space table (``COLUMNS``) as a ParallelConfig; with ``model``, the stage
    split the search costed it with where it is not the even one (``arrays``)."""
    c = dict(zip(COLUMNS, (int(x) for x in r), strict=True))
    split: Sequence[int] | None = None
    if model is not None:
        if c["v"] == 1:
            split = input_split(model.num_layers, c["pp"], model.first_stage_layers)
        elif _SCHEDULE_NAMES[c["schedule"]] not in V_SCHEDULES:  # V: the default v_split
            split = interleaved_split(model.num_layers, c["pp"], c["v"], model.mtp_layers)
    return ParallelConfig(
        stage_layers=tuple(split) if split else None,
        dp=c["dp"], tp=c["tp"], pp=c["pp"], cp=c["cp"], ep=c["ep"],
        etp=c["etp"] if c["etp"] != c["tp"] else None, zero_stage=c["zero"],
        sharding_group=c["group"] if c["zero"] and c["group"] != c["dp"] else None,
        sequence_parallel=bool(c["sp"]), micro_batch_size=c["mbs"],
        pipeline_schedule=_SCHEDULE_NAMES[c["schedule"]], virtual_pipeline_stages=c["v"],
        recompute=_RECOMPUTE_NAMES[c["recompute"]],
        recompute_num_layers=c["recompute_layers"] or None,
        offload=_OFFLOAD_NAMES[c["offload"]])


def config_row(cfg: ParallelConfig) -> np.ndarray:
    """A ParallelConfig as a row of ``COLUMNS`` (the inverse of ``row_config``)."""
    return np.array([cfg.dp, cfg.tp, cfg.pp, cfg.cp, cfg.ep, cfg.expert_tp, cfg.zero_stage,
                     cfg.sharding_group or cfg.dp, int(cfg.sequence_parallel),
                     cfg.micro_batch_size, SCHEDULE_CODES[str(cfg.pipeline_schedule)],
                     cfg.virtual_pipeline_stages, RECOMPUTE_CODES[cfg.recompute],
                     cfg.recompute_num_layers or 0, OFFLOAD_CODES[cfg.offload]],
                    dtype=np.int64)


class _Tables:
    """Option tables made once per key (the shardings of a mesh, the recomputes of a chunk
    size), numbered in the order they are made."""

    def __init__(self) -> None:
        self.index: dict[tuple[int | bool, ...], int] = {}
        self.tables: list[np.ndarray] = []

    def of(self, key: tuple[int | bool, ...], make: Callable[..., np.ndarray],
           *args: Any) -> int | None:
        """The number of ``key``'s table (``make(*args)`` the first time), None if empty."""
        if key not in self.index:
            self.index[key] = len(self.tables)
            self.tables.append(make(*args))
        i = self.index[key]
        return i if len(self.tables[i]) else None


@functools.lru_cache(maxsize=4096)
def _chunk_layers(num_layers: int, pp: int, schedule: int, v: int, mtp_layers: int) -> int:
    """Layers of the largest chunk of a pipeline of ``pp`` ranks, ``v`` chunks each, under
    ``schedule`` (a V schedule's split, or the interleaved one; even chunks otherwise)."""
    split = v_split(num_layers, pp) if _SCHEDULE_NAMES[schedule] in V_SCHEDULES \
        else interleaved_split(num_layers, pp, v, mtp_layers)
    return max(split) if split else num_layers // (pp * v)


@functools.lru_cache(maxsize=4096)
def _core_problem(trainer: str, schedule: int, ep: int, pp: int, micro_batches: int
                  ) -> tuple[str, str] | None:
    """(rule, what) a core breaks in its schedule under ``trainer`` (a framework's name):
    combined 1F1B without expert parallel, or a micro-batch count the trainer's schedule does
    not run; None when it runs (memoized: the space asks it once per core)."""
    fw = framework(trainer)
    name = _SCHEDULE_NAMES[schedule]
    if name == "combined-1f1b" and ep == 1:
        return "combined_ep", "pipeline_schedule=combined-1f1b"
    problem = schedule_problem(fw, name, pp, micro_batches)
    return ("schedule_micro_batches", problem) if problem else None


def build_space(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
                constraints: Constraints | None = None) -> Space:
    """Every valid configuration of ``job.framework`` on ``cluster`` under ``constraints``
    (``model``: a preset, or a traced graph's ``LayerCosts``: its TP degrees and sequence
    parallelism, context parallelism where its layers allow it, expert parallelism where
    they route tokens to experts)."""
    cons = constraints or Constraints()
    fw = framework(job.framework)
    rej = Rejections()
    f = Filter(cons, rej)
    world, gpn, L = cluster.num_gpus, cluster.scale_up, model.num_layers
    traced = isinstance(model, LayerCosts) and model.spec is None
    need = model.first_stage_layers
    refused: dict[tuple[int, bool], bool] = {}

    def runs(tp: int, sp: bool) -> bool:
        """Whether planner.apply runs the traced layout at ``tp`` (``tp_runs``)."""
        if (tp, sp) not in refused:
            refused[tp, sp] = bool(LayerCosts.of(model).tp_refusal(tp, sp))
        return not refused[tp, sp]

    tps = f.keep("tp", divisors(world), [("tp_node", lambda t: gpn % t == 0),
                                         *tp_rules(model)])
    cores: list[tuple[int, ...]] = []
    shard_of: list[int] = []
    rec_of: list[int] = []
    shardings, recomputes = _Tables(), _Tables()
    combined = combined_runs(model, job)
    whole_moe = "moe" in job.recompute_modules
    for tp in tps:
        pps = f.keep("pp", divisors(world // tp), [
            ("pp_layers", lambda p: p <= L),
            ("pp_inputs", lambda p: p == 1 or L - need >= p - 1)],
            show=lambda p, tp=tp: f"tp={tp} pp={p}")
        for pp in pps:
            scheds = schedule_options(fw, f, L, pp, need, model.mtp_layers, combined)
            cps = f.keep("cp", divisors(world // (tp * pp)), [
                ("cp_seq", lambda c: job.seq_len % c == 0),
                ("cp_traced", lambda c: c == 1 or not traced
                 or LayerCosts.of(model).context_parallel_ok),
                ("mesh_nodes", lambda c, tp=tp: gpn % (tp * c) == 0 or (tp * c) % gpn == 0)],
                show=lambda c, tp=tp, pp=pp: f"tp={tp} pp={pp} cp={c}")
            for cp in cps:
                dp = world // (tp * pp * cp)
                ok = f.keep("dp", [dp], [
                    ("dp_batch", lambda d: job.global_batch_size % d == 0)],
                    show=lambda d, tp=tp, pp=pp, cp=cp: f"tp={tp} pp={pp} cp={cp} dp={d}")
                if not ok:
                    continue
                sps = f.keep("sequence_parallel", [False, True] if tp > 1 else [False],
                             [("sp_seq", lambda s, cp=cp, tp=tp: not s
                               or (job.seq_len // cp) % tp == 0),
                              ("sp_traced", lambda s: not traced
                               or s in LayerCosts.of(model).sp_options),
                              ("tp_runs", lambda s, tp=tp: not traced or runs(tp, s)),
                              ("sp_framework", lambda s: not s or fw.sequence_parallel)])
                mbss = f.keep("micro_batch_size", divisors(job.global_batch_size // dp))
                for ep, etp in expert_meshes(model, fw, f, dp, tp, pp, cp):
                    z = shardings.of((dp, pp, cp, ep, tp, etp), sharding_options,
                                     fw, f, dp, pp, cp, ep, tp, etp)
                    if z is None:
                        continue
                    for (s, v), sp, mbs in itertools.product(scheds, sps, mbss):
                        # The check only asks whether ep is 1: min(ep, 2) keeps its cache small.
                        problem = _core_problem(fw.name, s, min(ep, 2), pp,
                                                job.global_batch_size // (dp * mbs))
                        if problem:
                            rej.add(problem[0], f"tp={tp} pp={pp} dp={dp} ep={ep} "
                                    f"mbs={mbs}: {problem[1]}")
                            continue
                        comb = s == SCHEDULE_CODES["combined-1f1b"]
                        chunk = _chunk_layers(L, pp, s, v, model.mtp_layers)
                        rc = recomputes.of((chunk, comb), recompute_options, f, chunk,
                                           not comb, not (comb and whole_moe))
                        if rc is None:
                            continue
                        cores.append((dp, tp, pp, cp, ep, etp, int(sp), mbs, s, v))
                        shard_of.append(z)
                        rec_of.append(rc)
    if not model.is_moe and cons.fixed.get("ep", 1) != 1:
        rej.add("ep_dense", f"ep={cons.fixed['ep']} on the dense {model.name}")
    space = Space(framework=fw.name,
                  cores=np.array(cores, dtype=np.int64).reshape(-1, len(CORE)),
                  shard_of=np.array(shard_of, dtype=np.int64),
                  recompute_of=np.array(rec_of, dtype=np.int64),
                  shardings=tuple(shardings.tables), recomputes=tuple(recomputes.tables),
                  rejected={k: (int(n), str(ex)) for k, (n, ex) in rej.counts.items()})
    # Read-only: searches share a space (``spaces`` keeps the last few).
    for arr in (space.cores, space.shard_of, space.recompute_of, *space.shardings,
                *space.recomputes):
        arr.flags.writeable = False
    return space


#: The spaces built last, keyed by all that ``build_space`` reads of its inputs: a preset
#: model, the cluster, the constraints, and of the job its trainer, sequence, batch,
#: recompute modules and whether it may run combined 1F1B. A plan, its explanation and the
#: explanation's searches with another dispatcher or routing load share one space.
_SPACES: dict[tuple[Any, ...], Space] = {}
_SPACES_KEPT = 8
_SPACES_LOCK = threading.Lock()  # the explorer serves requests on threads


def forget_spaces() -> None:
    """Drop the kept spaces (``_SPACES``): the next search builds its space again, as a first
    plan does (``benchmarks/search_speed.py`` times it so)."""
    with _SPACES_LOCK:
        _SPACES.clear()


def _space_key(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
               cons: Constraints) -> tuple[Any, ...] | None:
    """``_SPACES``'s key for these inputs; None for a traced model (not kept)."""
    if not isinstance(model, ModelSpec):
        return None
    return (model, cluster, repr(cons), job.framework, job.seq_len, job.global_batch_size,
            job.recompute_modules, combined_runs(model, job))


def spaces(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
           constraints: Constraints | None = None) -> list[tuple[Job, Space]]:
    """One (job, space) per trainer the constraints name (default: the job's own); the last
    few spaces built are kept (``_SPACES``)."""
    cons = constraints or Constraints()
    names = cons.frameworks or (job.framework,)
    out = []
    refused: dict[str, str] = {}
    for name in names:
        j = job if name == job.framework else replace(job, framework=name)
        why = job_problem(model, cluster, j)
        if why is not None:
            if len(names) == 1:
                # No split can run it: say why before any is costed (a precision the GPU
                # lacks would otherwise surface as a missing datasheet peak).
                raise SpecError(why)
            # A trainer that cannot run the job whatever the split (a setting another trainer
            # owns, a kernel it lacks) is left out of a search over several, and said so.
            refused[name] = why
            continue
        key = _space_key(model, cluster, j, cons)
        with _SPACES_LOCK:
            space = _SPACES.pop(key, None) if key is not None else None
        if space is None:
            space = build_space(model, cluster, j, cons)
        if key is not None:
            with _SPACES_LOCK:
                _SPACES[key] = space  # the most recent last
                while len(_SPACES) > _SPACES_KEPT:
                    del _SPACES[next(iter(_SPACES))]
        out.append((j, space))
    if not out:
        raise SpecError("no trainer named can run this job: "
                        + "; ".join(f"{n}: {w}" for n, w in refused.items()))
    for name, why in refused.items():
        warnings.warn(f"{name} is not searched: {why}", stacklevel=3)
    return out

"""``load_model``: a model from what a user types: a preset name, a Hugging Face
``config.json`` path, or ``package.module:attr`` naming a model in their own code.

``module:attr`` imports the module (the current directory is on the path, as with
``python -m``) and reads the attribute, which may be a ``ModelSpec``, a Hugging Face config
dict, a ``transformers`` config or model (its ``.config`` is read), or a function or class
taking no arguments that returns one of these; a torch module class is built on the meta
device, so no weights are allocated. ``load_model_or_module`` also accepts a plain
``torch.nn.Module`` (an instance, a class or a function building one): ``planner plan``
traces it into a layer graph and plans that. Nothing is unpickled and no string is
evaluated.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from hardware_profiles.files import is_file

if TYPE_CHECKING:
    from costmodel.trace.graph import LayerGraph

__all__ = ["build_module", "costs_from_graph", "load_model", "load_model_or_module"]


def load_model(spec: str | ModelSpec) -> ModelSpec:
    """The model ``spec`` names: a ``ModelSpec`` (returned as is), a preset (``planner
    models``), the path of a Hugging Face ``config.json``, or ``module:attr``."""
    found = _load(spec, modules=False)
    assert isinstance(found, ModelSpec)
    return found


def load_model_or_module(spec: str | ModelSpec) -> Any:
    """As ``load_model``, except that ``module:attr`` naming a torch ``nn.Module`` with no
    ``ModelSpec`` or Hugging Face config (an instance, or a class or function building one on
    the meta device) returns that module, to be planned from its traced graph."""
    return _load(spec, modules=True)


def _load(spec: str | ModelSpec, modules: bool) -> Any:
    """``load_model``; a plain torch module named by ``module:attr`` too when ``modules``.
    The user's code prints to standard error while it is imported and built (standard
    output stays the planner's)."""
    with contextlib.redirect_stdout(sys.stderr):
        return _load_quietly(spec, modules)


def _load_quietly(spec: str | ModelSpec, modules: bool) -> Any:
    if isinstance(spec, ModelSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("--model is empty; give a preset name (see 'planner models'), a "
                        "config.json path or module:attr")
    spec = spec.strip()
    if spec.endswith(".json") or is_file(spec):
        return ModelSpec.from_hf_config(spec)
    if ":" in spec:
        return _from_code(spec, modules)
    return ModelSpec.preset(spec)


def _is_module(obj: Any) -> bool:
    """A torch ``nn.Module`` instance (not the class)."""
    return not isinstance(obj, type) and hasattr(obj, "named_parameters") \
        and hasattr(obj, "forward")


def build_module(spec: str) -> Any:
    """The torch ``nn.Module`` that ``module:attr`` names, built to train (not on the meta
    device): an instance as it is, a class or function called with no arguments. What
    ``planner run`` trains for the plan of a traced module. The user's code prints to
    standard error while it is imported and built."""
    with contextlib.redirect_stdout(sys.stderr):
        obj = _import_attr(spec)
        if not _is_module(obj) and callable(obj):
            try:
                obj = obj()
            except Exception as e:  # the user's constructor, as one line
                raise SpecError(f"model {spec!r}: building it raised {type(e).__name__}: "
                                f"{e}") from None
    if not _is_module(obj):
        raise SpecError(f"model {spec!r} is a {type(obj).__name__}, not a torch nn.Module "
                        "(or a class or function taking no arguments that returns one)")
    return obj


def _from_code(spec: str, modules: bool) -> Any:
    """``module:attr`` (``attr`` may be dotted)."""
    return _to_spec(_import_attr(spec), spec, depth=0, modules=modules)


def _import_attr(spec: str) -> Any:
    """The object ``module:attr`` names (``attr`` may be dotted), imported from the working
    directory or the path."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise SpecError(f"model {spec!r}: write module:attr, e.g. mymodels:llama_small")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise SpecError(f"model {spec!r}: cannot import {mod_name!r} ({e}); run from the "
                        "directory that holds it or add it to PYTHONPATH") from None
    except Exception as e:  # the user's module failed while importing
        raise SpecError(f"model {spec!r}: importing {mod_name!r} raised "
                        f"{type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"model {spec!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _to_spec(obj: Any, spec: str, depth: int, modules: bool) -> Any:
    """``obj`` as a ``ModelSpec``; a plain torch module as itself when ``modules``."""
    if isinstance(obj, ModelSpec):
        return obj
    if isinstance(getattr(obj, "spec", None), ModelSpec) and _is_module(obj):
        return obj.spec  # built by planner.runtime.build_model
    if isinstance(obj, dict):
        return ModelSpec.from_hf_config(obj, name=spec.partition(":")[2])
    config = getattr(obj, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        obj = config  # a transformers model: its config says its shape
    if hasattr(obj, "to_dict") and hasattr(obj, "model_type"):
        return ModelSpec.from_hf_config(dict(obj.to_dict()), name=spec.partition(":")[2])
    if _is_module(obj):
        if modules:
            return obj
        raise SpecError(
            f"model {spec!r} is a torch module ({type(obj).__name__}) with no ModelSpec or "
            "Hugging Face config: 'planner plan' plans it from its traced graph (see "
            "--input-shape); this command needs a preset, a config.json or a ModelSpec")
    if callable(obj) and depth == 0:
        with _meta_device():
            try:
                built = obj()
            except TypeError as e:
                raise SpecError(f"model {spec!r}: calling it without arguments failed ({e}); "
                                "point at a function that takes none") from None
            except Exception as e:
                raise SpecError(f"model {spec!r}: building it raised {type(e).__name__}: "
                                f"{e}") from None
        return _to_spec(built, spec, depth=1, modules=modules)
    raise SpecError(
        f"model {spec!r} is a {type(obj).__name__}; the planner reads a model from a "
        "ModelSpec, a Hugging Face config (dict, transformers config or model), a torch "
        "nn.Module, or a class or function taking no arguments that returns one")


@contextlib.contextmanager
def _meta_device() -> Any:
    """Build torch modules on the meta device (no weights allocated) when torch is here."""
    try:
        import torch
    except ImportError:
        yield
        return
    with torch.device("meta"):
        yield


def costs_from_graph(graph: LayerGraph, cluster: Cluster, job: Job, *,
                     tp_degrees: Sequence[int] | None = None,
                     sequence_parallel: bool | Literal["both"] = False,
                     time_limit_s: float = 10.0,
                     autocast_graph: LayerGraph | None = None) -> LayerCosts:
    """The ``LayerCosts`` of a traced ``LayerGraph``: each block sharded at each TP degree by
    the sharding ILP (``costmodel.trace.blockcosts.costs_from_graph``, where the arguments are
    described). The trace side (networkx, OR-Tools) is imported on the first call."""
    from costmodel.trace.blockcosts import costs_from_graph as from_graph

    return from_graph(graph, cluster, job, tp_degrees=tp_degrees,
                      sequence_parallel=sequence_parallel, time_limit_s=time_limit_s,
                      autocast_graph=autocast_graph)

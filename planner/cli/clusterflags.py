"""The cluster a command's flags name: a cluster preset or TOML file (``--cluster``), or
the short form (``--gpus N --gpu NAME``), with a measured GPU profile (``--profile``), the
scale-up domain and a power limit. Bad input raises ``SpecError``, which ``planner.cli.main``
prints as one line."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import hardware_profiles
from costmodel import Cluster, SpecError
from costmodel.hardware import GPU
from hardware_profiles.files import is_file, printable
from planner.cli.messages import warn

#: Types of the keys of a cluster TOML file.
CLUSTER_KEYS: dict[str, type | tuple[type, ...]] = {
    "gpu": str, "num_nodes": int, "gpus_per_node": int, "intra_node_link": str,
    "inter_node_link": str, "nics_per_node": int, "host_memory_gib": (int, float), "name": str,
    "gpus_per_domain": int, "power_limit_w": (int, float)}
CLUSTER_KINDS = {str: "a name in quotes", int: "a whole number", (int, float): "a number"}
#: The default GPU of the short form ``--gpus N``.
DEFAULT_GPU = "h100-sxm"


def load_profile(args: argparse.Namespace) -> GPU | None:
    """The GPU of ``--profile FILE`` (a measured or hand-written GPU profile), if given."""
    path = getattr(args, "profile", None)
    return GPU.from_file(path) if path else None


def load_cluster(args: argparse.Namespace) -> Cluster:
    """``--cluster`` (preset or TOML file) or the short form ``--gpus --gpu --gpus-per-node``,
    with the GPU of ``--profile`` where given."""
    return make_cluster(args.cluster, args.num_nodes, args.gpus, args.gpu, args.gpus_per_node,
                        args.intra_node, args.inter_node, load_profile(args),
                        domain=args.gpus_per_domain, power=args.power_limit)


def load_clusters(args: argparse.Namespace) -> list[Cluster]:
    """``planner compare``: every cluster its repeatable flags name (``--cluster`` each with
    each ``--num-nodes``; each ``--gpus`` with each ``--gpu`` and ``--inter-node``)."""
    out = []
    kinds, nics = args.gpu or [None], args.inter_node or [None]
    measured = load_profile(args)
    for c, n, kind, nic in itertools.product(args.cluster or [], args.num_nodes or [None],
                                             kinds, nics):
        out.append(make_cluster(c, n, None, kind, args.gpus_per_node, args.intra_node, nic,
                                measured, domain=args.gpus_per_domain,
                                power=args.power_limit))
    if args.gpus and args.num_nodes and not args.cluster:
        raise SpecError("--num-nodes goes with --cluster; with --gpus give the total GPUs")
    for g, kind, nic in itertools.product(args.gpus or [], kinds, nics):
        out.append(make_cluster(None, None, g, kind, args.gpus_per_node, args.intra_node,
                                nic, measured, domain=args.gpus_per_domain,
                                power=args.power_limit))
    if not out:
        raise SpecError("say which GPUs: --cluster NAME, or --gpus N --gpu NAME (each may be "
                        "repeated to compare clusters)")
    return out


def make_cluster(cluster: str | None, num_nodes: int | None, gpus: int | None,
                 gpu: str | None, gpus_per_node: int | None, intra: str | None,
                 inter: str | None, measured: GPU | None = None, *,
                 domain: int | None = None, power: float | None = None) -> Cluster:
    """The cluster of the flags' values: a cluster preset or TOML file (``cluster``), or the
    short form of ``gpus`` GPUs of kind ``gpu``; ``measured``: the ``--profile`` GPU, which
    must be the GPU the other flags name, if they name one; ``domain``: ``--gpus-per-domain``
    (the preset's or file's own, else a node); ``power``: ``--power-limit`` (W)."""
    out = _flagged_cluster(cluster, num_nodes, gpus, gpu, gpus_per_node, intra, inter,
                           measured, domain)
    return out if power is None else dataclasses.replace(out, power_limit_w=power)


def _flagged_cluster(cluster: str | None, num_nodes: int | None, gpus: int | None,
                     gpu: str | None, gpus_per_node: int | None, intra: str | None,
                     inter: str | None, measured: GPU | None, domain: int | None) -> Cluster:
    """``make_cluster`` without the power limit."""
    if cluster and gpus:
        raise SpecError("give either --cluster or --gpus/--gpu, not both")
    _check_profile(measured, gpu, "--gpu")
    if not cluster:
        nodes, per_node = _short_form_nodes(num_nodes, gpus, gpus_per_node)
        return Cluster(gpu=resolve_gpu(gpu, measured), num_nodes=nodes,
                       gpus_per_node=per_node, intra_node_link=intra, inter_node_link=inter,
                       gpus_per_domain=domain)
    if hardware_profiles.is_path(cluster):
        return _cluster_file(cluster, num_nodes, measured, domain)
    _not_shadowed("clusters", cluster, "--cluster")
    return _cluster_preset(cluster, num_nodes, gpu, gpus_per_node, intra, inter, measured,
                           domain)


def _not_shadowed(kind: str, name: str, flag: str) -> None:
    """Warn when a preset name is also a file in this folder: the preset is used (a name is
    a name), and the warning says how to read the file instead."""
    for candidate in (name, f"{name}.toml"):
        if is_file(candidate):
            warn(f"{flag} {printable(name)} is the shipped {kind[:-1]} preset; the file "
                 f"{printable(candidate)} in this folder is not read (give "
                 f"./{printable(candidate)} to read the file)")


def _check_profile(measured: GPU | None, gpu: str | None, where: str) -> None:
    """A ``--profile`` must describe the GPU the cluster flags name, if they name one."""
    if measured is not None and gpu is not None and str(gpu).strip().lower() != measured.name:
        raise SpecError(f"--profile measured {measured.name!r} but {where} names {gpu!r}; "
                        f"drop --gpu, use --gpus N --profile FILE, or profile that GPU")


def resolve_gpu(gpu: str | None, measured: GPU | None) -> GPU:
    """The GPU of the short form: the measured ``--profile`` one, else ``--gpu`` (a shipped
    profile name or a GPU profile TOML file), else ``DEFAULT_GPU``."""
    if measured is not None:
        return measured
    name = gpu or DEFAULT_GPU
    if hardware_profiles.is_path(name):
        return GPU.from_file(name)
    _not_shadowed("gpus", name, "--gpu")
    return GPU.preset(name)


def _short_form_nodes(num_nodes: int | None, gpus: int | None, gpus_per_node: int | None
                      ) -> tuple[int, int]:
    """Nodes and GPUs per node of ``--gpus N [--gpus-per-node M]`` (at most 8 per node by
    default)."""
    if num_nodes:
        raise SpecError("--num-nodes goes with --cluster; with --gpus give the total GPUs")
    if not gpus:
        raise SpecError("say which GPUs: --cluster NAME, or --gpus N --gpu NAME")
    if gpus < 1:
        raise SpecError(f"--gpus {gpus}: give a positive number of GPUs")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise SpecError(f"--gpus-per-node {gpus_per_node}: give a positive number")
    per_node = gpus_per_node or min(gpus, 8)
    if gpus % per_node:
        raise SpecError(f"--gpus {gpus} is not a multiple of --gpus-per-node {per_node}")
    return gpus // per_node, per_node


def _cluster_preset(name: str, num_nodes: int | None, gpu: str | None,
                    gpus_per_node: int | None, intra: str | None, inter: str | None,
                    measured: GPU | None, domain: int | None) -> Cluster:
    """A shipped cluster preset, with the GPU, node counts, scale-up domain and links the
    flags override (the domain before the sizes are checked: 64 nodes of an NVL72 rack's 4
    GPUs fill no whole 72-GPU domain until ``--gpus-per-domain`` says how they split)."""
    if measured is not None:
        _check_profile(measured, hardware_profiles.load("clusters", name)["gpu"],
                       f"cluster {name!r}")
    out = Cluster.preset(name, num_nodes=num_nodes, gpu=measured or gpu,
                         gpus_per_node=gpus_per_node, gpus_per_domain=domain)
    if intra or inter:
        out = dataclasses.replace(out, intra_node_link=intra or out.intra_node_link,
                                  inter_node_link=inter or out.inter_node_link)
    return out


def _cluster_file(path: str, num_nodes: int | None, measured: GPU | None,
                  domain: int | None = None) -> Cluster:
    """A cluster TOML file (the ``Cluster`` fields), every key checked; ``num_nodes`` and
    ``domain`` (``--gpus-per-domain``) override its own."""
    data = hardware_profiles.load_file(path)
    allowed = {f.name for f in dataclasses.fields(Cluster)}
    unknown = set(data) - allowed - {"description", "source"}
    if unknown:
        raise SpecError(f"cluster file {path!r} has unknown keys {sorted(unknown)}; "
                        f"allowed: {sorted(allowed)}")
    fields = {k: v for k, v in data.items() if k in allowed}
    if num_nodes:
        fields["num_nodes"] = num_nodes
    if domain is not None:
        fields["gpus_per_domain"] = domain
    if "gpu" not in fields:
        raise SpecError(f"cluster file {path!r} names no gpu; add e.g. "
                        'gpu = "h100-sxm" (see \'planner gpus\')')
    for key, kind in CLUSTER_KEYS.items():
        if key in fields and (not isinstance(fields[key], kind)
                              or isinstance(fields[key], bool)):
            raise SpecError(f"cluster file {path!r}: {key} = {fields[key]!r} should "
                            f"be {CLUSTER_KINDS[kind]}")
    if measured is not None:
        _check_profile(measured, fields["gpu"], f"cluster file {path!r}")
        fields["gpu"] = measured
    return Cluster(**fields)

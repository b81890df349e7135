"""The sharding ILP now lives in ``costmodel.trace.autoshard`` (it is how ``costs_from_graph``
costs a block); this module keeps the old import path."""

from costmodel.trace.autoshard import ShardingProblem, Solution, brute_force, solve
from costmodel.trace.layouts import Mesh, Strategy

__all__ = ["Mesh", "ShardingProblem", "Solution", "Strategy", "brute_force", "solve"]

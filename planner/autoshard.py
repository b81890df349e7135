"""The sharding ILP now lives in ``costmodel.autoshard`` (it is how ``LayerCosts.from_graph``
costs a block); this module keeps the old import path."""

from costmodel.autoshard import Mesh, ShardingProblem, Solution, Strategy, brute_force, solve

__all__ = ["Mesh", "ShardingProblem", "Solution", "Strategy", "brute_force", "solve"]

"""The trace side: a torch module traced on the meta device into a ``LayerGraph``
(``graph``, ``trace_ops``), per-op sharding rules (``sharding``), the per-block sharding ILP
(``autoshard``) and the block costs it produces (``blockcosts``), which end in the same
``LayerCosts`` a preset does. Imports the formulas; the formulas never import it.
"""

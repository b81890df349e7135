"""The analytic cost model: what a parallel configuration costs, term by term.

Per-layer formulas (``compute``, ``kernels``, ``activations``, ``states``, ``comm``) feed
``LayerCosts``, the seam every model source ends in; the terms that read it (``memory``,
``stepterms``, ``steptime``, ``pipeline``), the vectorized pass over a grid of configurations
(``tables``) and the public ``estimate`` sit above. Never imports the trace side, fitting or
serving.
"""

"""The one input-error type every room of the project raises.

It lives in the bottom room (``hardware_profiles`` imports nothing of ours) so that the
profile loader, the cost model and the planner all raise the same class;
``costmodel.errors`` and ``planner`` re-export it.
"""


class SpecError(ValueError):
    """Bad input: names the offending value and says how to fix it."""

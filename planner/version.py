"""The planner's version, written into every file it emits."""

__version__ = "0.1.0"

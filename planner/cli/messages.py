"""What the commands print beside their results: warnings on standard error, JSON on
standard output."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(value: Any) -> None:
    """``value`` as indented JSON on standard output."""
    print(json.dumps(value, indent=2))


def warn(message: str) -> None:
    """``planner: warning: message`` on standard error."""
    print(f"planner: warning: {message}", file=sys.stderr)

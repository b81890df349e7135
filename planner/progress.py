"""A progress bar for searches that take more than a second, on standard error.

Quiet by default unless the stream is a terminal, and silent for the first ``delay`` seconds,
so scripts, pipes and fast searches print nothing extra.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Callable with the fraction done (0 to 1); draws ``label [#####.....]  45%  1.3 s``.

    ``stream``: where to draw (default standard error); ``enabled``: draw at all (default:
    when ``stream`` is a terminal); ``delay``: seconds before the bar first appears;
    ``clock``: a monotonic clock in seconds (tests pass a fake one).
    """

    WIDTH = 30

    def __init__(self, label: str = "searching", *, stream: TextIO | None = None,
                 enabled: bool | None = None, delay: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.delay = delay
        self.clock = clock
        self.start = clock()
        self.shown = False
        self.fraction = 0.0

    def __call__(self, fraction: float) -> None:
        """Record ``fraction`` done and redraw when the bar is due."""
        self.fraction = min(1.0, max(self.fraction, float(fraction)))
        elapsed = self.clock() - self.start
        if not self.enabled or elapsed < self.delay:
            return
        filled = round(self.WIDTH * self.fraction)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {100 * self.fraction:3.0f}%  "
                          f"{elapsed:.1f} s")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """Clear the bar's line, if it was drawn."""
        if self.shown:
            self.stream.write("\r" + " " * (len(self.label) + self.WIDTH + 20) + "\r")
            self.stream.flush()
            self.shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

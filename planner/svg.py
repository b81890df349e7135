"""A small SVG writer for the interactive figures (``planner.figures``): shapes with hover
titles and ``data-*`` attributes, axes with round ticks, legends. Pure Python: the figures
need neither matplotlib nor a browser library, so the explorer page (``planner serve``), a
notebook and an exported ``.svg`` file show the same drawing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

__all__ = ["COLORS", "Axis", "Canvas", "nice_ticks"]

#: Colours of the figures (matplotlib's tab10 palette, which ``planner.plots`` also draws
#: with, so a PNG and the page colour a term alike).
COLORS = {"blue": "#1f77b4", "orange": "#ff7f0e", "green": "#2ca02c", "red": "#d62728",
          "purple": "#9467bd", "brown": "#8c564b", "pink": "#e377c2", "gray": "#7f7f7f",
          "olive": "#bcbd22", "cyan": "#17becf", "lightgreen": "#3cb371",
          "yellowgreen": "#9acd32", "gold": "#ffd700"}


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) covering
    ``lo`` to ``hi``."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    x = first
    while x <= hi + step * 1e-9:
        out.append(round(x, 12))
        x += step
    return out


def _num(x: float) -> str:
    """A coordinate, short."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def tick_text(x: float) -> str:
    """A tick label: no trailing zeros, thousands separated."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.6g}"


@dataclass(frozen=True)
class Axis:
    """A linear (or log10) map from data values ``lo``..``hi`` to pixels ``a``..``b``."""

    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __call__(self, x: float) -> float:
        """The pixel of value ``x``."""
        lo, hi, v = self.lo, self.hi, x
        if self.log:
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(max(x, 1e-300))
        span = hi - lo or 1.0
        return self.a + (v - lo) / span * (self.b - self.a)

    def ticks(self, count: int = 5) -> list[float]:
        """Tick values inside the axis."""
        if not self.log:
            return nice_ticks(self.lo, self.hi, count)
        out = []
        for p in range(math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi)) + 1):
            out += [m * 10.0 ** p for m in (1, 2, 5) if self.lo <= m * 10.0 ** p <= self.hi]
        return out or [self.lo]


@dataclass
class Canvas:
    """An SVG drawing of ``width`` x ``height`` pixels; ``kind`` names the figure
    (``data-figure``, which the page's script and the tests look for)."""

    width: float
    height: float
    kind: str
    parts: list[str] = field(default_factory=list)

    @staticmethod
    def _attrs(data: dict[str, object] | None, title: str | None) -> tuple[str, str]:
        extra = "".join(f' data-{k}="{escape(str(v))}"' for k, v in (data or {}).items())
        tip = f"<title>{escape(title)}</title>" if title else ""
        return extra, tip

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *,
             title: str | None = None, data: dict[str, object] | None = None,
             stroke: str | None = None, cls: str | None = None, opacity: float = 1.0) -> None:
        """A rectangle, with a hover ``title`` and ``data-*`` attributes."""
        extra, tip = self._attrs(data, title)
        line = f' stroke="{stroke}" stroke-width="1"' if stroke else ""
        klass = f' class="{cls}"' if cls else ""
        alpha = f' fill-opacity="{opacity:g}"' if opacity < 1 else ""
        self.parts.append(f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(max(w, 0.0))}" '
                          f'height="{_num(max(h, 0.0))}" fill="{fill}"{alpha}{line}{klass}'
                          f'{extra}>{tip}</rect>')

    def circle(self, x: float, y: float, r: float, fill: str, *, title: str | None = None,
               data: dict[str, object] | None = None, cls: str | None = None,
               stroke: str = "none", opacity: float = 1.0) -> None:
        """A dot."""
        extra, tip = self._attrs(data, title)
        klass = f' class="{cls}"' if cls else ""
        self.parts.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(r)}" fill="{fill}" '
                          f'fill-opacity="{opacity:g}" stroke="{stroke}"{klass}{extra}>{tip}'
                          f'</circle>')

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str = "#000", *,
             width: float = 1.0, dash: str | None = None, title: str | None = None) -> None:
        """A straight line."""
        d = f' stroke-dasharray="{dash}"' if dash else ""
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f'<line x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" '
                          f'y2="{_num(y2)}" stroke="{color}" stroke-width="{width:g}"{d}>'
                          f'{tip}</line>')

    def path(self, points: Sequence[tuple[float, float]], color: str, *,
             width: float = 1.5) -> None:
        """A polyline through ``points``."""
        if not points:
            return
        pts = " ".join(f"{_num(x)},{_num(y)}" for x, y in points)
        self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                          f'stroke-width="{width:g}" pointer-events="none"/>')

    def text(self, x: float, y: float, words: str, *, size: float = 11, anchor: str = "start",
             color: str = "#222", weight: str = "normal", cls: str | None = None) -> None:
        """A label (escaped)."""
        klass = f' class="{cls}"' if cls else ""
        bold = f' font-weight="{weight}"' if weight != "normal" else ""
        self.parts.append(f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size:g}" '
                          f'text-anchor="{anchor}" fill="{color}"{bold}{klass}>'
                          f'{escape(words)}</text>')

    def group(self, cls: str, inner: Canvas, data: dict[str, object] | None = None) -> None:
        """``inner``'s shapes in a ``<g class=cls>`` (one zoomable or selectable layer)."""
        extra, _ = self._attrs(data, None)
        self.parts.append(f'<g class="{cls}"{extra}>' + "".join(inner.parts) + "</g>")

    def x_axis(self, ax: Axis, y: float, label: str, fmt: object = tick_text) -> None:
        """Ticks and a label under the plot."""
        self.line(ax.a, y, ax.b, y, "#444")
        for t in ax.ticks():
            x = ax(t)
            self.line(x, y, x, y + 4, "#444")
            self.text(x, y + 15, fmt(t), size=10, anchor="middle")  # type: ignore[operator]
        self.text((ax.a + ax.b) / 2, y + 31, label, size=11, anchor="middle")

    def y_axis(self, ax: Axis, x: float, label: str, grid_to: float | None = None) -> None:
        """Ticks, grid lines and a label left of the plot."""
        self.line(x, ax.a, x, ax.b, "#444")
        for t in ax.ticks():
            y = ax(t)
            self.line(x - 4, y, x, y, "#444")
            if grid_to is not None:
                self.line(x, y, grid_to, y, "#e5e5e5")
            self.text(x - 6, y + 3.5, tick_text(t), size=10, anchor="end")
        mid = (ax.a + ax.b) / 2
        self.parts.append(f'<text transform="translate({_num(x - 44)},{_num(mid)}) rotate(-90)" '
                          f'font-size="11" text-anchor="middle" fill="#222">{escape(label)}'
                          f'</text>')

    def legend(self, x: float, y: float, items: Sequence[tuple[str, str]]) -> None:
        """Colour swatches with names, one per line, from (``x``, ``y``)."""
        for i, (name, color) in enumerate(items):
            self.rect(x, y + 16 * i, 11, 11, color)
            self.text(x + 16, y + 16 * i + 10, name, size=10)

    def render(self, label: str) -> str:
        """The SVG document (``label``: its accessible name)."""
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="planner-figure" '
                f'data-figure="{self.kind}" viewBox="0 0 {_num(self.width)} '
                f'{_num(self.height)}" width="{_num(self.width)}" height="{_num(self.height)}" '
                f'role="img" aria-label="{escape(label)}" font-family="sans-serif">'
                + "".join(self.parts) + "</svg>")

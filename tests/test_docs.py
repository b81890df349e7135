"""Every command output and figure that README.md and docs/*.md quote is what the command
prints now. The blocks and figures are marked with their command (docs/regenerate.py says
how); this test runs the same commands as ``python docs/regenerate.py`` and fails with the
difference when a quoted output has changed. Wall-clock times and scratch paths are masked on
both sides by the regenerator's own ``mask``. Also: the README stays at most 300 lines, and
the README and every long doc open with a contents list of their sections."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parent.parent


def _regenerate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regenerate", ROOT / "docs" / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["regenerate"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


regen = _regenerate()
DOCS = regen.documents()
NAMES = [str(p.relative_to(ROOT)) for p in DOCS]
HINT = "\n\nA quoted output changed: run `python docs/regenerate.py` and review the diff.\n"


@pytest.fixture(scope="module")
def outputs() -> object:
    """Each marked command run once for the whole module."""
    return regen.Outputs(regen.saved_files())


def _check(name: str, outputs: object, slow: bool) -> None:
    path = ROOT / name
    text = path.read_text()
    diff = regen.differences(path, text, regen.render(text, outputs, slow=slow))
    assert not diff, diff + HINT


@pytest.mark.slow  # the documentation's commands: the whole suite (CI) runs them, as README says
@pytest.mark.parametrize("name", NAMES)
def test_quoted_outputs_are_what_the_commands_print(name: str, outputs: object) -> None:
    _check(name, outputs, slow=False)


def _has_slow(text: str) -> bool:
    specs, figures = regen.markers(text)
    return any(s.slow for s in specs) or any(map(regen.slow_figure, figures))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, p in zip(NAMES, DOCS, strict=True)
                                  if _has_slow(p.read_text())])
def test_slow_quoted_outputs_are_what_the_commands_print(name: str, outputs: object) -> None:
    _check(name, outputs, slow=True)


def test_a_figure_that_moved_fails_the_check(outputs: object) -> None:
    """Breaking one quoted figure (in a copy of the README) is a difference; changing only a
    wall-clock time is not."""
    path = ROOT / "README.md"
    text = path.read_text()
    m = re.search(r"<!--fig:qs-step-->([\d.]+) s<!--/fig-->", text)
    assert m, "the README quotes the quick start's step time"
    broken = text.replace(m.group(0), "<!--fig:qs-step-->99.999 s<!--/fig-->")
    diff = regen.differences(path, broken, regen.render(broken, outputs, slow=False))
    assert "<!--fig:qs-step-->99.999 s" in diff
    block = text.split("<!-- output: planner plan --model llama-3-70b", 1)[1]
    wall = re.search(r"configurations in ([\d.]+) s", block)
    assert wall, "the quick start's output shows the search's wall time"
    retimed = text.replace(wall.group(0), "configurations in 12.34 s", 1)
    assert not regen.differences(path, retimed, regen.render(retimed, outputs, slow=False))
    step = re.search(r"(?m)^         step ([\d.]+) s", block)
    assert step, "the quick start's output shows its step time"
    bad = text.replace(step.group(0), "         step 1.000 s", 1)
    assert regen.differences(path, bad, regen.render(bad, outputs, slow=False))


def test_every_marker_names_a_command_and_every_figure_is_defined() -> None:
    used: set[str] = set()
    for path in DOCS:
        specs, figures = regen.markers(path.read_text())
        for spec in specs:
            for command in spec.commands:
                assert re.match(r"(planner |python benchmarks/)", command), (path, command)
        for name in figures:
            assert name in regen.FIGURES, (path, name)
        used.update(figures)
    assert set(regen.FIGURES) == used, f"figures no document quotes: {set(regen.FIGURES) - used}"


def test_masking_is_the_same_on_both_sides() -> None:
    a = "searched 673,517 configurations in 0.36 s: 131,330 evaluated\n"
    b = "searched 673,517 configurations in 1.02 s: 131,330 evaluated\n"
    assert regen.mask(a) == regen.mask(b)
    assert regen.mask(a) != regen.mask(a.replace("673,517", "673,518"))
    row = "GPT-3 175B, 1,024 A100   torchtitan   3,889,819   67,888   0.52s    1.0s    0.04G  19.64"
    assert regen.mask(row) == regen.mask(row.replace("0.52s", "0.61s").replace("0.04G", "0.05G"))
    assert regen.mask(row) != regen.mask(row.replace("19.64", "19.65"))
    quality = "megatron2021_t1_1.7B    yes      3.85s     2.89s    1.33x  dp=32"
    assert regen.mask(quality) == quality  # published and planned step times: checked
    wall = "  wall 1.23 s (target 1.5 s), the three spaces 0.07 s of it; space 14,077,964"
    assert regen.mask(wall) == regen.mask(wall.replace("1.23", "1.4").replace("0.07", "0.1"))
    assert regen.mask(wall) != regen.mask(wall.replace("1.5 s", "2 s"))


def test_the_readme_is_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail to docs/"


def _headings(text: str) -> list[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"(?m)^## (.+)$", body)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("name", [n for n, p in zip(NAMES, DOCS, strict=True)
                                  if p.read_text().count("\n") > 100])
def test_long_documents_open_with_their_contents(name: str) -> None:
    """A "Contents" list links every section (## heading) of the document, in order."""
    text = (ROOT / name).read_text()
    headings = [h for h in _headings(text) if h != "Contents"]
    assert "## Contents" in text, name
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"(?m)^- \[(.+?)\]\(#([\w-]+)\)", contents)
    assert [t for t, _ in links] == headings, name
    assert [a for _, a in links] == [_anchor(h) for h in headings], name


def test_links_between_documents_resolve() -> None:
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target, anchor in re.findall(r"\]\(((?:\.\./|docs/)?[\w.-]+\.md)(?:#([\w-]+))?\)",
                                         text):
            linked = (path.parent / target).resolve()
            assert linked.is_file(), (path.name, target)
            if anchor:
                anchors = [_anchor(h) for h in re.findall(r"(?m)^#+ (.+)$", re.sub(
                    r"```.*?```", "", linked.read_text(), flags=re.S))]
                assert anchor in anchors, (path.name, target, anchor)

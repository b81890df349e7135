"""The house rules, checked on every change (shared/DESIGN.md, "Rules that keep the way short"):
no import circle between the modules of ``planner``, ``costmodel`` and ``hardware_profiles``
(every import counts: at the top, inside a function, under ``TYPE_CHECKING``), no module over
700 lines, no function over complexity 15 (ruff's C901, the McCabe number)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "costmodel", "hardware_profiles")
MAX_LINES = 700
MAX_COMPLEXITY = 15


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (a package is its
    ``__init__.py``)."""
    out = {}
    for package in PACKAGES:
        for f in sorted((root / package).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _top_names(tree: ast.Module, package: str, mods: dict[str, Path]) -> set[str]:
    """Names a package binds at its top level (its own attributes), but for its own
    submodules imported by their names (``from planner.cli import serve`` in
    planner/cli/__init__.py binds the submodule, which stays an edge to it)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == package):
            names.update(a.asname or a.name for a in node.names
                         if a.asname or f"{package}.{a.name}" not in mods)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """The modules and who imports whom, every ``import`` statement anywhere in a file.

    ``from a.b import c`` is an edge to ``a.b.c`` where ``c`` is a module that ``a.b`` does
    not shadow with a name of its own, else to ``a.b``; importing a submodule is not an edge
    to the packages above it (Python runs them, but they are the containers, not the
    dependency)."""
    mods = modules(root)
    trees = {m: ast.parse(f.read_text(), str(f)) for m, f in mods.items()}
    own = {m: _top_names(t, m, mods) for m, t in trees.items() if mods[m].name == "__init__.py"}
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, tree in trees.items():
        package = m if mods[m].name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = []
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    shadowed = a.name in own.get(base, set())
                    targets.append(sub if sub in mods and not shadowed else base)
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    g.add_edge(m, t)
    return g


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """The import circles: every strongly connected set of more than one module, with one
    circle through it to show."""
    out = []
    for scc in nx.strongly_connected_components(g):
        if len(scc) > 1:
            out.append(nx.find_cycle(g.subgraph(scc)))
    return out


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    shown = ["; ".join(f"{a} -> {b}" for a, b in c) for c in found]
    assert not found, "import circles (dependencies must point one way):\n" + "\n".join(shown)


def test_the_circle_check_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    """The check finds a circle closed by an import inside a function or under
    ``TYPE_CHECKING`` (what hides one from Python but not from a reader)."""
    pkg = tmp_path / "planner"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planner.b import x\n")
    (pkg / "b.py").write_text("def x():\n    from planner import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from planner.d import y\n")
    (pkg / "d.py").write_text("from .c import z\n")
    # A package that imports its own submodule by name, which lazily imports a module that
    # imports the package: planner.cli -> planner.cli.serve -> planner.web -> planner.cli.
    (pkg / "e").mkdir()
    (pkg / "e" / "__init__.py").write_text("from planner.e import f\n\ndef build():\n"
                                           "    pass\n")
    (pkg / "e" / "f.py").write_text("def run():\n    from planner import g\n")
    (pkg / "g.py").write_text("from planner.e import build\n")
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
        (tmp_path / other / "__init__.py").write_text("")
    found = {frozenset(a for a, _ in c) for c in cycles(import_graph(tmp_path))}
    assert found == {frozenset({"planner.a", "planner.b"}), frozenset({"planner.c", "planner.d"}),
                     frozenset({"planner.e", "planner.e.f", "planner.g"})}


def test_no_module_over_700_lines() -> None:
    long = {m: n for m, f in modules().items()
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along the domain): {long}"


def test_no_function_over_complexity_15() -> None:
    """ruff's C901 (McCabe) over the packages at the limit pyproject.toml sets."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", "--select", "C901", "--output-format", "concise",
                        *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    config = (ROOT / "pyproject.toml").read_text()
    assert f"max-complexity = {MAX_COMPLEXITY}" in config


if __name__ == "__main__":  # python tests/test_house.py: print the circles
    for c in cycles(import_graph()):
        print(" -> ".join(a for a, _ in c))
    sys.exit(0)

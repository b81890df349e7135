"""The notebooks run top to bottom against the public API (their code cells are executed)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, capsys) -> None:
    nb = json.loads(path.read_text())
    namespace: dict = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    assert capsys.readouterr().out.strip()


def test_there_is_a_notebook() -> None:
    assert NOTEBOOKS

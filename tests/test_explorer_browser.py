"""The explorer page in a real browser: headless Chromium (Debian's package, which .ci/run
installs) driven by Playwright. It fills the form for the quick-start job, checks the plan
shown equals `planner plan --json`, picks another configuration on the frontier and sees the
memory chart change, zooms the timeline, downloads the torchtitan file and parses it, sees a
bad value's message next to its field, and shows an MoE model and a traced module's saved
plan. Screenshots of each state go to the folder ``$PLANNER_SCREENSHOTS`` names (default:
``explorer-screenshots`` in the test's temporary folder; its path is printed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import run_planner

from planner import Plan, load_model
from planner.alternatives import describe
from planner.emit import read_back
from planner.web.server import make_server

pytestmark = pytest.mark.slow

#: Chromium's flags on a machine with no network beyond loopback and no display.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUICK = {"#f-model": "llama-3-70b", "#f-gpu": "h100-sxm", "#f-gpus": "64",
         "#f-gpus_per_node": "8", "#f-global_batch_size": "512", "#f-seq_len": "8192"}
QUICK_FLAGS = ["--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm",
               "--gpus-per-node", "8", "--global-batch-size", "512", "--seq-len", "8192"]


def _browser_or_skip() -> tuple[Any, str]:
    """Playwright and Chromium, or a skip (a failure where CI requires them)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if chromium and sync_playwright:
        return sync_playwright, chromium
    why = "the browser test needs Chromium (apt-get install chromium) and playwright"
    if os.environ.get("PLANNER_REQUIRE_BROWSER"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    srv = make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("PLANNER_SCREENSHOTS")
                  or tmp_path_factory.mktemp("explorer-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"explorer screenshots in {folder}")
    return folder


@pytest.fixture(scope="module")
def page(url: str) -> Iterator[Any]:
    sync_playwright, chromium = _browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(url)
        pg.wait_for_selector("body[data-ready]", timeout=60_000)  # the defaults' plan
        pg.errors = errors
        yield pg
        browser.close()
    assert not errors, errors


def _submit(pg: Any, fields: dict[str, str]) -> None:
    """Fill ``fields`` (selector -> value), press Plan and wait for the answer."""
    before = pg.evaluate("document.body.dataset.ready")
    for sel, value in fields.items():
        if pg.eval_on_selector(sel, "e => e.tagName") == "SELECT":
            pg.select_option(sel, value)
        else:
            pg.fill(sel, value)
    pg.click("#go")
    pg.wait_for_function(f"document.body.dataset.ready !== {json.dumps(before)} && "
                         "document.body.dataset.ready !== undefined", timeout=60_000)


def _wait_views(pg: Any) -> None:
    for sel in ("#frontier svg", "#fig-memory svg", "#fig-step svg", "#fig-timeline svg",
                "#whatif svg"):
        pg.wait_for_selector(sel, timeout=120_000)


def test_quick_start_plan_equals_the_cli(page: Any, shots: Path) -> None:
    _submit(page, QUICK)
    page.screenshot(path=str(shots / "1-plan.png"), full_page=True)
    cli = run_planner("plan", *QUICK_FLAGS, "--json")
    assert cli.returncode == 0, cli.stderr
    d = json.loads(cli.stdout)
    saved = Plan.from_json(cli.stdout)
    assert page.inner_text("#plan-config") == f"{d['framework']}: {describe(saved.config)}"
    assert float(page.get_attribute("#plan-step", "data-seconds")) == \
        d["estimate"]["step_time_s"]
    command = page.inner_text("#command").split()
    assert command[:2] == ["planner", "plan"]
    pairs = dict(zip(command[2::2], command[3::2], strict=True))
    assert pairs == dict(zip(QUICK_FLAGS[::2], QUICK_FLAGS[1::2], strict=True))


def test_frontier_selection_changes_the_memory_chart(page: Any, shots: Path) -> None:
    _wait_views(page)
    page.screenshot(path=str(shots / "2-frontier.png"), full_page=True)
    before = page.inner_html("#fig-memory")
    # The fitting dot with the least memory: a configuration other than the plan.
    dot = page.evaluate("""() => {
        const dots = [...document.querySelectorAll('#frontier circle.pt[data-fits="1"]')];
        dots.sort((a, b) => (+a.getAttribute('cx')) - (+b.getAttribute('cx')));
        return dots[0].dataset.i; }""")
    # Dots overlap: the click selects whichever is on top at that point, one of the
    # frontier's.
    page.click(f'#frontier circle.pt[data-i="{dot}"]', force=True)
    page.wait_for_function("(document.querySelector('#sel-config').dataset.cand || '')"
                           ".startsWith('front:')", timeout=30_000)
    assert page.inner_html("#fig-memory") != before
    assert page.inner_text("#sel-config") != page.inner_text("#plan-config")
    page.screenshot(path=str(shots / "3-selected.png"), full_page=True)
    # The timeline zooms: half the time shown after one press of +.
    page.click("#zoom-in")
    view = page.evaluate("document.querySelector('#fig-timeline svg').plannerView()")
    assert view["hi"] - view["lo"] == pytest.approx(view["span"] / 2)
    page.locator("#fig-timeline").screenshot(path=str(shots / "4-timeline-zoomed.png"))


def test_download_the_torchtitan_file(page: Any, tmp_path: Path) -> None:
    with page.expect_download() as info:
        page.click('#downloads button[data-target="torchtitan"]')
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    text = path.read_text()
    assert tomllib.loads(text)["parallelism"]
    back = read_back("torchtitan", text, load_model("llama-3-70b"))
    fields = json.loads(page.evaluate("JSON.stringify(document.querySelector('#sel-config')"
                                      ".dataset)"))
    assert fields["cand"].startswith("front:")
    sel = page.inner_text("#sel-config")
    assert f"tp={back.config.tp}" in sel and f"pp={back.config.pp}" in sel


def test_a_bad_value_shows_the_cli_message(page: Any, shots: Path) -> None:
    page.fill("#f-seq_len", "abc")
    page.click("#go")
    page.wait_for_function("document.body.dataset.ready === 'error'", timeout=30_000)
    shown = page.inner_text('.err[data-for="seq_len"]')
    cli = run_planner("plan", *QUICK_FLAGS[:-1], "abc")
    assert cli.returncode == 2 and shown == cli.stderr.strip()
    assert "Traceback" not in page.content()
    assert "bad" in (page.get_attribute("#f-seq_len", "class") or "")
    page.screenshot(path=str(shots / "5-bad-value.png"), full_page=True)


def test_an_moe_model(page: Any, shots: Path) -> None:
    _submit(page, {"#f-model": "mixtral-8x7b", "#f-gpus": "32", "#f-gpus_per_node": "8",
                   "#f-global_batch_size": "256", "#f-seq_len": "4096"})
    assert page.evaluate("document.body.dataset.ready") != "error"
    assert "ep=" in page.inner_text("#summary") or "ep=" in page.inner_text("#why")
    _wait_views(page)
    page.screenshot(path=str(shots / "6-moe.png"), full_page=True)


def test_a_traced_modules_saved_plan(page: Any, shots: Path, tmp_path: Path) -> None:
    saved = tmp_path / "vit-plan.json"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--model",
                        "planner.examples:ViT", "--gpus", "8", "--global-batch-size", "64",
                        "--input-shape", "8x3x32x32", "-o", str(saved)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    before = page.evaluate("document.body.dataset.ready")
    page.set_input_files("#f-planfile", str(saved))
    page.wait_for_function(f"document.body.dataset.ready !== {json.dumps(before)}",
                           timeout=60_000)
    d = json.loads(saved.read_text())
    assert page.inner_text("#plan-config").endswith(
        page.evaluate("document.querySelector('#sel-config').textContent.split(': ')[1]"))
    assert f"pp={d['config']['pp']}" in page.inner_text("#plan-config")
    _wait_views(page)
    page.screenshot(path=str(shots / "7-traced-plan.png"), full_page=True)


def test_a_cluster_preset(page: Any, shots: Path) -> None:
    """A cluster preset stands in for GPU x count x GPUs per node (which the page then
    leaves out, as the CLI takes one or the other)."""
    _submit(page, {"#f-model": "llama-3-8b", "#f-cluster": "dgx-h100", "#f-num_nodes": "2",
                   "#f-global_batch_size": "64", "#f-seq_len": "4096"})
    assert page.evaluate("document.body.dataset.ready") != "error"
    assert page.is_disabled("#f-gpus")
    command = page.inner_text("#command")
    assert "--cluster dgx-h100 --num-nodes 2" in command and "--gpus " not in command
    page.screenshot(path=str(shots / "8-cluster-preset.png"), full_page=True)

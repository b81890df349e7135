"""How fast the explorer page answers, measured in a real browser (Debian's Chromium driven by
Playwright, as tests/test_explorer_browser.py drives it).

For the README's quick-start job (Llama-3-70B, 64 H100, batch 512 x 8,192; the page's
defaults), each run starts a fresh server (nothing cached), opens the page and times:
- plan: from pressing Plan to the plan shown with its memory, step-time and timeline figures
  (target < 2 s on the 2-core development machine);
- frontier and what-if: until each background view is drawn (they show progress meanwhile).
The median and the worst of ``--runs`` runs are printed. ``--screenshot FILE`` also writes
the page once everything is drawn (docs/explorer.png is made this way).

    python benchmarks/explorer_speed.py [--runs N] [--screenshot FILE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time

from playwright.sync_api import sync_playwright

from planner.web import make_server

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def one_run(browser: object, screenshot: str | None) -> tuple[float, float, float]:
    """Seconds to the plan, the frontier and the what-if strip on a fresh server."""
    srv = make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    page = browser.new_page(viewport={"width": 1400, "height": 1250})  # type: ignore[attr-defined]
    try:
        page.goto(f"http://127.0.0.1:{srv.server_address[1]}/")
        page.wait_for_selector("body[data-ready]", timeout=60_000)  # the defaults' first plan
        # A fresh search of the same job: a new server holds nothing, so ask it again there.
        srv.explorer.problems.clear()
        t0 = time.perf_counter()
        page.click("#go")
        page.wait_for_function("document.body.dataset.ready === '2'", timeout=60_000)
        page.wait_for_selector("#fig-timeline svg")
        plan = time.perf_counter() - t0
        page.wait_for_selector("#frontier svg", timeout=120_000)
        front = time.perf_counter() - t0
        page.wait_for_selector("#whatif svg", timeout=120_000)
        whatif = time.perf_counter() - t0
        if screenshot:
            page.screenshot(path=screenshot)
        return plan, front, whatif
    finally:
        page.close()
        srv.shutdown()
        srv.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--screenshot", help="write the page's screenshot here (PNG)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("needs Chromium: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        times = [one_run(browser, args.screenshot if i == 0 else None)
                 for i in range(args.runs)]
        browser.close()
    print(f"explorer, quick-start job (llama-3-70b, 64 x h100-sxm, 512 x 8192), "
          f"{args.runs} runs on fresh servers")
    for k, name in enumerate(("plan shown (target < 2 s)", "frontier drawn", "what-if drawn")):
        col = [t[k] for t in times]
        print(f"  {name:28s} median {statistics.median(col):5.2f} s   worst {max(col):5.2f} s")


if __name__ == "__main__":
    main()

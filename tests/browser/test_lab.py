"""Notebooks 04 and 05 in JupyterLab, in a real browser, with the network closed (and every other
notebook opened, not run: it must stay unmodified on the "Python (btb)" kernel).

JupyterLab runs on the loopback interface on a copy of ``notebooks/`` (so autosave never touches the
repository); Debian's Chromium, driven by Playwright (no browser is downloaded), may reach only that
server: every other request is aborted and recorded. For each notebook the test checks that opening it
leaves it unmodified on the "Python (btb)" kernel, runs all cells, and asserts every chart rendered
(a Vega canvas or SVG, no error text); in notebook 05 it moves the X slider, presses Run and asserts
the explorer's output changed. The shipped ``figures/`` must be byte-identical afterwards.

Run with ``make test-browser`` (part of ``make test``); set ``BTB_BROWSER_SHOTS=DIR`` to keep
screenshots.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
#: Notebooks the test must open; others are copied too, so links between them work.
REQUIRED = ("04_btb_replay.ipynb", "05_threshold_explorer.ipynb")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_ALL_TIMEOUT_S = 420
ERROR_TEXT = ("Error loading script", "JavaScript Error", "Javascript Error", "Traceback",
              "Error displaying widget", "Failed to load model class")

playwright_sync = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[browser]'")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium on PATH: `make test-browser` installs Debian's chromium (apt-get, as root)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebooks/; yields (base_url, root)."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    root.mkdir()
    for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(nb, root / nb.name)
    port, token = _free_port(), "btb-browser-test"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BTB_")}
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), BTB_PROGRESS="0")
    # no "official Jupyter news?" prompt (it would fetch news from the internet if accepted)
    notif = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text('{"fetchNews": "false"}')
    # every cell stays in the page (no virtual scrolling), so every prompt and chart can be checked
    tracker = tmp / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"JupyterLab did not start:\n{(tmp / 'lab.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield base, token, root
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, lab):
    """A page that may reach only the Lab server; ``page.blocked`` lists every other request."""
    base, _, _ = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.blocked = []

    def route(r):
        if r.request.url.startswith(base) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            page.blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    yield page
    context.close()


def _shot(page, name):
    folder = os.environ.get("BTB_BROWSER_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)


def _open(page, lab, name):
    base, token, _ = lab
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset", wait_until="domcontentloaded")
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    panel.locator(".jp-Cell").first.wait_for(timeout=90_000)
    # the kernel has started and is idle
    deadline = time.monotonic() + 120
    name_box = page.locator(".jp-Toolbar-kernelName").first
    while time.monotonic() < deadline:
        if (name_box.count() and "No Kernel" not in name_box.inner_text() and page.locator(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']").count()):
            break
        time.sleep(0.5)
    _shot(page, f"{Path(name).stem}-opened")
    return panel


def _menu(page, top, item):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def _run_all(page, panel):
    _menu(page, "Run", "Run All Cells")
    deadline = time.monotonic() + RUN_ALL_TIMEOUT_S
    prompts = panel.locator(".jp-CodeCell .jp-InputArea-prompt")
    while time.monotonic() < deadline:
        texts = prompts.all_inner_texts()
        if texts and all(re.fullmatch(r"\[\d+\]:", t.strip()) for t in texts):
            return
        if panel.locator("[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback").count():
            break
        time.sleep(1)
    pytest.fail(f"cells did not all finish; prompts: {prompts.all_inner_texts()}\n"
                f"{panel.inner_text()[-3000:]}")


def _charts(scope):
    """Rendered Vega charts (a canvas or SVG inside a vega-embed container) in ``scope``."""
    return scope.locator(".vega-embed:has(canvas), .vega-embed:has(svg.marks)")


def _expected_charts(name: str) -> int:
    """Every figure a notebook saves must also be shown: at least one chart per save_chart call."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return sum(line.count("save_chart(") for c in cells if c["cell_type"] == "code"
               for line in "".join(c["source"]).splitlines()
               if not line.lstrip().startswith(("from ", "import ")))


def _assert_clean(page, panel, name):
    text = panel.inner_text()
    for bad in ERROR_TEXT:
        assert bad not in text, f"{name}: {bad!r} on the page:\n{text[-3000:]}"
    assert not page.blocked, f"{name}: the page tried to reach the network: {page.blocked[:5]}"


OTHERS = tuple(nb.name for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if nb.name not in REQUIRED)


@pytest.mark.parametrize("name", OTHERS)
def test_every_other_notebook_opens_unmodified(page, lab, name):
    """Opening a notebook (not running it) leaves it as committed, on the "Python (btb)" kernel."""
    _, _, root = lab
    before = (root / name).read_bytes()
    _open(page, lab, name)
    kernel = page.locator(".jp-Toolbar-kernelName").first.inner_text()
    assert "Python (btb)" in kernel, f"{name}: {kernel}"
    time.sleep(2)
    assert not page.locator(".jp-mod-dirty").count(), f"{name} marked modified just by opening it"
    assert (root / name).read_bytes() == before
    _assert_clean(page, page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)"), name)


@pytest.mark.parametrize("name", REQUIRED)
def test_open_run_all_charts_render(page, lab, name):
    _, _, root = lab
    before = (root / name).read_bytes()
    panel = _open(page, lab, name)
    # opening leaves the notebook as it is: asks for "Python (btb)", not marked modified
    kernel = page.locator(".jp-Toolbar-kernelName").first.inner_text()
    assert "Python (btb)" in kernel, kernel
    time.sleep(2)
    assert not page.locator(".jp-mod-dirty").count(), f"{name} marked modified just by opening it"
    assert (root / name).read_bytes() == before
    start = time.monotonic()
    _run_all(page, panel)
    print(f"{name}: run all took {time.monotonic() - start:.0f} s")
    _shot(page, f"{Path(name).stem}-run-all")
    charts = _charts(panel)
    expected = _expected_charts(name)
    deadline = time.monotonic() + 60
    while charts.count() < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert charts.count() >= expected >= 1, (
        f"{name}: {charts.count()} charts rendered, expected {expected}\n{panel.inner_text()[-2000:]}")
    _assert_clean(page, panel, name)
    if name.startswith("05"):
        _slider_and_run(page, panel)


def _slider_and_run(page, panel):
    ui = panel.locator(".widget-interact").first
    ui.scroll_into_view_if_needed()
    run = ui.locator("button", has_text=re.compile(r"^Run$"))
    out = ui.locator(".widget-output")
    run.click()
    _wait_chart(out, "X=2 ")
    first = out.inner_text()
    slider = ui.locator(".widget-slider", has=page.locator(".widget-label", has_text="X repeats"))
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    handle.focus()
    handle.press("ArrowRight")
    assert slider.locator(".widget-readout").inner_text().strip() == "3"
    run.click()
    _wait_chart(out, "X=3 ")
    _shot(page, "05-slider-run")
    assert out.inner_text() != first
    _assert_clean(page, panel, "05 explorer")


def _wait_chart(out, title):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _charts(out).count() and title in out.inner_text():
            return
        time.sleep(0.5)
    pytest.fail(f"the explorer did not redraw with {title!r}:\n{out.inner_text()[-2000:]}")


def test_figures_untouched(lab):
    """Running notebooks in Lab writes nowhere in figures/ (only `make reproduce` does)."""
    assert _digest(REPO / "figures") == FIGURES_BEFORE


FIGURES_BEFORE = _digest(REPO / "figures")

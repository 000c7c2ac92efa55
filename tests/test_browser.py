"""The workbench in a real browser (headless Chromium driven by selenium): a notebook opened in
JupyterLab, run, its slider moved and its output seen to change; the report rendered with its
tables and figures, every link resolving, a screenshot taken.

`make test` installs Debian's chromium and chromium-driver (as root, where apt-get works);
elsewhere these tests skip and say so. In CI (``CI`` set) a missing browser fails instead, so the
browser tests cannot pass there by being skipped."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_lab import free_port, stop_group

ROOT = Path(__file__).resolve().parents[1]


def _browser_paths():
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                   if shutil.which(n)), None)
    return chrome, shutil.which("chromedriver")


@pytest.fixture(scope="module")
def driver():
    chrome, chromedriver = _browser_paths()
    missing = [n for n, p in (("chromium", chrome), ("chromedriver", chromedriver)) if p is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        msg = (f"no headless browser: {', '.join(missing)} not installed (`make test` installs "
               "Debian's chromium and chromium-driver when run as root)")
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(msg + "; in CI the browser tests must run, not skip")
        pytest.skip(msg)
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not look for drivers online
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    d = webdriver.Chrome(options=opts, service=Service(executable_path=chromedriver))
    d.set_page_load_timeout(120)
    yield d
    d.quit()


def _wait(fn, timeout: float, what: str, step: float = 0.5, diagnose=None):
    t0 = time.time()
    while True:
        try:
            out = fn()
        except Exception:  # the page is still building itself
            out = None
        if out:
            return out
        if time.time() - t0 > timeout:
            seen = f"; the page shows: {diagnose()}" if diagnose else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
        time.sleep(step)


def _png_is_not_blank(path: Path) -> bool:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)  # (H, W, C) floats
    return img.shape[0] > 100 and img.shape[1] > 100 and float(img[..., :3].std()) > 0.02


def test_report_renders_with_tables_figures_and_links(driver, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from test_pipeline import make_repo

    from agentrl_lib import cli
    from agentrl_lib.pipeline.report import broken_links

    root = make_repo(tmp_path)
    monkeypatch.chdir(root)
    for s in (0, 1):
        assert cli.main(["run", "00", "--seed", str(s), "--quiet"]) == 0
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [0, 1, 4])
    (root / "runs/ci/00_toy/seed0/figures").mkdir()
    fig.savefig(root / "runs/ci/00_toy/seed0/figures/curve.png")
    assert cli.main(["report"]) == 0
    index = root / "report/index.html"
    assert broken_links(index) == []

    driver.get(index.as_uri())
    assert "agentrl" in driver.title
    tables = driver.find_elements("css selector", "table")
    # the scoreboard opens the page, then each notebook's table of claims
    assert len(tables) >= 2 and "Scoreboard" in driver.page_source
    assert "00_toy" in tables[0].text and "fidelity" in tables[0].text
    assert "total is positive" in tables[1].text and "holds" in tables[1].text
    imgs = driver.find_elements("css selector", "img")
    assert imgs and all(driver.execute_script("return arguments[0].naturalWidth", i) > 100
                        for i in imgs)  # every figure decoded
    shot = tmp_path / "report.png"
    driver.save_screenshot(str(shot))
    assert _png_is_not_blank(shot)
    # every link of the page resolves in the browser too: the executed notebooks open
    hrefs = [a.get_attribute("href") for a in driver.find_elements("css selector", "a")]
    anchors = [h for h in hrefs if h.startswith("file:") and "#" in h]  # the scoreboard's
    assert [h.split("#")[1] for h in anchors] == ["00_toy"]
    assert driver.find_elements("id", "00_toy")  # the section it links to
    local = [h for h in hrefs if h.startswith("file:") and "#" not in h]
    assert len(local) == 2  # seed 0 and seed 1
    for h in local:
        driver.get(h)
        assert "total is positive" in driver.find_element("tag name", "body").text


def test_slider_changes_the_view_in_jupyterlab(driver, tmp_path):
    """Notebook 01 opened in JupyterLab, run with Run All, its gamma slider dragged: the figure
    the interactive view draws must change."""
    port = free_port()
    # a person's session: not headless (the test suite's default), the kernel's own backend
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENTRL_HEADLESS", "CI", "MPLBACKEND")}
    env["AGENTRL_RUNS_ROOT"] = str(tmp_path / "runs")  # the notebook's results stay out of runs/
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         "--ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.open_browser=False",
         "--allow-root"],
        cwd=ROOT / "notebooks", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: urllib.request.urlopen(f"{base}/api/status", timeout=5).status == 200, 120,
              "the JupyterLab server")
        driver.get(f"{base}/lab/tree/01_mdp_dynamic_programming.ipynb")
        _wait(lambda: driver.find_elements("css selector", ".jp-Notebook .jp-Cell"), 120,
              "the notebook to open")
        # JupyterLab may ask which kernel to start: take the one it offers (the notebook's)
        t0 = time.time()
        while time.time() - t0 < 30:
            accept = driver.find_elements("css selector", ".jp-Dialog .jp-mod-accept")
            if accept:
                accept[0].click()
                break
            if driver.find_elements("css selector", ".jp-Notebook-ExecutionIndicator"
                                    "[data-status='idle']") and time.time() - t0 > 10:
                break
            time.sleep(0.5)
        _wait(lambda: driver.execute_script(
            "const s = document.querySelector('.jp-Notebook-ExecutionIndicator');"
            "return s && s.getAttribute('data-status') === 'idle';"), 120, "an idle kernel")
        # Run > Run All Cells, through the menu as a person would
        menu = _wait(lambda: [m for m in driver.find_elements("css selector", ".lm-MenuBar-item")
                              if m.text.strip() == "Run"], 30, "the Run menu")[0]
        menu.click()
        item = _wait(lambda: driver.find_element(
            "css selector", "li.lm-Menu-item[data-command='runmenu:run-all']"), 30,
            "Run All Cells")
        item.click()
        handle = _wait(lambda: driver.find_element(
            "css selector", ".widget-interact .widget-slider .noUi-handle"), 300,
            "the interactive view's slider (the notebook runs its ci profile first)",
            diagnose=lambda: (driver.save_screenshot("/tmp/agentrl-lab-failure.png"),
                              driver.execute_script(
                "return Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                ".map(e => e.innerText.slice(0, 200)).join(' | ')"))[1])
        view = driver.find_element("css selector", ".widget-interact")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", view)
        before = _wait(lambda: view.find_element("css selector", "img").get_attribute("src"),
                       60, "the view's first figure")
        readout = view.find_element("css selector", ".widget-readout").text
        from selenium.webdriver import ActionChains

        ActionChains(driver).drag_and_drop_by_offset(handle, -120, 0).perform()
        _wait(lambda: view.find_element("css selector", ".widget-readout").text != readout, 30,
              "the slider's readout to move")
        after = _wait(lambda: (lambda s: s if s and s != before else None)(
            view.find_element("css selector", "img").get_attribute("src")), 60,
            "the figure to change after the slider moved")
        assert after != before
        shot = tmp_path / "lab.png"
        driver.save_screenshot(str(shot))
        assert _png_is_not_blank(shot)
    finally:
        stop_group(proc)

"""`make lab`, the README's command to learn: it sets up, fills the base-model cache and serves
JupyterLab on notebooks/ with the widget extension. Started here on a free local port without a
browser; the page, the notebooks and the widget manager must be there."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen) -> None:
    """End a server started with ``start_new_session=True`` and everything it started."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_the_notebooks_with_widgets():
    if not (ROOT / ".venv/bin/jupyter").exists():
        pytest.skip("no .venv here: `make lab` is tested where `make test` set it up")
    port = free_port()
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_ARGS=--no-browser --port={port} --ip=127.0.0.1 "
         "--IdentityProvider.token= --ServerApp.open_browser=False"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                page = get(f"{base}/lab")
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    out = proc.stdout.read() if proc.poll() is not None else ""
                    pytest.fail(f"make lab did not serve {base}/lab: {out[-2000:]}")
                time.sleep(1)
        assert "@jupyter-widgets/jupyterlab-manager" in page  # ipywidgets render in the lab
        names = {c["name"] for c in json.loads(get(f"{base}/api/contents/"))["content"]}
        assert "01_mdp_dynamic_programming.ipynb" in names and "README.md" in names
    finally:
        stop_group(proc)

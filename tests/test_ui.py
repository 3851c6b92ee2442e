"""The Dagster UI in a real browser: headless Chromium (Debian's `chromium` package, driven by
Playwright; browsers are never downloaded) against `dagster dev` on a free port.

The asset graph lists every asset; a materialization launched from the UI for one partition
succeeds; that asset's page then shows its plot. Screenshots go to the test's tmp folder.
Skipped, saying why, only when Chromium is missing (`apt-get install chromium`).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines.definitions import ALL_ASSETS
from tests.conftest import ROOT, write_edges

CHROMIUM = Path(os.environ.get("GNNFLOW_CHROMIUM", "/usr/lib/chromium/chromium"))

pytestmark = pytest.mark.skipif(
    not CHROMIUM.is_file(), reason=f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


@pytest.fixture
def dagster_dev(tmp_path):
    """`dagster dev` on a free port over a temporary DAGSTER_HOME with one landing dataset `tiny`."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "pipelines" / "dagster.yaml", home / "dagster.yaml")
    landing = tmp_path / "landing"
    write_edges(landing / "tiny" / "edges.parquet", [0, 1, 2, 3, 4], [1, 2, 3, 4, 0])
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GNNFLOW_HOME": str(tmp_path / "gnnflow"),
        "GNNFLOW_LANDING": str(landing),
    }
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "gnnflow"), "datasets", "sync"], env=env, cwd=ROOT, check=True, timeout=120)
    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "wb")
    proc = subprocess.Popen(
        [str(bin_dir / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/server_info", proc, 180)
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_ui_lists_assets_launches_a_partition_and_shows_its_plot(dagster_dev):
    from playwright.sync_api import expect, sync_playwright

    url, tmp = dagster_dev
    names = [spec.key.to_user_string() for a in ALL_ASSETS for spec in a.specs]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(60_000)

        page.goto(f"{url}/asset-groups")
        for name in names:  # the global asset graph shows a node per asset
            expect(page.get_by_text(name, exact=True).first).to_be_visible()
        page.screenshot(path=str(tmp / "asset_graph.png"))

        # launch canonical_graph for the partition `tiny` from the asset's page
        page.goto(f"{url}/assets/canonical_graph")
        page.get_by_role("button", name="Materialize", exact=True).click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        dialog.get_by_text("tiny", exact=True).first.wait_for()
        page.screenshot(path=str(tmp / "launch_dialog.png"))
        dialog.get_by_role("button", name="Launch 1 run").click()

        # the run finishes and the asset's page shows the materialization with its plot
        deadline = time.monotonic() + 120
        plot = page.locator('img[alt="degree distribution"]')
        while time.monotonic() < deadline:
            page.goto(f"{url}/assets/canonical_graph?view=events&partition=tiny")
            if (tmp / "gnnflow" / "tiny" / "canonical_graph" / "summary.json").is_file() and plot.count():
                break
            time.sleep(3)
        page.screenshot(path=str(tmp / "materialized.png"), full_page=True)
        assert (tmp / "gnnflow" / "tiny" / "canonical_graph" / "summary.json").is_file(), "the run did not finish"
        expect(plot.first).to_be_visible()
        browser.close()

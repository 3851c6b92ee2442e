"""The Dagster UI in a real browser: headless Chromium (Debian's `chromium` package, driven by
Playwright; browsers are never downloaded) against `dagster dev` on a free port.

The asset graph lists every asset; a materialization launched from the UI for one partition
succeeds; that asset's page then shows its plot. Screenshots go to the test's tmp folder.
Skipped, saying why, only when Chromium is missing (`apt-get install chromium`).
"""

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


def _wait_for_ui_run(dagster_home: Path, deadline: float):
    """The finished run of canonical_graph that no sensor or schedule requested."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(dagster_home))
    done = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
    while True:
        runs = [
            r
            for r in instance.get_runs()
            if "dagster/sensor_name" not in r.tags and "dagster/schedule_name" not in r.tags
        ]
        finished = [r for r in runs if r.status in done]
        if finished:
            return finished[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no UI-launched run finished; runs: {[(r.run_id, r.status) for r in runs]}")
        time.sleep(2)


def _dismiss_welcome(page) -> None:
    """Close the first-visit welcome dialog of a fresh DAGSTER_HOME, when it shows."""
    skip = page.get_by_role("button", name="Skip", exact=True)
    try:
        skip.wait_for(timeout=10_000)
    except Exception:
        return
    skip.click()


def test_ui_lists_assets_launches_a_partition_and_shows_its_plot(dagster_dev):
    from playwright.sync_api import expect, sync_playwright

    url, tmp = dagster_dev
    groups: dict[str, list[str]] = {}
    for a in ALL_ASSETS:
        for spec in a.specs:
            groups.setdefault(spec.group_name, []).append(spec.key.to_user_string())
    assert sum(len(m) for m in groups.values()) == 10  # edge_split: a second asset of the normalized_adjacency step
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)

        page.goto(f"{url}/asset-groups")
        _dismiss_welcome(page)
        for group in groups:  # the global lineage shows every group (collapsed)...
            expect(page.get_by_role("button", name=f"asset_group {group} {group}")).to_be_visible()
        page.screenshot(path=str(tmp / "lineage.png"))
        for group, members in groups.items():  # ...and each group's graph a node per asset
            page.goto(f"{url}/locations/gnnflow/asset-groups/{group}")
            for name in members:
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            page.screenshot(path=str(tmp / f"asset_graph_{group}.png"))

        # launch canonical_graph for the partition `tiny` from the asset's page
        page.goto(f"{url}/assets/canonical_graph")
        try:
            page.get_by_role("button", name=re.compile(r"^(materialization )?Materialize")).first.click()
            dialog = page.get_by_role("dialog")
            expect(dialog).to_be_visible()
            dialog.get_by_role("button", name="All", exact=True).click()  # every partition: just `tiny`
            expect(dialog.get_by_text("1 partition", exact=True)).to_be_visible()
            page.screenshot(path=str(tmp / "launch_dialog.png"))
            dialog.get_by_role("button", name=re.compile(r"^Launch")).last.click()
        except Exception:
            page.screenshot(path=str(tmp / "launch_failed.png"))
            raise

        # the run launched from the UI (not one of the landing sensor's) succeeds
        ui_run = _wait_for_ui_run(tmp / "dagster_home", deadline=time.monotonic() + 150)
        page.screenshot(path=str(tmp / "launched.png"))
        assert ui_run.status.value == "SUCCESS", f"run {ui_run.run_id} from the UI ended {ui_run.status}"
        assert ui_run.tags.get("dagster/partition") == "tiny" or "dagster/backfill" in ui_run.tags

        # the asset's page shows the materialization's degree plot
        page.goto(f"{url}/assets/canonical_graph?view=events&partition=tiny")
        row = page.get_by_role("row", name=re.compile(r"^degree_distribution")).first
        row.get_by_text("[Show Markdown]").click()  # the metadata table opens the inline PNG in a dialog
        plot = page.get_by_role("dialog").locator('img[alt="degree distribution"]').first
        expect(plot).to_be_visible()
        assert plot.evaluate("img => img.naturalWidth") > 100  # the PNG decoded, not a broken image
        page.screenshot(path=str(tmp / "materialized.png"), full_page=True)
        browser.close()

"""The README's command-line section, run as written against a temporary DAGSTER_HOME.

Reproduces the trap first: a backfill queued with `-m pipelines.definitions` named a code
location the daemon serving `workspace.yaml` does not have, so its runs failed with
DagsterCodeLocationNotFoundError. Here every README command of that section runs verbatim
(only `.venv/bin/` becomes this interpreter's folder): `gnnflow datasets sync`, one asset for
one partition, the sensor stopped, a job backfill over two datasets executed by `dagster-daemon
run` (started for the test, its process group killed at teardown), and the files of each dataset
are checked; the schedule started; `make ui` and `make ui PORT=...` dry-run. Bad input and a
missing DAGSTER_HOME end with a line that says what is wrong. tests/test_readme.py checks that
every command of the README's bash blocks is one that a test runs.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_edges

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line:
                lines.append(line)
    return lines


def readme_command(prefix: str) -> list[str]:
    """The one README command starting with `prefix`, as argv with `.venv/bin/` -> this venv."""
    found = [c for c in readme_commands() if c.startswith(prefix)]
    assert found, f"the README has no command starting with {prefix!r}"
    argv = shlex.split(found[0])
    argv[0] = str(BIN / Path(argv[0]).name) if argv[0].startswith(".venv/bin/") else argv[0]
    return argv


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    landing = tmp_path / "landing"
    write_edges(landing / "mydata" / "edges.parquet", [10, 11, 12, 13], [11, 12, 13, 10])
    write_edges(landing / "otherdata" / "edges" / "0.parquet", ["a", "b"], ["b", "c"], pa.string())
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GNNFLOW_HOME": str(tmp_path / "gnnflow"),
        "GNNFLOW_LANDING": str(landing),
    }


def _run(argv, env, timeout=300):
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def daemon():
    """Start `dagster-daemon run` (the README's command) in its own process group; kill it after."""
    procs = []

    def start(env, log: Path):
        argv = readme_command(".venv/bin/dagster-daemon run")
        with open(log, "w") as f:
            procs.append(
                subprocess.Popen(argv, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            )
        return procs[-1]

    yield start
    for p in procs:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def test_readme_cli_section_runs_as_written(tmp_path, env, daemon):
    sync = _run(readme_command(".venv/bin/gnnflow datasets sync"), env)
    assert sync.returncode == 0, sync.stderr
    assert "newly registered: mydata, otherdata" in sync.stdout

    # one asset, one partition: in the shell's process, nothing else running
    one = _run(readme_command(".venv/bin/gnnflow launch --assets canonical_graph"), env)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    gnn = Path(env["GNNFLOW_HOME"])
    assert pq.read_table(gnn / "mydata" / "canonical_graph" / "edges.parquet").num_rows == 8
    assert not (gnn / "otherdata").exists()

    # the backfill: queued under the UI's code location, executed by the daemon
    stop = _run(readme_command(".venv/bin/dagster sensor stop landing_sensor"), env)
    assert stop.returncode == 0, stop.stderr[-2000:]  # the test checks the backfill's runs alone
    assert _instigator_status(env, "landing_sensor") == "STOPPED"
    backfill = _run(readme_command(".venv/bin/dagster job backfill"), env)
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    daemon(env, tmp_path / "daemon.log")
    deadline = time.time() + 420
    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        while True:
            runs = [r for r in instance.get_runs() if "dagster/backfill" in r.tags]
            if len(runs) == 2 and all(r.is_finished for r in runs):
                break
            assert time.time() < deadline, (runs, (tmp_path / "daemon.log").read_text()[-4000:])
            time.sleep(2)
        assert {r.tags["dagster/partition"]: r.status for r in runs} == {
            "mydata": dg.DagsterRunStatus.SUCCESS,
            "otherdata": dg.DagsterRunStatus.SUCCESS,
        }, (tmp_path / "daemon.log").read_text()[-4000:]
        assert {r.job_name for r in runs} == {"ingest"}
        assert {r.remote_job_origin.location_name for r in runs} == {"gnnflow"}
    assert pq.read_table(gnn / "mydata" / "canonical_graph" / "edges.parquet").num_rows == 8
    nodes = pq.read_table(gnn / "otherdata" / "canonical_graph" / "nodes.parquet")
    assert nodes.column("original_id").to_pylist() == ["a", "b", "c"]
    report = _run(readme_command(".venv/bin/gnnflow backfills"), env)
    assert report.returncode == 0 and "ingest [mydata,otherdata] succeeded: 2 runs" in report.stdout, report.stdout

    # the same backfill once otherdata's file is bad: reported as failed, with the cause
    pq.write_table(
        pa.table({"from": ["a"], "to": ["b"]}), Path(env["GNNFLOW_LANDING"]) / "otherdata" / "edges" / "0.parquet"
    )
    assert _run(readme_command(".venv/bin/dagster job backfill"), env).returncode == 0
    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        while not (len(runs := instance.get_runs()) >= 5 and all(r.is_finished for r in runs)):
            assert time.time() < deadline, (tmp_path / "daemon.log").read_text()[-4000:]
            time.sleep(2)
    report = _run(readme_command(".venv/bin/gnnflow backfills"), env)
    assert report.returncode == 1, report.stdout + report.stderr
    newest = report.stdout.splitlines()
    assert "ingest [mydata,otherdata] failed: 1 of 2 runs failed" in newest[0], newest
    assert newest[1].startswith("  canonical_graph (otherdata) failed: ") and "missing column 'src'" in newest[1], (
        newest
    )
    assert "succeeded: 2 runs" in newest[2]  # the first backfill, as it ended


def test_bad_input_and_a_missing_dagster_home_end_with_the_cause(tmp_path, env):
    """A bad file: a few lines, the error on one line, no stack trace, no Dagster notice, the cause
    last; a dataset not yet synced and a missing DAGSTER_HOME: the hint, exit code 2."""
    pq.write_table(
        pa.table({"src": [1, 2], "dst": [2.5, 3.0]}), Path(env["GNNFLOW_LANDING"]) / "mydata" / "edges.parquet"
    )
    argv = readme_command(".venv/bin/gnnflow launch --assets canonical_graph")
    unsynced = _run(argv, env)
    assert unsynced.returncode == 2 and "`gnnflow datasets sync`" in unsynced.stderr, unsynced.stderr
    assert _run(readme_command(".venv/bin/gnnflow datasets sync"), env).returncode == 0
    bad = _run(argv, env)
    assert bad.returncode == 1
    lines = (bad.stdout + bad.stderr).strip().splitlines()
    assert len(lines) <= 12 and not [line for line in lines if "Stack Trace" in line or "Traceback" in line], lines
    assert not [line for line in lines if "superseded" in line], lines
    cause = bad.stderr.strip().splitlines()[-2]
    assert cause.startswith("gnnflow: canonical_graph (mydata) failed:"), cause
    assert "edges.parquet: column 'dst' has type double" in cause
    verbose = _run([*argv, "--verbose"], env)
    assert "Stack Trace" in verbose.stderr and verbose.returncode == 1

    # the dagster CLI itself: the datasets-sync hint as its last line, whatever DAGSTER_HOME is
    dagster_cli = [str(BIN / "dagster"), "asset", "materialize", "-m", "pipelines.definitions"]
    lost = _run([*dagster_cli, "--select", "canonical_graph", "--partition", "notsynced"], env)
    assert lost.returncode != 0 and "`gnnflow datasets sync`" in lost.stderr.strip().splitlines()[-1]
    no_home = {k: v for k, v in env.items() if k != "DAGSTER_HOME"}
    sync = _run(readme_command(".venv/bin/gnnflow datasets sync"), no_home)
    assert sync.returncode == 2 and "DAGSTER_HOME is not set" in sync.stderr
    for command in (argv, [*dagster_cli, "--select", "canonical_graph", "--partition", "mydata"]):
        lost = _run(command, no_home)
        assert lost.returncode != 0
        assert "DAGSTER_HOME is not set" in lost.stderr.strip().splitlines()[-1]


def _instigator_status(env, name: str) -> str:
    """RUNNING or STOPPED: the stored state of a schedule or sensor in env's DAGSTER_HOME."""
    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        states = {s.instigator_name: s.status.value for s in instance.all_instigator_state()}
    return states.get(name, "not stored")


def test_readme_schedule_command_starts_the_retrain_schedule(env):
    assert _instigator_status(env, "retrain_schedule") == "not stored"  # stopped by default
    start = _run(readme_command(".venv/bin/dagster schedule start retrain_schedule"), env)
    assert start.returncode == 0 and "Started schedule retrain_schedule" in start.stdout, start.stderr[-2000:]
    assert _instigator_status(env, "retrain_schedule") == "RUNNING"


def test_make_ui_takes_a_port():
    """The README's `make ui` commands, dry-run: the UI on 127.0.0.1, port 3000 unless PORT= names one."""
    commands = [c for c in readme_commands() if c.startswith("make ui")]
    assert len(commands) >= 2 and any("PORT=" in c for c in commands), commands
    for command in commands:
        argv = shlex.split(command)
        port = next((a.split("=", 1)[1] for a in argv if a.startswith("PORT=")), "3000")
        env = {k: v for k, v in os.environ.items() if k != "PORT"}  # the Makefile's `PORT ?= 3000`
        dry = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert f"dagster dev -w workspace.yaml -h 127.0.0.1 -p {port}" in dry.stdout, (command, dry.stdout)

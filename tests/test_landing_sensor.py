"""The landing sensor requests runs for real changes only, once the files are stable.

Each test reproduces a trap first: a dataset ingested by `make demo` or by a tuned CLI run was
re-run (with default settings) the first time `make ui` started the sensor, and a file still
being copied triggered a run on half a file.
"""

import json
import logging
import os
import time

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import LANDING_FINGERPRINT, dataset_partitions, ingested_fingerprint
from graphs.stages.canonical import READY_MARKER, landing_fingerprint
from pipelines.definitions import ALL_ASSETS
from pipelines.sensors import make_landing_sensor
from tests.conftest import write_edges


def _tick(sensor, instance, storage, cursor=None):
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources={"storage": storage}))


def _ingest(instance, storage, name, run_config=None):
    result = dg.materialize(
        [canonical_graph],
        partition_key=name,
        instance=instance,
        resources={"storage": storage},
        run_config=run_config,
    )
    assert result.success


def _touch_later(path):
    """Bump mtime by a second: file systems with coarse timestamps still see a change."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_datasets_ingested_outside_the_sensor_request_nothing(tmp_path, storage, instance):
    """`make demo` / a tuned CLI run, then `make ui`: the sensor's first ticks launch nothing."""
    landing = tmp_path / "landing"
    write_edges(landing / "tuned" / "edges.parquet", [1, 2, 3], [2, 3, 1])
    write_edges(landing / "demo" / "edges" / "0.parquet", ["a", "b"], ["b", "c"], pa.string())
    instance.add_dynamic_partitions(dataset_partitions.name, ["tuned", "demo"])
    _ingest(instance, storage, "demo")
    _ingest(instance, storage, "tuned", {"ops": {"canonical_graph": {"config": {"symmetrize": False}}}})
    assert ingested_fingerprint(instance, "tuned") == landing_fingerprint(landing / "tuned")

    sensor = make_landing_sensor(ALL_ASSETS)
    first = _tick(sensor, instance, storage)  # a fresh sensor: no cursor, as at the first `make ui`
    second = _tick(sensor, instance, storage, first.cursor)
    assert first.run_requests == [] and second.run_requests == []
    assert first.dynamic_partitions_requests == []
    assert json.loads(second.cursor) == {"pending": {}, "requested": {}}


def test_a_file_added_then_changed_mid_copy_runs_once_it_is_stable(tmp_path, storage, instance):
    landing = tmp_path / "landing" / "ds"
    write_edges(landing / "edges" / "a.parquet", [1, 2], [2, 3])
    instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    _ingest(instance, storage, "ds")
    sensor = make_landing_sensor(ALL_ASSETS)
    quiet = _tick(sensor, instance, storage)
    assert quiet.run_requests == []

    # a file appears (the copy has just started) ...
    part = write_edges(landing / "edges" / "b.parquet", [3], [4])
    t1 = _tick(sensor, instance, storage, quiet.cursor)
    assert t1.run_requests == []
    assert json.loads(t1.cursor)["pending"] == {"ds": landing_fingerprint(landing)}
    # ... and is still growing at the next tick
    write_edges(part, [3, 4, 5], [4, 5, 6])
    _touch_later(part)
    t2 = _tick(sensor, instance, storage, t1.cursor)
    assert t2.run_requests == []
    # unchanged across two ticks: one run, for this dataset, keyed by the files it saw
    t3 = _tick(sensor, instance, storage, t2.cursor)
    assert [r.partition_key for r in t3.run_requests] == ["ds"]
    assert t3.run_requests[0].run_key == f"ds:{landing_fingerprint(landing)}"
    # not again while that run is pending (or after it failed) for the same files
    t4 = _tick(sensor, instance, storage, t3.cursor)
    assert t4.run_requests == []
    # once ingested, the dataset is quiet and leaves the cursor
    _ingest(instance, storage, "ds")
    t5 = _tick(sensor, instance, storage, t4.cursor)
    assert t5.run_requests == [] and json.loads(t5.cursor) == {"pending": {}, "requested": {}}
    edges = pq.read_table(tmp_path / "home" / "ds" / "canonical_graph" / "edges.parquet")
    assert edges.num_rows == 2 * 5  # 1-2, 2-3, 3-4, 4-5, 5-6 in both directions: the whole copy


def test_a_success_marker_runs_at_once_and_a_stale_one_does_not(tmp_path, storage, instance):
    landing = tmp_path / "landing" / "ds"
    write_edges(landing / "edges.parquet", [1, 2], [2, 3])
    instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    _ingest(instance, storage, "ds")
    sensor = make_landing_sensor(ALL_ASSETS)

    # the marker left from an earlier copy is older than the new file: wait for stability
    (landing / READY_MARKER).write_text("")
    time.sleep(0.01)
    new = write_edges(landing / "edges.parquet", [1, 2, 7], [2, 3, 8])
    _touch_later(new)
    stale = _tick(sensor, instance, storage)
    assert stale.run_requests == []
    # a copy that writes the marker last is complete: requested on the first tick
    (landing / READY_MARKER).write_text("")
    os.utime(landing / READY_MARKER, ns=(new.stat().st_mtime_ns, new.stat().st_mtime_ns))
    ready = _tick(sensor, instance, storage)
    assert [r.partition_key for r in ready.run_requests] == ["ds"]


def test_canonical_graph_records_the_fingerprint_of_the_files_it_read(tmp_path, storage, instance):
    write_edges(tmp_path / "landing" / "ds" / "edges.parquet", [1], [2])
    instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    result = dg.materialize([canonical_graph], partition_key="ds", instance=instance, resources={"storage": storage})
    mat = result.asset_materializations_for_node("canonical_graph")[0]
    assert mat.metadata[LANDING_FINGERPRINT].value == landing_fingerprint(tmp_path / "landing" / "ds")
    assert ingested_fingerprint(instance, "ds") == mat.metadata[LANDING_FINGERPRINT].value
    assert ingested_fingerprint(instance, "other") is None


class _ListHandler(logging.Handler):
    def __init__(self, records: list):
        super().__init__()
        self.records = records

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("broken", ["dangling_symlink", "fifo_nodes", "link_out_of_landing"])
def test_one_broken_dataset_folder_never_stops_the_sensor_for_the_others(tmp_path, storage, instance, broken):
    landing = tmp_path / "landing"
    write_edges(landing / "good" / "edges.parquet", [1, 2], [2, 3])
    write_edges(landing / "bad" / "edges" / "a.parquet", [1, 2], [2, 3])
    write_edges(tmp_path / "outside.parquet", [1], [2])
    entry = {
        "dangling_symlink": landing / "bad" / "edges" / "b.parquet",
        "fifo_nodes": landing / "bad" / "nodes.parquet",
        "link_out_of_landing": landing / "bad" / "features.parquet",
    }[broken]
    if broken == "fifo_nodes":
        os.mkfifo(entry)
    else:
        entry.symlink_to(tmp_path / ("gone.parquet" if broken == "dangling_symlink" else "outside.parquet"))
    (landing / "good" / READY_MARKER).write_text("")
    (landing / "bad" / READY_MARKER).write_text("")
    sensor = make_landing_sensor(ALL_ASSETS)
    context = dg.build_sensor_context(instance=instance, resources={"storage": storage})
    records = []
    context.log.addHandler(_ListHandler(records))
    tick = sensor(context)
    assert sorted(tick.dynamic_partitions_requests[0].partition_keys) == ["bad", "good"]  # both registered
    assert [r.partition_key for r in tick.run_requests] == ["good"]
    warnings = [r.getMessage() for r in records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"dataset 'bad' skipped: {entry}: " in warnings[0]
    # fixed: the next tick requests it
    entry.unlink()
    fixed = _tick(sensor, instance, storage, tick.cursor)
    assert [r.partition_key for r in fixed.run_requests] == ["bad"]


def test_a_refused_dataset_alone_is_named_in_the_skip_reason(tmp_path, storage, instance):
    landing = tmp_path / "landing"
    write_edges(landing / "bad" / "edges.parquet", [1], [2])
    instance.add_dynamic_partitions(dataset_partitions.name, ["bad"])
    os.mkfifo(landing / "bad" / "features.parquet")
    tick = _tick(make_landing_sensor(ALL_ASSETS), instance, storage)
    assert tick.run_requests == [] and tick.skip_reason.skip_message == "refused (see the warnings): bad"

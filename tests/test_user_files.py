"""Files as users have them: a column mapping in gnnflow.yaml, CSV / TSV / SNAP-style edge lists,
categorical labels mapped to classes (and back to the user's values when scoring), integral
float labels from CSV, content fingerprints, and the sensor's "has labels" question."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphs.stages.canonical import InputError, build_canonical_graph, read_label_classes
from graphs.stages.landing import find_dataset_files, is_dataset_folder, landing_fingerprint
from graphs.stages.user_files import check_column_mapping, landing_has_labels

EDGES = [(1, 2, 0.5), (2, 3, 1.5), (3, 1, 2.0), (3, 4, 1.0)]
NODES = [(1, "cat", "train"), (2, "dog", "train"), (3, None, "val"), (4, "ant", "test")]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _layout(folder: Path) -> Path:
    """The reference dataset in the landing layout (Parquet, layout names, integer labels
    numbered as the categorical mapping numbers them: ant 0, cat 1, dog 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    src, dst, w = zip(*EDGES)
    pq.write_table(pa.table({"src": list(src), "dst": list(dst), "weight": list(w)}), folder / "edges.parquet")
    classes = {"ant": 0, "cat": 1, "dog": 2, None: None}
    ids, labels, splits = zip(*NODES)
    labels = pa.array([classes[v] for v in labels], pa.int64())
    pq.write_table(pa.table({"node_id": list(ids), "label": labels, "split": list(splits)}), folder / "nodes.parquet")
    return folder


def _graph(out: Path) -> tuple:
    edges = pq.read_table(out / "edges.parquet").to_pydict()
    nodes = pq.read_table(out / "nodes.parquet", columns=["original_id", "label", "split"]).to_pydict()
    return edges, nodes


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    build_canonical_graph(_layout(root / "landing" / "ref"), root / "out")
    return _graph(root / "out")


def test_a_mapped_parquet_dataset_with_string_labels_is_the_layout_graph(tmp_path, reference):
    ds = tmp_path / "landing" / "ds"
    ds.mkdir(parents=True)
    src, dst, w = zip(*EDGES)
    pq.write_table(pa.table({"from_id": list(src), "to_id": list(dst), "amount": list(w)}), ds / "edges.parquet")
    ids, labels, splits = zip(*NODES)
    pq.write_table(
        pa.table({"customer_id": list(ids), "segment": list(labels), "split": list(splits)}), ds / "nodes.parquet"
    )
    _write(
        ds / "gnnflow.yaml",
        "columns: {src: from_id, dst: to_id, weight: amount, node_id: customer_id, label: segment}\n",
    )
    s = build_canonical_graph(ds, tmp_path / "out")  # the mapping of the folder's gnnflow.yaml
    assert _graph(tmp_path / "out") == reference
    assert s["weight_files"] == ["edges.parquet"] and s["num_classes"] == 3
    assert read_label_classes(tmp_path / "out") == ["ant", "cat", "dog"]
    doc = json.loads((tmp_path / "out" / "label_classes.json").read_text())
    assert doc == {"format_version": 1, "type": "string", "classes": ["ant", "cat", "dog"]}
    hashes = json.loads((tmp_path / "out" / "hashes.json").read_text())["files"]
    assert "label_classes.json" in hashes and "_work" not in str(hashes)  # the scratch inputs are gone


def test_integer_labels_write_no_label_classes(tmp_path):
    build_canonical_graph(_layout(tmp_path / "landing" / "ds"), tmp_path / "out")
    assert not (tmp_path / "out" / "label_classes.json").exists()
    assert read_label_classes(tmp_path / "out") is None


def test_a_file_missing_a_mapped_column_is_refused_naming_file_column_and_key(tmp_path):
    ds = _layout(tmp_path / "landing" / "ds")
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out", columns={"node_id": "customer_id"})
    assert str(err.value) == (
        f"{ds / 'nodes.parquet'}: missing column 'customer_id' (gnnflow.yaml columns.node_id); columns present: "
        "['node_id', 'label', 'split']"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "mapping, says",
    [
        ({"source": "a"}, "key 'columns.source' is not a column of the layout; the keys are src, dst, weight"),
        ({"src": 3}, "key 'columns.src': 3 is not a column name"),
        ({"src": ""}, "key 'columns.src': '' is not a column name"),
        ({"src": "a\nb"}, "key 'columns.src': 'a\\nb' is not a column name"),
        ({"src": "x", "dst": "x"}, "key 'columns': 'x' is the column of two edges keys"),
        (["src"], "key 'columns' must be a mapping such as {src: from_id}, got list"),
    ],
)
def test_a_bad_column_mapping_is_refused_naming_the_key(mapping, says):
    with pytest.raises(ValueError) as err:
        check_column_mapping(mapping, "ds/gnnflow.yaml")
    assert str(err.value).startswith(f"ds/gnnflow.yaml: {says}")


def test_the_settings_file_accepts_columns_and_refuses_a_bad_one(tmp_path):
    from assets.settings import SettingsError, read_columns

    path = _write(tmp_path / "landing" / "ds" / "gnnflow.yaml", "columns: {src: 'from \"id\"', label: segment}\n")
    assert read_columns(path) == {"src": 'from "id"', "label": "segment"}
    _write(path, "columns: {colour: x}\n")
    with pytest.raises(SettingsError, match="key 'columns.colour' is not a column of the layout"):
        read_columns(path)


def test_a_quoted_column_name_is_an_identifier_not_sql(tmp_path, reference):
    """A mapped name holding quotes and SQL is read as the name of a column, in CSV and Parquet."""
    name = "a\"b'; DROP TABLE x; --"
    ds = tmp_path / "landing" / "ds"
    src, dst, w = zip(*EDGES)
    lines = "\n".join(f"{s},{d},{x}" for s, d, x in EDGES)
    _write(ds / "edges.csv", f'"{name.replace(chr(34), chr(34) * 2)}",dst,weight\n{lines}\n')
    ids, labels, splits = zip(*NODES)
    pq.write_table(pa.table({"node_id": list(ids), "label": list(labels), "split": list(splits)}), ds / "nodes.parquet")
    build_canonical_graph(ds, tmp_path / "out", columns={"src": name})
    assert _graph(tmp_path / "out") == reference


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_csv_and_tsv_files_with_headers_give_the_layout_graph(tmp_path, reference, suffix, sep):
    ds = tmp_path / "landing" / "ds"
    rows = "\n".join(sep.join(str(v) for v in e) for e in EDGES)
    _write(ds / "edges" / f"part{suffix}", f"from_id{sep}to_id{sep}amount\n{rows}\n")
    rows = "\n".join(sep.join("" if v is None else str(v) for v in n) for n in NODES)
    _write(ds / f"nodes{suffix}", f"node_id{sep}segment{sep}split\n{rows}\n")
    s = build_canonical_graph(
        ds, tmp_path / "out", columns={"src": "from_id", "dst": "to_id", "weight": "amount", "label": "segment"}
    )
    assert _graph(tmp_path / "out") == reference
    assert s["weight_files"] == [f"part{suffix}"]
    assert read_label_classes(tmp_path / "out") == ["ant", "cat", "dog"]


def test_a_headerless_csv_is_positional(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "a,b\nb,c\n")
    _write(ds / "nodes.csv", "a,x\nb,y\nc,\n")
    build_canonical_graph(ds, tmp_path / "out")
    edges, nodes = _graph(tmp_path / "out")
    assert nodes["original_id"] == ["a", "b", "c"] and nodes["label"] == [0, 1, -1]
    assert list(zip(edges["src"], edges["dst"])) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_a_csv_header_naming_no_known_column_asks_for_a_mapping(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "source,target\n1,2\n2,3\n")
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out")
    assert str(err.value).startswith(
        f"{ds / 'edges.csv'}: the first row ['source', 'target'] looks like a header but names none of the columns "
        "src, dst, weight; rename them, or map them in gnnflow.yaml"
    )


def test_a_snap_edge_list_with_comments_and_whitespace(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges" / "graph.txt", "# Directed graph\n# FromNodeId\tToNodeId\n10\t20\n20  30\n\n% konect\n 30 10\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    edges, nodes = _graph(tmp_path / "out")
    assert nodes["original_id"] == [10, 20, 30] and s["id_type"] == "int" and s["input_rows"] == 3
    assert list(zip(edges["src"], edges["dst"])) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    _write(ds / "edges" / "graph.txt", "a b 2.5\nb c 0.5\n")  # string ids and a weight column
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["id_type"] == "string" and s["weighted"] and s["weight_max"] == 2.5


@pytest.mark.parametrize(
    "text, says",
    [
        ("# c\n1 2\n3 4 5\n", "line 3 has 3 column(s), the first edge line (line 2) 2; an edge list has 2 columns"),
        ("1 2 1.0\n\n2 3 heavy\n", "line 3: weight 'heavy' is not a number"),
        ("1\n", "line 1 has 1 column(s); an edge list has 2 columns (src dst) or 3"),
        ("# only comments\n", "holds no edge lines"),
    ],
)
def test_a_bad_snap_line_is_named_by_file_and_number(tmp_path, text, says):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.txt", text)
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out")
    assert str(err.value).startswith(f"{ds / 'edges.txt'}: {says}")


def test_an_unparsable_csv_line_is_named_by_file_and_line(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n3,4,5\n6,7\n")
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out")
    message = str(err.value)
    assert message.startswith(f"{ds / 'edges.csv'}: cannot be read as CSV: ") and "Line: 3" in message


def test_errors_about_a_converted_file_name_the_users_file(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n")
    _write(ds / "nodes.csv", "node_id,label\n1,0\n1,1\n")
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out")
    assert str(err.value) == f"{ds / 'nodes.csv'}: column 'node_id' repeats the id 1; one row per node"


def test_whole_float_csv_labels_are_classes_and_others_are_refused_naming_the_value(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n2,3\n")
    _write(ds / "nodes.csv", "node_id,label\n1,1.0\n2,0.0\n3,\n")  # a label column DuckDB reads as DOUBLE
    build_canonical_graph(ds, tmp_path / "out")
    assert _graph(tmp_path / "out")[1]["label"] == [1, 0, -1]
    assert read_label_classes(tmp_path / "out") is None
    _write(ds / "nodes.csv", "node_id,label\n1,1.0\n2,2.5\n")
    with pytest.raises(InputError) as err:
        build_canonical_graph(ds, tmp_path / "out")
    assert str(err.value).startswith(f"{ds / 'nodes.csv'}: column 'label' has the value 2.5, not a whole number")


def test_boolean_and_dictionary_labels_are_categorical(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n2,3\n")
    _write(ds / "nodes.csv", "node_id,label\n1,true\n2,false\n3,true\n")
    build_canonical_graph(ds, tmp_path / "out")
    assert read_label_classes(tmp_path / "out") == [False, True]
    assert _graph(tmp_path / "out")[1]["label"] == [1, 0, 1]
    (ds / "nodes.csv").unlink()
    labels = pa.array(["b", "a", None]).dictionary_encode()
    pq.write_table(pa.table({"node_id": [1, 2, 3], "label": labels}), ds / "nodes.parquet")
    build_canonical_graph(ds, tmp_path / "out")
    assert read_label_classes(tmp_path / "out") == ["a", "b"]
    assert _graph(tmp_path / "out")[1]["label"] == [1, 0, -1]


def test_discovery_covers_every_format_and_refuses_one_input_in_two(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n")
    _write(ds / "edges" / "b.txt", "1 2\n")
    _write(ds / "edges" / "a.tsv", "src\tdst\n1\t2\n")
    _write(ds / "edges" / "notes.md", "not an input\n")
    _write(ds / "nodes.tsv", "node_id\n1\n")
    assert is_dataset_folder(ds)
    files = find_dataset_files(ds)
    assert files.edge_files == [ds / "edges" / "a.tsv", ds / "edges" / "b.txt", ds / "edges.csv"]
    assert files.nodes == ds / "nodes.tsv"
    pq.write_table(pa.table({"src": [1], "dst": [2]}), ds / "edges.parquet")
    with pytest.raises(InputError) as err:
        find_dataset_files(ds)
    assert str(err.value).startswith(f"{ds / 'edges.parquet'} and edges.csv: one input in two formats")
    (ds / "edges.parquet").unlink()
    _write(ds / "nodes.csv", "node_id\n1\n")
    with pytest.raises(InputError, match="nodes.csv and nodes.tsv: one input in two formats"):
        find_dataset_files(ds)


def test_the_fingerprint_follows_content_not_times(tmp_path):
    ds = tmp_path / "landing" / "ds"
    path = _write(ds / "edges.csv", "src,dst\n1,2\n2,3\n")
    first = landing_fingerprint(ds)
    copy = tmp_path / "copy.csv"
    shutil.copy(path, copy)
    path.unlink()
    shutil.copy(copy, path)  # copied back: a new inode and a new mtime, the same bytes
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert landing_fingerprint(ds) == first
    path.write_text("src,dst\n1,2\n2,4\n")  # one byte changed, same size
    assert landing_fingerprint(ds) != first
    _write(ds / "nodes.csv", "node_id\n1\n")
    assert landing_fingerprint(ds) not in (first, landing_fingerprint(tmp_path / "none"))


def test_the_fingerprint_never_opens_a_fifo(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n")
    os.mkfifo(ds / "nodes.csv")
    assert len(landing_fingerprint(ds)) == 16  # returns: the FIFO counts by its name, unopened


@pytest.mark.parametrize(
    "files, columns, expected",
    [
        ({"nodes.csv": "customer_id,segment\n1,gold\n"}, "columns: {node_id: customer_id, label: segment}\n", True),
        ({"nodes.csv": "node_id,label\n1,\n"}, "", False),
        ({"nodes.csv": "node_id,label\n1,-1\n"}, "", False),
        ({"nodes.csv": "node_id,label\n1,2.0\n"}, "", True),
        ({"nodes.tsv": "node_id\tsplit\n1\ttrain\n"}, "", False),
        ({}, "", False),
        ({"nodes.csv": "customer_id,label\n1,3\n"}, "columns: {node_id: customer_id}\n", True),
        ({"nodes.csv": "node_id,segment\n1,a\n"}, "", False),  # without the mapping: no label column
    ],
)
def test_landing_has_labels_honours_formats_and_mapping(tmp_path, files, columns, expected):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n")
    for name, text in files.items():
        _write(ds / name, text)
    if columns:
        _write(ds / "gnnflow.yaml", columns)
    assert landing_has_labels(ds) is expected


def test_landing_has_labels_reads_parquet_string_labels(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n1,2\n")
    pq.write_table(pa.table({"node_id": [1, 2], "label": [None, "x"]}), ds / "nodes.parquet")
    assert landing_has_labels(ds) is True
    pq.write_table(pa.table({"node_id": [1, 2], "label": pa.array([None, None], pa.string())}), ds / "nodes.parquet")
    assert landing_has_labels(ds) is False


# ----------------------------------------------------------------------------- end to end: train and score


def _string_label_landing(folder: Path, n: int, rng) -> None:
    """A graph whose labels are the strings 'blue', 'green', 'red' in nodes.csv, with a column
    mapping, features tied to the label."""
    ids = np.arange(n)
    src = np.concatenate([ids, ids])
    dst = np.concatenate([(ids + 1) % n, (ids + 7) % n])
    _write(folder / "edges.csv", "a,b\n" + "\n".join(f"{s},{d}" for s, d in zip(src, dst)) + "\n")
    names = np.array(["blue", "green", "red"])
    label = (ids // 5) % 3
    _write(folder / "nodes.csv", "id,colour\n" + "\n".join(f"{i},{names[c]}" for i, c in zip(ids, label)) + "\n")
    _write(folder / "gnnflow.yaml", "columns: {src: a, dst: b, node_id: id, label: colour}\n")
    feat = rng.normal(size=(n, 8)).astype(np.float32)
    feat[ids, label] += 3.0
    pq.write_table(
        pa.table({"id": ids, "feat": pa.FixedSizeListArray.from_arrays(pa.array(feat.ravel()), 8)}),
        folder / "features.parquet",  # the mapped node_id column, in every node and feature file
    )


def test_string_labels_train_and_score_as_the_users_values(tmp_path):
    from graphs.infra.storage import read_file_hashes
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from graphs.stages.normalize import build_normalized_adjacency
    from training.config import RunConfig
    from training.outputs import MODEL_BEST
    from training.predict import predict
    from training.train import train

    landing, home = tmp_path / "landing" / "ds", tmp_path / "home"
    _string_label_landing(landing, 90, np.random.default_rng(0))
    build_canonical_graph(landing, home / "canonical_graph")
    build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")
    write_minibatch_shards(
        load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency"),
        home / "minibatch_shards",
        ShardConfig(fanouts="4,4", batch_size=32, epochs=1, world_size=1),
    )
    cfg = {
        "model": {"conv": "sage", "hidden": 16, "num_layers": 2},
        "training": {"epochs": 15, "profiler": "none", "optimizer": {"lr": 0.02}},
        "paths": {"shards": str(home / "minibatch_shards"), "out": str(home / "trained_model")},
    }
    train(RunConfig.from_dict(cfg))
    model_dir = home / "trained_model"
    assert read_label_classes(model_dir) == ["blue", "green", "red"]
    assert "label_classes.json" in read_file_hashes(model_dir, stage="trained_model")

    predict(model_dir / MODEL_BEST, home / "canonical_graph", home / "normalized_adjacency", tmp_path / "scored")
    pred = pq.read_table(tmp_path / "scored" / "predictions.parquet")
    assert pred.column_names == ["node_id", "predicted", "predicted_index", "probabilities", "index"]
    assert pred.schema.field("predicted").type == pa.string()
    assert pred.schema.field("predicted_index").type == pa.int32()
    names = np.array(["blue", "green", "red"])
    index = pred.column("predicted_index").to_numpy()
    assert pred.column("predicted").to_pylist() == names[index].tolist()
    truth = names[(pred.column("node_id").to_numpy() // 5) % 3]
    assert (np.array(pred.column("predicted").to_pylist()) == truth).mean() > 0.8  # the user's values, right


def test_integer_labels_score_with_predicted_index_too(tmp_path):
    import torch

    from training.predict import write_scored

    write_scored(tmp_path / "p.parquet", pa.array([5, 6]), torch.tensor([[0.0, 1.0], [2.0, 0.0]]), None)
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.column("predicted").to_pylist() == [1, 0] == t.column("predicted_index").to_pylist()
    assert t.schema.field("predicted").type == pa.int32()
    write_scored(tmp_path / "p.parquet", pa.array([5, 6]), torch.tensor([[0.0, 1.0], [2.0, 0.0]]), [False, True])
    assert pq.read_table(tmp_path / "p.parquet").column("predicted").to_pylist() == [True, False]


def test_the_sensor_ignores_a_file_copied_back_unchanged_and_sees_one_byte_changed(tmp_path):
    """Through the canonical_graph asset (CSV files, a column mapping in gnnflow.yaml) and the
    landing sensor: an identical copy requests nothing, a changed byte waits for stable files."""
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import ALL_ASSETS
    from pipelines.sensors import make_landing_sensor
    from tests.test_landing_sensor import _ingest, _tick

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    ds = tmp_path / "landing" / "ds"
    edges = _write(ds / "edges.csv", "from_id,to_id\n1,2\n2,3\n")
    _write(ds / "nodes.csv", "node_id,segment\n1,gold\n2,silver\n")
    _write(ds / "gnnflow.yaml", "columns: {src: from_id, dst: to_id, label: segment}\n")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
        _ingest(instance, storage, "ds")
        assert read_label_classes(tmp_path / "home" / "ds" / "canonical_graph") == ["gold", "silver"]
        record = instance.fetch_materializations(dg.AssetKey("canonical_graph"), limit=1).records[0]
        assert record.asset_materialization.metadata["label_values"].value == ["gold", "silver"]
        sensor = make_landing_sensor(ALL_ASSETS)
        quiet = _tick(sensor, instance, storage)
        assert quiet.run_requests == []
        text = edges.read_bytes()
        edges.unlink()
        edges.write_bytes(text)  # copied back: new inode and times, same bytes
        again = _tick(sensor, instance, storage, quiet.cursor)
        assert again.run_requests == [] and json.loads(again.cursor)["pending"] == {}
        edges.write_bytes(text.replace(b"2,3", b"2,4"))
        changed = _tick(sensor, instance, storage, again.cursor)
        assert json.loads(changed.cursor)["pending"] == {"ds": landing_fingerprint(ds)}


def test_a_long_snap_file_whose_separator_changes_after_its_head_reads_whole(tmp_path):
    """The first 64 KiB use one tab (DuckDB's CSV reader takes the file); a line further on uses
    spaces: the whitespace reader reads the file again, and every edge arrives."""
    from graphs.stages.text_inputs import HEAD_BYTES

    ds = tmp_path / "landing" / "ds"
    n = HEAD_BYTES // 8 + 100
    lines = [f"{i}\t{i + 1}" for i in range(n)] + [f"{n}   {n + 1}", f"{n + 1} x7"]
    _write(ds / "edges.txt", "% konect\n" + "\n".join(lines) + "\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["input_rows"] == n + 2 and s["id_type"] == "string" and s["nodes"] == n + 3
    _write(ds / "edges.txt", "% konect\n" + "\n".join(lines[:-1]) + "\n")  # integers throughout
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["input_rows"] == n + 1 and s["id_type"] == "int" and s["edges"] == 2 * (n + 1)


def test_text_files_with_glob_characters_in_their_names_are_read_literally(tmp_path):
    ds = tmp_path / "landing" / "d[s]*"
    _write(ds / "edges" / "*.csv", "src,dst\n1,2\n")
    _write(ds / "edges" / "[a-z].tsv", "src\tdst\n3\t4\n")
    _write(ds / "edges" / "a.txt", "5 6\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["input_rows"] == 3 and s["nodes"] == 6 and s["input_files"] == 3


@pytest.mark.parametrize(
    "name, data",
    [
        ("edges.csv", b"\xef\xbb\xbfsrc,dst\r\n1,2\r\n2,3\r\n"),  # a byte-order mark and CRLF line ends
        ("edges.txt", b"# c\r\n\t1 2 \r\n2\t3\r\n \r\n"),  # CRLF, a leading tab, a blank line of spaces
    ],
)
def test_windows_line_ends_and_stray_whitespace_are_read(tmp_path, name, data):
    ds = tmp_path / "landing" / "ds"
    ds.mkdir(parents=True)
    (ds / name).write_bytes(data)
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["input_rows"] == 2 and s["id_type"] == "int"
    assert _graph(tmp_path / "out")[1]["original_id"] == [1, 2, 3]


@pytest.mark.parametrize(
    "name, text",
    [
        ("edges.csv", "src,dst\n{a},7\n7,8\n"),
        ("edges.csv", "{a},7\n7,8\n"),  # no header: positional
        ("edges.tsv", "src\tdst\n7\t8\n{a}\t7\n"),
        ("edges.txt", "# snap\n{a} 7\n7 8\n"),  # one space: DuckDB's CSV reader
        ("edges.txt", "{a}  7\n7\t8\n"),  # mixed whitespace: the general reader
    ],
)
@pytest.mark.parametrize("a", ["007", "+7", "7.0", "-0", "0x7"])
def test_text_ids_that_are_no_canonical_integer_stay_distinct_strings(tmp_path, name, text, a):
    """`007` and `7` are two nodes: the ids of a text file are integers only when every one is a
    canonical integer, else strings as written."""
    ds = tmp_path / "landing" / "ds"
    _write(ds / name, text.format(a=a))
    s = build_canonical_graph(ds, tmp_path / "out")
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert s["id_type"] == "string" and s["nodes"] == 3
    assert nodes.schema.field("original_id").type == pa.string()
    assert nodes.column("original_id").to_pylist() == sorted([a, "7", "8"])


@pytest.mark.parametrize(
    "name, text",
    [
        ("edges.csv", "src,dst\n-7,0\n0,8\n"),
        ("edges.csv", "src, dst\n-7, 0\n 0 ,8\n"),  # spaces around a field are no part of the id
        ("edges.tsv", "-7\t0\n0\t8\n"),
        ("edges.txt", "-7 0\n0 8\n"),
        ("edges.txt", "-7  0\n0\t8\n"),
    ],
)
def test_text_ids_in_canonical_integer_form_are_int64(tmp_path, name, text):
    ds = tmp_path / "landing" / "ds"
    _write(ds / name, text)
    s = build_canonical_graph(ds, tmp_path / "out")
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert s["id_type"] == "int" and nodes.schema.field("original_id").type == pa.int64()
    assert nodes.column("original_id").to_pylist() == [-7, 0, 8]


def test_text_ids_beyond_int64_are_strings(tmp_path):
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges.csv", "src,dst\n9223372036854775807,9223372036854775808\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    assert s["id_type"] == "string"
    assert _graph(tmp_path / "out")[1]["original_id"] == ["9223372036854775807", "9223372036854775808"]


def test_one_text_file_with_string_ids_makes_every_text_files_ids_strings(tmp_path):
    """edges.csv holds integers only, nodes.csv a `007`: the dataset's ids are the strings as
    written (no "ids mix integers and strings" refusal, no merge of 007 with 7)."""
    ds = tmp_path / "landing" / "ds"
    _write(ds / "edges" / "a.csv", "src,dst\n7,8\n")
    _write(ds / "edges" / "b.txt", "8 9\n")
    _write(ds / "nodes.csv", "node_id,label\n007,ant\n7,cat\n8,ant\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    edges, nodes = _graph(tmp_path / "out")
    assert s["id_type"] == "string" and s["nodes"] == 4 and s["input_rows"] == 2
    assert nodes["original_id"] == ["007", "7", "8", "9"] and nodes["label"] == [0, 1, 0, -1]


def test_a_leading_zero_id_past_duckdbs_type_sample_is_no_merge(tmp_path):
    """DuckDB's type detection samples the first rows: an `007` further on would be cast to the
    integer 7 by a detected BIGINT column; every value is checked, so the ids are strings."""
    ds = tmp_path / "landing" / "ds"
    n = 30_000
    _write(ds / "edges.csv", "src,dst\n" + "".join(f"{i},{i + 1}\n" for i in range(1, n)) + "007,7\n")
    s = build_canonical_graph(ds, tmp_path / "out")
    original = _graph(tmp_path / "out")[1]["original_id"]
    assert s["id_type"] == "string" and s["nodes"] == n + 1 and s["input_rows"] == n
    assert "007" in original and "7" in original

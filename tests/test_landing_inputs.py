"""Hostile landing folders: file names DuckDB would glob, symlinks, FIFOs, uint64 ids beyond
int64, labels that are not class indices, split words in other spellings."""

import os
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphs.infra import duck
from graphs.stages.canonical import (
    CanonicalConfig,
    InputError,
    build_canonical_graph,
    find_dataset_files,
    is_dataset_folder,
    landing_fingerprint,
)
from graphs.stages.landing import checked_dataset_file
from tests.conftest import write_edges

# Names DuckDB's globbing gives a meaning, beside names that only look odd.
GLOB_NAMES = ["*.parquet", "[a-z].parquet", "?.parquet", "**.parquet", "{a,b}.parquet", "[!a].parquet", "[[].parquet"]
ODD_NAMES = ["a.parquet", "b.parquet", "sp ace.parquet", "it's.parquet", 'd"q.parquet', "ünï €.parquet", "%41.parquet"]
ODD_NAMES += ["a]b.parquet", "$HOME.parquet", "~.parquet", "{a}.parquet"]


def _read_files(paths) -> list[str]:
    con = duckdb.connect()
    rows = duck.read_parquet(con, paths, filename=True).select("filename").fetchall()
    return [r[0] for r in rows]


def test_literal_paths_read_exactly_the_named_file(tmp_path):
    folder = tmp_path / "l[x]*? {a} it's"  # the folder's own name is a pattern too
    folder.mkdir()
    for name in GLOB_NAMES + ODD_NAMES:
        pq.write_table(pa.table({"v": [1]}), folder / name)
    for name in GLOB_NAMES + ODD_NAMES:
        assert _read_files([folder / name]) == [str(folder / name)], name
    # a list keeps its order, each file once
    names = ["[a-z].parquet", "b.parquet", "*.parquet", "a.parquet"]
    assert len(_read_files([folder / n for n in names])) == 4
    assert duck.literal_path(folder / "*.parquet").endswith("/l[[]x][*][?] {a} it's/[*].parquet")


def test_a_backslash_is_read_unless_the_path_also_holds_a_glob_character(tmp_path):
    plain, globbed = _mkdir(tmp_path / "p"), _mkdir(tmp_path / "g*")
    for folder in (plain, globbed):
        pq.write_table(pa.table({"v": [1]}), folder / "back\\slash.parquet")
    assert _read_files([plain / "back\\slash.parquet"]) == [str(plain / "back\\slash.parquet")]
    with pytest.raises(ValueError) as err:
        duck.literal_path(globbed / "back\\slash.parquet")
    assert str(err.value).startswith(f"{globbed}/back\\slash.parquet: DuckDB cannot read a path that holds both")
    write_edges(tmp_path / "ds*" / "edges" / "a\\b.parquet", [1], [2])
    with pytest.raises(InputError) as err:
        build_canonical_graph(tmp_path / "ds*", tmp_path / "out")
    assert str(err.value).startswith(f"{tmp_path / 'ds*' / 'edges' / 'a'}\\b.parquet: DuckDB cannot read")


def test_literal_path_reads_a_hidden_file_and_a_symlink_and_adds_no_folder_columns(tmp_path):
    folder = tmp_path / "weight=5"  # a hive-style folder name: no "weight" column is guessed from it
    folder.mkdir()
    pq.write_table(pa.table({"src": [1]}), folder / ".h*.parquet")
    (folder / "l?nk.parquet").symlink_to(folder / ".h*.parquet")
    con = duckdb.connect()
    rel = duck.read_parquet(con, [folder / ".h*.parquet", folder / "l?nk.parquet"])
    assert rel.columns == ["src"] and rel.fetchall() == [(1,), (1,)]


@pytest.mark.parametrize("folder", ["ds", "d[s]*"])
def test_glob_characters_in_landing_file_names_ingest_each_file_once(tmp_path, folder):
    dataset = tmp_path / "landing" / folder
    names = GLOB_NAMES + ODD_NAMES
    for i, name in enumerate(names):  # file i: one edge 2i -> 2i+1 of weight i + 1
        pq.write_table(
            pa.table({"src": [2 * i], "dst": [2 * i + 1], "weight": [float(i + 1)]}), _mkdir(dataset / "edges") / name
        )
    s = build_canonical_graph(dataset, tmp_path / "out")
    assert (s["input_files"], s["input_rows"], s["edges"]) == (len(names), len(names), 2 * len(names))
    assert sorted(s["weight_files"]) == sorted(names)
    edges = pq.read_table(tmp_path / "out" / "edges.parquet").to_pydict()
    # node ids are 0..2k-1 in the original order: edge 2i -> 2i+1 keeps file i's weight, not a sum
    given = {(2 * i, 2 * i + 1): float(i + 1) for i in range(len(names))}
    got = {(a, b): w for a, b, w in zip(edges["src"], edges["dst"], edges["weight"]) if a < b}
    assert got == given


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def landing(tmp_path) -> Path:
    """landing/ds with one edge file, and landing/shared/x.parquet to link to."""
    write_edges(tmp_path / "landing" / "ds" / "edges" / "a.parquet", [1, 2], [2, 3])
    write_edges(tmp_path / "landing" / "shared" / "x.parquet", [7], [8])
    write_edges(tmp_path / "outside" / "x.parquet", [7], [8])
    return tmp_path / "landing"


@pytest.mark.parametrize(
    ("entry", "make", "message"),
    [
        (
            "edges/b.parquet",
            lambda p, root: p.symlink_to(root / "gone.parquet"),
            "a symlink whose target does not exist",
        ),
        ("edges.parquet", lambda p, root: p.symlink_to(p), "cannot be examined"),
        ("nodes.parquet", lambda p, root: p.symlink_to(root.parent / "outside" / "x.parquet"), "outside the landing"),
        ("nodes.parquet", lambda p, root: os.mkfifo(p), "not a regular file (a FIFO)"),
        ("features.parquet", lambda p, root: os.mkfifo(p), "not a regular file (a FIFO)"),
        ("edges/f.parquet", lambda p, root: os.mkfifo(p), "not a regular file (a FIFO)"),
        ("edges/spark.parquet", lambda p, root: p.mkdir(), "not a regular file (a folder)"),
    ],
)
def test_broken_or_foreign_entries_are_refused_by_name(landing, tmp_path, entry, make, message):
    path = landing / "ds" / entry
    make(path, landing)
    with pytest.raises(InputError, match="not a regular|symlink|outside|cannot be examined") as err:
        build_canonical_graph(landing / "ds", tmp_path / "out")
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert not (tmp_path / "out").exists()
    assert is_dataset_folder(landing / "ds")  # still a dataset: the sensor names it instead of ignoring it
    landing_fingerprint(landing / "ds")  # and its fingerprint never raises


def test_an_edges_folder_linked_out_of_landing_is_refused_and_one_inside_is_followed(landing, tmp_path):
    write_edges(tmp_path / "outside" / "edges" / "a.parquet", [1], [2])
    _mkdir(landing / "out_link").joinpath("edges").symlink_to(tmp_path / "outside" / "edges")
    with pytest.raises(InputError) as err:
        build_canonical_graph(landing / "out_link", tmp_path / "out")
    assert str(err.value).startswith(f"{landing / 'out_link' / 'edges'}: resolves to {tmp_path / 'outside' / 'edges'}")
    (landing / "in_link").mkdir()
    (landing / "in_link" / "edges").symlink_to(landing / "ds" / "edges")
    (landing / "in_link" / "nodes.parquet").symlink_to(Path("..") / "shared" / "x.parquet")  # relative, inside
    files = find_dataset_files(landing / "in_link")
    assert files.edge_files == [landing / "in_link" / "edges" / "a.parquet"]
    assert files.nodes == landing / "in_link" / "nodes.parquet"


def test_a_dataset_folder_linked_out_of_landing_is_refused(landing, tmp_path):
    write_edges(tmp_path / "outside" / "ds2" / "edges.parquet", [1], [2])
    (landing / "ds2").symlink_to(tmp_path / "outside" / "ds2")
    with pytest.raises(InputError, match="outside the landing folder") as err:
        build_canonical_graph(landing / "ds2", tmp_path / "out")
    assert str(err.value).startswith(f"{landing / 'ds2'}: resolves to")


def test_uint64_ids_beyond_int64_are_refused_naming_file_and_column(tmp_path):
    ok = write_edges(tmp_path / "ok" / "edges.parquet", [0, 2**63 - 1], [1, 0], pa.uint64())
    s = build_canonical_graph(ok.parent, tmp_path / "out_ok")
    assert s["nodes"] == 3
    assert pq.read_table(tmp_path / "out_ok" / "nodes.parquet").column("original_id").to_pylist()[-1] == 2**63 - 1
    bad = write_edges(tmp_path / "bad" / "edges.parquet", [0, 1], [1, 2**63], pa.uint64())
    with pytest.raises(InputError) as err:
        build_canonical_graph(bad.parent, tmp_path / "out")
    assert str(err.value) == (
        f"{bad}: column 'dst' holds the uint64 id 9223372036854775808; uint64 ids above 9223372036854775807 "
        "(the largest int64) are not supported: cast the ids to strings, or renumber them"
    )
    nodes = tmp_path / "bad_nodes"
    write_edges(nodes / "edges.parquet", [0], [1], pa.uint64())
    pq.write_table(pa.table({"node_id": pa.array([0, 2**64 - 1], pa.uint64())}), nodes / "nodes.parquet")
    with pytest.raises(InputError, match=r"nodes.parquet: column 'node_id' holds the uint64 id 18446744073709551615"):
        build_canonical_graph(nodes, tmp_path / "out")


MAX_CLASSES = 1 << 16  # graphs.infra.config_checks.MAX_CLASSES, the largest number of classes a dataset may have


def _with_nodes(tmp_path, **columns) -> Path:
    n = len(next(iter(columns.values())))
    write_edges(tmp_path / "in" / "edges.parquet", list(range(n)), [(i + 1) % n for i in range(n)])
    pq.write_table(pa.table({"node_id": list(range(n)), **columns}), tmp_path / "in" / "nodes.parquet")
    return tmp_path / "in"


@pytest.mark.parametrize("label", [2**31 - 2, MAX_CLASSES, -2])
def test_labels_beyond_the_class_bound_are_refused(tmp_path, label):
    folder = _with_nodes(tmp_path, label=pa.array([0, label, None, -1], pa.int64()))
    with pytest.raises(InputError) as err:
        build_canonical_graph(folder, tmp_path / "out")
    assert str(err.value).startswith(f"{folder / 'nodes.parquet'}: column 'label' has value {label}; ")
    assert "at most 65536 classes" in str(err.value) and "number the classes 0..C-1" in str(err.value)


def test_largest_allowed_label_and_unknowns(tmp_path):
    folder = _with_nodes(tmp_path, label=pa.array([0, MAX_CLASSES - 1, None, -1], pa.int32()))
    s = build_canonical_graph(folder, tmp_path / "out")
    assert (s["num_classes"], s["labelled_nodes"], s["null_labels_as_unknown"]) == (MAX_CLASSES, 2, 1)
    labels = pq.read_table(tmp_path / "out" / "nodes.parquet").column("label").to_pylist()
    assert labels == [0, MAX_CLASSES - 1, -1, -1]


@pytest.mark.parametrize("type_", [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()])
def test_unsigned_labels_with_nulls_are_read_as_classes_and_unknowns(tmp_path, type_):
    folder = _with_nodes(tmp_path, label=pa.array([0, 2, None, 1], type_))
    s = build_canonical_graph(folder, tmp_path / "out")
    assert (s["num_classes"], s["labelled_nodes"], s["null_labels_as_unknown"]) == (3, 3, 1)
    assert pq.read_table(tmp_path / "out" / "nodes.parquet").column("label").to_pylist() == [0, 2, -1, 1]


def test_whole_float_labels_are_classes_and_nan_is_unknown(tmp_path):
    """pandas turns an integer column with gaps into float64 (NaN for the gaps)."""
    folder = _with_nodes(tmp_path, label=pa.array([0.0, 2.0, float("nan"), 1.0, None], pa.float64()))
    s = build_canonical_graph(folder, tmp_path / "out")
    assert (s["num_classes"], s["labelled_nodes"], s["null_labels_as_unknown"]) == (3, 3, 2)
    assert pq.read_table(tmp_path / "out" / "nodes.parquet").column("label").to_pylist() == [0, 2, -1, 1, -1]


@pytest.mark.parametrize(
    "value, says",
    [
        (1.5, "has the value 1.5, not a whole number"),
        (float("inf"), "has the value inf, not a whole number"),
        (1e20, "has value 100000000000000000000; labels are class indices"),
        (-2.0, "has value -2; labels are"),
    ],
)
def test_float_labels_that_are_no_class_index_are_refused_naming_the_value(tmp_path, value, says):
    folder = _with_nodes(tmp_path, label=pa.array([0.0, value, 1.0], pa.float64()))
    with pytest.raises(InputError) as err:
        build_canonical_graph(folder, tmp_path / "out")
    assert str(err.value).startswith(f"{folder / 'nodes.parquet'}: column 'label' ") and says in str(err.value)


def test_split_words_match_any_case_and_synonyms_and_others_are_counted(tmp_path):
    words = ["TEST", "validation", " Train ", "dev", "x", None, "holdout", "Valid", "training", "x", "testing", "other"]
    folder = _with_nodes(tmp_path, label=list(range(len(words))), split=pa.array(words))
    s = build_canonical_graph(folder, tmp_path / "out")
    split = pq.read_table(tmp_path / "out" / "nodes.parquet").column("split").to_pylist()
    assert split == ["test", "val", "train", "val", "other", "other", "other", "val", "train", "other", "test", "other"]
    assert (s["train_nodes"], s["val_nodes"], s["test_nodes"]) == (2, 3, 2)
    assert (s["null_splits_as_other"], s["unknown_splits_as_other"]) == (1, 3)
    assert s["unknown_split_words"] == ["x", "holdout"]


def test_unknown_split_words_are_bounded_in_the_summary(tmp_path):
    words = [f"w{i}-" + "y" * 100 for i in range(50)]
    folder = _with_nodes(tmp_path, split=pa.array(words, pa.large_string()))
    s = build_canonical_graph(folder, tmp_path / "out", CanonicalConfig(memory_limit="512MB"))
    assert s["unknown_splits_as_other"] == 50
    assert s["unknown_split_words"] == [w[:40] for w in words[:10]]


def test_canonical_graph_warns_naming_unknown_split_words(tmp_path):
    from assets.canonical_graph import canonical_graph
    from assets.common import GnnflowStorage, dataset_partitions

    _with_nodes(tmp_path / "landing", split=pa.array(["train", "TEST", "holdout", "holdout"]))
    os.rename(tmp_path / "landing" / "in", tmp_path / "landing" / "ds")
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
        result = dg.materialize(
            [canonical_graph], partition_key="ds", instance=instance, resources={"storage": storage}
        )
        md = result.asset_materializations_for_node("canonical_graph")[0].metadata
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if "in no split" in r.user_message]
    assert md["unknown_splits_as_other"].value == 2
    assert len(warnings) == 1 and warnings[0].startswith("dataset 'ds': 2 nodes.parquet splits other than")
    assert warnings[0].endswith("e.g. ['holdout']")


def test_the_fingerprint_is_over_the_input_entries_and_settings_names_and_contents(tmp_path):
    """Only input entries and the settings file count, one line each: relative name and SHA-256
    of the content, inputs in name order, then gnnflow.yaml."""
    import hashlib

    root = tmp_path / "ds"
    write_edges(root / "edges" / "a.parquet", [1], [2])
    write_edges(root / "edges.parquet", [1], [2])
    write_edges(root / "notes" / "other.parquet", [1], [2])  # not an input
    (root / "other.yaml").write_text("columns: {src: a}\n")  # not the settings file
    h = hashlib.sha256()
    for rel in ("edges/a.parquet", "edges.parquet"):
        h.update(f"{rel}:{hashlib.sha256((root / rel).read_bytes()).hexdigest()}\n".encode())
    assert landing_fingerprint(root) == h.hexdigest()[:16]
    (root / "gnnflow.yaml").write_bytes(b"task: node_classification\n")
    h.update(f"gnnflow.yaml:{hashlib.sha256(b'task: node_classification' + bytes([10])).hexdigest()}\n".encode())
    assert landing_fingerprint(root) == h.hexdigest()[:16]


def test_the_fingerprint_follows_the_settings_files_content(tmp_path):
    ds = tmp_path / "landing" / "ds"
    write_edges(ds / "edges.parquet", [1, 2], [2, 3])
    bare = landing_fingerprint(ds)
    settings = ds / "gnnflow.yaml"
    settings.write_text("columns: {src: from_id}\n")
    first = landing_fingerprint(ds)
    assert first != bare
    settings.unlink()
    settings.write_text("columns: {src: from_id}\n")  # the same bytes again: a new inode and mtime
    os.utime(settings, ns=(settings.stat().st_atime_ns, settings.stat().st_mtime_ns + 10**9))
    assert landing_fingerprint(ds) == first
    settings.write_text("columns: {src: from_ix}\n")  # one byte changed, same size
    assert landing_fingerprint(ds) not in (first, bare)
    settings.unlink()
    assert landing_fingerprint(ds) == bare


@pytest.mark.parametrize(
    "make",
    [
        lambda p, root: os.mkfifo(p),
        lambda p, root: p.symlink_to(root.parent / "outside.yaml"),
        lambda p, root: p.mkdir(),
    ],
)
def test_a_settings_entry_the_rule_refuses_counts_by_name_unopened(tmp_path, make):
    ds = tmp_path / "landing" / "ds"
    write_edges(ds / "edges.parquet", [1, 2], [2, 3])
    (tmp_path / "outside.yaml").write_text("columns: {src: a}\n")
    bare = landing_fingerprint(ds)
    make(ds / "gnnflow.yaml", tmp_path / "landing")
    refused = landing_fingerprint(ds)  # returns: a FIFO is never opened
    assert refused != bare and len(refused) == 16
    with pytest.raises(InputError, match="gnnflow.yaml: "):
        checked_dataset_file(ds / "gnnflow.yaml")

"""Property test: malformed landing data through `build_canonical_graph`.

Hypothesis draws a landing folder with any of: wrong column names or types, nulls, negative
or huge ids, ids of mixed kinds across files, empty or truncated Parquet files, features of
inconsistent width or non-finite values, labels out of range, split words in any case; file
and folder names DuckDB would glob (`*.parquet`, `[a-z].parquet`, ...), with spaces, quotes or
unicode; and in place of a file a dangling symlink, a symlink inside or out of the landing
folder, a FIFO or a folder. Every case must end either in a canonical graph that holds its
invariants and holds exactly the rows of the files present (the edges and nodes of a
reference computed here), or in an `InputError` whose message names the offending file or
value (the broken entry itself, when there is one), and never leave a partial output folder
or a temporary behind.

CI runs 200 examples; `GNNFLOW_SLOW=1` runs 2,000 (`GNNFLOW_EXAMPLES=N` sets any number).
"""

import faulthandler
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from graphs.stages.canonical import CanonicalConfig, InputError, build_canonical_graph

EXAMPLES = int(os.environ.get("GNNFLOW_EXAMPLES", 2000 if os.environ.get("GNNFLOW_SLOW") else 200))

HUGE = 2**62
BEYOND_INT64 = 2**63 + 5  # a uint64 id int64 cannot hold (clamped to 2^63-1 in signed columns)
ID_VALUES = st.one_of(
    st.integers(-5, 40), st.integers(-5, 40), st.sampled_from([-(2**40), HUGE, 2**31, -1, BEYOND_INT64])
)
INT_TYPES = [pa.int64(), pa.int32(), pa.int8(), pa.uint64()]
FLAWS = [
    "none",
    "rename_column",
    "float_ids",
    "bool_ids",
    "string_ids",
    "nulls",
    "empty_table",
    "zero_bytes",
    "truncated",
    "not_parquet",
    "list_ids",
]


def _ids(draw, n: int, kind: str, pool: list[int], unique: bool = False):
    """n ids of `kind`, mostly from the dataset's `pool`, some from anywhere (unique on request)."""
    values = st.one_of(st.sampled_from(pool), st.sampled_from(pool), ID_VALUES)
    values = draw(st.lists(values, min_size=n, max_size=n, unique=unique and draw(st.integers(0, 5)) > 0))
    if kind == "string":
        return pa.array([f"n{v}" for v in values], pa.string())
    if kind == "float":
        return pa.array([v + 0.5 for v in values], pa.float64())
    if kind == "bool":
        return pa.array([v % 2 == 0 for v in values], pa.bool_())
    if kind == "list":
        return pa.array([[min(v, 2**63 - 1)] for v in values], pa.list_(pa.int64()))
    t = draw(st.sampled_from(INT_TYPES))
    lo, hi = (0, 2**64 - 1) if t == pa.uint64() else (-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1)
    return pa.array([min(max(v, lo), hi) for v in values], t)


# Edge file names: ones DuckDB's globbing would expand beside ones they would match, and odd ones.
EDGE_NAMES = ["part-0.parquet", "*.parquet", "[a-z].parquet", "?.parquet", "**.parquet", "[[].parquet"]
EDGE_NAMES += [
    "a.parquet",
    "b.parquet",
    "{a,b}.parquet",
    "sp ace.parquet",
    "it's.parquet",
    "ünï €.parquet",
    "%41.parquet",
]
DATASET_NAMES = ["ds", "d[s]", "d*", "sp ace ü", "it's"]
# What stands at an input's name: the file itself, or (rarely) something else.
ENTRY_KINDS = ["file"] * 30 + ["link_inside", "link_outside", "dangling", "fifo", "folder"]
REFUSED_KINDS = {"link_outside", "dangling", "fifo", "folder"}


def _place(path: Path, table: pa.Table, flaw: str, kind: str, landing_root: Path, outside: Path) -> None:
    """Put the file (or, by `kind`, a link to it, a FIFO or a folder) at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(outside / "gone.parquet")
    elif kind in ("link_inside", "link_outside"):
        folder = landing_root / "_shared" if kind == "link_inside" else outside
        target = folder / f"{len(os.listdir(folder)) if folder.is_dir() else 0}.parquet"  # a fresh name
        _write(target, table, flaw)
        path.symlink_to(target)
    else:
        _write(path, table, flaw)


def _write(path: Path, table: pa.Table, flaw: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if flaw == "zero_bytes":
        path.write_bytes(b"")
    elif flaw == "not_parquet":
        path.write_text("src,dst\n1,2\n")
    else:
        pq.write_table(table, path)
        if flaw == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])


@st.composite
def landing_folders(draw):
    """(the dataset folder's name, files to write: {relative path: (table, flaw, entry kind)})."""
    files = {}
    dataset_kind = draw(st.sampled_from(["int", "string"]))
    pool = draw(st.lists(ID_VALUES, min_size=1, max_size=12, unique=True))
    names = draw(st.lists(st.sampled_from(EDGE_NAMES), min_size=1, max_size=3, unique=True))
    for name in names:
        flaw = draw(st.sampled_from(["none"] * 3 * len(FLAWS) + FLAWS))  # mostly sound files, a few flaws
        n = 0 if flaw == "empty_table" else draw(st.integers(1, 12))
        kind = {"float_ids": "float", "bool_ids": "bool", "string_ids": "string", "list_ids": "list"}.get(
            flaw, dataset_kind
        )
        src, dst = _ids(draw, n, kind, pool), _ids(draw, n, kind, pool)
        if flaw == "nulls" and n:
            mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
            src = pa.array([None if m else v for m, v in zip(mask, src.to_pylist())], src.type)
        cols = {"src": src, "dst": dst}
        if draw(st.booleans()):
            cols["weight"] = pa.array(draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n)), pa.float64())
        if flaw == "rename_column":
            cols = {("source" if k == "src" else k): v for k, v in cols.items()}
        rel = "edges.parquet" if name == "part-0.parquet" and draw(st.booleans()) else f"edges/{name}"
        files[rel] = (pa.table(cols), flaw, draw(st.sampled_from(ENTRY_KINDS)))
    if draw(st.booleans()):  # nodes.parquet
        n = draw(st.integers(0, 10))
        ids = _ids(draw, n, draw(st.sampled_from([dataset_kind] * 4 + ["string", "float"])), pool, unique=True)
        cols = {"node_id": ids}
        if draw(st.integers(0, 3)) > 0:
            label = st.one_of(st.integers(-1, 6), st.integers(-1, 6), st.none(), st.sampled_from([-3, 2**40]))
            labels = draw(st.lists(label, min_size=n, max_size=n))
            cols["label"] = pa.array(labels, pa.int64())
        if draw(st.booleans()):
            words = st.sampled_from(["train", "val", "test", "x", "TEST", " Validation", "dev", None])
            cols["split"] = pa.array(draw(st.lists(words, min_size=n, max_size=n)), pa.string())
        if draw(st.integers(0, 5)) == 0:
            cols = {("id" if k == "node_id" else k): v for k, v in cols.items()}
        flaw = draw(st.sampled_from(["none"] * 8 + ["truncated", "zero_bytes"]))
        files["nodes.parquet"] = (pa.table(cols), flaw, draw(st.sampled_from(ENTRY_KINDS)))
    if draw(st.booleans()):  # features.parquet
        n = draw(st.integers(0, 10))
        ids = _ids(draw, n, dataset_kind, pool, unique=True)
        widths = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        if draw(st.booleans()):
            widths = [widths[0] if widths else 3] * n
        values = st.one_of(*[st.floats(-10, 10)] * 6, st.sampled_from([float("nan"), float("inf")]))
        feats = [draw(st.lists(values, min_size=w, max_size=w)) for w in widths]
        if n and draw(st.integers(0, 4)) == 0:
            feats[0] = None
        files["features.parquet"] = (
            pa.table({"node_id": ids, "feat": pa.array(feats, pa.list_(pa.float32()))}),
            "none",
            draw(st.sampled_from(ENTRY_KINDS)),
        )
    return draw(st.sampled_from(DATASET_NAMES)), files


def _expected_graph(files: dict) -> tuple[set, dict, dict]:
    """From the tables written: (every node id, {(u, v): combined weight} of both directions of
    every kept edge row, weights summed as `weight_combine="sum"` does, 1.0 where a file has
    none), the reference a sound run must reproduce exactly."""
    ids, pairs = set(), {}
    weighted = any("weight" in t.column_names for rel, (t, _, _) in files.items() if rel.startswith("edges"))
    for rel, (table, _, _) in files.items():
        if rel == "nodes.parquet":
            ids |= {v for v in table.column("node_id").to_pylist() if v is not None}
        if not rel.startswith("edges"):
            continue
        src, dst = table.column("src").to_pylist(), table.column("dst").to_pylist()
        weight = table.column("weight").to_pylist() if "weight" in table.column_names else [1.0] * len(src)
        for u, v, w in zip(src, dst, weight):
            ids |= {x for x in (u, v) if x is not None}
            if u is not None and v is not None and u != v:
                key = (min(u, v), max(u, v))
                pairs[key] = pairs.get(key, 0.0) + w
    return ids, pairs, {"weighted": weighted}


def _check_rows(out: Path, files: dict) -> None:
    """The graph holds exactly the nodes and edges (and weights) of the files written."""
    ids, pairs, facts = _expected_graph(files)
    original = pq.read_table(out / "nodes.parquet").column("original_id").to_pylist()
    assert set(original) == ids
    edges = pq.read_table(out / "edges.parquet").to_pydict()
    weights = edges.get("weight", [1.0] * len(edges["src"]))
    got = {(original[a], original[b]): w for a, b, w in zip(edges["src"], edges["dst"], weights)}
    assert set(got) == {(u, v) for u, v in pairs} | {(v, u) for u, v in pairs}
    if facts["weighted"]:
        for (u, v), w in pairs.items():
            assert got[(u, v)] == got[(v, u)] and math.isclose(got[(u, v)], w, rel_tol=1e-9), (u, v)


def _check_success(out: Path, summary: dict, landing: Path) -> None:
    edges = pq.read_table(out / "edges.parquet")
    nodes = pq.read_table(out / "nodes.parquet")
    n = nodes.num_rows
    src, dst = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    assert summary["nodes"] == n and summary["edges"] == len(src)
    assert ((src >= 0) & (src < n) & (dst >= 0) & (dst < n) & (src != dst)).all()
    keys = src * n + dst
    assert (np.diff(keys) > 0).all()  # sorted, no duplicates
    labels = set(nodes.column("label").to_pylist())
    given = {-1}
    if (landing / "nodes.parquet").is_file() and "label" in pq.read_schema(landing / "nodes.parquet").names:
        given |= {v for v in pq.read_table(landing / "nodes.parquet").column("label").to_pylist() if v is not None}
    assert labels <= given  # every label as given (nothing wrapped around)
    if (out / "features.npy").exists():
        x = np.load(out / "features.npy")
        assert x.shape[0] == n and np.isfinite(x).all()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(folder=landing_folders())
def test_malformed_landing_data_fails_clearly_or_builds_a_sound_graph(tmp_path_factory, folder):
    name, files = folder
    root = tmp_path_factory.mktemp("bad")
    landing, out = root / "landing" / name, root / "home" / "canonical_graph"
    for rel, (table, flaw, kind) in files.items():
        _place(landing / rel, table, flaw, kind, root / "landing", root / "outside")
    refused = [str(landing / rel) for rel, (_, _, kind) in files.items() if kind in REFUSED_KINDS]
    faulthandler.dump_traceback_later(300, exit=True)  # a read that blocks (on a FIFO) fails the test
    try:
        summary = build_canonical_graph(landing, out, CanonicalConfig(memory_limit="512MB", threads=1))
    except InputError as exc:
        message = str(exc)
        named = [str(landing / rel) for rel in files] + [str(landing)]
        assert any(path in message for path in named), message
        # a broken entry is refused first, by its own name, before any file is read
        assert not refused or any(message.startswith(f"{path}: ") for path in refused), message
        assert not out.exists()
    else:
        event(f"built, {'with' if any(c in str(landing) + ''.join(files) for c in '*?[') else 'no'} glob characters")
        event(f"built, linked inside: {any(kind == 'link_inside' for _, _, kind in files.values())}")
        assert not refused, refused
        _check_success(out, summary, landing)
        sound = [t for rel, (t, _, _) in files.items() if rel.startswith("edges")]
        assert (summary["input_files"], summary["input_rows"]) == (len(sound), sum(t.num_rows for t in sound))
        _check_rows(out, files)
    finally:
        faulthandler.cancel_dump_traceback_later()
    left = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert left == (["canonical_graph"] if out.exists() else [])  # no partial folder, no temporary
    shutil.rmtree(root)

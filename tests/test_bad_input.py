"""Property test: malformed landing data through `build_canonical_graph`.

Hypothesis draws a landing folder with any of: wrong column names or types, nulls, negative
or huge ids, ids of mixed kinds across files, empty or truncated Parquet files, features of
inconsistent width or non-finite values, labels out of range. Every case must end either in
a canonical graph that holds its invariants, or in an `InputError` whose message names the
offending file or value, and never leave a partial output folder or a temporary behind.

CI runs 200 examples; `GNNFLOW_SLOW=1` runs 2,000 (`GNNFLOW_EXAMPLES=N` sets any number).
"""

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs.canonical import CanonicalConfig, InputError, build_canonical_graph

EXAMPLES = int(os.environ.get("GNNFLOW_EXAMPLES", 2000 if os.environ.get("GNNFLOW_SLOW") else 200))

HUGE = 2**62
ID_VALUES = st.one_of(st.integers(-5, 40), st.integers(-5, 40), st.sampled_from([-(2**40), HUGE, 2**31, -1]))
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
        return pa.array([[v] for v in values], pa.list_(pa.int64()))
    t = draw(st.sampled_from(INT_TYPES))
    lo, hi = (0, 2**64 - 1) if t == pa.uint64() else (-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1)
    return pa.array([min(max(v, lo), hi) for v in values], t)


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
    """(files to write: {relative path: (table, flaw)}, description)."""
    files = {}
    dataset_kind = draw(st.sampled_from(["int", "string"]))
    pool = draw(st.lists(ID_VALUES, min_size=1, max_size=12, unique=True))
    for i in range(draw(st.integers(1, 3))):
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
        files[f"edges/part-{i}.parquet"] = (pa.table(cols), flaw)
    if draw(st.booleans()):  # nodes.parquet
        n = draw(st.integers(0, 10))
        ids = _ids(draw, n, draw(st.sampled_from([dataset_kind] * 4 + ["string", "float"])), pool, unique=True)
        cols = {"node_id": ids}
        if draw(st.integers(0, 3)) > 0:
            label = st.one_of(st.integers(-1, 6), st.integers(-1, 6), st.none(), st.sampled_from([-3, 2**40]))
            labels = draw(st.lists(label, min_size=n, max_size=n))
            cols["label"] = pa.array(labels, pa.int64())
        if draw(st.booleans()):
            cols["split"] = pa.array(
                draw(st.lists(st.sampled_from(["train", "val", "test", "x"]), min_size=n, max_size=n))
            )
        if draw(st.integers(0, 5)) == 0:
            cols = {("id" if k == "node_id" else k): v for k, v in cols.items()}
        files["nodes.parquet"] = (pa.table(cols), draw(st.sampled_from(["none"] * 8 + ["truncated", "zero_bytes"])))
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
        )
    return files


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
@given(files=landing_folders())
def test_malformed_landing_data_fails_clearly_or_builds_a_sound_graph(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("bad")
    landing, out = root / "landing", root / "home" / "canonical_graph"
    for rel, (table, flaw) in files.items():
        _write(landing / rel, table, flaw)
    try:
        summary = build_canonical_graph(landing, out, CanonicalConfig(memory_limit="512MB", threads=1))
    except InputError as exc:
        message = str(exc)
        named = [str(landing / rel) for rel in files] + [str(landing)]
        assert any(path in message for path in named), message
        assert not out.exists()
    else:
        _check_success(out, summary, landing)
    left = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert left == (["canonical_graph"] if out.exists() else [])  # no partial folder, no temporary
    shutil.rmtree(root)

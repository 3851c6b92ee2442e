"""The canonical_graph stage's node table: nodes.parquet with each node's original id, label and split.

`graphs.stages.canonical` documents nodes.parquet (node_id, original_id, label int32 with -1 for
unknown, split string) and runs the stage. `write_nodes` reads the optional input nodes.parquet:
labels are class indices 0..C-1 (`MAX_CLASSES` at most; whole-number floats accepted, null and NaN
read as unknown), split words match `SPLIT_WORDS` case-insensitively (others read as 'other' and
are counted, up to `SHOWN_SPLIT_WORDS` named), and when labels exist without a split, a seeded
train/val/test split of the labelled nodes is made. Nodes met only in edges get label -1 and
split 'other'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.infra.config_checks import MAX_CLASSES
from graphs.stages.canonical_ids import Relabeler
from graphs.stages.landing import DatasetFiles, InputError

# The split words of nodes.parquet, matched case-insensitively after trimming spaces, and their
# code in SPLIT_NAMES (the output's split values); any other word is read as 'other', counted.
SPLIT_NAMES = ("train", "val", "test", "other")
SPLIT_WORDS = {
    "train": 0,
    "training": 0,
    "val": 1,
    "valid": 1,
    "validation": 1,
    "dev": 1,
    "test": 2,
    "testing": 2,
    "other": 3,
}
SHOWN_SPLIT_WORDS, SHOWN_WORD_CHARS = 10, 40  # unknown split words named in the summary, each cut to this


def write_nodes(
    tmp: Path,
    files: DatasetFiles,
    relabel: Relabeler,
    new_ids: np.ndarray | None = None,
    *,
    split_seed: int,
    train_fraction: float,
    val_fraction: float,
) -> dict:
    """nodes.parquet and its facts; `new_ids` of the node file's rows when already known. A split
    generated for labels without one is seeded by `split_seed`, with these shares of the labelled
    nodes in train and val (the rest in test)."""
    n = relabel.n
    label = np.full(n, -1, dtype=np.int32)
    split = np.full(n, SPLIT_NAMES.index("other"), dtype=np.int8)
    facts = {
        "has_labels": False,
        "split_generated": False,
        "nodes_without_node_row": 0,
        "null_labels_as_unknown": 0,
        "null_splits_as_other": 0,
        "unknown_splits_as_other": 0,
        "unknown_split_words": [],
    }
    if files.nodes is not None:
        t = pq.read_table(files.nodes)
        idx = new_ids if new_ids is not None else relabel(t.column("node_id"))
        # filled, not failed: nodes met only in edges get label -1 and split 'other'
        facts["nodes_without_node_row"] = int(n - t.num_rows)
        if t.column("node_id").null_count:
            raise InputError(f"{files.nodes}: column 'node_id' has {t.column('node_id').null_count} null values")
        counts = np.bincount(idx, minlength=n)
        if (counts > 1).any():
            dup = relabel.ids[int(np.flatnonzero(counts > 1)[0])].as_py()
            raise InputError(f"{files.nodes}: column 'node_id' repeats the id {dup!r}; one row per node")
        if "label" in t.column_names:
            label[idx], facts["null_labels_as_unknown"] = _class_labels(t.column("label"), files.nodes)
            facts["has_labels"] = bool((label >= 0).any())
        if "split" in t.column_names:
            facts["null_splits_as_other"] = int(t.column("split").null_count)
            split[idx], unknown_rows, unknown_words = split_codes(t.column("split"))
            facts["unknown_splits_as_other"], facts["unknown_split_words"] = unknown_rows, unknown_words
        elif facts["has_labels"]:
            seeded_split(split, np.flatnonzero(label >= 0), split_seed, train_fraction, val_fraction)
            facts["split_generated"] = True
    facts["labelled_nodes"] = int(np.count_nonzero(label >= 0))
    facts["num_classes"] = int(label.max()) + 1 if facts["labelled_nodes"] else 0
    per_split = np.bincount(split, minlength=len(SPLIT_NAMES))
    for code, name in enumerate(("train", "val", "test")):
        facts[f"{name}_nodes"] = int(per_split[code])
    table = pa.table(
        {
            "node_id": pa.array(np.arange(n, dtype=np.int64)),
            "original_id": relabel.ids,
            "label": pa.array(label),
            "split": pa.array(SPLIT_NAMES, type=pa.string()).take(pa.array(split)),
        }
    )
    # ids delta-encoded (sorted: a few bits each; sorted strings share prefixes), label and
    # split by dictionary: smaller than zstd over plain values, and about twice as fast
    original = "DELTA_BINARY_PACKED" if pa.types.is_integer(relabel.ids.type) else "DELTA_BYTE_ARRAY"
    pq.write_table(
        table,
        tmp / CanonicalGraph.NODES,
        compression="none",
        use_dictionary=["label", "split"],
        column_encoding={"node_id": "DELTA_BINARY_PACKED", "original_id": original},
    )
    return facts


def _class_labels(labels: pa.ChunkedArray, path: Path) -> tuple[np.ndarray, int]:
    """(a nodes.parquet `label` column as int32 class indices, the rows read as -1 (unknown):
    null, and NaN in a float column). Floats must hold whole numbers (a pandas column of
    integers with gaps becomes float64); InputError naming the value for any other, or for a
    value outside -1..MAX_CLASSES-1."""
    if pa.types.is_floating(labels.type):
        values = labels.to_numpy()  # nulls read as NaN
        nan = np.isnan(values)
        given = values[~nan]
        whole = np.isfinite(given) & (given == np.floor(given))
        if not whole.all():
            raise InputError(
                f"{path}: column 'label' has the value {given[~whole][0]!r}, not a whole number; labels are class "
                "indices 0..C-1 (or -1/null/NaN for unknown)"
            )
        _check_label_range(given.min(initial=0), given.max(initial=0), path)
        return np.where(nan, -1, values).astype(np.int32), int(nan.sum())
    _check_label_range(pc.min(labels).as_py(), pc.max(labels).as_py(), path)
    # cast first: -1 fits no unsigned type
    return labels.cast(pa.int32()).fill_null(-1).to_numpy(), int(labels.null_count)


def _check_label_range(low, high, path: Path) -> None:
    for value in (low, high):
        if value is not None and not -1 <= value < MAX_CLASSES:
            raise InputError(
                f"{path}: column 'label' has value {int(value)}; labels are class indices 0..C-1 (at most "
                f"{MAX_CLASSES} classes: the model has one output per class up to the largest label), "
                "or -1/null for unknown: number the classes 0..C-1"
            )


def seeded_split(
    split: np.ndarray, labelled: np.ndarray, seed: int, train_fraction: float, val_fraction: float
) -> None:
    """Put the rows `labelled` of the split codes `split` into train / val / test, in place, in a
    permutation seeded by `seed`: these shares in train and val, the rest in test."""
    order = np.random.default_rng(seed).permutation(labelled)
    n_train = int(round(train_fraction * len(order)))
    n_val = int(round(val_fraction * len(order)))
    split[order[:n_train]] = 0
    split[order[n_train : n_train + n_val]] = 1
    split[order[n_train + n_val :]] = 2


def split_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, int, list[str]]:
    """(the code in `SPLIT_NAMES` of each row of a nodes.parquet `split` column, the rows whose
    word is none of `SPLIT_WORDS`, up to `SHOWN_SPLIT_WORDS` of those words). Words match
    case-insensitively, surrounding spaces ignored; null and unknown words read as 'other'."""
    words = column.cast(pa.string()).combine_chunks().dictionary_encode()
    normal = pc.utf8_lower(pc.utf8_trim_whitespace(words.dictionary))
    found = pc.index_in(normal, value_set=pa.array(list(SPLIT_WORDS))).to_numpy(zero_copy_only=False)
    known = ~np.isnan(found)
    word_code = np.full(len(found), SPLIT_NAMES.index("other"), dtype=np.int8)
    word_code[known] = np.array(list(SPLIT_WORDS.values()), dtype=np.int8)[found[known].astype(np.int64)]
    codes = np.full(len(words), SPLIT_NAMES.index("other"), dtype=np.int8)
    valid = words.indices.is_valid().to_numpy(zero_copy_only=False)
    row_word = words.indices.to_numpy(zero_copy_only=False)[valid].astype(np.int64)
    codes[valid] = word_code[row_word]
    unknown_rows = int(np.count_nonzero(~known[row_word]))
    unknown = np.flatnonzero(~known)[:SHOWN_SPLIT_WORDS]
    shown = [w[:SHOWN_WORD_CHARS] for w in words.dictionary.take(pa.array(unknown, pa.int64())).to_pylist()]
    return codes, unknown_rows, shown


__all__ = [
    "SHOWN_SPLIT_WORDS",
    "SHOWN_WORD_CHARS",
    "SPLIT_NAMES",
    "SPLIT_WORDS",
    "seeded_split",
    "split_codes",
    "write_nodes",
]

"""label_classes.json: the user's label value of each class index, beside a graph and a model.

Written into canonical_graph's folder by the ingest (`graphs.stages.canonical.build_canonical_graph`)
when the labels it read were categorical values (strings, booleans, dictionary-encoded values)
rather than integer class indices; copied into trained_model/ by training (so it is in the
model's hashes.json and in every model version); read by scoring (`training.predict`), which
returns the user's values. Format (version 1)::

    {"format_version": 1, "type": "string" | "bool" | "int" | "float",
     "classes": [value of class 0, value of class 1, ...]}

Class i is the i-th of the sorted distinct non-null label values.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from graphs.infra.config_checks import MAX_CLASSES, bounded_repr

LABEL_CLASSES = "label_classes.json"
FORMAT_VERSION = 1
# the file's "type" -> (the Python type of its values, the Arrow type they are returned as)
VALUE_TYPES = {
    "string": (str, pa.string()),
    "bool": (bool, pa.bool_()),
    "int": (int, pa.int64()),
    "float": (float, pa.float64()),
}


def _type_name(classes: list) -> str:
    for name, (kind, _) in VALUE_TYPES.items():  # bool before int: True is an int too
        if all(isinstance(v, kind) for v in classes):
            return name
    raise ValueError(f"label classes of mixed or unsupported types: {bounded_repr(classes)}")


def write_label_classes(folder: str | os.PathLike, classes: list) -> None:
    """label_classes.json in `folder` for these class values (class i = classes[i])."""
    doc = {"format_version": FORMAT_VERSION, "type": _type_name(classes), "classes": list(classes)}
    (Path(folder) / LABEL_CLASSES).write_text(json.dumps(doc, ensure_ascii=False) + "\n")


def read_label_classes(folder: str | os.PathLike) -> list | None:
    """The class values of a canonical_graph or trained_model folder, None when it has no
    label_classes.json (its labels were class indices). ValueError naming the file when the
    file is not in the format above."""
    path = Path(folder) / LABEL_CLASSES
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({str(exc)[:200]}); re-materialize canonical_graph") from None
    kind = VALUE_TYPES.get(doc.get("type")) if isinstance(doc, dict) else None
    classes = doc.get("classes") if isinstance(doc, dict) else None
    if (
        kind is None
        or doc.get("format_version") != FORMAT_VERSION
        or not isinstance(classes, list)
        or not 0 < len(classes) <= MAX_CLASSES
        or _type_name(classes) != doc["type"]
    ):
        raise ValueError(
            f"{path}: not a label_classes.json of format version {FORMAT_VERSION}; re-materialize canonical_graph"
        )
    return classes


def copy_label_classes(source: str | os.PathLike, target: str | os.PathLike) -> bool:
    """Copy `source`'s label_classes.json into `target`, when there is one; whether it was."""
    path = Path(source) / LABEL_CLASSES
    if not path.is_file():
        return False
    shutil.copyfile(path, Path(target) / LABEL_CLASSES)
    return True


def label_values(classes: list, indices: np.ndarray) -> pa.Array:
    """The user's value of each class index, as an Arrow array of the values' type."""
    values = pa.array(classes, type=VALUE_TYPES[_type_name(classes)][1])
    return values.take(pa.array(np.asarray(indices, dtype=np.int64)))


__all__ = ["LABEL_CLASSES", "copy_label_classes", "label_values", "read_label_classes", "write_label_classes"]

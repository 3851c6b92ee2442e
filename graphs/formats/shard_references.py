"""The arrays a minibatch_shards manifest names instead of storing them: node features and Â's weight factors.

`graphs.formats.shard_format` documents the manifest's ``features`` and ``weight_factors`` entries;
this module writes them (`features_entry`, `weight_factors_entry`, for `graphs.sampling.writer`) and
opens what they name for the reader (`open_features`, `open_weight_factors`, for `training.data`),
refusing files that changed since the shards were written. Features are the canonical graph's FP32
``features.npy`` or the compressed_graph folder's codes and scales, opened either way as one
`graphs.kernels.quantize.EncodedFeatures`; weight factors are normalized_adjacency's float64 row
and column scales.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from graphs.formats.compress_files import CompressedGraph
from graphs.formats.shard_format import FEATURE_ENCODINGS, MANIFEST_NAME, ShardError
from graphs.kernels.quantize import EncodedFeatures
from graphs.stages.compress import load_features

__all__ = ["features_entry", "open_features", "open_weight_factors", "weight_factors_entry"]


def features_entry(
    encoding: str,
    shape: tuple[int, int],
    folder: Path,
    fp32_path: Path | None,
    compressed_dir: Path | None,
) -> dict | None:
    """The manifest's ``features`` entry for feature `encoding` (one of FEATURE_ENCODINGS).

    `folder` is where the manifest will live (paths are stored relative to it);
    `fp32_path` the canonical ``features.npy`` (None: the graph has no features, the entry
    is None); `compressed_dir` the compressed_graph folder, needed for ``compressed``.
    """
    if encoding not in FEATURE_ENCODINGS:
        raise ValueError(f"feature encoding {encoding!r} is not one of {FEATURE_ENCODINGS}")
    if fp32_path is None:
        return None
    if encoding == "fp32":
        return {"encoding": "fp32", "path": os.path.relpath(fp32_path, folder), "shape": list(shape)}
    feats = _load_compressed(compressed_dir, "feature_encoding='compressed'")
    if feats is None or (feats.num_rows, feats.num_cols) != tuple(shape):
        got = "no features" if feats is None else f"features of shape [{feats.num_rows}, {feats.num_cols}]"
        raise ValueError(
            f"feature_encoding='compressed': {compressed_dir} holds {got}, the canonical graph {list(shape)}; "
            "re-materialize compressed_graph"
        )
    return {
        "encoding": "compressed",
        "path": os.path.relpath(compressed_dir, folder),
        "codes": feats.encoding,
        "transform": feats.transform,
        "shape": list(shape),
    }


def weight_factors_entry(folder: Path, row: Path, col: Path | None) -> dict:
    """The manifest's ``weight_factors`` entry: Â's row and column scale files (`graphs.stages.normalize`,
    ``col`` None for 'right'), relative to `folder`, where the manifest will live."""
    return {
        "row": os.path.relpath(row, folder),
        "col": None if col is None else os.path.relpath(col, folder),
    }


def _load_compressed(compressed_dir: Path | None, what: str, verify: bool = True) -> EncodedFeatures | None:
    if compressed_dir is None or not (Path(compressed_dir) / CompressedGraph.MANIFEST).is_file():
        raise ValueError(
            f"{what} needs compressed_graph's files in {compressed_dir}; materialize compressed_graph first"
        )
    return load_features(compressed_dir, verify=verify)


# ----------------------------------------------------------------------------- reading


def open_features(manifest: dict, root: str | os.PathLike) -> EncodedFeatures | None:
    """The features the manifest in `root` names, memory-mapped, as `graphs.kernels.quantize.EncodedFeatures`
    (None without features). Refuses files that changed since the shards were written."""
    entry = manifest.get("features")
    if entry is None:
        return None
    root = Path(root)
    shape = tuple(entry["shape"])
    path = root / entry["path"]
    stale = "they changed since the shards were written; re-materialize minibatch_shards"
    if entry["encoding"] == "fp32":
        try:
            x = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise ShardError(f"{path}: feature file named by the manifest is missing; re-materialize") from None
        if x.dtype != np.float32 or x.shape != shape:
            raise ShardError(
                f"{path}: {x.dtype} {list(x.shape)} but the manifest expects float32 {list(shape)}; {stale}"
            )
        return EncodedFeatures("fp32", shape[0], shape[1], {"x": x})
    if entry["encoding"] != "compressed":
        raise ShardError(f"{root / MANIFEST_NAME}: unknown feature encoding {entry['encoding']!r}")
    try:  # unverified here: training checks these files through the manifest (verify_upstream)
        feats = _load_compressed(path, "the shards' features", verify=False)
    except (ValueError, OSError) as exc:
        raise ShardError(str(exc)) from None
    got = None if feats is None else (feats.encoding, feats.transform, (feats.num_rows, feats.num_cols))
    if got != (entry["codes"], entry["transform"], shape):
        raise ShardError(
            f"{path}: compressed features {got} but the manifest expects "
            f"{(entry['codes'], entry['transform'], shape)}; {stale}"
        )
    return feats


def open_weight_factors(manifest: dict, root: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(row, col) float64 [n] memory-mapped, that the manifest in `root` names for weight
    encoding ``factors`` (``col`` is ``row`` for a symmetric Â, None for 'right'); None for
    another encoding. Refuses a missing file, or one of another dtype or length."""
    if manifest.get("weight_encoding") != "factors":
        return None
    entry = manifest.get("weight_factors")
    if not isinstance(entry, dict) or "row" not in entry:
        raise ShardError(f"{Path(root) / MANIFEST_NAME}: weight encoding factors without weight_factors")
    n, loaded = int(manifest["n"]), {}
    for key in ("row", "col"):
        rel = entry.get(key)
        if rel is None or rel in loaded:
            continue
        path = Path(root) / rel
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise ShardError(f"{path}: scale file named by the manifest is missing; re-materialize") from None
        if arr.dtype != np.float64 or arr.shape != (n,):
            raise ShardError(
                f"{path}: {arr.dtype} {list(arr.shape)} but the manifest expects float64 [{n}]; it changed since "
                "the shards were written; re-materialize minibatch_shards"
            )
        loaded[rel] = arr
    col = entry.get("col")
    return loaded[entry["row"]], None if col is None else loaded[col]

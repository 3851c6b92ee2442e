"""The minibatch shard format, defined once: file names, keys, version, manifest schema, reading a shard.

The writer (`graphs.sampling`, the minibatch_shards stage: `STAGE`) and the reader (`training.data`, on every
training rank) both import this module, so every name, dtype and version of the format has one owner. It needs only
NumPy (no DGL, no torch): training runs where DGL is not installed. Every change to what is stored bumps
`FORMAT_VERSION` here; a reader refuses any other version with a message naming the stage to re-run.
Two modules beside it apply the format: `graphs.formats.shard_codec` encodes minibatches into a
file's entries and decodes them back (`encode_shard`, `decode_minibatch`), and
`graphs.formats.shard_references` writes and opens the arrays the manifest names instead of storing
(features, weight factors).

Layout of a minibatch_shards folder (replaced atomically as a whole):

``epoch={e}/rank={r}/shard-{k:05d}.npz`` (`shard_relpath`)
    Uncompressed ``.npz`` (`graphs.formats.npzio.write_npz`: streamed, 64-byte aligned, readable
    by ``np.load(..., allow_pickle=False)``) holding ``minibatches_per_shard`` minibatches
    (the last shard of a stream may hold fewer). Header scalars (`HEADER_KEYS`):
    ``format_version`` and ``minibatches``; then per minibatch ``i`` (0-based within the
    file) the entries of `MINIBATCH_ENTRIES` under the prefix ``mb{i}_`` (`minibatch_key`)
    and, per block ``l``, those of `BLOCK_ENTRIES` under ``mb{i}_l{l}_`` (`block_key`).
    Blocks ``l = 0 .. num_layers-1``; with the manifest's ``shared_block`` (cluster_gcn,
    saint) only ``l0`` is stored and stands for every layer.

``manifest.json`` (`MANIFEST_NAME`)
    JSON with the keys of `MANIFEST_KEYS` (required ones checked by `read_manifest`); per
    (epoch, rank) stream the files in order with their byte size, SHA-256 and minibatch
    count (`stream_record`, `read_shard` checks them).

A block is CSC over its destination nodes (`training.blocks.Block`): the destination
nodes are the first ``num_dst`` source nodes, and block ``l``'s destinations are block
``l + 1``'s sources, so the one array ``input_nodes`` of global ids names the nodes of
every block. Edge weights are stored in one of `WEIGHT_ENCODINGS`: ``fp32`` (``weight``)
or ``int8`` (``weight_q`` int8 per edge and ``weight_scale`` float32 per destination,
symmetric per row: weight = q * scale[dst], `graphs.kernels.quantize_csr.quantize_int8_rows_csr`) or
``factors``: none per edge. Where Â factors (an unweighted graph, `graphs.stages.normalize`), its
entry of block edge u -> v is float32(row[v] · col[u]) (float32(row[v]) without ``col``), from
normalized_adjacency's two float64 vectors over all nodes that the manifest's
``weight_factors`` names (`graphs.formats.shard_references.open_weight_factors`), gathered for a minibatch's ``input_nodes``
when a layer needs the weights: bit for bit what ``weight`` would hold, at no byte per edge.
The weights are Â's entries; the sampler's correction (inverse inclusion probability) is
stored on its own (``correction``, FP32), so each layer type applies it its own way
(`training.layers.sampled_edge_weight`: GCN Â·c, GIN c, SAGE-mean the c-weighted mean).
Version 3 split the correction out of the weights (version 2 stored Â·c as ``weight``);
version 5 stores it as two values per destination (``correction_first``, ``correction_rest``)
when that is exact (`graphs.formats.shard_codec.compact_correction`; the reader expands it); version 6 added the
``factors`` weight encoding.

Features are not copied into the shards: the manifest's ``features`` entry
(`graphs.formats.shard_references.features_entry`) names either the canonical graph's FP32 ``features.npy`` or the
compressed_graph folder, whose codes and scales (INT8, 4-bit or bit-packed, with its
``feature_transform``) are decoded by `graphs.kernels.quantize.EncodedFeatures` — the one layout
of quantized features. `graphs.formats.shard_references.open_features` gives the reader an `EncodedFeatures` either way:
its ``gather(nodes)`` takes a batch's compact rows, ``decode_gathered(_torch)`` decodes
them (on the training device for CUDA), ``asinh`` undone.

Extending the format (and bump `FORMAT_VERSION`):

- a per-edge array of a block (e.g. a sampling correction stored on its own): add it to
  `BLOCK_ENTRIES` with ``required=False`` and give the sampled block an attribute of that
  name; `graphs.formats.shard_codec.encode_minibatch` writes it when not None and
  `graphs.formats.shard_codec.decode_minibatch` returns it in ``shard_codec.StoredBlock.extra`` — no other
  change;
- a manifest fact (e.g. upstream content hashes): add it to `MANIFEST_KEYS` (required ones
  are checked by `read_manifest`) and write it in the writer's manifest;
- an optional per-minibatch array (link prediction's ``pos_pairs`` / ``neg_pairs``): add it
  to `MINIBATCH_ENTRIES` with ``required=False`` and give the sampled minibatch an attribute
  of that name; it is written when not None and read into ``shard_codec.StoredMinibatch.extra``;
- anything else per minibatch: add it to `MINIBATCH_ENTRIES`, `graphs.formats.shard_codec.encode_minibatch`
  and `graphs.formats.shard_codec.decode_minibatch`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.npzio import NpzFormatError, aligned_buffer, read_npz
from graphs.infra.storage import (
    HASHES_NAME,
    CorruptFileError,
    cached_file_sha256,
    file_is_as_published,
    read_file_hashes,
    split_run_stats,
    verify_files,
    write_summary,
)
from graphs.stages.normalize import Adjacency

__all__ = [
    "BLOCK_ENTRIES",
    "FEATURE_ENCODINGS",
    "FORMAT_VERSION",
    "HEADER_KEYS",
    "MANIFEST_KEYS",
    "MANIFEST_NAME",
    "MINIBATCH_ENTRIES",
    "STAGE",
    "SUPPORTED_FORMAT_VERSION",
    "DamagedFileError",
    "ShardError",
    "WEIGHT_ENCODINGS",
    "block_key",
    "check_manifest",
    "index_dtype",
    "minibatch_key",
    "read_manifest",
    "read_shard",
    "shard_relpath",
    "stream_record",
    "upstream_hashes",
    "refuse_republished_upstream",
    "verify_upstream",
    "write_manifest",
]

STAGE = "minibatch_shards"  # the asset (stage) whose folder holds this format
FORMAT_VERSION = 8
"""Version of the files this code writes; the reader refuses any other (git's history of this line: what changed)."""
SUPPORTED_FORMAT_VERSION = FORMAT_VERSION
"""Version of the files this code reads (only its own: a format change re-samples)."""

MANIFEST_NAME = "manifest.json"
WEIGHT_ENCODINGS = ("fp32", "int8", "factors")
FEATURE_ENCODINGS = ("fp32", "compressed")

HEADER_KEYS = {
    "format_version": "int64 scalar, FORMAT_VERSION",
    "minibatches": "int64 scalar, minibatches in this file",
}


@dataclass(frozen=True)
class Entry:
    """One npz entry of a minibatch or block: what it holds, and whether every file has it."""

    doc: str
    required: bool = True


MINIBATCH_ENTRIES = {
    "input_nodes": Entry(
        "int32 [num_src(l0)] global ids of block 0's source nodes (feature rows); its first num_dst(l) "
        "entries are block l's destination nodes (int64 if an id >= 2^31)"
    ),
    "seeds": Entry("int64 [S] global ids of the loss nodes"),
    "seed_pos": Entry(
        "int64 [S] their positions among the last block's destination nodes (arange(S) for neighbor/importance)"
    ),
    "labels": Entry("int64 [S]"),
    "loss_weight": Entry("float32 [S] per-seed loss weight (saint)", required=False),
    "pos_pairs": Entry(
        "int64 [2, P] link prediction: positive pairs (row 0 source, row 1 destination) as positions among "
        "the last block's destination nodes",
        required=False,
    ),
    "neg_pairs": Entry("int64 [2, Q] link prediction: negative pairs, positions as pos_pairs", required=False),
}

BLOCK_ENTRIES = {
    "num_src": Entry("int64 scalar"),
    "num_dst": Entry("int64 scalar"),
    "indptr": Entry("int32 [num_dst + 1] CSC over the destination nodes (int64 if nnz >= 2^31)"),
    "indices": Entry("int32 [nnz] local source index (int64 if num_src >= 2^31)"),
    "correction": Entry(
        "float32 [nnz] sampling correction per edge (1 for self loops and unsampled edges): neighbor "
        "deg(v)/sampled(v) (1 without samplers.neighbor.rescale), importance c_u/(s q_u), saint C_v/C_uv, cluster_gcn 1; "
        "absent when correction_first and correction_rest hold it",
        required=False,
    ),
    "correction_first": Entry(
        "float32 [num_dst] the correction of each destination's first in-edge (its self loop, when the "
        "blocks hold self loops), stored instead of correction when every other in-edge of a destination "
        "has one value (`compact_correction`)",
        required=False,
    ),
    "correction_rest": Entry(
        "float32 [num_dst] that value: the correction of each destination's other in-edges", required=False
    ),
    "weight": Entry(
        "float32 [nnz] Â's entry per edge (without the correction) with weight encoding fp32", required=False
    ),
    "weight_q": Entry("int8 [nnz] with weight encoding int8", required=False),
    "weight_scale": Entry("float32 [num_dst] with weight encoding int8: weight = q * scale[dst]", required=False),
    # weight encoding factors: no weight entry (the manifest's weight_factors hold them)
    "etype": Entry(
        "int16 [nnz] typed graphs only: each edge's relation index (the manifest's typed schema), from the"
        " relational Â (graphs.stages.normalize_relations)",
        required=False,
    ),
}


@dataclass(frozen=True)
class ManifestKey:
    doc: str
    required: bool = True


MANIFEST_KEYS = {
    "format_version": ManifestKey("int, FORMAT_VERSION of the shard files"),
    "sampler": ManifestKey("the registered sampler's name (graphs.sampling.registry)"),
    "settings": ManifestKey("every ShardConfig field"),
    "num_layers": ManifestKey("blocks per minibatch (the model's number of layers)"),
    "shared_block": ManifestKey("true when only block l0 is stored and stands for every layer"),
    "non_uniform_draws": ManifestKey(
        "null for draws with equal probabilities, else the settings that draw unequally (e.g. \"sampler 'saint'\"):"
        " the edges' corrections then suit only a (weighted) sum or mean (a layer's `linear` trait)"
    ),
    "world_size": ManifestKey("W, ranks the shards were cut for"),
    "batch_size": ManifestKey("seeds per minibatch per rank (upper bound; neighbor/importance)"),
    "epochs": ManifestKey("E"),
    "n": ManifestKey("nodes of the graph"),
    "num_classes": ManifestKey("classes of the labels"),
    "feature_dim": ManifestKey("D, 0 without features"),
    "train_nodes": ManifestKey("T, training nodes (split train, label >= 0)"),
    "weight_encoding": ManifestKey("fp32 | int8 | factors: the edge-weight encoding of the shards"),
    "weight_factors": ManifestKey(
        "weight encoding factors only: {row: path, col: path or null} of normalized_adjacency's float64 scale"
        " vectors (relative to the manifest's folder; col = row for a symmetric Â, null for 'right')",
        required=False,
    ),
    "self_loops": ManifestKey("whether every block holds each destination's self loop"),
    "features": ManifestKey(
        "null, or {encoding: fp32, path: canonical features.npy} or {encoding: compressed, path: compressed_graph"
        " folder, codes: int8 | int4 | binary, transform: none | asinh}; paths relative to the manifest's folder;"
        " plus shape [n, D] (see features_entry)"
    ),
    "minibatches_per_epoch_per_rank": ManifestKey("M, equal for every epoch and rank"),
    "streams": ManifestKey(
        "list of {epoch, rank, minibatches, seeds, sampled_edges, bytes, files: [{path, bytes, sha256, minibatches}]}"
    ),
    "sampled_edges": ManifestKey(
        "edges of all stored blocks of all minibatches (self loops included; a shared block counts once)"
    ),
    "seeds": ManifestKey("loss nodes over all minibatches"),
    "bytes": ManifestKey("bytes of all shard files"),
    "bytes_per_sampled_edge": ManifestKey("bytes / sampled_edges"),
    # run statistics (seconds, seeds_per_second, sampled_edges_per_second, peak_rss_bytes) are
    # returned by write_minibatch_shards and kept in run_stats.json (graphs.infra.storage.write_summary),
    # so the manifest, and the training data version over it, does not change with timing
    "upstream": ManifestKey(
        "list of {stage, path, sha256}: every upstream file the shards and training read (path relative to"
        " the manifest's folder); read_manifest(verify_upstream=True) refuses a mismatch, naming the stage"
    ),
    "saint": ManifestKey("saint only: presamples N, mean subgraph nodes", required=False),
    "placement": ManifestKey(
        "with METIS parts only: {mode: random | partition, rank_of_part, remote_row_share_mean / _max / _total:"
        " share of gathered feature rows (input nodes) in another rank's parts, per step and overall}; streams"
        " then also carry gathered_rows and remote_rows",
        required=False,
    ),
    "rebalance": ManifestKey(
        "rebalance only, when the ranks' speeds differed: {shares: each rank's share of an epoch's seeds};"
        " training weights rank r's loss by world_size x shares[r] (graphs.sampling.rebalance)",
        required=False,
    ),
    "inputs": ManifestKey("paths (relative) of the canonical, adjacency, partition and compressed folders used"),
    "task": ManifestKey(
        "node_classification (absent: the same), link_prediction (minibatches carry pos_pairs / neg_pairs; the"
        " seeds are the pairs' endpoints, labels -1) or graph_property (see graphs)",
        required=False,
    ),
    "graphs": ManifestKey(
        "graph_property only (samplers whole_graphs, khop_graphs): {train_graphs, graphs_per_batch, label_kind;"
        " khop_graphs: hops, roots, max_nodes}; each minibatch is graphs of the collection, whole or cut to the"
        " k-hop neighbourhood of roots: seeds are graph indices (graphs.formats.graph_table), seed_pos each"
        " graph's first position among the nodes, labels the class index (-1 for values and missing labels)",
        required=False,
    ),
    "typed": ManifestKey(
        "typed graphs only: canonical_graph's types.json (graphs.stages.typed_graph.TypedSchema): the node types"
        " (count, offset, feat_width), the relations and the target type; every block then holds etype",
        required=False,
    ),
    "link": ManifestKey(
        "link prediction only: seed edges, negatives per positive, negative filter and distribution, the"
        " negative sampler's rejection counts, the edge_split folder",
        required=False,
    ),
}


class ShardError(RuntimeError):
    """A shard file or manifest is missing, truncated, corrupt or of another format."""


class DamagedFileError(ShardError, CorruptFileError):
    """A file the shards read (a shard, the manifest, or an upstream stage's file) no longer
    holds what was published: damaged or edited since. Caught as either parent."""


# ----------------------------------------------------------------------------- names


def shard_relpath(epoch: int, rank: int, shard: int) -> str:
    """Path of shard file `shard` of (`epoch`, `rank`), relative to the folder."""
    return f"epoch={epoch}/rank={rank}/shard-{shard:05d}.npz"


def minibatch_key(i: int, name: str) -> str:
    """The npz key of entry `name` (of `MINIBATCH_ENTRIES`) of minibatch `i` of a file."""
    return f"mb{i}_{name}"


def block_key(i: int, layer: int, name: str) -> str:
    """The npz key of entry `name` (of `BLOCK_ENTRIES`) of block `layer` of minibatch `i`."""
    return f"mb{i}_l{layer}_{name}"


def index_dtype(bound: int):
    """int32 when every value is below `bound` <= 2^31, else int64 (ids, indptr, indices)."""
    return np.int32 if bound < 2**31 else np.int64


# ----------------------------------------------------------------------------- writing


def write_manifest(folder: str | os.PathLike, manifest: dict) -> None:
    """Write `manifest` (checked against `MANIFEST_KEYS`) as the folder's manifest.json; its run
    statistics (seconds, rates, peak RSS) go to run_stats.json beside it."""
    path = Path(folder) / MANIFEST_NAME
    check_manifest(split_run_stats(manifest)[0], path)
    write_summary(folder, manifest, MANIFEST_NAME)


# The files of each upstream stage that the shards reference or training reads (besides the shard
# files, hashed in `streams`); compressed_graph's feature files are hashed when referenced.
UPSTREAM_FILES = {
    CanonicalGraph.STAGE: (CanonicalGraph.NODES, CanonicalGraph.FEATURES, CanonicalGraph.TYPES),
    Adjacency.STAGE: (
        *Adjacency.CSR_FILES,
        Adjacency.ROW_SCALE,
        Adjacency.COL_SCALE,
        *Adjacency.RELATIONAL_FILES.values(),
    ),
}


def upstream_hashes(folder: str | os.PathLike, inputs: dict[str, Path], features: dict | None) -> list[dict]:
    """``[{stage, path, sha256}]`` of every upstream file the shards depend on: `inputs` maps a
    stage name to its folder, `features` is the manifest's features entry, paths are stored
    relative to `folder` (where the manifest lives). The digests come from the per-process cache
    (`graphs.infra.storage.cached_file_sha256`), filled when the stage's readers checked the files."""
    files = []
    for stage, names in UPSTREAM_FILES.items():
        if stage in inputs:
            files += [(stage, Path(inputs[stage]) / name) for name in names]
    if features is not None and features["encoding"] == "compressed":
        # lexically: `folder` may not exist yet (a first write), and '..' must not need it to
        compressed = Path(os.path.normpath(Path(folder) / features["path"]))
        c = CompressedGraph  # its manifest, the codes referenced and their scales
        files += [(c.STAGE, compressed / f) for f in (c.MANIFEST, c.FEATURE_FILES[features["codes"]], c.FEATURE_SCALES)]
    return [
        {"stage": stage, "path": os.path.relpath(path, folder), "sha256": cached_file_sha256(path)}
        for stage, path in files
        if path.is_file()
    ]


def verify_upstream(manifest: dict, root: str | os.PathLike) -> None:
    """Refuse an upstream file recorded in the manifest that is missing or no longer has the
    recorded SHA-256, naming the stage to re-run.

    Which stage depends on the file's own stage record (`graphs.infra.storage.file_is_as_published`):
    a file that still matches what its stage published means that stage was re-materialized
    after the shards (ShardError: re-materialize minibatch_shards); a file that no longer
    matches its stage's record was damaged after publishing (DamagedFileError: re-materialize
    that stage; re-sampling would bake the damage into new shards).
    """
    for entry in manifest["upstream"]:
        path = Path(os.path.normpath(Path(root).resolve() / entry["path"]))
        if not path.is_file() or cached_file_sha256(path) != entry["sha256"]:
            raise _changed_upstream(path, str(entry["stage"])[:64])


def refuse_republished_upstream(manifest: dict, root: str | os.PathLike) -> None:
    """ShardError naming the first upstream file whose stage published another version of it
    since the shards were written (its hashes.json records another SHA-256 than the manifest).
    Reads the stages' records only, no file's bytes: the cheap check before a training launch."""
    for entry in manifest["upstream"]:
        path = Path(os.path.normpath(Path(root).resolve() / entry["path"]))
        try:
            published = read_file_hashes(path.parent, stage="")[path.name]["sha256"]
        except (CorruptFileError, KeyError):
            continue  # no record to compare with: the training's own full check decides
        if published != entry["sha256"]:
            raise _changed_upstream(path, str(entry["stage"])[:64])


def _changed_upstream(path: Path, stage: str) -> ShardError:
    """The error for an upstream file that differs from the shards' record (see verify_upstream)."""
    missing = "is missing" if not path.is_file() else "changed"
    published = file_is_as_published(path.parent, path.name)
    if published is False:
        return DamagedFileError(
            f"{path} {missing}: it no longer matches what {stage} published (its hashes.json), so it was "
            f"damaged after publishing; re-materialize {stage} (the shards were cut from the file as published; "
            "re-sampling now would bake the damage in)"
        )
    if published is None and not (path.parent / HASHES_NAME).is_file():
        return ShardError(
            f"{path} {missing} since minibatch_shards was materialized from it, and {path.parent} has no hash "
            f"record to tell a re-materialized file from a damaged one; re-materialize {stage}, then minibatch_shards"
        )
    return ShardError(
        f"{path} {missing} since minibatch_shards was materialized from it: {stage} was "
        f"re-materialized; re-materialize minibatch_shards so the shards match {stage}"
    )


# ----------------------------------------------------------------------------- reading


def check_manifest(manifest: Any, path: str | os.PathLike) -> dict:
    """`manifest` if it is a manifest of this format version with every required key, else ShardError."""
    if not isinstance(manifest, dict):
        raise ShardError(f"{path}: not a JSON object; re-materialize minibatch_shards")
    version = manifest.get("format_version")
    if version != SUPPORTED_FORMAT_VERSION:
        raise ShardError(
            f"{path}: shard format version {version!r}, this code reads version {SUPPORTED_FORMAT_VERSION}; "
            "re-materialize minibatch_shards"
        )
    missing = [k for k, spec in MANIFEST_KEYS.items() if spec.required and k not in manifest]
    if missing:
        raise ShardError(f"{path}: manifest lacks {missing}; re-materialize minibatch_shards")
    return manifest


def read_manifest(asset_dir: str | os.PathLike, verify_upstream_files: bool = False) -> dict:
    """The manifest.json of a minibatch_shards folder (version and required keys checked; with
    `verify_upstream_files`, also the manifest against the folder's hashes.json and every recorded
    upstream file's SHA-256, see `verify_upstream`)."""
    path = Path(asset_dir) / MANIFEST_NAME
    if verify_upstream_files and path.is_file():
        try:
            verify_files(asset_dir, [MANIFEST_NAME], stage=STAGE)
        except CorruptFileError as exc:
            raise DamagedFileError(str(exc)) from None
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{path}: no manifest; materialize minibatch_shards first") from None
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: cannot be read as JSON ({exc}); re-materialize minibatch_shards") from exc
    check_manifest(manifest, path)
    if verify_upstream_files:
        verify_upstream(manifest, asset_dir)
    return manifest


def stream_record(manifest: dict, epoch: int, rank: int) -> dict:
    """The manifest's stream record of (`epoch`, `rank`): files, minibatches, seeds, bytes."""
    if not 0 <= rank < manifest["world_size"]:
        raise ValueError(f"rank {rank}: the shards were written for world_size={manifest['world_size']}")
    if not 0 <= epoch < manifest["epochs"]:
        raise ValueError(
            f"epoch {epoch}: the shards hold epochs 0..{manifest['epochs'] - 1}; pass epoch % {manifest['epochs']} "
            "to reuse them, or re-materialize with more epochs"
        )
    for s in manifest["streams"]:
        if s["epoch"] == epoch and s["rank"] == rank:
            return s
    raise ShardError(f"manifest has no stream for epoch {epoch}, rank {rank}")


# Shard files whose SHA-256 this process has checked: (path, device, inode, size, mtime in ns,
# digest). A later epoch reading the same file unchanged skips the hash (~0.3 CPU s per epoch
# of 1M-row shards); a file replaced, rewritten or touched since has a new identity and is hashed
# again. A file modified in the last `_SETTLED_NS` is hashed at every read: file systems stamp
# times at a clock tick's resolution, so a rewrite within one tick could keep the stamp. Sets
# are safe to add to from the loader threads (the GIL).
_VERIFIED: set[tuple] = set()
_SETTLED_NS = 2_000_000_000


def read_shard(root: str | os.PathLike, record: dict, verify: bool = True) -> dict[str, np.ndarray]:
    """The arrays of one shard file (`record` from `stream_record`), after checking its size,
    (with `verify`) its SHA-256, its version and its minibatch count. The SHA-256 is computed
    once per process and file: again only when the file's inode, size, modification or change
    time changed (`_VERIFIED`; a content change whose times were set back changes the change time).

    The file is read once into a buffer; the arrays are views into it
    (`graphs.formats.npzio.read_npz`: no pickle, no second copy, no per-member CRC when the
    file's SHA-256 has been checked).
    """
    path = Path(root) / record["path"]
    try:
        stat = path.stat()
        size = stat.st_size
        if size != record["bytes"]:
            raise DamagedFileError(
                f"{path}: {size} bytes but the manifest says {record['bytes']}: the file was damaged (truncated or "
                "replaced) after minibatch_shards published it; re-materialize minibatch_shards"
            )
        data = aligned_buffer(size)
        with open(path, "rb") as f:
            got = f.readinto(data)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file is missing; re-materialize minibatch_shards") from None
    if got != size:
        raise ShardError(f"{path}: read {got} of {size} bytes (file changed while reading)")
    identity = (
        str(path.absolute()),
        stat.st_dev,
        stat.st_ino,
        size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
        record["sha256"],
    )
    if verify and identity not in _VERIFIED:
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise DamagedFileError(
                f"{path}: SHA-256 {digest[:16]}... does not match the manifest's {str(record['sha256'])[:16]}...: "
                "the file was damaged after minibatch_shards published it; re-materialize minibatch_shards"
            )
        if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > _SETTLED_NS:
            _VERIFIED.add(identity)
    try:
        arrays = read_npz(data)
        if int(arrays["format_version"]) != SUPPORTED_FORMAT_VERSION:
            raise ShardError(
                f"{path}: shard format version {int(arrays['format_version'])}, expected {SUPPORTED_FORMAT_VERSION}"
            )
        if int(arrays["minibatches"]) != record["minibatches"]:
            raise ShardError(
                f"{path}: holds {int(arrays['minibatches'])} minibatches, manifest says {record['minibatches']}"
            )
    except ShardError:
        raise
    except (NpzFormatError, KeyError) as exc:
        raise ShardError(f"{path}: cannot be read as a shard .npz ({type(exc).__name__}: {exc})") from exc
    return arrays

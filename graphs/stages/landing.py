"""What a landing dataset folder holds, and which of its entries may be read.

A dataset folder (`landing/<dataset>/`) holds the ingest's inputs:
    edges/*.<fmt> and/or edges.<fmt>   the edge files (at least one: that makes it a dataset);
                                       <fmt> one of `EDGE_SUFFIXES`: parquet, csv, tsv, txt
    nodes.<fmt>                        optional; parquet, csv or tsv (`NODE_SUFFIXES`)
    features.parquet                   optional
    graphs.parquet                     optional: makes the folder a graph collection
                                       (`graphs.stages.collection` documents its layout)
    nodes/<type>.parquet               a typed graph: one file per node type (the folder makes the
    features/<type>.parquet            dataset typed; `graphs.stages.typed_graph` documents the layout,
                                       edges/ then holds edges/<src_type>__<relation>__<dst_type>.parquet)
    _SUCCESS                           optional marker: "the copy is complete" (`landing_marked_ready`)
One input in two formats (edges.parquet and edges.csv, nodes.parquet and nodes.csv) is refused.
How the text formats are read is `graphs.stages.user_files`' part.

The rule for every input entry, applied in one place (`find_dataset_files`) for the ingest
(`graphs.stages.canonical.build_canonical_graph`) and the landing sensor (`pipelines.sensors`):
the dataset folder, `edges/` and each input file are followed through symlinks only when
they resolve inside the landing folder (the dataset folder's parent), and must then be a
folder (the dataset folder, `edges/`) or a regular file (every input file). A
dangling symlink, a symlink that leads out of the landing folder, a FIFO, socket, device or
folder in a file's place is refused with an `InputError` naming the entry; nothing is ever
opened before its entry passes (so a FIFO cannot block a read). Other entries of the folder
are not inputs and are ignored; the dataset's settings file (`gnnflow.yaml`) passes the
same rule before it is read (`checked_dataset_file`).

The landing sensor's view of a folder (`is_dataset_folder`, `landing_fingerprint`,
`landing_marked_ready`) lists the same entries and never raises for one bad entry, so one
broken dataset folder never stops the sensor for the others: the sensor calls
`find_dataset_files` for each dataset and skips the ones it refuses, naming them.
`landing_fingerprint` reads the content of the entries that pass the rule, the inputs and
the settings file (a SHA-256 per file, kept per process while the file's size and times
stay the same: `graphs.infra.storage.cached_file_sha256`); it opens no other entry.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from graphs.infra.storage import cached_file_sha256

READY_MARKER = "_SUCCESS"
SETTINGS_FILE = "gnnflow.yaml"  # the dataset's settings: its column mapping and stage settings
# the node and feature files of a landing folder in the layout read without conversion (and generated)
EDGES_FILE = "edges.parquet"
NODES_FILE = "nodes.parquet"
GRAPHS_FILE = "graphs.parquet"  # a graph collection's graph table (`graphs.stages.collection`)
FEATURES_FILE = "features.parquet"
EDGE_SUFFIXES = (".parquet", ".csv", ".tsv", ".txt")
NODE_SUFFIXES = (".parquet", ".csv", ".tsv")
FEATURE_SUFFIXES = (".parquet",)
# the optional inputs: file stem -> the formats it may come in
OPTIONAL_INPUTS = {"nodes": NODE_SUFFIXES, "features": FEATURE_SUFFIXES, "graphs": (".parquet",)}
# a typed graph's per-type folders (`graphs.stages.typed_graph`): folder -> the file suffix it holds
TYPED_FOLDERS = {"nodes": ".parquet", "features": ".parquet"}


class InputError(ValueError):
    """Raised for bad input; the message names the file, the column and the value."""


@dataclass
class DatasetFiles:
    """The input files of one dataset folder, as named in it (symlinks not resolved)."""

    edge_files: list[Path]
    nodes: Path | None
    features: Path | None
    graphs: Path | None = None  # a graph collection's graphs.parquet (`graphs.stages.collection`)
    node_type_files: list[Path] = field(default_factory=list)  # a typed graph's nodes/<type>.parquet
    feature_type_files: list[Path] = field(default_factory=list)  # a typed graph's features/<type>.parquet

    @property
    def typed(self) -> bool:
        """Whether the folder is a typed graph (it has a ``nodes/`` folder)."""
        return bool(self.node_type_files)


def _present(root: Path, stem: str, suffixes: tuple[str, ...]) -> list[Path]:
    """The entries `<stem><suffix>` of `root` that exist (dangling symlinks included)."""
    return [root / f"{stem}{suffix}" for suffix in suffixes if os.path.lexists(root / f"{stem}{suffix}")]


def _edge_entries(root: Path, strict: bool = False) -> list[Path]:
    """The edge entries of a dataset folder, of any kind (dangling symlinks included):
    ``edges/*.<fmt>`` in name order, then ``edges.<fmt>`` (`EDGE_SUFFIXES`). An ``edges``
    symlink or folder that cannot be listed counts as one entry (raises OSError with
    `strict`); OSError when the dataset folder itself cannot be examined."""
    entries: list[Path] = []
    edges = root / "edges"
    if edges.is_symlink() or edges.is_dir():
        try:
            entries = sorted(p for p in edges.iterdir() if p.name.endswith(EDGE_SUFFIXES))
        except OSError:
            if strict:
                raise
            entries = [edges]
    return entries + _present(root, "edges", EDGE_SUFFIXES)


def _folder_entries(root: Path, name: str, strict: bool = False) -> list[Path]:
    """The ``<name>/*<suffix>`` entries of a typed graph's folder `name` (`TYPED_FOLDERS`) in name
    order, [] when there is no such folder; one that cannot be listed counts as one entry (raises
    OSError with `strict`)."""
    folder = root / name
    if not (folder.is_symlink() or folder.is_dir()):
        return []
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith(TYPED_FOLDERS[name]))
    except OSError:
        if strict:
            raise
        return [folder]


def _input_entries(root: Path) -> list[Path]:
    """Every input entry of a dataset folder (`_edge_entries`, then the optional files present,
    then a typed graph's per-type files)."""
    optional = [p for stem, sfx in OPTIONAL_INPUTS.items() for p in _present(root, stem, sfx)]
    return _edge_entries(root) + optional + [p for name in TYPED_FOLDERS for p in _folder_entries(root, name)]


def _one_format(entries: list[Path]) -> Path | None:
    """The one entry of an input, None when absent; InputError naming both when it comes in two formats."""
    if len(entries) > 1:
        raise InputError(
            f"{entries[0]} and {entries[1].name}: one input in two formats; keep one of them "
            "(move the other out of the dataset folder)"
        )
    return entries[0] if entries else None


def is_dataset_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder holding edge entries, sound or not (a broken one is then
    refused by name by `find_dataset_files`); False when the folder cannot be examined."""
    try:
        return Path(path).is_dir() and bool(_edge_entries(Path(path)))
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "a special file"


def _check_entry(path: Path, landing: Path, folder: bool = False) -> None:
    """Refuse `path` unless it resolves inside `landing` to a folder (`folder`) or a regular file."""
    try:
        target = path.resolve(strict=True)
        mode = target.stat().st_mode
    except FileNotFoundError:
        if not path.is_symlink():
            raise InputError(f"{path}: does not exist") from None
        raise InputError(
            f"{path}: a symlink whose target does not exist; remove the link or put the file itself there"
        ) from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise InputError(f"{path}: cannot be examined ({exc}); fix its permissions or remove it") from None
    if not target.is_relative_to(landing):
        raise InputError(
            f"{path}: resolves to {target}, outside the landing folder {landing}; symlinks are followed only "
            "within the landing folder: copy the data in instead"
        )
    if folder and not stat.S_ISDIR(mode):
        raise InputError(f"{path}: not a folder ({_kind(mode)})")
    if not folder and not stat.S_ISREG(mode):
        raise InputError(f"{path}: not a regular file ({_kind(mode)}); put the Parquet file itself there")


def checked_dataset_file(path: str | os.PathLike) -> Path | None:
    """A file of a dataset folder other than the inputs (its gnnflow.yaml) under the same rule:
    None when there is no such entry, else the path once it passed (InputError naming it when
    it is a dangling or outward symlink, a FIFO or a folder), so it is never opened otherwise."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    try:
        landing = path.parent.parent.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{path.parent.parent}: landing folder cannot be examined ({exc})") from None
    _check_entry(path, landing)
    return path


def find_dataset_files(dataset_dir: str | os.PathLike) -> DatasetFiles:
    """The edge, node and feature files of a landing folder, each checked by the rule in the
    module docstring; InputError naming the first entry refused."""
    root = Path(dataset_dir)
    if not os.path.lexists(root):
        raise InputError(f"{root}: dataset folder does not exist")
    try:
        landing = root.parent.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{root.parent}: landing folder cannot be examined ({exc})") from None
    _check_entry(root, landing, folder=True)
    edges = root / "edges"
    try:
        if edges.is_symlink() or edges.is_dir():
            _check_entry(edges, landing, folder=True)
        edge_files = _edge_entries(root, strict=True)
        _one_format(_present(root, "edges", EDGE_SUFFIXES))
        optional = {stem: _one_format(_present(root, stem, sfx)) for stem, sfx in OPTIONAL_INPUTS.items()}
        typed = {}
        for name in TYPED_FOLDERS:
            if (root / name).is_symlink() or (root / name).is_dir():
                _check_entry(root / name, landing, folder=True)
            typed[name] = _folder_entries(root, name, strict=True)
    except OSError as exc:
        raise InputError(
            f"{exc.filename or root}: cannot be listed ({exc.strerror or exc}); fix its permissions"
        ) from None
    if not edge_files:
        raise InputError(f"{root}: no edge files; expected edges/*.parquet or edges.parquet (or .csv, .tsv, .txt)")
    if (root / "nodes").is_dir() and not typed["nodes"]:
        raise InputError(f"{root / 'nodes'}: a typed graph's folder with no <type>.parquet file")
    for name, stem in (("nodes", "nodes"), ("features", "features")):
        if typed[name] and optional[stem] is not None:
            raise InputError(
                f"{optional[stem]} and {name}/: a dataset is typed (per-type files in {name}/) or not; keep one of them"
            )
    if typed["features"] and not typed["nodes"]:
        raise InputError(f"{root / 'features'}: per-type feature files need the node types' files in nodes/")
    inputs = edge_files + [p for p in optional.values() if p is not None] + typed["nodes"] + typed["features"]
    for path in inputs:
        _check_entry(path, landing)
    return DatasetFiles(
        edge_files, optional["nodes"], optional["features"], optional["graphs"], typed["nodes"], typed["features"]
    )


def _content_line(path: Path, root: Path, landing: Path | None) -> str:
    """ "relative path:sha256" of an input or settings entry that passes the module's rule, else
    "relative path:" and why it does not (no entry that fails the rule is opened)."""
    try:
        if landing is None:
            raise InputError("landing folder cannot be examined")
        _check_entry(path, landing)
        return f"{path.relative_to(root)}:{cached_file_sha256(path)}\n"
    except (InputError, OSError) as exc:
        return f"{path.relative_to(root)}:{type(exc).__name__}\n"


def _fingerprinted_entries(root: Path) -> list[Path]:
    """The entries `landing_fingerprint` reads: every input entry, then the settings file when present."""
    settings = root / SETTINGS_FILE
    return sorted(_input_entries(root)) + ([settings] if os.path.lexists(settings) else [])


def landing_fingerprint(dataset_dir: str | os.PathLike) -> str:
    """16 hex digits over the relative path and content (SHA-256) of every input entry of a
    landing folder (`_input_entries`, through symlinks within the landing folder) and of its
    settings file (`SETTINGS_FILE`: its column mapping and stage settings change what the
    pipeline makes of the inputs); an entry the module's rule refuses counts by its name and
    is not opened. It is what canonical_graph records as `landing_fingerprint` and what the
    landing sensor compares with, so inputs or settings whose content changed since the last
    ingest are noticed, and a file copied back unchanged is not. A file's digest is computed
    once per process while its size and times stay the same
    (`graphs.infra.storage.cached_file_sha256`). Never raises for a broken entry."""
    root = Path(dataset_dir)
    h = hashlib.sha256()
    try:
        landing = root.parent.resolve(strict=True)
    except (OSError, RuntimeError):
        landing = None
    try:
        lines = [_content_line(p, root, landing) for p in _fingerprinted_entries(root)]
    except OSError as exc:  # the folder itself cannot be listed
        lines = [f".:{type(exc).__name__}\n"]
    for line in lines:
        h.update(line.encode())
    return h.hexdigest()[:16]


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def landing_marked_ready(dataset_dir: str | os.PathLike) -> bool:
    """Whether the folder holds a `_SUCCESS` marker at least as new as every input entry in
    it (a copy that writes the marker last says "complete" without waiting for a second look)."""
    root = Path(dataset_dir)
    marker = root / READY_MARKER
    try:
        if not marker.is_file():
            return False
        newest = max((_mtime_ns(p) for p in _input_entries(root)), default=0)
        return marker.stat().st_mtime_ns >= newest
    except OSError:
        return False


__all__ = [
    "READY_MARKER",
    "SETTINGS_FILE",
    "DatasetFiles",
    "EDGE_SUFFIXES",
    "EDGES_FILE",
    "GRAPHS_FILE",
    "InputError",
    "NODE_SUFFIXES",
    "find_dataset_files",
    "is_dataset_folder",
    "landing_fingerprint",
    "landing_marked_ready",
]

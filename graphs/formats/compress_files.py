"""The compressed_graph folder as a typed artifact: its file names, format version, summary and manifest.

The format (dtypes, shapes, what each file holds) is documented where it is written,
`graphs.stages.compress`; this module is the one place its file names live, shared by that writer
and by every reader (`graphs.stages.compress`'s loaders, the minibatch shards, the benchmarks).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from graphs.formats.stage_artifact import StageArtifact, StageFormatError

__all__ = ["CompressedGraph"]


@dataclass(frozen=True)
class CompressedGraph(StageArtifact):
    """A compressed_graph folder (`graphs.stages.compress` documents the files), with its manifest.json,
    which carries the same format version as summary.json and is checked by `open` too."""

    STAGE = "compressed_graph"
    FORMAT_VERSION = 1
    MANIFEST = "manifest.json"
    FEATURE_FILES = {"int8": "features_int8.npy", "int4": "features_int4.npy", "binary": "features_binary.npy"}
    FEATURE_SCALES = "feature_scales.npy"
    WEIGHTS_INT8 = "weights_int8.npy"
    WEIGHT_SCALES = "weight_scales.npy"

    manifest: dict = field(default_factory=dict)

    @classmethod
    def open(cls, root: str | os.PathLike, *, verify: bool = False):
        """The folder `root` with its summary and manifest (both checked against hashes.json with
        `verify`); StageFormatError when either is missing or of another format version."""
        art = super().open(root, verify=verify)
        path = art.path(cls.MANIFEST)
        if not path.is_file():
            raise StageFormatError(f"{path}: missing; re-materialize {cls.STAGE}")
        manifest = json.loads((art.verified(cls.MANIFEST) if verify else path).read_text())
        cls.check_version(path, cls.format_version_of(manifest))
        return dataclasses.replace(art, manifest=manifest)

    @staticmethod
    def bloom_file(p: int) -> str:
        """The path, relative to the folder, of part `p`'s Bloom filter."""
        return f"bloom/part-{p}.bloom"

"""The typed reader of one stage's output folder: its file names, its format version, its summary.

Each stage's format owner (the module that writes the folder and documents its files) declares
one subclass of `StageArtifact`: the stage (asset) name, the format version its writer puts in
summary.json, and the folder's file names as class constants. The writer and every reader use
those constants, so a file name is spelled once. A reader opens the folder first::

    graph = CanonicalGraph.open(canonical_dir)  # StageFormatError: no summary, another version
    edges = graph.verified(graph.EDGES)          # checked against the folder's hashes.json

`open` reads summary.json only (one small file), so opening stays cheap on every path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from graphs.infra.storage import SUMMARY_NAME, verified

__all__ = ["StageArtifact", "StageFormatError"]


class StageFormatError(ValueError):
    """A stage folder without its summary, or written in a format version its reader does not read."""


@dataclass(frozen=True)
class StageArtifact:
    """One published (or staged) output folder of stage `STAGE`, with its parsed summary."""

    STAGE: ClassVar[str] = ""
    """The asset that writes the folder: the stage to re-materialize when it is refused."""
    FORMAT_VERSION: ClassVar[int] = 1
    """The format version this reader reads (the writer's)."""
    SUMMARY: ClassVar[str] = SUMMARY_NAME
    """The summary every stage writes (`graphs.infra.storage.write_summary`)."""

    root: Path
    summary: dict

    @classmethod
    def open(cls, root: str | os.PathLike, *, verify: bool = False):
        """The folder `root` as this stage's output; StageFormatError when its summary is missing,
        unreadable or of another format version. With `verify`, the summary is first checked
        against the folder's hashes.json (`graphs.infra.storage.verified`)."""
        root = Path(root)
        path = root / cls.SUMMARY
        if not path.is_file():
            raise StageFormatError(f"{path}: missing, so {root} is no complete {cls.STAGE}; re-materialize {cls.STAGE}")
        try:
            summary = json.loads((verified(root, cls.SUMMARY) if verify else path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StageFormatError(f"{path}: unreadable ({exc}); re-materialize {cls.STAGE}") from None
        cls.check_version(path, cls.format_version_of(summary))
        return cls(root, summary)

    @classmethod
    def format_version_of(cls, summary) -> object:
        """The format version a summary declares (stages that nest it override this)."""
        return summary.get("format_version") if isinstance(summary, dict) else None

    @classmethod
    def check_version(cls, path: Path, found: object) -> None:
        """StageFormatError naming `path`, the version `found` and the one read, unless they match."""
        if found != cls.FORMAT_VERSION:
            raise StageFormatError(
                f"{path}: {cls.STAGE} format version {str(found)[:20]}, this reader reads {cls.FORMAT_VERSION}; "
                f"re-materialize {cls.STAGE}"
            )

    def path(self, name: str) -> Path:
        """`<root>/<name>`, unchecked."""
        return self.root / name

    def has(self, name: str) -> bool:
        """Whether the folder holds the (optional) file `name`."""
        return (self.root / name).is_file()

    def verified(self, name: str) -> Path:
        """`<root>/<name>` after checking it against the folder's hashes.json (`graphs.infra.storage.verified`)."""
        return verified(self.root, name)

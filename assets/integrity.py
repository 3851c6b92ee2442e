"""How the stages report a damaged input file and a full disk: a run failure whose description
is the library's message (the file, the stage to re-materialize or the space needed and free).

The readers in `graphs` check every upstream file against its folder's hashes.json before
using it (`graphs.infra.storage.verified`, CorruptFileError) and reserve the space of memory-mapped
outputs up front (`graphs.infra.storage.reserve_space`, DiskFullError); `staged_output` removes the
temporary folder either way, so the stage's previous output stays as it was.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import dagster as dg

from graphs.infra.storage import CorruptFileError, DiskFullError


@contextlib.contextmanager
def file_errors_as_failures(dataset: str) -> Iterator[None]:
    """Turn a CorruptFileError or DiskFullError raised in the block into `dg.Failure` with its
    message (enter it outside `storage.publishing`, so a full disk met while publishing counts too)."""
    try:
        yield
    except (CorruptFileError, DiskFullError) as exc:
        raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc

"""Atomic output folders and small file helpers shared by every stage.

A stage writes all of its files into a temporary sibling of its final folder and only
renames it into place when everything is written, so a failed or killed run never leaves
a half-written folder and never touches the previous materialization.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_output_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces `final_dir` as a whole.

    On an exception the temporary folder is removed and `final_dir` is left untouched.
    The swap is two renames (old out of the way, new into place), so readers see either
    the old or the new folder, never a mix.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = final.with_name(f".{final.name}.tmp-{tag}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f".{final.name}.old-{tag}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def dir_bytes(path: str | os.PathLike) -> int:
    """Total size in bytes of the regular files under `path`."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

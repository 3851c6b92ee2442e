"""Temporary sibling folders of a stage output: their names, the swap into place, the cleanup.

A writer fills `staging_dir_for(final)`, a sibling `.<name>.tmp-<tag>` (`is_staging_dir` tells
one by its name), and `publish_dir` puts it in the place of `final` as a whole. On Linux the swap
is one `renameat2(RENAME_EXCHANGE)`, so readers see the old or the new folder and never no folder;
elsewhere it is two renames, through a `.<name>.old-<tag>` sibling. `clean_stale_temporaries`
removes the `.tmp-` and `.old-` siblings killed runs left. `graphs.infra.storage.staged_output`
is the writers' entry point.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import uuid
from pathlib import Path

_TEMP_MARKERS = (".tmp-", ".old-")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2); False when unsupported."""
    global _renameat2
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _renameat2 = libc.renameat2
            _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def publish_dir(staging: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the complete folder `staging` in the place of `final` (which may not exist)."""
    staging, final = Path(staging), Path(final)
    if final.exists() and _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous version
        return
    old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def staging_dir_for(final: str | os.PathLike) -> Path:
    """A fresh, not yet created temporary sibling `.<name>.tmp-<tag>` of `final`."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")


_STAGING_NAME = re.compile(r"\..+\.tmp-[0-9a-f]{8}")


def is_staging_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is named as `staging_dir_for` names a folder being written (not yet published)."""
    return bool(_STAGING_NAME.fullmatch(Path(path).name))


def clean_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove `.<name>.tmp-*` / `.<name>.old-*` folders and files left directly under
    `folder` by killed runs; call only while holding the folder's lock. Returns what was removed."""
    removed = []
    root = Path(folder)
    if not root.is_dir():
        return removed
    for p in root.iterdir():
        if p.name.startswith(".") and any(m in p.name for m in _TEMP_MARKERS):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed

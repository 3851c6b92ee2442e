"""Output folders, dataset names and the per-dataset lock shared by every stage.

Three rules every writer follows (used by the assets through `assets.common`, and by
`training` directly):

- `graphs.infra.dataset_names.validate_dataset_name` is the one check a dataset name passes
  before it becomes any path.
- `dataset_lock(folder)` takes an exclusive `fcntl.flock` on `<folder>/.lock` (the dataset's
  folder under GNNFLOW_HOME) for the duration of a write, so two runs of one dataset never
  write at once, whether launched in-process by the CLI or by a run worker. The holder writes
  its pid into the file; the kernel drops the lock when the holder dies, so a killed run never
  leaves a lock behind. Once the lock is held, `clean_stale_temporaries` (`graphs.infra.folder_swap`)
  removes what killed runs of that dataset left. A process started by the holder (the trained_model asset's
  training) runs under its ancestor's lock instead of waiting for it, and calls
  `verify_lock_held` before each write: once that ancestor is gone (and with it the lock) the
  writer stops instead of writing beside the next run. `held_lock_fd` is the holder's
  descriptor, which a child started with it (``pass_fds``) shares: the lock then stays held
  while that child lives.
- `staged_output(final)` / `atomic_output_dir(final)`: every file is written into a
  temporary sibling `.<name>.tmp-<tag>`, which replaces `final` as a whole only when
  complete (and, for `staged_output`, only when the caller's checks passed). On Linux the
  swap is one `renameat2(RENAME_EXCHANGE)`, so readers see the old or the new folder and
  never no folder; elsewhere it is two renames (`graphs.infra.folder_swap`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from graphs.infra.folder_swap import clean_stale_temporaries, is_staging_dir, publish_dir, staging_dir_for

LOCK_NAME = ".lock"


# ----------------------------------------------------------------------------- the lock


class DatasetLockTimeout(TimeoutError):
    """The dataset lock was not free within the wait allowed."""


class DatasetLockLost(RuntimeError):
    """The dataset lock a writer ran under is no longer held for it."""


# per thread, lock file -> times held (re-entrant within a thread), and lock file -> this
# process's descriptor holding it, or None while running under an ancestor's lock
_held = threading.local()


def _ancestors() -> set[int]:
    """Pids of this process's ancestors (Linux /proc; empty elsewhere)."""
    pids, pid = set(), os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def _holder(lock_file: Path) -> int | None:
    try:
        text = lock_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _lock_key(folder: str | os.PathLike) -> tuple[Path, str]:
    lock_file = Path(folder) / LOCK_NAME
    return lock_file, str(lock_file.resolve())


@contextlib.contextmanager
def dataset_lock(
    folder: str | os.PathLike, *, timeout_s: float | None = None, log: Callable[[str], None] | None = None
) -> Iterator[Path]:
    """Hold the exclusive lock `<folder>/.lock` for the duration of the block.

    Waits for another holder (logging once who holds it), at most `timeout_s` seconds
    when given (DatasetLockTimeout then). Re-entrant within a thread; a descendant of the
    holder (e.g. a torchrun rank of the training asset) proceeds under the holder's lock,
    and `verify_lock_held` tells it when that lock has ended. Yields the lock file's path.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    lock_file, key = _lock_key(root)
    held = _held.__dict__.setdefault("counts", {})
    fds = _held.__dict__.setdefault("fds", {})
    if held.get(key):
        held[key] += 1
        try:
            yield lock_file
        finally:
            held[key] -= 1
        return
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    acquired = False
    try:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                acquired = True
                break
            except BlockingIOError:
                holder = _holder(lock_file)
                if holder is not None and holder in _ancestors():
                    break  # our parent run holds it for us
                if deadline is not None and time.monotonic() >= deadline:
                    raise DatasetLockTimeout(
                        f"{root}: pid {holder} (another run, or another step of this run) is writing this dataset; gave up after {timeout_s:g} s"
                    ) from None
                if log is not None and not told:
                    log(
                        f"{root}: pid {holder} (another run, or another step of this run) is writing this dataset; waiting for it to finish"
                    )
                    told = True
                time.sleep(0.2)
        if acquired:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            clean_stale_temporaries(root)
        held[key], fds[key] = 1, fd if acquired else None
        try:
            yield lock_file
        finally:
            held.pop(key, None)
            fds.pop(key, None)
    finally:
        if acquired:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def held_lock_fd(folder: str | os.PathLike) -> int | None:
    """The descriptor by which this thread holds `<folder>/.lock` in a `dataset_lock` block
    (None outside one, or under an ancestor's lock). A child process started with it
    (``pass_fds``) shares the lock: it stays held while either of them lives, until the block
    ends (its release frees the lock for both)."""
    _, key = _lock_key(folder)
    return _held.__dict__.get("fds", {}).get(key)


def verify_lock_held(folder: str | os.PathLike) -> None:
    """Raise DatasetLockLost unless `<folder>/.lock` is held for this process: by a
    `dataset_lock` block of this thread, or by the living ancestor that the lock file names
    when the block runs under an ancestor's lock. Cheap (a few small /proc reads)."""
    lock_file, key = _lock_key(folder)
    if not _held.__dict__.get("counts", {}).get(key):
        raise DatasetLockLost(f"{lock_file}: not inside a dataset_lock block of this thread")
    if _held.fds.get(key) is not None:
        return  # held by this process's own descriptor
    holder = _holder(lock_file)
    if holder is None or holder not in _ancestors():
        if holder is None:
            now = "nobody holds it now"
        elif Path(f"/proc/{holder}").exists():
            now = f"pid {holder}, another run, holds it now"
        else:
            now = f"pid {holder}, which held it, is gone"
        raise DatasetLockLost(
            f"{lock_file}: the process that launched this one no longer holds the dataset lock ({now}); "
            "stopping without writing more: run the step again"
        )


@contextlib.contextmanager
def staged_output(final_dir: str | os.PathLike, *, record_hashes: bool = True) -> Iterator[Path]:
    """Yield the path of a temporary sibling of `final_dir` (not created: a library writer
    creates it); when the block ends without an exception it replaces `final_dir`.

    The caller checks the files in the block (raising to refuse them); on any exception the
    temporary folder is removed and `final_dir` is left untouched, and a full disk (ENOSPC from
    any writer) is raised as DiskFullError naming the file and the free space. With
    `record_hashes` (every stage output), the SHA-256 of every file is written to `hashes.json`
    just before the swap (`write_file_hashes`), so readers can tell a damaged file from a
    re-materialized one; when `final_dir` is itself a staging folder (a library writer called
    inside an asset's `staged_output`), the outer publisher records them, once.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir_for(final)
    try:
        yield tmp
        if not tmp.is_dir():
            raise FileNotFoundError(f"{tmp}: nothing was written to publish as {final}")
        if record_hashes and not is_staging_dir(final):  # a staging `final`: its own publisher hashes it
            write_file_hashes(tmp)
    except OSError as exc:
        full = _as_disk_full(exc, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, final)


@contextlib.contextmanager
def atomic_output_dir(final_dir: str | os.PathLike, *, record_hashes: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces `final_dir` as a whole.

    On an exception the temporary folder is removed and `final_dir` is left untouched.
    """
    with staged_output(final_dir, record_hashes=record_hashes) as tmp:
        tmp.mkdir()
        yield tmp


# ----------------------------------------------------------------------------- file hashes
#
# `hashes.json` (format 1), written into every published stage folder by `staged_output`:
#     {"format_version": 1, "files": {"<path relative to the folder, '/'-separated>":
#                                      {"bytes": int, "sha256": "<hex>"}, ...}}
# every regular file under the folder except `hashes.json` itself and `run_stats.json`
# (run statistics change with timing; the hashes, like summary.json, do not). A reader of
# another stage's folder opens a file through `verified(folder, name)` (or checks several with
# `verify_files`) before using it, so a file damaged after publishing fails the reader, naming
# the file and the stage to re-materialize, instead of flowing on into later stages. Digests
# are computed once per process and unchanged file (`cached_file_sha256`); each stage runs in
# a process of its own (Dagster's multiprocess executor), so a stage run reads each input file
# once more than it would unchecked.

HASHES_NAME = "hashes.json"
HASHES_VERSION = 1


class CorruptFileError(RuntimeError):
    """A published file whose size or SHA-256 differs from what its stage recorded (damaged
    or edited after publishing), or a stage folder without its hash record."""


def _hashed_files(folder: Path) -> list[Path]:
    skip = {HASHES_NAME, RUN_STATS_NAME}
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink() and p.relative_to(folder).as_posix() not in skip
    )


def write_file_hashes(folder: str | os.PathLike) -> dict[str, dict]:
    """Write `<folder>/hashes.json` for the files under `folder` (see above); returns its `files`."""
    folder = Path(folder)
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": cached_file_sha256(p)}
        for p in _hashed_files(folder)
    }
    (folder / HASHES_NAME).write_text(json.dumps({"format_version": HASHES_VERSION, "files": files}, indent=1))
    return files


def _valid_record(doc) -> bool:
    files = doc.get("files") if isinstance(doc, dict) else None
    return (
        isinstance(files, dict)
        and doc.get("format_version") == HASHES_VERSION
        and all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()
        )
    )


def read_file_hashes(folder: str | os.PathLike, *, stage: str) -> dict[str, dict]:
    """The `files` record of `<folder>/hashes.json` (parsed once per process while the file is
    unchanged: a reader of per-part files asks once per part); CorruptFileError naming `stage`
    when the record is missing, unreadable or of another format version."""
    path = Path(folder) / HASHES_NAME
    try:
        key, stamp, settled = _file_stamp(path)
        hit = _RECORDS.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        doc = json.loads(path.read_text())
        if not _valid_record(doc):
            version = str(doc.get("format_version"))[:20] if isinstance(doc, dict) else "none"
            raise ValueError(f"format_version {version}, expected {HASHES_VERSION} with a size and SHA-256 per file")
    except FileNotFoundError:
        raise CorruptFileError(
            f"{path}: missing, so the files of {folder} cannot be checked (written by an older gnnflow, "
            f"or not by gnnflow); re-materialize {stage}"
        ) from None
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"{path}: unreadable hash record ({exc}); re-materialize {stage}") from None
    if settled and _file_stamp(path)[1] == stamp:
        _RECORDS[key] = (stamp, doc["files"])
    return doc["files"]


def verify_files(folder: str | os.PathLike, names: Iterable[str] | None = None, *, stage: str | None = None) -> None:
    """Check files of a published stage folder against its `hashes.json`: `names` (paths relative
    to the folder), or every recorded file. CorruptFileError naming the file and `stage` (the
    stage to re-materialize; by default the folder's name, which is the stage's under
    GNNFLOW_HOME) on a missing, resized or changed file. Each file is hashed once per process
    while it stays unchanged (`cached_file_sha256`)."""
    folder = Path(folder)
    stage = stage or folder.name
    record = read_file_hashes(folder, stage=stage)
    for name in record if names is None else names:
        name = Path(name).as_posix()
        path = folder / name
        entry = record.get(name)
        if entry is None:
            raise CorruptFileError(f"{path}: not among the files {stage} published in {folder}; re-materialize {stage}")
        what = _differs(path, entry, stage)
        if what is None:
            continue
        if what == "missing":
            raise CorruptFileError(f"{path}: missing, but {stage} published it; re-materialize {stage}")
        raise CorruptFileError(
            f"{path}: {what}: the file was damaged or edited after publishing; re-materialize {stage}"
        )


def _differs(path: Path, entry: dict, stage: str) -> str | None:
    """How the file at `path` differs from its record `entry` ("missing", its size, its SHA-256),
    None when it matches."""
    try:
        size = path.stat().st_size
    except OSError:
        return "missing"
    if size != entry["bytes"]:
        return f"is {size} bytes, {stage} published {entry['bytes']}"
    if cached_file_sha256(path) != entry["sha256"]:
        return f"its SHA-256 differs from the one {stage} recorded when it published it"
    return None


def verified(folder: str | os.PathLike, name: str, *, stage: str | None = None) -> Path:
    """`<folder>/<name>`, after checking it against the folder's `hashes.json` (`verify_files`:
    CorruptFileError naming the file and the stage to re-materialize). A staging folder
    (`is_staging_dir`: being written, not yet published, so without a record) is read unchecked:
    only the run writing it reads it, to check its own output."""
    folder = Path(folder)
    if not is_staging_dir(folder):
        verify_files(folder, [name], stage=stage)
    return folder / name


def verify_inputs(folder: str | os.PathLike, names: Iterable[str], *, stage: str | None = None) -> None:
    """`verified` for each of `names` that the folder holds or its record lists, so a stage can
    check the files it is about to read before any work: an optional file (features of a graph
    without them) is skipped when it was never published, refused when it was and is gone."""
    folder = Path(folder)
    if is_staging_dir(folder):
        return
    recorded = read_file_hashes(folder, stage=stage or folder.name)
    verify_files(folder, [n for n in names if n in recorded or (folder / n).exists()], stage=stage)


def file_is_as_published(folder: str | os.PathLike, name: str) -> bool | None:
    """Whether `<folder>/<name>` matches its stage's hash record: None when there is no record
    of it (so nothing can be said), else True / False."""
    folder = Path(folder)
    try:
        entry = read_file_hashes(folder, stage="")[Path(name).as_posix()]
    except (CorruptFileError, KeyError):
        return None
    return (folder / name).is_file() and _differs(folder / name, entry, "") is None


_SETTLED_NS = 2_000_000_000
_DIGESTS: dict[tuple[int, int], tuple[tuple[int, int, int], str]] = {}
_RECORDS: dict[tuple[int, int], tuple[tuple[int, int, int], dict]] = {}


def _file_stamp(path: str | os.PathLike) -> tuple[tuple[int, int], tuple[int, int, int], bool]:
    """(device and inode, (size, modification time, change time), settled) of a file: a value
    computed from it may be kept under the inode while the stamp stays the same (a rewrite, or
    a content change whose times were set back, changes the change time), but only once it is
    settled, unchanged for two seconds before this call: file systems stamp times at a clock
    tick's resolution, so a rewrite within one tick could keep them."""
    now = time.time_ns()
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return (st.st_dev, st.st_ino), stamp, now - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_NS


def cached_file_sha256(path: str | os.PathLike) -> str:
    """`file_sha256`, computed once per process for a file that has not changed since
    (`_file_stamp`; a digest given by `remember_sha256` counts too). A file changed in the last
    two seconds, or while it was hashed, is hashed at every call."""
    key, stamp, settled = _file_stamp(path)
    hit = _DIGESTS.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    digest = file_sha256(path)
    if settled and _file_stamp(path)[1] == stamp:
        _DIGESTS[key] = (stamp, digest)
    return digest


def remember_sha256(path: str | os.PathLike, digest: str) -> None:
    """Record the SHA-256 of a file its writer computed while writing it (and has closed), so
    publishing (`write_file_hashes`) does not read it again. Kept under the file's current
    stamp: any later change to the file makes it be hashed anew."""
    key, stamp, _ = _file_stamp(path)
    _DIGESTS[key] = (stamp, digest)


# ----------------------------------------------------------------------------- disk space


class DiskFullError(OSError):
    """No space left for a file being written (errno ENOSPC); the message names the file, the
    bytes needed when known, and what its file system has free (`disk_full_error`)."""

    def __str__(self) -> str:
        return str(self.strerror)


def _mount_point(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def disk_full_error(path: str | os.PathLike, needed: int | None = None) -> DiskFullError:
    """DiskFullError for `path`: "disk full writing <path>: N bytes needed, M bytes free on <mount>"."""
    mount = _mount_point(Path(path))
    try:
        st = os.statvfs(mount)
        free = f"{st.f_bavail * st.f_frsize:,} bytes free"
    except OSError:
        free = "free space unknown"
    need = "" if needed is None else f"{needed:,} bytes needed, "
    return DiskFullError(
        errno.ENOSPC,
        f"disk full writing {path}: {need}{free} on {mount}; free space there (or point GNNFLOW_HOME at a "
        "larger disk) and run the stage again",
        str(path),
    )


def _as_disk_full(exc: OSError, where: Path) -> DiskFullError | None:
    """A raw 'no space left' OSError as DiskFullError (None for any other error)."""
    if isinstance(exc, DiskFullError) or (exc.errno != errno.ENOSPC and "No space left on device" not in str(exc)):
        return None
    return disk_full_error(exc.filename or where)


def reserve_space(fd: int, offset: int, length: int, path: str | os.PathLike) -> None:
    """Allocate bytes [offset, offset + length) of the open file `fd` (at `path`) on disk now
    (``posix_fallocate``, which extends the file to cover them).

    A file written through a memory map must have its blocks before the first store: a store
    into a page the file system cannot back kills the process with SIGBUS, without a message.
    Reserved up front, a full disk is a DiskFullError naming the file and the bytes needed.
    Where the file system or platform cannot reserve, the file is left as it is.
    """
    if length <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise disk_full_error(path, length) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


# ----------------------------------------------------------------------------- summaries

RUN_STATS_NAME = "run_stats.json"
SUMMARY_NAME = "summary.json"  # every stage's summary: `graphs.formats.stage_artifact.StageArtifact.SUMMARY`


def is_run_statistic(key: str) -> bool:
    """Keys that measure a run rather than describe its output: seconds, rates, peak memory,
    the processes it used."""
    return key == "seconds" or key.endswith(("_seconds", "_per_second", "_per_s", "rss_bytes", "_processes"))


def split_run_stats(obj):
    """(content, statistics) of a summary: nested dicts (and dicts in lists) split by
    `is_run_statistic`, each part keeping the nesting; statistics None when there are none."""
    if isinstance(obj, dict):
        content, stats = {}, {}
        for k, v in obj.items():
            if is_run_statistic(k):
                stats[k] = v
                continue
            c, st = split_run_stats(v)
            content[k] = c
            if st is not None:
                stats[k] = st
        return content, stats or None
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        parts = [split_run_stats(v) for v in obj]
        stats = [st for _, st in parts]
        return [c for c, _ in parts], stats if any(st is not None for st in stats) else None
    return obj, None


def write_summary(folder: str | os.PathLike, summary: dict, name: str = SUMMARY_NAME) -> None:
    """Write `summary` as `<folder>/<name>` without its run statistics, and those statistics
    (seconds, rates, peak RSS) as `<folder>/run_stats.json`: the content file, and so every
    hash or data version over it, is then the same for the same inputs and settings."""
    folder = Path(folder)
    content, stats = split_run_stats(summary)
    (folder / name).write_text(json.dumps(content, indent=2))
    if stats is not None:
        (folder / RUN_STATS_NAME).write_text(json.dumps(stats, indent=2))


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
    """Peak resident set size of this process image so far, in bytes.

    Linux's VmHWM (/proc/self/status), which starts afresh at exec; ru_maxrss (the fallback
    elsewhere, in KiB) also counts the peak of the parent a child was forked from, so a stage
    run as a subprocess of a large process would report the parent's memory as its own.
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def drop_page_cache(path: str | os.PathLike) -> None:
    """Drop `path`'s pages from the page cache, its dirty pages written first (so none stays):
    the next read of the file goes to the disk. A process that maps the file keeps the pages it
    has mapped until it unmaps or ``madvise(MADV_DONTNEED)``s them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read_bytes() -> int | None:
    """Bytes this process has had read from storage so far (Linux's /proc/self/io ``read_bytes``:
    its reads and page faults that went to the disk, page-cache hits not counted); None where
    the kernel does not report it."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def private_rss_bytes() -> int | None:
    """Resident bytes of this process that no other process shares (Linux's smaps_rollup
    Private_Clean + Private_Dirty): for a forked child, what it added to its parent's
    memory. None where the kernel does not report it. Takes milliseconds in a large process."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            return sum(
                int(line.split()[1]) * 1024 for line in f if line.startswith((b"Private_Clean:", b"Private_Dirty:"))
            )
    except OSError:
        return None

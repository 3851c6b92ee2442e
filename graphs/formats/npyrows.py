"""Rows of `.npy` files read and written without keeping file pages in this process's RSS.

Linux counts every page of a file mapping that a process has touched in its resident set
(RssFile in /proc/<pid>/status) until the mapping goes away, although those pages belong to
the page cache and the kernel can drop them at any time. A process that gathers rows at
random from a 10 GB memory-mapped file, or writes one through a writable mapping, therefore
shows a peak RSS (VmHWM) up to 10 GB above the memory it needs, and a memory budget checked
against peak RSS fails (BENCHMARKS.md, "Streaming evaluation memory", measures it).

- :func:`take_rows`: rows ``ids`` of a memory-mapped array, gathered in ascending windows of
  ``window_bytes`` of the file; after each window, ``madvise(MADV_DONTNEED)`` drops that
  window's pages from this process's page tables (they stay in the page cache: a later read
  is a minor fault). RssFile grows by at most about one window per call.
- :func:`read_rows`: a contiguous row range, copied out and its pages dropped the same way.
- :func:`release`: drop every page of an array's mapping from this process.
- :func:`advise_random`: a mapping's page faults read their own page only (no read-around).
- :func:`prefetch_rows`: ask the kernel to read the pages of rows ``ids`` ahead
  (``madvise(MADV_WILLNEED)`` per run of adjacent pages), so that a gather from a file that is
  not in the page cache waits for many reads in flight at once instead of one page fault
  after another; with the file resident the advice costs about what the gather does, so
  callers use it when the file does not stay cached (BENCHMARKS.md, "Tiered feature storage").
- :class:`NpyRowWriter`: an ``.npy`` file (format 1.0 header, C order) created at its final
  size and written by row ranges with ``os.pwrite``: the data goes through the page cache,
  never through a mapping of this process.
- :func:`create_npy_memmap`: a new ``.npy`` file memory-mapped for writing, the one way an
  output array is mapped for writing.

Both reserve the file's disk space when they create it (`graphs.infra.storage.reserve_space`): a
store through a mapping into a page the file system cannot back kills the process with SIGBUS
and no message, so a full disk must show up before the first store, as a DiskFullError that
names the file and the bytes it needs.

Arrays that are not backed by a file mapping are read as they are (nothing to drop), so
callers need not care where an array lives. Dropping pages is only an optimisation of what
RSS reports: a read-only (or shared) file mapping re-reads the same bytes after it, so the
results never change. Platforms without ``MADV_DONTNEED`` skip it.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from graphs.infra.storage import reserve_space

__all__ = [
    "WINDOW_BYTES",
    "NpyRowWriter",
    "advise_random",
    "create_npy_memmap",
    "mapped_bytes",
    "prefetch_rows",
    "read_rows",
    "release",
    "take_rows",
]

WINDOW_BYTES = 64 << 20
"""Bytes of the file one window of `take_rows` covers (the most RssFile one call adds)."""

_PAGE = mmap.PAGESIZE
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
_RANDOM = getattr(mmap, "MADV_RANDOM", None)
_MAX_RUNS = 8  # ids in more ascending runs than this are sorted first


def _mapping(array) -> mmap.mmap | None:
    """The mmap object behind ``array`` (an np.memmap, or a view of one), or None."""
    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = getattr(base, "base", None)
    return None


def _plain(array: np.ndarray) -> np.ndarray:
    """``array`` as a base-class ndarray (np.take on an np.memmap subclass is ~3x slower)."""
    return array.view(np.ndarray) if isinstance(array, np.memmap) else array


class _Pages:
    """Drops the pages of byte ranges of ``array``'s mapping (no-op without one)."""

    def __init__(self, array: np.ndarray):
        self.mapping = _mapping(array) if _DONTNEED is not None else None
        if self.mapping is not None and not self.mapping.closed and len(self.mapping):
            self.base = np.frombuffer(self.mapping, dtype=np.uint8).ctypes.data
            self.first = array.ctypes.data - self.base  # the array's first byte in the mapping
        else:
            self.mapping = None

    def drop(self, start: int, stop: int) -> None:
        """Drop the pages holding bytes ``start:stop`` of the array (page-aligned outwards)."""
        if self.mapping is None or stop <= start:
            return
        lo = (self.first + start) // _PAGE * _PAGE
        hi = min(len(self.mapping), -(-(self.first + stop) // _PAGE) * _PAGE)
        if hi > lo:
            self.mapping.madvise(_DONTNEED, lo, hi - lo)


def mapped_bytes(array) -> int:
    """Bytes of the file mapping behind ``array`` (0 when it is not memory-mapped)."""
    mapping = _mapping(array)
    return len(mapping) if mapping is not None and not mapping.closed else 0


def release(array) -> None:
    """Drop every page of ``array``'s file mapping from this process's RSS (no-op without one)."""
    mapping = _mapping(array) if _DONTNEED is not None else None
    if mapping is not None and not mapping.closed and len(mapping):
        mapping.madvise(_DONTNEED)


def page_runs(first_byte: np.ndarray, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(first page, last page) of each maximal run of adjacent pages holding the rows that start
    at the ascending byte offsets `first_byte` (each `row_bytes` long)."""
    lo = first_byte // _PAGE
    hi = (first_byte + row_bytes - 1) // _PAGE
    reach = np.maximum.accumulate(hi)  # rows may span pages; runs merge overlapping or touching pages
    begins = np.flatnonzero(lo[1:] > reach[:-1] + 1) + 1
    starts = np.concatenate(([0], begins))
    ends = np.concatenate((begins - 1, [len(lo) - 1]))
    return lo[starts], reach[ends]


def prefetch_rows(array: np.ndarray, ids) -> int:
    """Start reading the file pages of rows ``ids`` (ascending or not) of a memory-mapped array
    into the page cache; the number of page runs advised (0 without a file mapping).

    One ``madvise(MADV_WILLNEED)`` per run of adjacent pages: the loop is over page runs of the
    requested rows and each turn is one system call queueing reads (~14 us of kernel time here
    against well under 1 us of Python), so its cost is the I/O submission, not the interpreter.
    It never changes what a later read returns; without a mapping (or MADV_WILLNEED) it does nothing.
    """
    plain = _plain(array)
    ids = np.asarray(ids, dtype=np.int64)
    if _WILLNEED is None or not len(ids) or not plain.ndim or not plain.flags.c_contiguous:
        return 0
    pages = _Pages(plain)
    if pages.mapping is None:
        return 0
    if len(ids) > 1 and bool(np.any(ids[1:] < ids[:-1])):
        ids = np.sort(ids)
    row = plain.strides[0]
    first, last = page_runs(pages.first + ids * row, row)
    size = len(pages.mapping)
    for a, b in zip((first * _PAGE).tolist(), (np.minimum((last + 1) * _PAGE, size)).tolist()):
        pages.mapping.madvise(_WILLNEED, a, b - a)
    return len(first)


def advise_random(array: np.ndarray) -> bool:
    """Tell the kernel that ``array``'s file mapping is read at random (``madvise(MADV_RANDOM)``): a
    page fault then reads its own page, not the read-around window about it (the block device's
    read-ahead, up to megabytes per fault). For rows read ahead with `prefetch_rows`, whose
    faults land on pages evicted before the gather reached them. False without a mapping."""
    mapping = _mapping(array) if _RANDOM is not None else None
    if mapping is None or mapping.closed or not len(mapping):
        return False
    mapping.madvise(_RANDOM)
    return True


def read_rows(array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """A copy of rows ``start:stop`` of ``array``; their pages are dropped afterwards."""
    plain = _plain(array)
    out = np.array(plain[start:stop])
    if len(out) and plain.flags.c_contiguous:
        row = plain.strides[0] if plain.ndim else plain.itemsize
        _Pages(plain).drop(start * row, stop * row)
    return out


def take_rows(array: np.ndarray, ids, out: np.ndarray | None = None, window_bytes: int = WINDOW_BYTES) -> np.ndarray:
    """``array[ids]`` (rows, any order, duplicates allowed) into ``out`` (allocated when None).

    Gathered window by window in ascending id order (ids made of up to a few ascending runs,
    e.g. a chunk's own rows then its other neighbours, are used as they are; others are
    sorted first), each window's pages dropped after it; see the module docstring.
    """
    ids = np.asarray(ids, dtype=np.int64)
    n = array.shape[0]
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise IndexError(f"row ids must lie in [0, {n}); got {int(ids.min())}..{int(ids.max())}")
    plain = _plain(array)
    if out is None:
        out = np.empty((len(ids), *plain.shape[1:]), dtype=plain.dtype)
    elif out.shape != (len(ids), *plain.shape[1:]) or out.dtype != plain.dtype:
        raise ValueError(f"out is {out.dtype} {list(out.shape)}; need {plain.dtype} {[len(ids), *plain.shape[1:]]}")
    pages = _Pages(plain) if plain.flags.c_contiguous and plain.ndim else None
    if pages is None or pages.mapping is None or not len(ids):
        np.take(plain, ids, axis=0, out=out, mode="clip")  # ids checked above; "clip" is unbuffered
        return out
    starts = np.flatnonzero(ids[1:] < ids[:-1]) + 1
    if len(starts) >= _MAX_RUNS:
        order = np.argsort(ids, kind="stable")
        out[order] = take_rows(array, ids[order], window_bytes=window_bytes)
        return out
    row = plain.strides[0]
    window = max(1, window_bytes // max(row, 1))
    bounds = [0, *starts.tolist(), len(ids)]
    for a, b in zip(bounds[:-1], bounds[1:]):  # each ascending run
        run = ids[a:b]
        cuts = np.flatnonzero(np.diff(run // window)) + 1
        for s, e in zip([0, *cuts.tolist()], [*cuts.tolist(), len(run)]):  # each window of the file
            np.take(plain, run[s:e], axis=0, out=out[a + s : a + e], mode="clip")
            pages.drop(int(run[s]) * row, (int(run[e - 1]) + 1) * row)
    return out


def create_npy_memmap(path: str | os.PathLike, dtype, shape: tuple[int, ...]) -> np.memmap:
    """A new ``.npy`` file of ``dtype`` and ``shape`` (zeros), its data's disk space reserved,
    memory-mapped for writing; DiskFullError naming the file when the disk cannot hold it."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
    with open(path, "r+b") as f:
        reserve_space(f.fileno(), out.offset, out.nbytes, path)
    return out


class NpyRowWriter:
    """An ``.npy`` file of ``dtype`` and ``shape`` written by row ranges with ``os.pwrite``.

    The file is created at its final size (rows not yet written read as zeros, the space
    reserved on disk) with an NPY format 1.0 header, so ``np.load`` (memory-mapped or not)
    reads it like any ``.npy``, and a writer may also map it for writing.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, dtype, shape: tuple[int, ...]):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        if not self.shape or min(self.shape) < 0:
            raise ValueError(f"shape {self.shape}: need at least one dimension, none negative")
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        with open(self.path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            self.offset = f.tell()
            f.truncate(self.offset + self.shape[0] * self.row_bytes)
            f.flush()
            reserve_space(f.fileno(), self.offset, self.shape[0] * self.row_bytes, self.path)
        self._fd = os.open(self.path, os.O_WRONLY)

    def write(self, start: int, rows) -> None:
        """Write ``rows`` (``[k, *shape[1:]]``, cast to the file's dtype) at rows ``start:start+k``."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.shape[1:] or start < 0 or start + len(rows) > self.shape[0]:
            raise ValueError(f"{self.path}: rows {list(rows.shape)} at {start} do not fit {list(self.shape)}")
        view = memoryview(rows.reshape(-1).view(np.uint8))
        pos = self.offset + start * self.row_bytes
        while len(view):
            done = os.pwrite(self._fd, view, pos)
            view, pos = view[done:], pos + done

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "NpyRowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

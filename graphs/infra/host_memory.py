"""Host memory reused between the steps of a stage: freed blocks are kept, not unmapped and faulted in again.

A CPU training step allocates and frees the same large tensors every step (a layer's
activations, its dropout mask, the zero-filled gradients of a block's sources: tens of MB
each); the compressed_graph stage does the same with its per-part arrays. glibc serves every
allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it on
free, so the next one faults every page in again and the kernel zeroes it, and the
element-wise kernels that first touch the memory (``fill_``, ``copy_``, dropout) run at a
fraction of their speed (docs/performance.md has the trade-off: fewer faults and less system
time for a higher peak RSS).

``reuse_freed_memory()`` tells glibc, for as long as it is entered, to serve large
allocations from its heap (``M_MMAP_MAX = 0``) and to keep freed heap memory
(``M_TRIM_THRESHOLD`` = 2 GiB, the most mallopt takes), so the next step reuses the last
step's pages. On exit it restores glibc's defaults and returns the free pages to the system
(``malloc_trim``), so whatever runs after sees the memory the process really holds. Peak RSS
becomes the heap's high-water mark.

On anything but glibc (musl, macOS, Windows) the context does nothing. Device memory is
not affected: CUDA tensors go through torch's caching allocator already.

``gc_paused()`` switches Python's cyclic garbage collector off for a stage whose work is in
arrays, not Python objects, and back on after. The collections such a stage still triggers
come from the objects its imports and numba's kernel loading create, and each traverses every
object the process holds (a Dagster process holds many). The cycles made inside are collected
once the collector is back on.

``memory_limit_bytes()`` is the memory this process may hold: physical memory, or less where a
memory cgroup (v1 or v2, the process's own or one above it) sets a lower limit, as a container
or a ``memory.limit_in_bytes`` / ``memory.max`` does. Page cache counts against a cgroup's
limit, so a file larger than half of it cannot be expected to stay cached.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["gc_paused", "memory_limit_bytes", "reuse_freed_memory"]

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# glibc's defaults (mallopt(3)); restored on exit
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
# the largest threshold mallopt takes (an int): up to 2 GiB of free memory at the heap's top is kept
_KEEP_TOP = 2**31 - 1

_lock = threading.Lock()
_depth = 0  # nested and concurrent entries (several runs in one process) share one setting
_gc_depth = 0  # entries of gc_paused, and whether the collector was on at the first one
_gc_was_enabled = False


def _glibc():
    """libc with mallopt and malloc_trim, or None off glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        # gnu_get_libc_version exists on glibc only (musl has mallopt as a stub that does nothing)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):
        return None
    return libc


def _set(libc, trim_threshold: int, mmap_max: int) -> bool:
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)) and bool(libc.mallopt(_M_MMAP_MAX, mmap_max))


@contextlib.contextmanager
def reuse_freed_memory(enabled: bool = True) -> Iterator[bool]:
    """Within the block, freed host memory is kept for the next allocation (glibc only).

    Yields whether the setting is in effect. Entries may nest and overlap across threads;
    the defaults come back when the last one exits.
    """
    global _depth
    libc = _glibc() if enabled else None
    with _lock:
        if libc is not None and _depth == 0 and not _set(libc, _KEEP_TOP, 0):
            log.info("mallopt refused the host-memory settings; allocations keep glibc's defaults")
            _set(libc, _DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX)
            libc = None
        if libc is not None:
            _depth += 1
    if libc is None:
        yield False
        return
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set(libc, _DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX)
                libc.malloc_trim(0)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off within the block, as it was after it.

    Entries may nest and overlap across threads: the collector comes back (if it was on at
    the first entry) when the last one exits, error or not.
    """
    global _gc_depth, _gc_was_enabled
    with _lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def memory_limit_bytes() -> int | None:
    """Physical memory, or the lowest memory-cgroup limit above this process where lower; None
    where neither can be read (module docstring)."""
    limits = _cgroup_limits()
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    return min(limits) if limits else None


def _cgroup_limits(proc: Path = Path("/proc/self")) -> list[int]:
    """The memory limits set on this process's cgroup and its ancestors, as the kernel's
    cgroup files read here give them (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    try:
        groups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    limits = []
    for line in groups:
        _, controllers, path = line.split(":", 2)
        version = 2 if controllers == "" else 1 if "memory" in controllers.split(",") else 0
        mount = _cgroup_mount(mounts, version) if version else None
        if mount is None:
            continue
        mount_root, mount_point = mount
        relative = Path(path).relative_to(mount_root) if Path(path).is_relative_to(mount_root) else Path()
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        for part in (relative, *relative.parents):
            try:
                text = (Path(mount_point) / part / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():  # v2 writes "max" for no limit
                limits.append(int(text))
    return limits


def _cgroup_mount(mountinfo: list[str], version: int) -> tuple[str, str] | None:
    """(root within the hierarchy, mount point) of the cgroup2 hierarchy (`version` 2) or of the v1
    hierarchy holding the memory controller, from /proc/self/mountinfo's lines; None if absent."""
    for line in mountinfo:
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        fstype, options = extra[0], extra[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (version == 1 and fstype == "cgroup" and "memory" in options):
            return parts[3], parts[4]
    return None

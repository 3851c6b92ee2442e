"""Tiered feature storage: cold rows memory-mapped on disk, warm rows in a cache in CPU memory
(the highest-degree nodes, or LRU), hot rows (the highest-degree nodes) on the training device.

A minibatch's input nodes are looked up hot tier first, then warm, then cold:

- **cold**: the feature file itself (`graphs.kernels.quantize.EncodedFeatures` over a memory map:
  canonical ``features.npy`` or compressed_graph's codes), read with ``np.take`` in
  ascending node order; with ``readahead`` the pages of a gather's misses are first advised
  (`graphs.formats.npyrows.prefetch_rows`, ``madvise(MADV_WILLNEED)``), so a file that is not in the
  page cache is read with many requests in flight instead of one page fault after another, and
  the mapping is advised ``MADV_RANDOM`` (a fault on a page evicted before the gather reached it
  reads that page, not the device's read-ahead window about it)
  (default: on when the file is larger than half the memory the process may hold, the
  machine's or its memory cgroup's limit, i.e. cannot be expected to stay cached; with the file resident the advice would only add its system calls).
  The one-off fills of the hot and ``degree`` tiers are always read ahead;
- **warm**: ``warm_rows`` rows in one preallocated CPU array with a slot per row, kept by
  one of two policies (``warm_policy``):
  ``lru``: every row read from cold is inserted, evicting the least recently used slots
  (recency counts gathers: all rows of one gather share a time stamp, and a gather never
  evicts the rows it hits itself); each gather's misses are inserted in ascending node
  order, at most as many as there are slots it does not use;
  ``degree``: the ``warm_rows`` highest-degree nodes after the hot ones, filled once and
  never evicted (neighbour sampling reads a node in proportion to its degree, so this is
  the best static choice for it; measured in BENCHMARKS.md against LRU);
- **hot**: the ``hot_rows`` nodes of highest degree (ties: lower id first), their rows copied
  once to ``device`` (a CUDA device in training; the CPU works too, e.g. in tests).

Every tier holds the compact rows (INT8 / 4-bit / bit codes when compressed features are
chosen, so a byte of cache holds 4x-32x the rows it would in float32); ``gather`` decodes
once, on the device, with the file's own decoder (`EncodedFeatures.decode_gathered_torch`),
so the rows equal the dequantized originals exactly. ``gather`` is two halves that a loader can
run apart: ``gather_split`` on the host (the warm and cold rows, and where the hot ones go: a
`HotSplit`, pinned and copied like a tensor) and ``assemble`` on the device. Training builds
its tiers from a `CacheSpec` (``training.feature_cache``, ``feature_cache_policy``,
``feature_cache_hot``).

Counters (``stats``): requested rows (after removing duplicates within a gather), hot hits,
warm hits, cold reads; ``hit_rate`` = (hot + warm) / requested; and the file pages the cold
reads touched, as runs of adjacent pages (``cold_runs``, ``cold_pages``, counted when the cold
tier reads ahead: the reads a disk serves when none of them is cached,
`benchmarks/memory_wall.py` replays them).

Why: neighbour sampling reads a node in proportion to its degree, so on a power-law graph a
cache of a small share of the rows serves most of the reads; with features larger than host
or device memory, the warm and hot tiers are where the bandwidth is. `benchmarks/feature_cache.py`
measures it against an uncached (page-cache evicted) gather and against all rows in RAM.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np
import torch

from graphs.formats.npyrows import advise_random, mapped_bytes, page_runs, prefetch_rows
from graphs.infra.host_memory import memory_limit_bytes
from graphs.kernels.degree import top_degree_nodes as hot_nodes
from graphs.kernels.quantize import EncodedFeatures

__all__ = ["WARM_POLICIES", "CacheSpec", "CacheStats", "HotSplit", "TieredFeatures", "hot_nodes"]

WARM_POLICIES = ("lru", "degree")


def _unique(nodes) -> tuple[np.ndarray, np.ndarray | None]:
    """(ascending unique ids, inverse or None when `nodes` already is ascending and unique)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) < 2 or bool(np.all(nodes[1:] > nodes[:-1])):
        return nodes, None
    return np.unique(nodes, return_inverse=True)


def _take_rows(rows: np.ndarray, index: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """rows[index] (index int64), gathered by `torch.index_select`: its threads split the rows
    (and release the GIL), where `np.take` is one thread. Into `out` when given."""
    if out is None:
        return torch.index_select(torch.from_numpy(rows), 0, torch.from_numpy(index)).numpy()
    torch.index_select(torch.from_numpy(rows), 0, torch.from_numpy(index), out=torch.from_numpy(out))
    return out


class _Recycled:
    """Arrays for the gathered rows, handed out again once nothing holds them.

    A new array per gather maps new pages, and the kernel zeroes every one: at 100k rows of
    512 bytes, gathering into a new array ran at 4.0M rows/s here, and into one already faulted
    in at 13.3M (memcpy: 17.3M). A gather's rows are a view of one of `keep` arrays. An array
    is taken again only when no view of it is alive (its reference count: a view, or a tensor
    made from one, holds its base), so rows still in a loader's queue are never overwritten.
    When every kept array is in use, a new one is made and not kept.
    """

    def __init__(self, row_shape: tuple, dtype, keep: int = 4):
        self.row_shape, self.dtype, self.keep = tuple(row_shape), dtype, keep
        self._arrays: list[np.ndarray] = []

    def take(self, rows: int) -> np.ndarray:
        """An array of `rows` rows, nothing else holding it."""
        free = [i for i in range(len(self._arrays)) if sys.getrefcount(self._arrays[i]) <= _UNHELD]
        fits = [i for i in free if len(self._arrays[i]) >= rows]
        if fits:
            return self._arrays[min(fits, key=lambda i: len(self._arrays[i]))][:rows]
        fresh = np.empty((rows + rows // 4, *self.row_shape), dtype=self.dtype)  # room for a larger batch
        if len(self._arrays) < self.keep:
            self._arrays.append(fresh)
        elif free:  # a free array too small for this batch makes room
            self._arrays[free[0]] = fresh
        return fresh[:rows]


# sys.getrefcount of an array only the list holds: the list's reference and the argument's
_UNHELD = 2


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """The tiers a training run asks for (``training.feature_cache``, ``feature_cache_policy``,
    ``feature_cache_hot``), as shares of the rows; `TieredFeatures.from_spec` sizes them."""

    warm_share: float  # rows in CPU memory
    warm_policy: str  # one of WARM_POLICIES
    hot_share: float  # the highest-degree rows on `device`
    device: str | torch.device
    degree: np.ndarray  # each node's degree (ranks the hot tier and the `degree` policy)


@dataclass
class HotSplit:
    """A gather with a hot tier, between its two halves: the compact rows the host read (warm and
    cold) and where they and the hot tier's rows go. `TieredFeatures.gather_split` makes it on the
    host (a loader's thread), `TieredFeatures.assemble` finishes it on the device; in between it
    moves like a tensor (``pin_memory``, ``to``)."""

    host_rows: torch.Tensor  # compact rows of the unique nodes that are not hot, in ascending node order
    host_pos: torch.Tensor  # their positions among the unique nodes
    hot_pos: torch.Tensor  # positions of the hot ones among the unique nodes
    hot_slot: torch.Tensor  # and their rows in the hot tier
    inverse: torch.Tensor | None  # unique -> the nodes as asked (None: they were ascending and unique)
    num_unique: int
    unique: torch.Tensor | None = None  # the unique node ids, for features with per-type parameters

    def _map(self, f) -> "HotSplit":
        tensors = (self.host_rows, self.host_pos, self.hot_pos, self.hot_slot)
        inverse = None if self.inverse is None else f(self.inverse)
        unique = None if self.unique is None else f(self.unique)
        return HotSplit(*map(f, tensors), inverse, self.num_unique, unique)

    def pin_memory(self) -> "HotSplit":
        return self._map(lambda t: t.pin_memory())

    def to(self, device, non_blocking: bool = False) -> "HotSplit":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))


@dataclass
class CacheStats:
    """Row counts since the cache was built (or `reset`)."""

    requested: int = 0
    hot_hits: int = 0
    warm_hits: int = 0
    cold_reads: int = 0
    cold_runs: int = 0
    cold_pages: int = 0

    @property
    def hit_rate(self) -> float:
        return (self.hot_hits + self.warm_hits) / self.requested if self.requested else 0.0


def larger_than_half_the_memory(array: np.ndarray) -> bool:
    """Whether `array` is memory-mapped from a file larger than half of the memory this process
    may hold (physical memory, or its memory cgroup's lower limit: `memory_limit_bytes`)."""
    memory = memory_limit_bytes()
    return memory is not None and mapped_bytes(array) > memory // 2


class TieredFeatures:
    """Feature rows from the hot (device), warm (LRU, CPU) and cold (memory map) tiers."""

    FILL_CHUNK_BYTES = 64 << 20  # the degree tier is filled this many bytes of rows at a time

    def __init__(
        self,
        encoded: EncodedFeatures,
        *,
        warm_rows: int = 0,
        hot_rows: int = 0,
        degree: np.ndarray | None = None,
        device: str | torch.device = "cpu",
        warm_policy: str = "lru",
        readahead: bool | None = None,
    ):
        if warm_rows < 0 or hot_rows < 0:
            raise ValueError(f"warm_rows and hot_rows must be >= 0, got {warm_rows} and {hot_rows}")
        if warm_policy not in WARM_POLICIES:
            raise ValueError(f"warm_policy={warm_policy!r}: must be one of {WARM_POLICIES}")
        needs_degree = hot_rows or (warm_rows and warm_policy == "degree")
        if needs_degree and (degree is None or len(degree) != encoded.num_rows):
            raise ValueError(
                f"hot_rows={hot_rows} / warm_policy={warm_policy!r} needs the degree of each of the "
                f"{encoded.num_rows} nodes"
            )
        self.warm_policy = warm_policy
        self.encoded = encoded
        self.device = torch.device(device)
        codes = encoded.codes
        self._cold = codes.view(np.ndarray) if isinstance(codes, np.memmap) else codes  # np.take: ~3x faster
        self.readahead = larger_than_half_the_memory(codes) if readahead is None else bool(readahead)
        if self.readahead:  # the reads are the advised pages: a fault must not pull in megabytes about it
            advise_random(codes)
        n = encoded.num_rows
        self._row_shape, self._dtype = codes.shape[1:], codes.dtype
        self._row_bytes = int(codes.strides[0]) if codes.ndim else 0  # for the page counts (`stats`)
        self._lock = threading.Lock()
        self.stats = CacheStats()

        hot = hot_nodes(degree, hot_rows) if hot_rows else np.empty(0, dtype=np.int64)
        self.hot_nodes = hot
        self._hot_slot = np.full(n, -1, dtype=np.int64) if len(hot) else None
        if len(hot):
            self._hot_slot[hot] = np.arange(len(hot))
        prefetch_rows(self._cold, hot)  # the one-off fills are read ahead whatever `readahead` says
        self._hot = torch.from_numpy(np.take(self._cold, hot, axis=0)).to(self.device)

        capacity = min(int(warm_rows), n)
        self.capacity = capacity
        self._slot_of = np.full(n, -1, dtype=np.int64) if capacity else None
        self._node_of = np.full(capacity, -1, dtype=np.int64)
        self._last_used = np.full(capacity, -1, dtype=np.int64)
        self._rows = np.empty((capacity, *self._row_shape), dtype=self._dtype)
        self._out = _Recycled(self._row_shape, self._dtype)
        self._tick = 0
        if capacity and warm_policy == "degree":
            ranked = np.argsort(-np.asarray(degree, dtype=np.int64), kind="stable")
            if len(hot):
                ranked = ranked[self._hot_slot[ranked] < 0]
            fill = np.sort(ranked[:capacity]).astype(np.int64)
            self._node_of[: len(fill)] = fill
            self._slot_of[fill] = np.arange(len(fill))
            self._fill_warm(fill)

    def _fill_warm(self, fill: np.ndarray) -> None:
        """Rows of ascending `fill` into the first warm slots, in chunks of about 64 MiB, each read
        ahead and gathered into its slots: no second copy of the tier is made, and no more of the
        file is asked for at once than one chunk (a page cache the tier's size need not be free)."""
        step = max(1, self.FILL_CHUNK_BYTES // max(1, self._row_bytes))
        for a in range(0, len(fill), step):
            ids = fill[a : a + step]
            prefetch_rows(self._cold, ids)
            np.take(self._cold, ids, axis=0, out=self._rows[a : a + len(ids)])

    @classmethod
    def from_spec(cls, encoded: EncodedFeatures, spec: CacheSpec) -> "TieredFeatures":
        """The tiers `spec` asks for, over `encoded` (shares rounded to whole rows)."""
        n = encoded.num_rows
        return cls(
            encoded,
            warm_rows=int(round(spec.warm_share * n)),
            hot_rows=int(round(spec.hot_share * n)),
            degree=spec.degree,
            device=spec.device,
            warm_policy=spec.warm_policy,
        )

    # ------------------------------------------------------------------ lookups

    def cached_nodes(self) -> np.ndarray:
        """Ascending ids of the rows now in the warm tier."""
        return np.sort(self._node_of[self._node_of >= 0])

    def reset_stats(self) -> None:
        self.stats = CacheStats()

    def gather_codes(self, nodes: np.ndarray) -> np.ndarray:
        """Compact rows of `nodes` (any order, duplicates allowed) from the warm and cold tiers
        only, on the CPU: what a host-side reader uses when there is no hot tier."""
        unique, inverse = _unique(nodes)
        with self._lock:
            self.stats.requested += len(unique)
            rows = self._warm_or_cold(unique)
        return rows if inverse is None else rows[inverse]

    def gather(self, nodes: np.ndarray) -> torch.Tensor:
        """float32 [len(nodes), D] rows of `nodes` on the device, decoded."""
        return self.assemble(self.gather_split(nodes).to(self.device))

    def gather_split(self, nodes: np.ndarray) -> HotSplit:
        """The host half of `gather`: the rows of `nodes` that are not hot, from the warm and cold
        tiers (compact, on the CPU), and where the hot ones go."""
        unique, inverse = _unique(nodes)
        with self._lock:
            self.stats.requested += len(unique)
            if self._hot_slot is not None:
                slot = self._hot_slot[unique]
                is_hot = slot >= 0
            else:
                slot, is_hot = None, np.zeros(len(unique), dtype=bool)
            self.stats.hot_hits += int(is_hot.sum())
            host = self._warm_or_cold(unique[~is_hot])
        hot_slot = slot[is_hot] if slot is not None else np.empty(0, dtype=np.int64)
        return HotSplit(
            host_rows=torch.from_numpy(host),
            host_pos=torch.from_numpy(np.flatnonzero(~is_hot)),
            hot_pos=torch.from_numpy(np.flatnonzero(is_hot)),
            hot_slot=torch.from_numpy(hot_slot),
            inverse=None if inverse is None else torch.from_numpy(inverse),
            num_unique=len(unique),
            unique=None if self.encoded.type_offsets is None else torch.from_numpy(unique),
        )

    def assemble(self, split: HotSplit) -> torch.Tensor:
        """The device half of `gather`: the hot tier's rows and the host's, in the nodes' order,
        decoded on the device (`split` already moved there)."""
        out = torch.empty((split.num_unique, *self._row_shape), dtype=self._hot.dtype, device=self.device)
        if len(split.hot_pos):
            out[split.hot_pos] = self._hot[split.hot_slot]
        if len(split.host_pos):
            out[split.host_pos] = split.host_rows
        out = self.encoded.decode_gathered_torch(out, split.unique)
        return out if split.inverse is None else out[split.inverse]

    def _read_cold(self, nodes: np.ndarray) -> np.ndarray:
        """Rows of ascending `nodes` from the feature file (their pages advised first with readahead)."""
        if self.readahead:
            prefetch_rows(self._cold, nodes)
            if len(nodes) and self._row_bytes:  # what the disk serves: counted where it is read
                first, last = page_runs(nodes * self._row_bytes, self._row_bytes)
                self.stats.cold_runs += len(first)
                self.stats.cold_pages += int((last - first).sum()) + len(first)
        return np.take(self._cold, nodes, axis=0)

    def _warm_or_cold(self, unique: np.ndarray) -> np.ndarray:
        """Compact rows of ascending unique `unique` from the warm tier or the cold file
        (inserting the cold ones, LRU); caller holds the lock and counts `requested`."""
        if not self.capacity:
            self.stats.cold_reads += len(unique)
            return self._read_cold(unique)
        self._tick += 1
        slot = _take_rows(self._slot_of, unique)
        hit = slot >= 0
        out = self._out.take(len(unique))
        if hit.all():  # the hit path: a single gather, by torch's threads
            hit_slots, miss = slot, unique[:0]
            _take_rows(self._rows, slot, out)
        else:  # one gather from the warm rows for every position (misses read slot 0), misses written over
            hit_slots = slot[hit]
            _take_rows(self._rows, np.maximum(slot, 0), out)
            miss_at = np.flatnonzero(~hit)
            miss = unique[miss_at]
            miss_rows = self._read_cold(miss)
            out[miss_at] = miss_rows
        self.stats.warm_hits += len(hit_slots)
        self.stats.cold_reads += len(miss)
        if self.warm_policy != "lru":
            return out
        self._last_used[hit_slots] = self._tick
        count = min(len(miss), self.capacity - len(hit_slots))
        if count > 0:
            if count < self.capacity:
                victims = np.argpartition(self._last_used, count - 1)[:count]
            else:
                victims = np.arange(self.capacity)
            old = self._node_of[victims]
            self._slot_of[old[old >= 0]] = -1
            self._node_of[victims] = miss[:count]
            self._slot_of[miss[:count]] = victims
            self._last_used[victims] = self._tick
            self._rows[victims] = miss_rows[:count]
        return out

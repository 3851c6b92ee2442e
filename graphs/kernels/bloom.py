"""Split-block Bloom filters over edge sets (u, v), for rejecting candidate negatives.

What it is for
--------------
A link-prediction sampler draws candidate negative pairs (u, v) at random and must drop the
ones that are edges. Holding every edge of a 100M-edge graph as sorted int64 keys costs
16 bytes per edge; a Bloom filter answers "may (u, v) be an edge?" in ~1.2 bytes per edge
at a 1% false-positive rate and never says "no" for a true edge, so a sampler that keeps
only the pairs the filter rejects never emits an edge (it wrongly discards ~1% of the
true negatives, which costs nothing but a slightly larger draw)::

    bf = BloomFilter.build(src, dst, fpr=0.01)
    u, v = rng.integers(0, n, size=(2, 4 * batch))
    keep = ~bf.might_contain(u, v)          # vectorised, broadcasts like NumPy
    neg_u, neg_v = u[keep][:batch], v[keep][:batch]

Layout: split-block Bloom filter
--------------------------------
The bit array is a sequence of 512-bit blocks (8 little-endian uint64 words = one cache
line). Each key hashes to one block; its k bits all live in that block, bit j in word
``j % 8`` (so for k <= 8 every bit is in a different word). Insert and query touch one cache
line per key instead of k random lines, which is what makes a single core build at tens of
millions of keys per second. The price is a slightly higher false-positive rate for the
same number of bits, because keys do not spread evenly over blocks: a block receives a
Poisson(512 / bits_per_key) number of keys. The sizing below therefore does not use the
classic ``m = -n ln p / ln^2 2`` but the exact false-positive model of this layout,

    FPR(b, k) = sum_j Poisson(j; 512/b) * prod_w (1 - (1 - 1/64)^(j k_w))^(k_w)

(b = bits per key, k_w = bits of a key in word w), and picks, for the target rate, the
k in 1..16 that needs the fewest bits per key. At 1% this gives k = 8 and 10.1 bits per key
(the classic layout needs 9.6 bits with k = 7, i.e. ~5% fewer); at 0.1%, k = 8 and 15.7 bits
(classic 14.4). tests/test_bloom.py and benchmarks/bloom.py check the measured rate against
the model.

The kernels are numba, single-threaded (`graphs.kernels.bloom_kernels`). They hash a group of
64 keys and prefetch their blocks before touching any of them, so the cache misses of a group
overlap (on a filter bigger than L2 the plain loop waits on each miss in turn).

Hash
----
Keys are pairs of arbitrary int64 ids (negative and >= 2**32 included). With s1, s2, s3
derived from the seed by splitmix64, and ``mix`` the splitmix64/murmur3 fmix64 finaliser
(a bijection on 64-bit words)::

    h  = mix(mix(u ^ s1) + v ^ s2)          # 64-bit hash of the ordered pair (u, v)
    block = ((h >> 32) * num_blocks) >> 32    # multiply-shift range reduction
    g  = mix(h ^ s3)                          # bits of key j < 8: 6-bit slice j of g
    g2 = mix(g ^ s3)                          # bits of key j >= 8 (only when k > 8)
    bit j: word (block * 8 + j % 8), bit index ((g or g2) >> (6 * (j % 8))) & 63

(u, v) and (v, u) are different keys; store both directions for an undirected graph.

File layout (version 1), all integers little-endian
---------------------------------------------------
====== ======= ============ ===================================================
offset bytes   type         field
====== ======= ============ ===================================================
0      8       bytes        magic ``b"GNNBLOOM"``
8      4       uint32       format version (1)
12     4       uint32       layout id (1 = split-block, 512-bit blocks)
16     8       uint64       num_bits m (a multiple of 512)
24     4       uint32       num_hashes k (1..16)
28     4       uint32       header size in bytes (64)
32     8       uint64       seed
40     8       uint64       count (keys inserted, duplicates included)
48     8       uint64       num_words = m / 64
56     8       float64      target false-positive rate the filter was sized for
64     8*m/64  uint64[]     the bit array, word i holds bits 64*i .. 64*i+63
====== ======= ============ ===================================================

The file is exactly ``64 + m / 8`` bytes; anything else is rejected on load. Files are
written to a temporary sibling and renamed into place, so a reader never sees half a file.
``BloomFilter.load`` memory-maps the bit array (copy-on-write: ``add`` on a loaded filter
changes memory, never the file; ``save`` it to persist). It checks the header and the size
only: the file carries no digest of its bits. A stage's filters are opened together by
`graphs.stages.compress.load_bloom_filters`, which first checks each file against compressed_graph's
hashes.json, so a damaged bit (a false negative: an edge drawn as a negative) is refused there.
"""

from __future__ import annotations

import math
import os
import struct
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from graphs.kernels.bloom_kernels import BLOCK_BITS, MASK64, WORDS_PER_BLOCK, insert_kernel, query_kernel, seed_salts

__all__ = [
    "BloomFilter",
    "optimal_parameters",
    "blocked_fpr",
    "measured_fpr",
    "MAGIC",
    "FORMAT_VERSION",
    "LAYOUT_SPLIT_BLOCK_512",
    "HEADER_BYTES",
]

MAGIC = b"GNNBLOOM"
FORMAT_VERSION = 1
LAYOUT_SPLIT_BLOCK_512 = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQIIQQQd")
assert _HEADER.size == HEADER_BYTES

MAX_HASHES = 16


# ---------------------------------------------------------------------------------------
# Sizing
# ---------------------------------------------------------------------------------------


def blocked_fpr(bits_per_key: float, num_hashes: int) -> float:
    """Expected false-positive rate of the split-block layout at `bits_per_key` bits per key.

    A non-member lands in a block holding Poisson(512 / bits_per_key) keys; given j keys
    there, each of its bits in word w is set with probability 1 - (1 - 1/64)^(j k_w).
    """
    if bits_per_key <= 0:
        return 1.0
    lam = BLOCK_BITS / bits_per_key
    jmax = int(lam + 12 * math.sqrt(lam) + 30)
    j = np.arange(jmax + 1, dtype=np.float64)
    log_pmf = -lam + j * math.log(lam) - np.array([math.lgamma(x + 1) for x in j])
    pmf = np.exp(log_pmf)
    k_w = np.array([num_hashes // WORDS_PER_BLOCK + (w < num_hashes % WORDS_PER_BLOCK) for w in range(8)])
    k_w = k_w[k_w > 0]
    p_hit = np.ones_like(j)
    for kw in k_w:
        p_hit *= (1.0 - (1.0 - 1.0 / 64.0) ** (j * kw)) ** kw
    return float(np.sum(pmf * p_hit))


@lru_cache(maxsize=256)
def _bits_per_key_for(fpr: float) -> tuple[float, int]:
    """(bits per key, k) with the fewest bits per key whose model FPR is <= `fpr`."""
    best: tuple[float, int] | None = None
    for k in range(1, MAX_HASHES + 1):
        lo, hi = 0.5, 4096.0
        if blocked_fpr(hi, k) > fpr:
            continue
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if blocked_fpr(mid, k) > fpr:
                lo = mid
            else:
                hi = mid
        if best is None or hi < best[0]:
            best = (hi, k)
    if best is None:  # pragma: no cover - unreachable for fpr >= 1e-12
        raise ValueError(f"cannot reach a false-positive rate of {fpr} with <= 4096 bits/key")
    return best


def optimal_parameters(capacity: int, fpr: float) -> tuple[int, int]:
    """(num_bits, num_hashes) of the smallest split-block filter whose model FPR at
    `capacity` keys is at most `fpr`. num_bits is a multiple of 512 (at least one block)."""
    if not (0.0 < fpr < 1.0):
        raise ValueError(f"target false-positive rate must be in (0, 1), got {fpr!r}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity!r}")
    bpk, k = _bits_per_key_for(float(fpr))
    num_blocks = max(1, math.ceil(bpk * capacity / BLOCK_BITS))
    if num_blocks >= 1 << 32:
        raise ValueError(f"{capacity} keys at fpr={fpr} need {num_blocks} blocks; the layout holds < 2**32")
    return num_blocks * BLOCK_BITS, k


def _aligned_zeros(num_words: int) -> np.ndarray:
    """Zeroed uint64 array whose data starts on a 64-byte (cache-line) boundary."""
    raw = np.zeros(num_words + WORDS_PER_BLOCK, dtype=np.uint64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip : skip + num_words]


def _as_id_arrays(src, dst, what: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Broadcast two id arrays; return contiguous flat uint64 views and the output shape."""
    src = np.asarray(src)
    dst = np.asarray(dst)
    for name, a in (("src", src), ("dst", dst)):
        if a.dtype.kind not in "iub":
            raise TypeError(f"{what}: {name} ids must be integers, got dtype {a.dtype}")
    try:
        s, d = np.broadcast_arrays(src, dst)
    except ValueError as exc:
        raise ValueError(f"{what}: src shape {src.shape} and dst shape {dst.shape} do not broadcast") from exc
    shape = s.shape
    s = np.ascontiguousarray(s.reshape(-1), dtype=np.int64).view(np.uint64)
    d = np.ascontiguousarray(d.reshape(-1), dtype=np.int64).view(np.uint64)
    return s, d, shape


# ---------------------------------------------------------------------------------------
# The filter
# ---------------------------------------------------------------------------------------


class BloomFilter:
    """Split-block Bloom filter over ordered int64 pairs (u, v).

    Create with :meth:`build` (from edges), :meth:`empty` (then :meth:`add`) or
    :meth:`load`. Queries never return False for a pair that was added.
    """

    __slots__ = ("_words", "_num_hashes", "_seed", "_count", "_target_fpr", "_salts")

    def __init__(self, words: np.ndarray, num_hashes: int, *, seed: int, count: int, target_fpr: float):
        if words.dtype != np.uint64 or words.ndim != 1:
            raise ValueError(f"bit array must be 1-d uint64, got {words.dtype} {words.shape}")
        if words.size == 0 or words.size % WORDS_PER_BLOCK:
            raise ValueError(f"bit array must hold whole 512-bit blocks, got {words.size} words")
        if not 1 <= num_hashes <= MAX_HASHES:
            raise ValueError(f"num_hashes must be in 1..{MAX_HASHES}, got {num_hashes}")
        self._words = words
        self._num_hashes = int(num_hashes)
        self._seed = int(seed) & MASK64
        self._count = int(count)
        self._target_fpr = float(target_fpr)
        self._salts = seed_salts(self._seed)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def empty(cls, capacity: int, *, fpr: float = 0.01, seed: int = 0) -> "BloomFilter":
        """An empty filter sized so that `capacity` keys give a false-positive rate `fpr`."""
        num_bits, k = optimal_parameters(int(capacity), fpr)
        return cls(_aligned_zeros(num_bits // 64), k, seed=seed, count=0, target_fpr=fpr)

    @classmethod
    def build(cls, src, dst, *, fpr: float = 0.01, seed: int = 0, capacity: int | None = None) -> "BloomFilter":
        """Filter holding every pair (src[i], dst[i]), sized for `capacity` keys
        (default: the number of pairs given) at false-positive rate `fpr`."""
        s, d, _ = _as_id_arrays(src, dst, "BloomFilter.build")
        bf = cls.empty(s.size if capacity is None else capacity, fpr=fpr, seed=seed)
        bf._insert(s, d)
        return bf

    def add(self, src, dst) -> None:
        """Insert the pairs (src[i], dst[i]) (arrays broadcast like NumPy)."""
        s, d, _ = _as_id_arrays(src, dst, "BloomFilter.add")
        if not self._words.flags.writeable:
            raise ValueError("this filter's bit array is read-only; load it with mmap=False")
        self._insert(s, d)

    def _insert(self, s: np.ndarray, d: np.ndarray) -> None:
        s1, s2, s3 = self._salts
        insert_kernel(self._words, self.num_blocks, self._num_hashes, s1, s2, s3, s, d)
        self._count += int(s.size)

    # -- queries ------------------------------------------------------------------------

    def might_contain(self, src, dst) -> np.ndarray:
        """Boolean array: False means (src[i], dst[i]) was certainly never added; True means
        it was added or is a false positive. Inputs broadcast; output has their shape."""
        s, d, shape = _as_id_arrays(src, dst, "BloomFilter.might_contain")
        out = np.empty(s.size, dtype=np.bool_)
        s1, s2, s3 = self._salts
        query_kernel(self._words, self.num_blocks, self._num_hashes, s1, s2, s3, s, d, out)
        return out.reshape(shape)

    def __contains__(self, pair) -> bool:
        u, v = pair
        return bool(self.might_contain(u, v))

    # -- properties ---------------------------------------------------------------------

    @property
    def words(self) -> np.ndarray:
        """The bit array, uint64 [num_bits / 64] (read it, do not resize it)."""
        return self._words

    @property
    def num_bits(self) -> int:
        """m, the number of bits (a multiple of 512)."""
        return int(self._words.size) * 64

    @property
    def num_blocks(self) -> int:
        return int(self._words.size) // WORDS_PER_BLOCK

    @property
    def num_hashes(self) -> int:
        """k, bits set per key."""
        return self._num_hashes

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def count(self) -> int:
        """Keys inserted so far (duplicates counted each time)."""
        return self._count

    @property
    def target_fpr(self) -> float:
        """The false-positive rate the filter was sized for."""
        return self._target_fpr

    @property
    def bits_per_item(self) -> float:
        """num_bits / count (inf while empty)."""
        return self.num_bits / self._count if self._count else math.inf

    @property
    def nbytes(self) -> int:
        """Bytes of the bit array (the file adds a 64-byte header)."""
        return int(self._words.nbytes)

    @property
    def expected_fpr(self) -> float:
        """Model false-positive rate at the current count (see module docstring)."""
        return blocked_fpr(self.bits_per_item, self._num_hashes) if self._count else 0.0

    def __repr__(self) -> str:
        return (
            f"BloomFilter(num_bits={self.num_bits}, num_hashes={self.num_hashes}, "
            f"count={self.count}, bits_per_item={self.bits_per_item:.2f}, seed={self.seed})"
        )

    # -- persistence --------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the filter in the version-1 layout (module docstring), atomically."""
        path = Path(path)
        header = _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            LAYOUT_SPLIT_BLOCK_512,
            self.num_bits,
            self._num_hashes,
            HEADER_BYTES,
            self._seed,
            self._count,
            int(self._words.size),
            self._target_fpr,
        )
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                np.ascontiguousarray(self._words, dtype="<u8").tofile(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = True) -> "BloomFilter":
        """Read a filter written by :meth:`save`. With `mmap` the bit array is memory-mapped
        copy-on-write; otherwise it is read into memory. Raises ValueError naming the file
        if it is not a version-1 Bloom filter file or is truncated."""
        path = Path(path)
        size = path.stat().st_size
        if size < HEADER_BYTES:
            raise ValueError(
                f"{path}: truncated Bloom filter file: {size} bytes, the header alone is "
                f"{HEADER_BYTES}; rewrite it with BloomFilter.save"
            )
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        (magic, version, layout, num_bits, k, header_bytes, seed, count, num_words, target_fpr) = _HEADER.unpack(raw)
        if magic != MAGIC:
            raise ValueError(f"{path}: not a gnnflow Bloom filter file (magic {magic!r}, expected {MAGIC!r})")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{path}: unsupported Bloom filter format version {version} (this reader "
                f"reads version {FORMAT_VERSION}); rebuild the filter with this gnnflow"
            )
        if layout != LAYOUT_SPLIT_BLOCK_512:
            raise ValueError(
                f"{path}: unknown Bloom filter layout id {layout} "
                f"(known: {LAYOUT_SPLIT_BLOCK_512} = split-block 512-bit)"
            )
        if header_bytes != HEADER_BYTES:
            raise ValueError(f"{path}: header size {header_bytes}, expected {HEADER_BYTES}")
        if num_words * 64 != num_bits or num_words == 0 or num_words % WORDS_PER_BLOCK:
            raise ValueError(
                f"{path}: inconsistent header: num_bits={num_bits}, num_words={num_words} "
                "(need num_bits = 64 * num_words, whole 512-bit blocks)"
            )
        if not 1 <= k <= MAX_HASHES:
            raise ValueError(f"{path}: num_hashes={k} outside 1..{MAX_HASHES}")
        expected = HEADER_BYTES + 8 * num_words
        if size != expected:
            what = "truncated" if size < expected else "has trailing bytes"
            raise ValueError(
                f"{path}: Bloom filter file {what}: {size} bytes, header says "
                f"{expected} ({num_bits} bits + {HEADER_BYTES}-byte header)"
            )
        if mmap:
            mm = np.memmap(path, dtype="<u8", mode="c", offset=HEADER_BYTES, shape=(num_words,))
            words = mm.view(np.ndarray).view(np.uint64)
        else:
            words = _aligned_zeros(num_words)
            with open(path, "rb") as f:
                f.seek(HEADER_BYTES)
                f.readinto(memoryview(words).cast("B"))
            if words.dtype.byteorder == ">":  # pragma: no cover - big-endian hosts
                words.byteswap(inplace=True)
        return cls(words, k, seed=seed, count=count, target_fpr=target_fpr)


# ---------------------------------------------------------------------------------------
# Measuring the false-positive rate
# ---------------------------------------------------------------------------------------


def _edge_key_membership(src, dst, num_nodes: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """is_edge(u, v) against the sorted int64 keys u * num_nodes + v of the true edges."""
    if num_nodes > 3_037_000_499:  # num_nodes**2 must fit in int64
        raise ValueError(f"num_nodes={num_nodes} too large for int64 pair keys; pass exclude as a callable")
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"exclude: src {src.shape} and dst {dst.shape} differ in length")
    keys = np.unique(src * num_nodes + dst)

    def is_edge(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        q = u * num_nodes + v
        pos = np.searchsorted(keys, q)
        pos[pos == keys.size] = 0
        return keys[pos] == q if keys.size else np.zeros(q.shape, dtype=bool)

    return is_edge


def measured_fpr(
    bf: BloomFilter,
    n_queries: int,
    num_nodes: int,
    *,
    exclude,
    seed: int = 0,
) -> float:
    """Fraction of `n_queries` uniformly random non-edges (u, v in [0, num_nodes)) that `bf`
    accepts. `exclude` is either the true edges as a pair of id arrays (src, dst) or a
    callable ``is_edge(u, v) -> bool array``; pairs it marks as edges are redrawn."""
    if n_queries <= 0:
        raise ValueError(f"n_queries must be positive, got {n_queries}")
    if num_nodes <= 0:
        raise ValueError(f"num_nodes must be positive, got {num_nodes}")
    is_edge = exclude if callable(exclude) else _edge_key_membership(*exclude, num_nodes)
    rng = np.random.default_rng(seed)
    accepted = 0
    drawn = 0
    attempts = 0
    while drawn < n_queries:
        need = n_queries - drawn
        u, v = rng.integers(0, num_nodes, size=(2, min(need + need // 8 + 64, 1 << 22)))
        keep = ~np.asarray(is_edge(u, v), dtype=bool)
        u, v = u[keep][:need], v[keep][:need]
        accepted += int(np.count_nonzero(bf.might_contain(u, v)))
        drawn += u.size
        attempts += 1
        if attempts > 1000 and drawn < attempts:  # almost every pair is an edge
            raise ValueError(f"could draw only {drawn} non-edges in {attempts} batches; is the graph complete?")
    return accepted / n_queries

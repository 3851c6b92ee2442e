"""Build and query rates of the edge-set Bloom filter (graphs/kernels/bloom.py) against plain NumPy.

One process, one edge set: ~10M distinct power-law-ish pairs (skewed source and target
degrees, ids scattered over the id range). Both filters are sized for the same target
false-positive rate:

* ours: split-block layout (512-bit blocks, one cache line per key), numba, one thread;
* reference: the classic layout in plain NumPy (k = round(ln 2 * m / n) bit positions
  h1 + i * h2 mod m over one m-bit array, m = -n ln p / ln^2 2), written below.

Prints build edges/s, query pairs/s (on the edges themselves and on uniformly random pairs,
the negative-sampling workload), the ratios ours / reference, bits per edge, bytes against
the raw int64 (src, dst) pairs, and the false-positive rate measured on 1M random non-edges
against the target. Times are the best and the median of --reps runs (other work on the
machine only ever slows a run down).

    python benchmarks/bloom.py
    python benchmarks/bloom.py --edges 10000000 --fpr 0.01 --reps 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

import harness  # noqa: E402  (benchmarks/harness.py)

from graphs.kernels.bloom import BloomFilter, measured_fpr  # noqa: E402

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class NumpyBloom:
    """Classic Bloom filter in plain NumPy: k positions by double hashing over m bits."""

    CHUNK = 1 << 20

    def __init__(self, capacity: int, fpr: float, seed: int = 0):
        self.m = max(64, math.ceil(-capacity * math.log(fpr) / math.log(2) ** 2))
        self.k = max(1, round(math.log(2) * self.m / max(1, capacity)))
        self.salt = _mix64(np.array([seed + 0x9E3779B97F4A7C15], dtype=np.uint64))[0]
        self.bits = np.zeros((self.m + 7) // 8, dtype=np.uint8)  # packed, little bit order

    def _positions(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        u = src.astype(np.int64).view(np.uint64)
        v = dst.astype(np.int64).view(np.uint64)
        h1 = _mix64((_mix64(u ^ self.salt) + v))
        h2 = _mix64(h1 ^ self.salt) | np.uint64(1)
        i = np.arange(self.k, dtype=np.uint64)[:, None]
        return (h1 + i * h2) % np.uint64(self.m)  # [k, n]

    def add(self, src: np.ndarray, dst: np.ndarray) -> None:
        flags = np.unpackbits(self.bits, count=self.m, bitorder="little").view(bool)
        for a in range(0, src.size, self.CHUNK):
            flags[self._positions(src[a : a + self.CHUNK], dst[a : a + self.CHUNK])] = True
        self.bits = np.packbits(flags, bitorder="little")

    def might_contain(self, src, dst) -> np.ndarray:
        src, dst = np.broadcast_arrays(np.asarray(src), np.asarray(dst))
        out = np.empty(src.size, dtype=bool)
        src, dst = src.ravel(), dst.ravel()
        for a in range(0, src.size, self.CHUNK):
            pos = self._positions(src[a : a + self.CHUNK], dst[a : a + self.CHUNK])
            hit = (self.bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
            out[a : a + self.CHUNK] = hit.all(axis=0)
        return out.reshape(src.shape)


def power_law_edges(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """num_edges distinct pairs with heavy-tailed out- and in-degrees, ids shuffled."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_nodes)
    keys = np.empty(0, dtype=np.int64)
    while keys.size < num_edges:
        draw = int((num_edges - keys.size) * 1.2) + 1000
        src = perm[(num_nodes * rng.random(draw) ** 3).astype(np.int64)]
        dst = perm[(num_nodes * rng.random(draw) ** 2).astype(np.int64)]
        keys = np.unique(np.concatenate([keys, src * num_nodes + dst]))
    keys = rng.permutation(keys)[:num_edges]
    return keys // num_nodes, keys % num_nodes


def _timed(fn, reps: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--fpr", type=float, default=0.01)
    ap.add_argument("--fpr-queries", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()
    n = args.edges

    t0 = time.perf_counter()
    src, dst = power_law_edges(args.nodes, n, seed=0)
    rng = np.random.default_rng(1)
    qs, qd = rng.integers(0, args.nodes, size=(2, n))
    print(
        f"{n:,} distinct edges over {args.nodes:,} nodes, target FPR {args.fpr} "
        f"(generated in {time.perf_counter() - t0:.1f}s); times: best / median of {args.reps}"
    )

    BloomFilter.build(src[:1000], dst[:1000]).might_contain(qs[:10], qd[:10])  # JIT / cache load
    b_best, b_med, ours = _timed(lambda: BloomFilter.build(src, dst, fpr=args.fpr), args.reps)
    qe_best, qe_med, hits = _timed(lambda: ours.might_contain(src, dst), args.reps)
    assert hits.all(), "false negative"
    qr_best, qr_med, _ = _timed(lambda: ours.might_contain(qs, qd), args.reps)

    def build_ref():
        ref = NumpyBloom(n, args.fpr)
        ref.add(src, dst)
        return ref

    rb_best, rb_med, ref = _timed(build_ref, args.reps)
    rqe_best, rqe_med, rhits = _timed(lambda: ref.might_contain(src, dst), args.reps)
    assert rhits.all(), "false negative (reference)"
    rqr_best, rqr_med, _ = _timed(lambda: ref.might_contain(qs, qd), args.reps)

    fpr_ours = measured_fpr(ours, args.fpr_queries, args.nodes, exclude=(src, dst), seed=2)
    fpr_ref = measured_fpr(ref, args.fpr_queries, args.nodes, exclude=(src, dst), seed=2)

    def rate(t: float) -> str:
        return f"{n / t / 1e6:7.1f}M/s"

    rows = [
        ("build (edges/s)", b_best, b_med, rb_best, rb_med),
        ("query edges (pairs/s)", qe_best, qe_med, rqe_best, rqe_med),
        ("query random (pairs/s)", qr_best, qr_med, rqr_best, rqr_med),
    ]
    print(
        f"\n{'':24s}{'ours best':>12s}{'median':>11s}{'numpy best':>13s}{'median':>11s}"
        f"{'speedup best':>14s}{'median':>8s}"
    )
    for name, ob, om, rb, rm in rows:
        print(
            f"{name:24s}{rate(ob):>12s}{rate(om):>11s}{rate(rb):>13s}{rate(rm):>11s}{rb / ob:>13.1f}x{rm / om:>7.1f}x"
        )
    raw = 16 * n
    print(f"\n{'':24s}{'ours':>12s}{'numpy':>11s}")
    print(f"{'layout':24s}{'split-block':>12s}{'classic':>11s}")
    print(f"{'hashes k':24s}{ours.num_hashes:>12d}{ref.k:>11d}")
    print(f"{'bits per edge':24s}{ours.bits_per_item:>12.2f}{ref.m / n:>11.2f}")
    ref_model = (1 - math.exp(-ref.k * n / ref.m)) ** ref.k
    print(f"{'bytes / raw int64 pair':24s}{ours.nbytes / raw:>12.4f}{ref.bits.nbytes / raw:>11.4f}")
    print(f"{'model FPR':24s}{ours.expected_fpr:>12.5f}{ref_model:>11.5f}")
    print(
        f"{'measured FPR':24s}{fpr_ours:>12.5f}{fpr_ref:>11.5f}"
        f"   ({args.fpr_queries:,} random non-edges; target {args.fpr})"
    )
    print(f"{'measured / target':24s}{fpr_ours / args.fpr:>12.3f}{fpr_ref / args.fpr:>11.3f}")
    common = {"benchmark": "bloom", "metric": "seconds (best)", "peer_name": "classic Bloom filter, NumPy"}
    size = {"nodes": args.nodes, "edges": n}
    harness.emit(
        args.record,
        [
            harness.Record(**common, **size, stage=f"Bloom filter {name.split(' (')[0]}", ours=ob, peer=rb)
            for name, ob, _, rb, _ in rows
        ]
        + [
            harness.Record(
                benchmark="bloom",
                stage="Bloom filter false-positive rate",
                metric="measured FPR",
                ours=fpr_ours,
                peer=fpr_ref,
                peer_name="classic Bloom filter, NumPy",
                notes=f"target {args.fpr}; {ours.bits_per_item:.2f} vs {ref.m / n:.2f} bits per edge",
                **size,
            )
        ],
    )


if __name__ == "__main__":
    main()

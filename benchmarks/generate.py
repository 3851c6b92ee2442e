"""Throughput and peak memory of the synthetic graph generator (graphs/synthetic/generate.py).

One process, one dataset; prints wall time, edge rows per second and peak RSS. There is no
baseline library for DC-SBM sampling at this scale, so the reference figures are the
naive cost of the same rows: NumPy's binary search (`np.searchsorted`) for the two
weighted draws per edge, timed on a sample of blocks and printed as a ratio.

    python benchmarks/generate.py --nodes 1000000 --edges 10000000 --out /tmp/gen_bench
    python benchmarks/generate.py --nodes 10000000 --edges 100000000 --out /tmp/gen_bench
"""

from __future__ import annotations

import argparse
import shutil
import time

import numpy as np
import psutil

from graphs.infra.storage import peak_rss_bytes
from graphs.synthetic import generate as gen


def _searchsorted_edges_per_second(model: gen._Model, config: gen.GenerateConfig, blocks: int = 8) -> float:
    """Baseline: the same two weighted draws per edge by plain binary search."""
    rng = np.random.default_rng(0)
    cum = model.cum[:-1]
    size = gen._EDGE_BLOCK
    t0 = time.perf_counter()
    for _ in range(blocks):
        np.searchsorted(cum, rng.random(size) * cum[-1], side="right")
        np.searchsorted(cum, rng.random(size) * cum[-1], side="right")
    return blocks * size / (time.perf_counter() - t0)


def _guide_edges_per_second(model: gen._Model, config: gen.GenerateConfig, blocks: int = 8) -> float:
    """Ours: whole edge blocks (src, class choice, dst) through the guide table."""
    t0 = time.perf_counter()
    rows = 0
    for block in range(blocks):
        rows += len(gen._edge_block(model, config, block)[0])
    return rows / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--edges", type=int, default=10_000_000)
    parser.add_argument("--out", default="/tmp/gen_bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the dataset written to --out")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    config = gen.scale_config(args.nodes, args.edges, seed=args.seed)
    summary = gen.generate_dataset(config, args.out, progress=not args.no_progress)
    peak = peak_rss_bytes()

    model = gen._build_model(config)  # after the run: must not inflate the figure above
    ours = _guide_edges_per_second(model, config)
    naive = _searchsorted_edges_per_second(model, config)

    print(
        f"nodes={summary['nodes']:,} edge_rows={summary['edge_rows']:,} "
        f"files={summary['edge_files']} on_disk={summary['bytes'] / 2**30:.2f} GiB"
    )
    print(
        f"wall={summary['seconds']:.1f} s  edges/s={summary['edges_per_second']:,.0f}  "
        f"peak_rss={peak / 2**30:.2f} GiB (machine total "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB)"
    )
    print(f"intra_class_fraction={summary['intra_class_fraction']:.4f} self_loops={summary['self_loops']:,}")
    print(
        f"sampling only: guide table {ours:,.0f} edges/s vs np.searchsorted {naive:,.0f} "
        f"edges/s (ratio {ours / naive:.1f}x)"
    )
    if not args.keep:
        shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Mean aggregation: torch sparse CSR matmul vs DGL's fused CPU kernel, one process.

Times ``training.aggregate.aggregate(block, x, reduce="mean")`` forward and
forward+backward with ``backend="torch"`` and ``backend="dgl"`` on a random graph
(default: 900k edges x 256 features, the size quoted in issue 6), and, as the plain-torch
reference the torch path improves on, ``torch.sparse.mm`` with torch's own backward
(which re-transposes the matrix every step). Prints the best of ``--repeat`` runs in ms
and the ratio torch / DGL. Never gates anything on time.

    DGLBACKEND=pytorch python benchmarks/aggregate.py [--nodes 100000 --edges 900000 --feats 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

import harness  # noqa: E402  (benchmarks/harness.py)

from training.aggregate import aggregate  # noqa: E402
from training.blocks import Block  # noqa: E402


def random_block(nodes: int, edges: int, seed: int = 0) -> Block:
    gen = torch.Generator().manual_seed(seed)
    dst, _ = torch.sort(torch.randint(0, nodes, (edges,), generator=gen))
    src = torch.randint(0, nodes, (edges,), generator=gen)
    indptr = torch.zeros(nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=nodes), 0, out=indptr[1:])
    return Block(indptr, src, nodes, nodes)


def best_ms(fn, repeat: int) -> float:
    fn()  # warm-up: builds and caches the block's CSR / DGL structures
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=900_000)
    parser.add_argument("--feats", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = parser.parse_args()

    block = random_block(args.nodes, args.edges)
    x = torch.randn(args.nodes, args.feats, generator=torch.Generator().manual_seed(1))
    grad = torch.ones(args.nodes, args.feats)
    print(
        f"mean aggregation, {args.nodes:,} nodes x {args.edges:,} edges x {args.feats} "
        f"features, {torch.get_num_threads()} threads, best of {args.repeat} (ms)"
    )

    def forward(backend):
        return lambda: aggregate(block, x, reduce="mean", backend=backend)

    def forward_backward(backend):
        def step():
            xg = x.detach().requires_grad_(True)
            aggregate(block, xg, reduce="mean", backend=backend).backward(grad)

        return step

    # plain torch.sparse.mm with torch's autograd (what the torch path replaces)
    inv_deg = 1.0 / block.in_degrees().clamp(min=1).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plain = torch.sparse_csr_tensor(block.indptr, block.indices, inv_deg[block.dst_ids()], (args.nodes, args.nodes))

    def plain_forward_backward():
        xg = x.detach().requires_grad_(True)
        torch.sparse.mm(plain, xg).backward(grad)

    rows = {
        "forward": (best_ms(forward("torch"), args.repeat), best_ms(forward("dgl"), args.repeat)),
        "forward+backward": (
            best_ms(forward_backward("torch"), args.repeat),
            best_ms(forward_backward("dgl"), args.repeat),
        ),
    }
    print(f"{'':18} {'torch sparse':>13} {'DGL kernel':>11} {'torch/DGL':>10}")
    for name, (ours, dgl_ms) in rows.items():
        print(f"{name:18} {ours:13.1f} {dgl_ms:11.1f} {ours / dgl_ms:10.2f}x")
    plain_ms = best_ms(plain_forward_backward, args.repeat)
    ours_fb = rows["forward+backward"][0]
    print(
        f"torch.sparse.mm with torch's own backward: forward+backward {plain_ms:.1f} ms "
        f"({plain_ms / ours_fb:.2f}x the cached-transpose torch path)"
    )
    harness.emit(
        args.record,
        [
            harness.Record(
                benchmark="aggregate",
                stage=f"mean aggregation {name}, {args.feats} features",
                metric="ms (best)",
                ours=ours,
                peer=dgl_ms,
                peer_name="DGL fused CPU kernel",
                nodes=args.nodes,
                edges=args.edges,
                notes="ours = the plain-torch path (training/ uses DGL's kernel on CPU when importable)"
                if name == "forward"
                else "",
            )
            for name, (ours, dgl_ms) in rows.items()
        ],
    )


if __name__ == "__main__":
    main()

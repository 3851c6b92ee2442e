"""Accuracy cost of the compressed graph: the same GCN trained on FP32 and on every encoding.

    .venv/bin/python benchmarks/compression.py
    .venv/bin/python benchmarks/compression.py --datasets demo heavy --seeds 5 --epochs 200

For each dataset the pipeline's own stages run once (canonical graph, normalized
adjacency, METIS parts; cached under --work), then `graphs.stages.compress.build_compressed_graph`
writes the compressed graph once per feature encoding, and the features and edge weights
the model sees are decoded from those files (`load_features`, `load_weights`). The model
is a full-batch 2-layer GCN over Â = D^-1/2 (A + I) D^-1/2, logits = Â relu(Â X W1 + b1) W2
+ b2: hidden 64, dropout 0.5 on the hidden features, Adam (lr 0.01, weight decay 5e-4),
200 epochs, and the test accuracy at the epoch of best validation accuracy. Every encoding
is trained with the same seeds (same initial weights and dropout masks), so differences
are the encoding's. Dropout sits on the hidden layer only (Kipf & Welling also drop input
features) so that Â X is computed once per run (dense features) or X stays sparse (0/1
features): that keeps a 100k-node full-batch epoch at ~0.15 s on one shared core, and the
comparison between encodings is unaffected.

Datasets:
  demo      `graphs.synthetic.generate.demo_config()`: 100k nodes, 1M edge rows, 32-dim Gaussian
            features around class centroids (its structure alone makes it easy: ~99.6%);
  heavy     a generated graph where the features matter (30k nodes, 150k edge rows,
            homophily 0.6; `heavy_tailed_config`) whose 32 feature columns are made
            heavy-tailed: column j of the generator's features x becomes exp(s_j * x), s_j
            uniform in [1.5, 3] (seeded) — log-normal, column max ~1000x the median;
  cora, citeseer   the Planetoid citation graphs in datasets/ (0/1 features).

Rows (`variants`): fp32 (the reference); int8 features with FP32 edge weights; the INT8
weights the asset stores ("w=int8") with int8, int4 and, on 0/1 features, binary codes
(there int4 and binary with FP32 weights too, to show they are exact); on the heavy-tailed
graph also the encoder's asinh transform. Columns: bytes of features + weights and their
saving against FP32; the whole compressed_graph asset's saving and ratio against the
FP32 / int64 originals (features + weights + Bloom edge sets against raw (src, dst) int64
pairs; rows with FP32 weights count them as stored so); the features' relative RMS
reconstruction error; mean ± std test accuracy over the seeds; the drop against fp32 in
points. The end lists, per dataset, the INT8 asset's drop and the smallest asset whose
drop stays within 0.5 points.

Threads: 1 by default (--threads): on the shared 2-core machine this was written on, two
threads made the sparse products up to 10x slower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from graphs.infra.storage import write_file_hashes  # noqa: E402
from graphs.kernels.quantize_csr import dequantize_int8_rows_csr  # noqa: E402
from graphs.stages.canonical import CanonicalGraph, build_canonical_graph  # noqa: E402
from graphs.stages.compress import (  # noqa: E402
    CompressConfig,
    build_compressed_graph,
    load_features,
    load_weights,
)
from graphs.stages.compress_features import encoding_nbytes  # noqa: E402
from graphs.stages.normalize import Adjacency, build_normalized_adjacency, load_csr  # noqa: E402
from graphs.stages.partition import PartitionConfig, Partitions, build_partitions  # noqa: E402
from graphs.synthetic.generate import GenerateConfig, demo_config, generate_dataset  # noqa: E402

DATASETS = Path(__file__).resolve().parents[1] / "datasets"  # in the repository (datasets/README.md)


# ----------------------------------------------------------------------------- data


def _staged(landing: Path, root: Path, parts: int) -> tuple[Path, Path, Path]:
    """(canonical, adjacency, partitions) folders for `landing`, built once under `root`."""
    canonical, adj, partitions = root / "canonical", root / "adj", root / "parts"
    if not (canonical / CanonicalGraph.SUMMARY).is_file():
        build_canonical_graph(landing, canonical)
    if not (adj / Adjacency.SUMMARY).is_file():
        build_normalized_adjacency(canonical, adj)
    if not (partitions / Partitions.SUMMARY).is_file():
        build_partitions(canonical, partitions, PartitionConfig(num_parts=parts, write_distdgl=False))
    return canonical, adj, partitions


def heavy_tailed_config() -> GenerateConfig:
    """The graph under the heavy-tailed features: smaller and less homophilous than the demo, so
    that the features matter (the demo graph's structure alone puts a GCN at ~99.6%)."""
    return GenerateConfig(num_nodes=30_000, num_edges=150_000, homophily=0.6, seed=1)


def heavy_tailed(canonical: Path, out: Path, seed: int = 0) -> Path:
    """A canonical folder sharing `canonical`'s graph whose features are exp(s_j * x_j),
    s_j uniform in [1.5, 3] per column: log-normal columns, max ~1000x the median."""
    graph = CanonicalGraph
    if (out / graph.SUMMARY).is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in (graph.EDGES, graph.NODES, graph.SUMMARY):
        shutil.copyfile(canonical / name, out / name)
    x = np.load(canonical / graph.FEATURES)
    s = np.random.default_rng(seed).uniform(1.5, 3.0, size=x.shape[1]).astype(np.float32)
    np.save(out / graph.FEATURES, np.exp(x * s).astype(np.float32))
    write_file_hashes(out)  # recorded as a stage records its files: compressed_graph checks them
    return out


def prepare(name: str, work: Path) -> tuple[Path, Path, Path]:
    """(canonical, adjacency, partitions) of a benchmark dataset, built once under `work`."""
    if name in ("demo", "heavy"):
        config, parts = (demo_config(), 4) if name == "demo" else (heavy_tailed_config(), 4)
        landing = work / f"{name}-landing"
        if not (landing / "nodes.parquet").is_file():
            generate_dataset(config, landing, progress=False)
        canonical, adj, partitions = _staged(landing, work / name, parts)
        if name == "heavy":
            canonical = heavy_tailed(canonical, work / name / "canonical-lognormal")
        return canonical, adj, partitions
    return _staged(DATASETS / name, work / name, parts=2)


def labels_and_masks(canonical: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    t = pq.read_table(CanonicalGraph.open(canonical).nodes_path, columns=["label", "split"])
    label = torch.from_numpy(t.column("label").to_numpy().astype(np.int64))
    split = t.column("split").to_numpy(zero_copy_only=False)
    masks = {s: torch.from_numpy((split == s) & (label.numpy() >= 0)) for s in ("train", "val", "test")}
    return label, masks


# ----------------------------------------------------------------------------- model


class _SpMM(torch.autograd.Function):
    """a @ h for a constant sparse CSR `a`, with the backward a_t @ grad from a transpose built
    once (INT8 weights with per-row scales make Â slightly asymmetric, so Âᵀ is its own matrix)."""

    @staticmethod
    def forward(ctx, a, a_t, h):
        ctx.a_t = a_t
        return a @ h

    @staticmethod
    def backward(ctx, grad):
        return None, None, ctx.a_t @ grad


def _csr_pair(indptr, indices, values, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """(matrix, its transpose) as torch sparse CSR."""
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        a = torch.sparse_csr_tensor(
            torch.as_tensor(np.asarray(indptr, dtype=np.int64)),
            torch.as_tensor(np.asarray(indices, dtype=np.int64)),
            torch.as_tensor(np.asarray(values, dtype=np.float32)),
            shape,
        )
        return a, a.to_sparse_coo().t().coalesce().to_sparse_csr()


class SparseOperand:
    """A constant sparse matrix M as a differentiable map h -> M @ h."""

    def __init__(self, indptr, indices, values, shape):
        self.m, self.m_t = _csr_pair(indptr, indices, values, shape)

    @classmethod
    def from_dense(cls, x: np.ndarray) -> "SparseOperand":
        rows, cols = np.nonzero(x)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=x.shape[0]))])
        return cls(indptr, cols, x[rows, cols], x.shape)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self.m, self.m_t, h)


class Inputs:
    """What the first layer reads: Â X precomputed (dense features; Â X W1 = (Â X) W1), or Â and
    a sparse X (0/1 bag-of-words features: Â X W1 = Â (X W1) costs O(non-zeros))."""

    def __init__(self, prop: SparseOperand, x: np.ndarray):
        self.prop = prop
        self.dims = x.shape[1]
        self.sparse = np.count_nonzero(x) < 0.1 * x.size
        if self.sparse:
            self.x = SparseOperand.from_dense(x)
        else:
            with torch.no_grad():
                self.ax = prop(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))

    def first_layer(self, lin: nn.Linear) -> torch.Tensor:
        if self.sparse:
            return self.prop(self.x(lin.weight.t())) + lin.bias
        return lin(self.ax)


class GCN(nn.Module):
    """Kipf & Welling's 2-layer GCN: logits = Â dropout(relu(Â X W1 + b1)) W2 + b2.

    Dropout (p = 0.5) is on the hidden layer only, so the first layer needs no sparse
    product per epoch on dense features. Initialised like ``training.convs.gcn.GraphConv``
    (Xavier-uniform weights, zero biases).
    """

    def __init__(self, d_in: int, hidden: int, classes: int):
        super().__init__()
        self.lin1 = nn.Linear(d_in, hidden)
        self.lin2 = nn.Linear(hidden, classes, bias=False)
        self.bias2 = nn.Parameter(torch.zeros(classes))
        for lin in (self.lin1, self.lin2):
            nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(self.lin1.bias)

    def hidden(self, inputs: Inputs) -> torch.Tensor:
        return F.relu(inputs.first_layer(self.lin1))

    def logits(self, inputs: Inputs, h: torch.Tensor) -> torch.Tensor:
        return inputs.prop(self.lin2(h)) + self.bias2


def half_dropout(h: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Dropout with p = 0.5 from random bits (torch's CPU dropout is ~25x slower at this size)."""
    bits = np.unpackbits(np.frombuffer(rng.bytes((h.numel() + 7) // 8), dtype=np.uint8))[: h.numel()]
    return h * torch.from_numpy(bits.reshape(h.shape)).to(h.dtype) * 2.0


def train_once(inputs: Inputs, label, masks, classes: int, seed: int, epochs: int) -> float:
    """Test accuracy at the epoch of best validation accuracy (the first such epoch).

    Each epoch evaluates the current parameters from the same hidden layer the training step
    uses (before its dropout), then takes the step; the parameters after the last step are
    evaluated at the end. So the epochs 0..epochs (initial parameters included) are compared.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = GCN(inputs.dims, 64, classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    train, val, test = masks["train"], masks["val"], masks["test"]
    best_val, best_test = -1.0, 0.0

    def score(logits: torch.Tensor) -> None:
        nonlocal best_val, best_test
        pred = logits.argmax(dim=1)
        acc_val = (pred[val] == label[val]).float().mean().item()
        if acc_val > best_val:
            best_val, best_test = acc_val, (pred[test] == label[test]).float().mean().item()

    for _ in range(epochs):
        opt.zero_grad()
        h = model.hidden(inputs)
        with torch.no_grad():
            score(model.logits(inputs, h))
        loss = F.cross_entropy(model.logits(inputs, half_dropout(h, rng))[train], label[train])
        loss.backward()
        opt.step()
    with torch.no_grad():
        score(model.logits(inputs, model.hidden(inputs)))
    return best_test


# ----------------------------------------------------------------------------- runs


def variants(binary: bool, heavy: bool) -> list[tuple[str, str, str]]:
    """(feature encoding, transform, edge-weight encoding) rows to train, fp32 first."""
    rows = [("fp32", "none", "fp32"), ("int8", "none", "fp32")]
    if binary:  # 0/1 features: every encoding is exact
        rows += [("int4", "none", "fp32"), ("binary", "none", "fp32"), ("binary", "none", "int8")]
    rows += [("int8", "none", "int8"), ("int4", "none", "int8")]
    if heavy:
        rows += [("int8", "asinh", "int8"), ("int4", "asinh", "int8")]
    return rows


def run_dataset(name: str, work: Path, seeds: int, epochs: int, fpr_queries: int) -> list[dict]:
    t0 = time.perf_counter()
    canonical, adj, parts = prepare(name, work)
    x32 = np.load(CanonicalGraph.open(canonical).features_path)
    label, masks = labels_and_masks(canonical)
    classes = int(label.max()) + 1
    csr = load_csr(adj, mmap=False)
    n, d = x32.shape
    nnz = csr.nnz

    # The compressed graph, built by the stage's library function once per feature encoding
    # (auto first, which also measures the other encodings); the model reads decoded files.
    first = build_compressed_graph(
        canonical, adj, parts, work / name / "compressed-auto", CompressConfig(fpr_queries=fpr_queries)
    )
    rows_to_train = variants(first["features"]["binary_valued"], name == "heavy")
    built = {(first["feature_encoding"], "none"): (work / name / "compressed-auto", first)}
    for enc, transform, _ in rows_to_train:
        if enc != "fp32" and (enc, transform) not in built:
            out = work / name / f"compressed-{enc}-{transform}"
            built[enc, transform] = (
                out,
                build_compressed_graph(
                    canonical,
                    adj,
                    parts,
                    out,
                    CompressConfig(
                        feature_encoding=enc,
                        feature_transform=transform,
                        fpr_queries=fpr_queries,
                        compare_encodings=False,
                    ),
                ),
            )
    q, qscale = load_weights(work / name / "compressed-auto")
    w8 = dequantize_int8_rows_csr(np.asarray(csr.indptr), np.asarray(q), np.asarray(qscale))
    props = {
        "fp32": SparseOperand(csr.indptr, csr.indices, csr.weights, (n, n)),
        "int8": SparseOperand(csr.indptr, csr.indices, w8, (n, n)),
    }
    bloom = first["bloom"]
    print(
        f"# {name}: n={n} d={d} nnz={nnz} parts={bloom['parts']}; Bloom {bloom['bits_per_edge']:.2f} bits/edge, "
        f"measured FPR {bloom['measured_fpr']:.4f} (target {bloom['target_fpr']}); "
        f"weights int8 rel RMS {first['weights']['rel_rms_error']:.4f}; ready in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )

    fp32_bytes = 4 * n * d + 4 * nnz  # features + weights
    originals = fp32_bytes + bloom["bytes_before"]  # + edge sets as int64 pairs
    weight_bytes = {"fp32": 4 * nnz, "int8": nnz + 4 * n}
    rows, ref = [], None
    for enc, transform, wenc in rows_to_train:
        if enc == "fp32":
            x, err = x32, 0.0
        else:
            stored = built[enc, transform]
            x, err = load_features(stored[0]).decode(), stored[1]["features"]["rel_rms_error"]
        t = time.perf_counter()
        inputs = Inputs(props[wenc], x)
        accs = [train_once(inputs, label, masks, classes, seed, epochs) for seed in range(seeds)]
        nbytes = encoding_nbytes(enc, n, d) + weight_bytes[wenc]
        asset = nbytes + (bloom["bytes_after"] if enc != "fp32" else bloom["bytes_before"])
        mean = 100 * statistics.mean(accs)
        ref = mean if ref is None else ref
        rows.append(
            {
                "dataset": name,
                "features": enc + ("+asinh" if transform == "asinh" else ""),
                "weights": wenc,
                "bytes": nbytes,
                "saving": 1 - nbytes / fp32_bytes,
                "asset_ratio": originals / asset,
                "rel_rms": err,
                "exact": bool(np.array_equal(x, x32)),
                "mean": mean,
                "std": 100 * statistics.pstdev(accs) if seeds > 1 else 0.0,
                "drop": round(ref - mean, 6) or 0.0,
                "accs": accs,  # `or 0.0`: print -0.00 as +0.00
            }
        )
        print(f"#   {rows[-1]['features']:11} w={wenc:4} {mean:6.2f} ({time.perf_counter() - t:.0f} s)", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'dataset':9} {'features':11} {'weights':7} {'feat+w bytes':>12} {'saving':>7} {'asset saving':>15} "
        f"{'feat relRMS':>11} {'test acc %':>13} {'drop pts':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        note = ""
        if r["features"] != "fp32" and r["exact"]:
            note = "  exact features" + (", identical accuracies" if r["accs"] == _reference(rows, r)["accs"] else "")
        asset = f"{100 * (1 - 1 / r['asset_ratio']):5.1f}% ({r['asset_ratio']:5.2f}x)"
        print(
            f"{r['dataset']:9} {r['features']:11} {r['weights']:7} {r['bytes']:>12,} {100 * r['saving']:6.1f}% "
            f"{asset:>15} {r['rel_rms']:11.4f} {r['mean']:7.2f} ±{r['std']:4.2f} {r['drop']:+8.2f}{note}"
        )


def print_verdicts(rows: list[dict], bound: float = 0.5) -> None:
    """Per dataset: the INT8 asset's drop, and the smallest asset whose drop is within `bound`."""
    print(f"\ntargets: INT8 drop <= {bound} points; >= 80% smaller with the best option within that bound")
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        int8 = next(r for r in mine if r["features"] == "int8" and r["weights"] == "int8")
        ok = [r for r in mine if r["features"] != "fp32" and r["drop"] <= bound]
        best = max(ok, key=lambda r: r["asset_ratio"]) if ok else None
        line = f"{name:9} int8+w8 drop {int8['drop']:+.2f} ({'ok' if int8['drop'] <= bound else 'MISSED'})"
        if best:
            saving = 1 - 1 / best["asset_ratio"]
            line += (
                f"; best within bound: {best['features']} + w{best['weights'][-1]} -> asset {100 * saving:.1f}% "
                f"smaller ({best['asset_ratio']:.2f}x), features+weights {100 * best['saving']:.1f}% smaller, "
                f"drop {best['drop']:+.2f} ({'ok' if saving >= 0.8 else 'MISSED'})"
            )
        print(line)


def _reference(rows: list[dict], r: dict) -> dict:
    return next(x for x in rows if x["dataset"] == r["dataset"] and x["features"] == "fp32" and x["weights"] == "fp32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--datasets",
        nargs="+",
        default=["demo", "heavy", "cora", "citeseer"],
        choices=["demo", "heavy", "cora", "citeseer"],
    )
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--fpr-queries", type=int, default=1_000_000)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; 1 by default: on a shared 2-core machine more threads run slower",
    )
    ap.add_argument("--work", type=Path, default=Path("bench_out/compression"))
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    t0 = time.perf_counter()
    for name in args.datasets:
        if name in ("cora", "citeseer") and not (DATASETS / name).is_dir():
            print(f"# {name}: skipped, {DATASETS / name} not found", file=sys.stderr)
            continue
        rows += run_dataset(name, work, args.seeds, args.epochs, args.fpr_queries)
    print()
    print(
        f"GCN 2x64, {args.epochs} epochs, {args.seeds} seeds; test accuracy at the best validation epoch. "
        "saving: features + edge weights vs FP32; asset saving: the whole compressed_graph (features + weights "
        "+ Bloom edge sets) vs FP32 / int64 (src, dst) originals."
    )
    print_table(rows)
    print_verdicts(rows)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    records = []
    for r in rows:
        if r["features"] == "int8" and r["weights"] == "int8":
            ref = _reference(rows, r)
            records.append(
                harness.Record(
                    benchmark="compression",
                    stage=f"{r['dataset']}: GCN on the INT8 compressed graph",
                    metric=f"test accuracy % (mean of {args.seeds} seeds)",
                    ours=r["mean"],
                    peer=ref["mean"],
                    peer_name="the same GCN on FP32",
                    notes=f"drop {r['drop']:+.2f} points (target <= 0.5); asset {r['asset_ratio']:.2f}x smaller",
                )
            )
    harness.emit(args.record, records)


if __name__ == "__main__":
    main()

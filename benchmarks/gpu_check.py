"""GPU readiness check: `python -m training` from small CPU-made shards, fp16 and bf16, no DGL.

    .venv/bin/python benchmarks/gpu_check.py --make bench_out/gpu_check        # on CPU (needs DGL)
    python benchmarks/gpu_check.py --data bench_out/gpu_check --device cuda      # on the GPU machine
    .venv/bin/python benchmarks/gpu_check.py --device cpu                        # CI: make, then run

`--make` generates a small labelled graph and writes its canonical graph, normalized adjacency,
METIS parts, compressed graph and two sets of minibatch shards (together well under 50 MB, so
the folder can be carried to a GPU machine; the manifests name their inputs by relative path):
the defaults (FP32 features, no weight per edge: Â's factors) and INT8 (compressed_graph's INT8
feature codes, INT8 edge weights). The check then runs `python -m training` once per entry of
`RUNS`, in a child interpreter where `import dgl` fails (DGL is also absent on a GPU machine:
training must not need it):
  fp16       SAGE, `mixed_float16` (fp16 autocast with GradScaler on CUDA, bf16 autocast on CPU)
  bf16       GCN, `bf16`: Â's weights recomputed from its factors on the device
  int8_fp16  GCN, `mixed_float16`, on the INT8 shards: features and weights decoded on the device
  int8_tiers SAGE, `mixed_float16`, on the INT8 shards through the feature cache: the 20 % of
             highest-degree rows (codes) on the device, 10 % more in CPU memory; the host reads,
             pins and copies only the rest, the device puts them beside the hot rows and decodes
and reads each run's metrics.parquet and summary.json:
  loss_falls    the last epoch's mean training loss is below the first epoch's
  step_ms       training seconds per optimizer step (mean over the epochs after the first)
  peak_mem_mb   device memory (torch.cuda.max_memory_allocated) on CUDA, peak RSS on CPU
  overlap       1 - data_wait_share: the share of training time the loop was not waiting for
                the next minibatch (shard read, decode and host-to-device copy run in the
                stream's background thread; 1.0 = fully overlapped with compute)
and, on CUDA, ``copy_overlap`` (`copy_overlap`): one epoch of the default shards read by a
`training.data.ShardStream` with a fixed compute per minibatch (20 matmuls of its features),
minibatches copied one ahead on a side stream (the training default) against the same copies
on the compute stream, alternating, 3 passes each (median seconds), beside the copies alone and
the compute alone; ``copy_hidden_s`` is how much of the copying the side stream hid behind
compute (compute-stream seconds minus side-stream seconds).
It prints one JSON line and exits non-zero when a run failed or its loss did not fall.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"fp16": "mixed_float16", "bf16": "bf16"}
SHARDS = {"default": "minibatch_shards", "int8": "minibatch_shards_int8"}
# run name -> (precision, layer type, shards, training settings besides them)
RUNS = {
    "fp16": ("fp16", "sage", "default", {}),
    "bf16": ("bf16", "gcn", "default", {}),
    "int8_fp16": ("fp16", "gcn", "int8", {}),
    "int8_tiers": ("fp16", "sage", "int8", {"feature_cache": 0.1, "feature_cache_hot": 0.2}),
}
# run `python -m training` with DGL made unimportable (a None entry in sys.modules raises ImportError)
_NO_DGL = "import runpy, sys; sys.modules['dgl'] = None; sys.argv[0] = 'training'; runpy.run_module('training', run_name='__main__', alter_sys=True)"
SHARD_BUDGET_BYTES = 50 * 2**20


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_inputs(data: Path, nodes: int, edges: int, seed: int = 0) -> dict:
    """Generated graph -> canonical -> adjacency -> parts -> compressed -> both shard sets under
    `data` (on CPU, with DGL)."""
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.compress import CompressConfig, build_compressed_graph
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    cfg = GenerateConfig(num_nodes=nodes, num_edges=edges, feature_dim=32, num_classes=4, num_edge_files=1, seed=seed)
    generate_dataset(cfg, data / "landing", progress=False)
    can, adj, parts, compressed = (
        data / name for name in ("canonical_graph", "normalized_adjacency", "metis_partitions", "compressed_graph")
    )
    build_canonical_graph(data / "landing", can)
    build_normalized_adjacency(can, adj)
    build_partitions(can, parts, PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(
        can, adj, parts, compressed, CompressConfig(feature_encoding="int8", compare_encodings=False)
    )
    inputs = load_shard_inputs(can, adj, parts, compressed)
    shard_cfg = {"fanouts": "10,5", "batch_size": 128, "epochs": 2, "world_size": 1}
    write_minibatch_shards(inputs, data / SHARDS["default"], ShardConfig(**shard_cfg))
    int8 = ShardConfig(**shard_cfg, feature_encoding="compressed", weight_encoding="int8")
    write_minibatch_shards(inputs, data / SHARDS["int8"], int8)
    size = sum(folder_bytes(p) for p in data.iterdir() if p.is_dir() and p.name != "landing")  # what is carried
    if size > SHARD_BUDGET_BYTES:
        raise SystemExit(f"{data}: {size / 2**20:.1f} MB of inputs, over the 50 MB budget")
    shards = sum(folder_bytes(data / folder) for folder in SHARDS.values())
    return {"shard_mb": shards / 2**20, "input_mb": size / 2**20}


def run_one(data: Path, name: str, device: str, epochs: int, out_root: Path) -> dict:
    """One `python -m training` run of `RUNS[name]` without DGL; its figures."""
    import pyarrow.parquet as pq
    import yaml

    from training.outputs import METRICS, SUMMARY

    precision, conv, shards, settings = RUNS[name]
    out = out_root / f"trained-{name}"
    config = {
        "model": {"conv": conv, "hidden": 64, "num_layers": 2, "dropout": 0.1},
        "training": {
            "epochs": epochs,
            "precision": PRECISIONS[precision],
            "device": device,
            "profiler": "none",
            "optimizer": {"lr": 0.01},
            **settings,
        },
        "paths": {
            "shards": str(data / SHARDS[shards]),
            "canonical": str(data / "canonical_graph"),
            "adjacency": str(data / "normalized_adjacency"),
            "out": str(out),
            "work": str(out_root / f".work-{name}"),
        },
    }
    run_yaml = out_root / f"run-{name}.yaml"
    run_yaml.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _NO_DGL, "--config", str(run_yaml)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:], "wall_s": wall}
    rows = pq.read_table(out / METRICS).to_pandas()
    rows = rows[rows["rank"] == 0].sort_values("epoch")
    summary = json.loads((out / SUMMARY).read_text())
    later = rows.iloc[1:] if len(rows) > 1 else rows  # the first epoch carries warm-up (CUDA context, kernels)
    losses = [float(v) for v in rows["loss"]]
    return {
        "ok": True,
        "precision": PRECISIONS[precision],
        "conv": conv,
        "shards": SHARDS[shards],
        "losses": [round(v, 4) for v in losses],
        "loss_falls": bool(losses[-1] < losses[0]),
        "step_ms": float((later["train_seconds"] / later["steps"]).mean() * 1000),
        "peak_mem_mb": float(rows["peak_memory_mb"].max()),
        "overlap": float(1.0 - later["data_wait_share"].mean()),
        "test_acc": float(summary["test_acc_at_best_val"]),
        "wall_s": wall,
    } | {k: summary[k] for k in ("feature_cache_hit_rate", "feature_cache_hot_hit_rate") if k in summary}


class OnComputeStream:
    """`training.copy_streams.CudaCopies`'s methods with every copy on the compute stream."""

    def side(self):
        return contextlib.nullcontext()

    def record(self):
        return None

    def wait(self, event) -> None:
        pass

    def keep(self, tensor) -> None:
        pass


def copy_overlap(data: Path, device, side=None, passes: int = 3) -> dict:
    """Median seconds of one epoch of the default shards (module docstring) with `side` (default
    `CudaCopies`) and with `OnComputeStream`, alternating, beside the copies and the compute alone."""
    import statistics

    import torch

    from training.copy_streams import CudaCopies
    from training.data import ShardStream

    device = torch.device(device)
    side = side if side is not None else CudaCopies(device)
    weight = torch.randn(32, 32, device=device) / 32**0.5

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def compute(mb):
        h = mb.x
        for _ in range(20):
            h = torch.tanh(h @ weight)
        return h

    def epoch(copies, work=True) -> float:
        sync()
        t = time.perf_counter()
        with ShardStream(data / SHARDS["default"], 0, 0, device, prefetch=4, copies=copies) as stream:
            for mb in stream:
                if work:
                    compute(mb)
        sync()
        return time.perf_counter() - t

    epoch(side)  # warm-up: kernels, pinned pools, page cache
    times = {"side_stream_s": [], "compute_stream_s": [], "copies_only_s": [], "compute_only_s": []}
    with ShardStream(data / SHARDS["default"], 0, 0, device, prefetch=4, copies=OnComputeStream()) as stream:
        resident = list(stream)
    for _ in range(passes):
        times["side_stream_s"].append(epoch(side))
        times["compute_stream_s"].append(epoch(OnComputeStream()))
        times["copies_only_s"].append(epoch(side, work=False))
        sync()
        t = time.perf_counter()
        for mb in resident:
            compute(mb)
        sync()
        times["compute_only_s"].append(time.perf_counter() - t)
    out = {k: round(statistics.median(v), 4) for k, v in times.items()}
    out["copy_hidden_s"] = round(out["compute_stream_s"] - out["side_stream_s"], 4)
    return {"minibatches": len(resident), **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("bench_out/gpu_check"), help="folder of the CPU-made inputs")
    ap.add_argument("--make", type=Path, help="make the inputs in this folder (CPU, needs DGL), then exit")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--nodes", type=int, default=3000)
    ap.add_argument("--edges", type=int, default=30000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--out", type=Path, help="where the runs write (default: <data>/runs-<device>)")
    args = ap.parse_args()

    if args.make is not None:
        print(json.dumps({"made": str(args.make), **make_inputs(args.make.resolve(), args.nodes, args.edges)}))
        return 0
    data = args.data.resolve()
    made = None
    if not all((data / folder / "manifest.json").is_file() for folder in SHARDS.values()):
        if args.device == "cuda":
            raise SystemExit(
                f"{data}: no {' / '.join(SHARDS.values())} manifests; make the inputs on CPU with --make {data}"
            )
        made = make_inputs(data, args.nodes, args.edges)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False (use --device cpu)")
    out_root = (args.out or data / f"runs-{args.device}").resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    runs = {name: run_one(data, name, args.device, args.epochs, out_root) for name in RUNS}
    result = {
        "check": "gpu_check",
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dgl_importable_in_runs": False,
        "shard_mb": round(sum(folder_bytes(data / folder) for folder in SHARDS.values()) / 2**20, 2),
        "made_inputs": made is not None,
        "runs": runs,
        "copy_overlap": copy_overlap(data, "cuda") if args.device == "cuda" else "CUDA only: the CPU copies nothing",
        "passed": all(r["ok"] and r["loss_falls"] for r in runs.values()),
    }
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

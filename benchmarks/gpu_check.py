"""GPU readiness check: `python -m training` from small CPU-made shards, fp16 and bf16, no DGL.

    .venv/bin/python benchmarks/gpu_check.py --make bench_out/gpu_check        # on CPU (needs DGL)
    python benchmarks/gpu_check.py --data bench_out/gpu_check --device cuda      # on the GPU machine
    .venv/bin/python benchmarks/gpu_check.py --device cpu                        # CI: make, then run

`--make` generates a small labelled graph and writes its canonical graph, normalized adjacency
and minibatch shards (well under 50 MB, so the folder can be carried to a GPU machine; the
manifest names its inputs by relative path). The check then runs `python -m training` once per
precision, fp16 (`mixed_float16`: fp16 autocast with GradScaler on CUDA, bf16 autocast on CPU)
and `bf16`, in a child interpreter where `import dgl` fails (DGL is also absent on a GPU
machine: training must not need it), and reads the run's metrics.parquet and summary.json:
  loss_falls    the last epoch's mean training loss is below the first epoch's
  step_ms       training seconds per optimizer step (mean over the epochs after the first)
  peak_mem_mb   device memory (torch.cuda.max_memory_allocated) on CUDA, peak RSS on CPU
  overlap       1 - data_wait_share: the share of training time the loop was not waiting for
                the next minibatch (shard read, decode and host-to-device copy run in the
                stream's background thread; 1.0 = fully overlapped with compute)
It prints one JSON line and exits non-zero when a run failed or its loss did not fall.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"fp16": "mixed_float16", "bf16": "bf16"}
# run `python -m training` with DGL made unimportable (a None entry in sys.modules raises ImportError)
_NO_DGL = "import runpy, sys; sys.modules['dgl'] = None; sys.argv[0] = 'training'; runpy.run_module('training', run_name='__main__', alter_sys=True)"
SHARD_BUDGET_BYTES = 50 * 2**20


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_inputs(data: Path, nodes: int, edges: int, seed: int = 0) -> dict:
    """Generated graph -> canonical -> adjacency -> shards under `data` (on CPU, with DGL)."""
    from graphs.canonical import build_canonical_graph
    from graphs.generate import GenerateConfig, generate_dataset
    from graphs.normalize import build_normalized_adjacency
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards

    cfg = GenerateConfig(num_nodes=nodes, num_edges=edges, feature_dim=32, num_classes=4, num_edge_files=1, seed=seed)
    generate_dataset(cfg, data / "landing", progress=False)
    build_canonical_graph(data / "landing", data / "canonical_graph")
    build_normalized_adjacency(data / "canonical_graph", data / "normalized_adjacency")
    shard_cfg = ShardConfig(fanouts="10,5", batch_size=128, epochs=2, world_size=1)
    write_minibatch_shards(
        load_shard_inputs(data / "canonical_graph", data / "normalized_adjacency"), data / "minibatch_shards", shard_cfg
    )
    size = folder_bytes(data / "minibatch_shards")
    if size > SHARD_BUDGET_BYTES:
        raise SystemExit(f"{data / 'minibatch_shards'}: {size / 2**20:.1f} MB of shards, over the 50 MB budget")
    return {"shard_mb": size / 2**20}


def run_one(data: Path, precision: str, device: str, epochs: int, out_root: Path) -> dict:
    """One `python -m training` run without DGL; its figures."""
    import pyarrow.parquet as pq
    import yaml

    out = out_root / f"trained-{precision}"
    config = {
        "model": {"conv": "sage", "hidden": 64, "num_layers": 2, "dropout": 0.1},
        "training": {
            "epochs": epochs,
            "precision": PRECISIONS[precision],
            "device": device,
            "profiler": "none",
            "optimizer": {"lr": 0.01},
        },
        "paths": {
            "shards": str(data / "minibatch_shards"),
            "canonical": str(data / "canonical_graph"),
            "adjacency": str(data / "normalized_adjacency"),
            "out": str(out),
            "work": str(out_root / f".work-{precision}"),
        },
    }
    run_yaml = out_root / f"run-{precision}.yaml"
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
    rows = pq.read_table(out / "metrics.parquet").to_pandas()
    rows = rows[rows["rank"] == 0].sort_values("epoch")
    summary = json.loads((out / "summary.json").read_text())
    later = rows.iloc[1:] if len(rows) > 1 else rows  # the first epoch carries warm-up (CUDA context, kernels)
    losses = [float(v) for v in rows["loss"]]
    return {
        "ok": True,
        "precision": PRECISIONS[precision],
        "losses": [round(v, 4) for v in losses],
        "loss_falls": bool(losses[-1] < losses[0]),
        "step_ms": float((later["train_seconds"] / later["steps"]).mean() * 1000),
        "peak_mem_mb": float(rows["peak_memory_mb"].max()),
        "overlap": float(1.0 - later["data_wait_share"].mean()),
        "test_acc": float(summary["test_acc_at_best_val"]),
        "wall_s": wall,
    }


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
    if not (data / "minibatch_shards" / "manifest.json").is_file():
        if args.device == "cuda":
            raise SystemExit(f"{data}: no minibatch_shards/manifest.json; make the inputs on CPU with --make {data}")
        made = make_inputs(data, args.nodes, args.edges)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False (use --device cpu)")
    out_root = (args.out or data / f"runs-{args.device}").resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    runs = {p: run_one(data, p, args.device, args.epochs, out_root) for p in PRECISIONS}
    result = {
        "check": "gpu_check",
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dgl_importable_in_runs": False,
        "shard_mb": round(folder_bytes(data / "minibatch_shards") / 2**20, 2),
        "made_inputs": made is not None,
        "runs": runs,
        "passed": all(r["ok"] and r["loss_falls"] for r in runs.values()),
    }
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

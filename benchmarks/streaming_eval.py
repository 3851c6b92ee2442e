"""Streaming full-graph evaluation (`training.evaluate.StreamingEval`): seconds per layer and memory.

    .venv/bin/python benchmarks/streaming_eval.py --make /tmp/se --nodes 1000000 --edges 10000000 --dim 128
    .venv/bin/python benchmarks/streaming_eval.py --data /tmp/se --chunk-rows 20000 \\
        --code /tmp/se/base_checkout          # optional: a second checkout measured alternately

``--make`` writes a generated dataset (``gnnflow generate``), its canonical graph and its
normalized adjacency (`graphs.stages.canonical`, `graphs.stages.normalize`) under the folder. Then every
variant (this checkout, and each ``--code`` checkout) runs ``StreamingEval.forward`` of a
GraphSAGE model (``--layers`` x ``--hidden``, weights seeded alike) over the canonical FP32
features (read through `training.data.FeatureRows` as training's evaluation does, row
normalization applied) in a fresh child process, ``--repeats`` times, alternating variants.
Each child prints one JSON line: wall and CPU seconds per layer (from the first chunk of a
layer to the first chunk of the next; the first layer's figure starts after the input features
are read), VmHWM, and the largest RssAnon / RssFile seen by a thread reading /proc/self/status
every 20 ms (RssFile: mapped file pages this process touched: they count in its RSS though the
kernel can drop them), both also just before the forward (libraries' pages: torch's alone are
~0.5 GB of RssFile), and a checksum of the logits; the
parent prints the rows and, per variant, the largest difference of its logits from the first
variant's. All input files are read once before the runs (page cache warm, as in a training run
whose rank 0 just read them).

``--chunk-rows`` is ``training.eval_batch_size``. To mirror the 100M run (10M nodes, 200,000
rows per chunk: 50 chunks), use n / 50 rows per chunk at other sizes: the rows gathered per
chunk (its neighbours) are then the same share of the graph.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def make(folder: Path, nodes: int, edges: int, dim: int) -> None:
    sys.path.insert(0, str(HERE))
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.normalize import build_normalized_adjacency

    landing = folder / "landing"
    if not (landing / "nodes.parquet").is_file():
        cmd = [str(HERE / ".venv/bin/gnnflow"), "generate", "--num-nodes", str(nodes), "--num-edges", str(edges)]
        subprocess.run([*cmd, "--feature-dim", str(dim), "--out", str(landing), "--quiet"], check=True)
    t0 = time.perf_counter()
    build_canonical_graph(landing, folder / "canonical_graph")
    t1 = time.perf_counter()
    build_normalized_adjacency(folder / "canonical_graph", folder / "normalized_adjacency")
    print(f"canonical {t1 - t0:.1f} s, adjacency {time.perf_counter() - t1:.1f} s", flush=True)


class _Sampler(threading.Thread):
    """Largest RssAnon / RssFile (bytes) of this process, read every `period` seconds."""

    def __init__(self, period: float = 0.02):
        super().__init__(daemon=True)
        self.period, self.peak, self.stopped = period, {"RssAnon": 0, "RssFile": 0}, threading.Event()

    def read(self) -> None:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                key = line.split(b":")[0].decode()
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], int(line.split()[1]) * 1024)

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            self.read()


def child(args) -> None:
    """One StreamingEval.forward in this (fresh) process; prints one JSON line."""
    code = args.code[-1]
    sys.path.insert(0, code)
    import numpy as np
    import torch

    from graphs.infra.storage import peak_rss_bytes
    from training.data import FeatureRows
    from training.evaluate import StreamingEval
    from training.features import FeatureTransform
    from training.layers import ModelConfig, build_model

    torch.set_num_threads(args.threads)
    data = Path(args.data)
    x = np.load(data / "canonical_graph" / args.features_file, mmap_mode="r")  # named by the parent's code
    n, dim = x.shape
    del x
    manifest = {"features": {"encoding": "fp32", "shape": [n, dim], "path": args.features_file}}
    features = FeatureRows("manifest", manifest, data / "canonical_graph")
    transform = FeatureTransform("row")

    def rows(ids):
        return transform(features.gather_host(ids, decode=True))

    torch.manual_seed(0)
    model = build_model(ModelConfig(conv="sage", hidden=args.hidden, num_layers=args.layers), dim, args.classes)
    starts: dict[int, float] = {}
    cpu_starts: dict[int, float] = {}
    layer = model.layer

    def timed_layer(index, *a, **k):
        if index not in starts:
            starts[index], cpu_starts[index] = time.perf_counter(), time.process_time()
        return layer(index, *a, **k)

    model.layer = timed_layer
    sampler = _Sampler()
    sampler.read()
    before = dict(sampler.peak)  # libraries' pages (torch alone maps ~0.5 GB of them) and the model
    sampler.start()
    work = Path(args.work)
    stream = StreamingEval(data / "normalized_adjacency", rows, args.chunk_rows, work, "cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    _, logits = stream.forward(model)
    t1, c1 = time.perf_counter(), time.process_time()
    sampler.stopped.set()
    sampler.join()
    sampler.read()
    marks = [starts[i] for i in range(args.layers)] + [t1]
    cpu_marks = [cpu_starts[i] for i in range(args.layers)] + [c1]
    np.save(work / "logits_copy.npy", np.asarray(logits[: min(n, 200_000)], dtype=np.float32))
    print(
        json.dumps(
            {
                "code": code,
                "seconds": round(t1 - t0, 2),
                "cpu_seconds": round(c1 - c0, 2),
                "layer_seconds": [round(marks[i + 1] - marks[i], 2) for i in range(args.layers)],
                "layer_cpu_seconds": [round(cpu_marks[i + 1] - cpu_marks[i], 2) for i in range(args.layers)],
                "vmhwm_gb": round(peak_rss_bytes() / 2**30, 3),
                "rss_anon_gb": round(sampler.peak["RssAnon"] / 2**30, 3),
                "rss_file_gb": round(sampler.peak["RssFile"] / 2**30, 3),
                "rss_anon_before_gb": round(before["RssAnon"] / 2**30, 3),
                "rss_file_before_gb": round(before["RssFile"] / 2**30, 3),
                "logits_sum": float(np.asarray(logits, dtype=np.float64).sum()),
            }
        ),
        flush=True,
    )


def warm(data: Path, features_file: str) -> None:
    """Read every input file once (page cache warm for every variant alike)."""
    for path in [data / "canonical_graph" / features_file, *sorted((data / "normalized_adjacency").glob("*.npy"))]:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--make", help="write the dataset, canonical graph and adjacency into this folder, then stop")
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--data", help="a folder written by --make")
    p.add_argument("--code", action="append", default=[], help="another checkout to measure alternately")
    p.add_argument("--chunk-rows", type=int, default=20_000, help="training.eval_batch_size")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the child")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--features-file", help=argparse.SUPPRESS)  # the canonical features' name, as this checkout has it
    args = p.parse_args(argv)
    if args.make:
        make(Path(args.make), args.nodes, args.edges, args.dim)
        return
    if args.child:
        child(args)
        return
    import numpy as np

    sys.path.insert(0, str(HERE))
    from graphs.stages.canonical import CanonicalGraph

    data = Path(args.data)
    warm(data, CanonicalGraph.FEATURES)
    codes = [str(HERE), *[str(Path(c).resolve()) for c in args.code]]
    first = None
    for r in range(args.repeats):
        for code in codes:
            work = data / "work"  # one at a time: a layer file is n x hidden x 4 bytes
            cmd = [sys.executable, __file__, "--child", "--data", str(data), "--work", str(work), "--code", code]
            cmd += ["--features-file", CanonicalGraph.FEATURES]
            for name in ("chunk_rows", "layers", "hidden", "classes", "threads"):
                cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            env = {**os.environ, "PYTHONPATH": code}
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            row = json.loads(out.strip().splitlines()[-1])
            logits = np.load(work / "logits_copy.npy")
            first = logits if first is None else first
            row["max_abs_diff_vs_first"] = float(np.abs(logits - first).max())
            shutil.rmtree(work)
            print(json.dumps({"repeat": r, **row}), flush=True)


if __name__ == "__main__":
    main()

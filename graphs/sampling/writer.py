"""Writes every epoch's sampled minibatches as shard files plus manifest.json, in the format
of `graphs.shard_format` (`write_minibatch_shards`)."""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from graphs.npzio import write_npz
from graphs.progress import Progress
from graphs.sampling.config import ShardConfig, resolve_batch_size
from graphs.sampling.inputs import ShardInputs
from graphs.sampling.samplers import (
    MinibatchSampler,
    SampledMinibatch,
)
from graphs.sampling.schedule import remote_rows
from graphs.shard_format import (
    FORMAT_VERSION,
    encode_shard,
    features_entry,
    shard_relpath,
    upstream_hashes,
    write_manifest,
)
from graphs.storage import atomic_output_dir, file_sha256, peak_rss_bytes

# ----------------------------------------------------------------------------- shard files


class _ShardWriter:
    """Writes shard files in a background thread (`graphs.npzio.write_npz`: CRC-32 and
    SHA-256 computed while streaming, no in-memory copy), overlapping the sampling."""

    def __init__(self, root: Path):
        self.root = root
        self.records: dict[str, dict] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self._thread.start()

    def submit(self, relpath: str, arrays: dict[str, np.ndarray], minibatches: int) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((relpath, arrays, minibatches))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue
            relpath, arrays, minibatches = item
            try:
                path = self.root / relpath
                path.parent.mkdir(parents=True, exist_ok=True)
                size, digest = write_npz(path, arrays)
                self.records[relpath] = {"path": relpath, "bytes": size, "sha256": digest, "minibatches": minibatches}
            except BaseException as exc:  # re-raised in the sampling thread
                self._error = exc

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def write_minibatch_shards(
    inputs: ShardInputs,
    out_dir: str | os.PathLike,
    cfg: ShardConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Sample every epoch for every rank and write the shards + manifest.json atomically.

    Returns the manifest (also written as manifest.json). A previous materialization in
    `out_dir` is replaced as a whole, only once everything is written.
    """
    cfg = resolve_batch_size(cfg or ShardConfig(), len(inputs.train_nodes))
    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    final = Path(out_dir).resolve()
    sampler = MinibatchSampler(inputs, cfg, log)
    per_rank = sampler.minibatches_per_rank()
    streams = []
    measure = sampler.rank_of_node is not None  # remote feature rows, per step
    step_shares: list[float] = []
    with atomic_output_dir(final) as tmp:
        shape = (inputs.n, inputs.feature_dim)
        features = features_entry(cfg.feature_encoding, shape, final, inputs.features_path, inputs.compressed_dir)
        writer = _ShardWriter(tmp)
        progress = Progress("sampling", per_rank * cfg.world_size * cfg.epochs, log, unit="minibatches")
        try:
            for epoch in range(cfg.epochs):
                stats = {
                    r: {"epoch": epoch, "rank": r, "minibatches": 0, "seeds": 0, "sampled_edges": 0, "files": []}
                    for r in range(cfg.world_size)
                }
                if measure:
                    for s in stats.values():
                        s["gathered_rows"] = s["remote_rows"] = 0
                pending: dict[int, list[SampledMinibatch]] = {r: [] for r in range(cfg.world_size)}

                def emit(rank: int) -> None:
                    batch = pending[rank]  # noqa: B023 (called only within this iteration)
                    if not batch:
                        return
                    shard = len(stats[rank]["files"])  # noqa: B023 (called only within this iteration)
                    rel = shard_relpath(epoch, rank, shard)  # noqa: B023 (called only within this iteration)
                    arrays = encode_shard(batch, cfg.weight_encoding)
                    writer.submit(rel, arrays, len(batch))
                    stats[rank]["files"].append(rel)  # noqa: B023 (called only within this iteration)
                    pending[rank] = []  # noqa: B023 (called only within this iteration)

                for rank, _, mb in sampler.epoch(epoch):
                    s = stats[rank]
                    s["minibatches"] += 1
                    s["seeds"] += len(mb.seeds)
                    s["sampled_edges"] += mb.num_edges
                    if measure:
                        remote = remote_rows(mb.input_nodes, sampler.rank_of_node, rank)
                        s["gathered_rows"] += len(mb.input_nodes)
                        s["remote_rows"] += remote
                        step_shares.append(remote / max(len(mb.input_nodes), 1))
                    pending[rank].append(mb)
                    if len(pending[rank]) == cfg.minibatches_per_shard:
                        emit(rank)
                    progress.advance()
                for rank in range(cfg.world_size):
                    emit(rank)
                streams.extend(stats.values())
        finally:
            writer.close()
        for s in streams:
            s["files"] = [writer.records[rel] for rel in s["files"]]
            s["bytes"] = sum(f["bytes"] for f in s["files"])
        counts = {s["minibatches"] for s in streams}
        if len(counts) != 1:  # unequal step counts would hang DDP
            raise AssertionError(f"ranks got different minibatch counts {sorted(counts)}")
        seconds = time.perf_counter() - t0
        total_bytes = sum(s["bytes"] for s in streams)
        edges = sum(s["sampled_edges"] for s in streams)
        seeds = sum(s["seeds"] for s in streams)
        manifest = {
            "format_version": FORMAT_VERSION,
            "sampler": cfg.sampler,
            "settings": asdict(cfg),
            "num_layers": cfg.num_layers,
            "shared_block": sampler.shared_block,
            "world_size": cfg.world_size,
            "batch_size": cfg.batch_size,
            "epochs": cfg.epochs,
            "n": inputs.n,
            "num_classes": inputs.num_classes,
            "feature_dim": inputs.feature_dim,
            "train_nodes": int(len(inputs.train_nodes)),
            "weight_encoding": cfg.weight_encoding,
            "self_loops": sampler.add_loops,
            "features": features,
            "minibatches_per_epoch_per_rank": per_rank,
            "streams": streams,
            "sampled_edges": int(edges),
            "seeds": int(seeds),
            "bytes": int(total_bytes),
            "bytes_per_sampled_edge": round(total_bytes / edges, 3) if edges else 0.0,
            "seconds": round(seconds, 3),
            "seeds_per_second": round(seeds / seconds, 1) if seconds > 0 else 0.0,
            "sampled_edges_per_second": round(edges / seconds, 1) if seconds > 0 else 0.0,
            "peak_rss_bytes": peak_rss_bytes(),
            "inputs": {
                name: os.path.relpath(path, final)
                for name, path in (
                    ("canonical_graph", inputs.canonical_dir),
                    ("normalized_adjacency", inputs.adjacency_dir),
                    ("metis_partitions", inputs.partitions_dir),
                    ("compressed_graph", inputs.compressed_dir),
                )
                if path is not None
            },
        }
        manifest["upstream"] = upstream_hashes(
            final,
            {
                name: path
                for name, path in (
                    ("canonical_graph", inputs.canonical_dir),
                    ("normalized_adjacency", inputs.adjacency_dir),
                )
                if path is not None
            },
            features,
        )
        if cfg.sampler == "saint":
            manifest["saint"] = sampler.saint_info
        if sampler.adaptive_info:
            manifest["adaptive"] = sampler.adaptive_info
            if inputs.node_scores_path is not None:
                manifest["adaptive"]["node_scores_sha256"] = file_sha256(inputs.node_scores_path)
        if measure:
            gathered = sum(s["gathered_rows"] for s in streams)
            manifest["placement"] = {
                "mode": cfg.placement,
                "rank_of_part": sampler.rank_of_part.tolist(),
                "remote_row_share_mean": round(float(np.mean(step_shares)), 4) if step_shares else 0.0,
                "remote_row_share_max": round(float(np.max(step_shares)), 4) if step_shares else 0.0,
                "remote_row_share_total": round(sum(s["remote_rows"] for s in streams) / gathered, 4)
                if gathered
                else 0.0,
            }
        if per_rank != counts.pop():
            raise AssertionError(f"planned {per_rank} minibatches per rank, wrote {streams[0]['minibatches']}")
        write_manifest(tmp, manifest)
    return manifest

"""Writes every epoch's sampled minibatches as shard files plus manifest.json, in the format
of `graphs.formats.shard_format` (`write_minibatch_shards`)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.npzio import write_npz
from graphs.formats.partition_files import Partitions
from graphs.formats.shard_codec import encode_shard
from graphs.formats.shard_format import (
    FORMAT_VERSION,
    shard_relpath,
    upstream_hashes,
    write_manifest,
)
from graphs.formats.shard_references import features_entry, weight_factors_entry
from graphs.infra.processes import die_with_parent
from graphs.infra.progress import Progress
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, private_rss_bytes, remember_sha256
from graphs.sampling.base import make_sampler
from graphs.sampling.config import ShardConfig, resolve_batch_size
from graphs.sampling.inputs import ShardInputs
from graphs.sampling.schedule import minibatch_seed
from graphs.stages.normalize import Adjacency

# ----------------------------------------------------------------------------- shard files

# What a shard-writing process works from: set before the worker processes are forked, so
# they inherit the sampler (its graph shared copy-on-write) instead of receiving a copy.
_JOB: dict = {}
_JOB_LOCK = threading.Lock()


def _write_shard(task: tuple[int, int, int, int, int]) -> dict:
    """Sample minibatches ``start..stop`` of (epoch, rank), write them as shard file
    `shard`, and return the file's record with the minibatches' statistics."""
    epoch, rank, shard, start, stop = task
    sampler, cfg, root, measure = _JOB["sampler"], _JOB["cfg"], _JOB["root"], _JOB["measure"]
    before = sampler.counters()
    if _JOB.get("epoch") != epoch:
        _JOB["epoch"], _JOB["schedule"] = epoch, sampler.schedule(epoch)
    items = _JOB["schedule"][rank][start:stop]
    sampler.at_rank(rank)
    batch = [sampler.sample(item, minibatch_seed(cfg.seed, epoch, rank, start + i)) for i, item in enumerate(items)]
    out = {
        "seeds": sum(len(mb.seeds) for mb in batch),
        "sampled_edges": sum(mb.num_edges for mb in batch),
        "step_shares": [],
    }
    if measure:
        gathered = [len(mb.input_nodes) for mb in batch]
        remote = [sampler.remote_rows(mb.input_nodes) for mb in batch]
        out.update(gathered_rows=sum(gathered), remote_rows=sum(remote))
        out["step_shares"] = [r / max(g, 1) for r, g in zip(remote, gathered)]
    rel = shard_relpath(epoch, rank, shard)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    size, digest = write_npz(path, encode_shard(batch, sampler.weight_encoding))
    out["record"] = {"path": rel, "bytes": size, "sha256": digest, "minibatches": len(batch)}
    out["private"] = None
    if _JOB.get("forked"):  # a worker's own memory while the batch is held, on its 1st, 2nd, 4th, ... file
        _JOB["tasks"] = tasks = _JOB["tasks"] + 1
        if tasks & (tasks - 1) == 0:
            out["private"] = (os.getpid(), private_rss_bytes())
    out["counters"] = {key: value - before[key] for key, value in sampler.counters().items()}
    return out


def _worker_init() -> None:
    # A worker dies with the stage's process (killed for memory, or by a user): it would
    # otherwise sample on, and keep the dataset's lock, whose file it inherited, held.
    if not die_with_parent(_JOB["parent"]):  # died before the death signal was set
        os._exit(1)
    # one thread per forked worker: the parallelism is the processes, and a forked child
    # must not reuse its parent's OpenMP pool
    torch.set_num_threads(1)
    _JOB.update(forked=True, tasks=0)


def sampling_workers(requested: int, tasks: int) -> int:
    """Processes for `tasks` shard files: `requested`, or 0 = the CPU cores this process
    may run on; never more than the files, and 1 (no fork) where processes cannot be forked
    or there is at most one file."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(requested or cores, tasks))


def _shard_tasks(sampler, cfg: ShardConfig) -> list[tuple[int, int, int, int, int]]:
    """(epoch, rank, shard, start, stop) of every shard file, in the order of the files."""
    tasks = []
    step = cfg.minibatches_per_shard
    for epoch in range(cfg.epochs):
        for rank, items in enumerate(sampler.schedule(epoch)):
            for shard, start in enumerate(range(0, len(items), step)):
                tasks.append((epoch, rank, shard, start, min(start + step, len(items))))
    return tasks


def _written_shards(tasks: list, workers: int) -> Iterator[dict]:
    """`_write_shard` of every task, in order, in this process (1 worker) or in `workers` forked
    ones. Before the fork, the sampler builds here what it would build on first use (`prepare`:
    its DGL graph, draw probabilities, their manifest facts), so the processes share it. Each
    minibatch is drawn from its own seed by DGL's generator of the forking thread, which a
    forked child inherits, so the files are byte-identical for any number of workers."""
    if workers == 1:
        for task in tasks:
            yield _write_shard(task)
        return
    _JOB["sampler"].prepare()
    _JOB["parent"] = os.getpid()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_init) as pool:
        try:
            for out in pool.map(_write_shard, tasks):
                _JOB["sampler"].add_counters(out["counters"])  # counted in the worker's copy
                yield out
        except BrokenProcessPool as exc:
            pool.shutdown(wait=True, cancel_futures=True)
            raise RuntimeError(
                f"a shard-writing worker process died ({exc}); if it was killed for memory, set "
                "minibatch_shards' workers to fewer processes (1 samples in the stage's own process)"
            ) from exc
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _gather(tasks: list, workers: int, stats: dict, step_shares: list, private: dict, progress: Progress) -> None:
    """Write every shard file (`_written_shards`) and add each one's record and statistics to
    its stream's entry in `stats`."""
    for (epoch, rank, *_), out in zip(tasks, _written_shards(tasks, workers)):
        s = stats[epoch, rank]
        s["files"].append(out["record"])
        remember_sha256(_JOB["root"] / out["record"]["path"], out["record"]["sha256"])  # not hashed again to publish
        s["minibatches"] += out["record"]["minibatches"]
        for key in ("seeds", "sampled_edges", "gathered_rows", "remote_rows"):
            if key in s:
                s[key] += out[key]
        step_shares.extend(out["step_shares"])
        pid, held = out["private"] or (None, None)
        if held is not None:
            private[pid] = max(private.get(pid, 0), held)
        progress.advance(out["record"]["minibatches"])


def write_minibatch_shards(
    inputs: ShardInputs,
    out_dir: str | os.PathLike,
    cfg: ShardConfig | None = None,
    log: Callable[[str], None] | None = None,
    sampler=None,
) -> dict:
    """Sample every epoch for every rank and write the shards + manifest.json atomically.

    Returns the manifest (also written as manifest.json). A previous materialization in
    `out_dir` is replaced as a whole, only once everything is written. `sampler` replaces
    the registered node-classification sampler ``cfg.sampler`` (link prediction passes its
    `graphs.sampling.link.LinkSampler`, configured with a resolved batch size); its
    ``manifest_facts()`` are added to the manifest. Shard files are sampled and written by
    ``cfg.workers`` forked processes (`sampling_workers`).
    """
    cfg = resolve_batch_size(cfg or ShardConfig(), len(inputs.train_nodes))
    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    final = Path(out_dir).resolve()
    sampler = sampler if sampler is not None else make_sampler(inputs, cfg, log)
    per_rank = sampler.minibatches_per_rank()
    measure = sampler.rank_of_node is not None  # remote feature rows, per step
    step_shares: list[float] = []
    private: dict[int, int] = {}  # worker pid -> the most memory of its own it was seen holding
    with atomic_output_dir(final) as tmp:
        shape = (inputs.n, inputs.feature_dim)
        features = features_entry(cfg.feature_encoding, shape, final, inputs.features_path, inputs.compressed_dir)
        tasks = _shard_tasks(sampler, cfg)
        workers = sampling_workers(cfg.workers, len(tasks))
        log(f"sampling {len(tasks)} shard files with {workers} process(es)")
        stats = _empty_stream_stats(cfg, measure)
        progress = Progress("sampling", per_rank * cfg.world_size * cfg.epochs, log, unit="minibatches")
        with _JOB_LOCK:  # one job at a time per process: the workers read _JOB
            _JOB.update(sampler=sampler, cfg=cfg, root=tmp, measure=measure)
            try:
                _gather(tasks, workers, stats, step_shares, private, progress)
            finally:
                _JOB.clear()
        streams, written = _finished_streams(stats)
        seconds = time.perf_counter() - t0
        manifest = _manifest(inputs, cfg, sampler, features, per_rank, streams, seconds)
        # run statistics (`graphs.infra.storage.is_run_statistic`): the files are the same for any number
        manifest |= _process_facts(workers, private)
        manifest["inputs"] = {name: os.path.relpath(path, final) for name, path in _input_dirs(inputs)}
        _add_upstream_facts(manifest, inputs, sampler, final, features)
        if measure:
            manifest["placement"] = _placement_facts(cfg, sampler, streams, step_shares)
        if inputs.rank_shares is not None:
            manifest["rebalance"] = {"shares": [float(s) for s in inputs.rank_shares]}
        manifest.update(sampler.manifest_facts())
        if per_rank != written:
            raise AssertionError(f"planned {per_rank} minibatches per rank, wrote {streams[0]['minibatches']}")
        write_manifest(tmp, manifest)
    return manifest


def _empty_stream_stats(cfg: ShardConfig, measure: bool) -> dict[tuple[int, int], dict]:
    """Zeroed statistics of each (epoch, rank) stream, with the remote-row counters when measured."""
    stats = {
        (e, r): {"epoch": e, "rank": r, "minibatches": 0, "seeds": 0, "sampled_edges": 0, "files": []}
        for e in range(cfg.epochs)
        for r in range(cfg.world_size)
    }
    if measure:
        for s in stats.values():
            s["gathered_rows"] = s["remote_rows"] = 0
    return stats


def _finished_streams(stats: dict[tuple[int, int], dict]) -> tuple[list[dict], int]:
    """The streams with their byte totals, and the minibatch count every stream has."""
    streams = list(stats.values())
    for s in streams:
        s["bytes"] = sum(f["bytes"] for f in s["files"])
    counts = {s["minibatches"] for s in streams}
    if len(counts) != 1:  # unequal step counts would hang DDP
        raise AssertionError(f"ranks got different minibatch counts {sorted(counts)}")
    return streams, counts.pop()


def _manifest(inputs: ShardInputs, cfg: ShardConfig, sampler, features: dict, per_rank: int, streams, seconds) -> dict:
    """The manifest's settings, graph facts, streams, totals and rates."""
    total_bytes = sum(s["bytes"] for s in streams)
    edges = sum(s["sampled_edges"] for s in streams)
    seeds = sum(s["seeds"] for s in streams)
    return {
        "format_version": FORMAT_VERSION,
        "sampler": cfg.sampler,
        "settings": {k: v for k, v in asdict(cfg).items() if k != "workers"},  # workers change no byte
        "num_layers": cfg.num_layers,
        "shared_block": sampler.shared_block,
        "non_uniform_draws": type(sampler).non_uniform_draws(cfg),
        "world_size": cfg.world_size,
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "n": inputs.n,
        "num_classes": inputs.num_classes,
        "feature_dim": inputs.feature_dim,
        "train_nodes": int(len(inputs.train_nodes)),
        "weight_encoding": sampler.weight_encoding,
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
        **({"typed": inputs.typed.to_json()} if inputs.typed is not None else {}),
    }


def _process_facts(workers: int, private: dict[int, int]) -> dict:
    """The stage's memory and sampling processes."""
    return {
        # the stage's memory: this process's peak plus what its forked workers held of their own
        "peak_rss_bytes": peak_rss_bytes() + sum(private.values()),
        "sampling_processes": workers,
        # what the forked workers held beside this process's pages, which they share (summed
        # over the workers, each at the most seen: sampled on its 1st, 2nd, 4th, ... file)
        "workers_private_rss_bytes": sum(private.values()),
    }


def _input_dirs(inputs: ShardInputs) -> list[tuple[str, Path]]:
    """(asset name, folder) of each upstream stage the shards were sampled from."""
    return [
        (name, path)
        for name, path in (
            (CanonicalGraph.STAGE, inputs.canonical_dir),
            (Adjacency.STAGE, inputs.adjacency_dir),
            (Partitions.STAGE, inputs.partitions_dir),
            (CompressedGraph.STAGE, inputs.compressed_dir),
        )
        if path is not None
    ]


def _add_upstream_facts(manifest: dict, inputs: ShardInputs, sampler, final: Path, features) -> None:
    """Add the weight factors and upstream hashes to `manifest`."""
    if sampler.weight_encoding == "factors":
        factors = inputs.scale_factors
        manifest["weight_factors"] = weight_factors_entry(final, factors.row_path, factors.col_path)
    hashed = (CanonicalGraph.STAGE, Adjacency.STAGE)
    manifest["upstream"] = upstream_hashes(
        final, {name: path for name, path in _input_dirs(inputs) if name in hashed}, features
    )


def _placement_facts(cfg: ShardConfig, sampler, streams: list[dict], step_shares: list[float]) -> dict:
    """The placement of partitions on ranks and the share of feature rows gathered from other ranks."""
    gathered = sum(s["gathered_rows"] for s in streams)
    return {
        "mode": cfg.placement,
        "rank_of_part": sampler.rank_of_part.tolist(),
        "replicated_rows": int(sampler.replicated.sum()) if sampler.replicated is not None else 0,
        "remote_row_share_mean": round(float(np.mean(step_shares)), 4) if step_shares else 0.0,
        "remote_row_share_max": round(float(np.max(step_shares)), 4) if step_shares else 0.0,
        "remote_row_share_total": round(sum(s["remote_rows"] for s in streams) / gathered, 4) if gathered else 0.0,
        **({"own_edges": sampler.rank_edges.facts} if sampler.rank_edges is not None else {}),
    }

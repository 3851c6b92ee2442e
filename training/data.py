"""Reading minibatch shards: one rank's stream of sampled blocks, with features, prefetched.

The minibatch_shards asset (`graphs.sampling`, where the file layout is documented) writes,
for every epoch and DDP rank, a list of ``.npz`` shard files plus ``manifest.json``. This
module turns one (epoch, rank) stream back into :class:`MiniBatch` objects: plain torch
:class:`~training.blocks.Block` s (CSC over the destination nodes), the input nodes'
features, the loss nodes and their labels. Nothing here imports DGL, so training runs
where DGL is not installed (e.g. a GPU machine; DGL's PyPI wheel is CPU-only).

Usage, on each rank::

    manifest = read_manifest(asset_dir)        # world size, batch size, epochs, classes ...
    for epoch in range(num_epochs):
        stream = ShardStream(asset_dir, rank, epoch % manifest["epochs"], device)
        with stream:
            for mb in stream:
                logits = model(mb.blocks, mb.x)            # [num_dst of the last block, C]
                loss = cross_entropy(mb, logits)
                ...
        stream.wait_seconds                                # time the loop waited for data

What happens per minibatch. A background thread (bounded queue of ``prefetch``
minibatches) reads each shard file once, checks its size and SHA-256 against the manifest
(a missing, truncated or corrupt file raises :class:`ShardError` naming the file), parses
it without pickle (`graphs.npzio.read_npz`: the arrays are views into the buffer that was
just hashed, sparing ``np.load``'s second copy and per-member CRC; the files also load with
``np.load(..., allow_pickle=False)``), builds CPU tensors, gathers the input nodes'
feature rows (from the memory-mapped ``features.npy``, or the INT8 rows, or a tensor you
pass) and pins them when the device is CUDA. The consuming thread then moves the batch
with ``non_blocking`` copies and builds the blocks. INT8 features and edge weights are
decoded on the device for CUDA (a quarter of the bytes cross PCIe) and in the prefetch
thread for CPU training (`graphs.quantize`, NumPy-only at import; both decode alike). So
the next minibatch is read and gathered while the current one trains; ``wait_seconds`` is the time the loop was
blocked on the queue (with ``prefetch=0`` everything runs inline and all of it counts).

Loss semantics (:func:`cross_entropy`): the logits of ``blocks[-1]``'s destination nodes
are indexed by ``seed_pos``; without ``loss_weight`` the loss is the mean over the seeds;
with it (GraphSAINT) it is ``Σ loss_weight_v · loss_v``, an unbiased estimate of the mean
training loss. A minibatch without seeds (possible for cluster_gcn/saint) gives a zero loss
that still depends on the parameters, so every DDP rank takes the same steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from graphs.npzio import NpzFormatError, aligned_buffer, read_npz
from training.blocks import Block

__all__ = [
    "FeatureRows",
    "MiniBatch",
    "SUPPORTED_FORMAT_VERSION",
    "ShardError",
    "ShardStream",
    "cross_entropy",
    "read_manifest",
    "stream_files",
]

SUPPORTED_FORMAT_VERSION = 1


class ShardError(RuntimeError):
    """A shard file or manifest is missing, truncated, corrupt or of another format."""


def read_manifest(asset_dir: str | os.PathLike) -> dict:
    """The manifest.json of a minibatch_shards folder (format checked)."""
    path = Path(asset_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{path}: no manifest; materialize minibatch_shards first") from None
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: cannot be read as JSON ({exc}); re-materialize minibatch_shards") from exc
    version = manifest.get("format_version")
    if version != SUPPORTED_FORMAT_VERSION:
        raise ShardError(
            f"{path}: shard format version {version!r}, this code reads version {SUPPORTED_FORMAT_VERSION}; "
            "re-materialize minibatch_shards"
        )
    return manifest


def stream_files(manifest: dict, epoch: int, rank: int) -> dict:
    """The manifest's stream record of (`epoch`, `rank`): files, minibatches, seeds, bytes."""
    if not 0 <= rank < manifest["world_size"]:
        raise ValueError(f"rank {rank}: the shards were written for world_size={manifest['world_size']}")
    if not 0 <= epoch < manifest["epochs"]:
        raise ValueError(
            f"epoch {epoch}: the shards hold epochs 0..{manifest['epochs'] - 1}; pass epoch % {manifest['epochs']} "
            "to reuse them, or re-materialize with more epochs"
        )
    for s in manifest["streams"]:
        if s["epoch"] == epoch and s["rank"] == rank:
            return s
    raise ShardError(f"manifest has no stream for epoch {epoch}, rank {rank}")


@dataclass
class MiniBatch:
    """One minibatch on the training device.

    ``blocks[l]`` is layer l's block (input layer first); ``x`` the features of
    ``blocks[0]``'s source nodes (None without features); ``seed_pos`` indexes the last
    block's destination nodes where the loss is computed; ``labels`` are the labels of
    those nodes (global ids ``seeds``); ``loss_weight`` is set for GraphSAINT shards.
    """

    blocks: list[Block]
    x: torch.Tensor | None
    input_nodes: torch.Tensor
    seeds: torch.Tensor
    seed_pos: torch.Tensor
    labels: torch.Tensor
    loss_weight: torch.Tensor | None
    index: int

    @property
    def num_seeds(self) -> int:
        return self.seeds.numel()


def cross_entropy(mb: MiniBatch, logits: torch.Tensor) -> torch.Tensor:
    """The minibatch's training loss from the logits of the last block's destination nodes."""
    if mb.num_seeds == 0:
        return logits.sum() * 0.0
    out = logits[mb.seed_pos]
    if mb.loss_weight is None:
        return torch.nn.functional.cross_entropy(out, mb.labels)
    per_node = torch.nn.functional.cross_entropy(out, mb.labels, reduction="none")
    return (per_node * mb.loss_weight.to(per_node.dtype)).sum()


# ----------------------------------------------------------------------------- features


class FeatureRows:
    """Where the input nodes' feature rows come from, and how they are decoded.

    ``source``: "manifest" (the memory-mapped FP32 or INT8 file the manifest names), None,
    or an [n, D] array/tensor. ``gather_host(ids, decode=True)`` reads just those rows.
    """

    def __init__(self, source, manifest: dict, root: Path):
        self.kind = "none"
        self.device_tensor = None
        if isinstance(source, (torch.Tensor, np.ndarray)):
            t = torch.as_tensor(source)
            if t.device.type == "cpu":
                self.kind, self.host = "tensor", t
            else:
                self.kind, self.device_tensor = "device", t
            return
        if source is None:
            return
        if source != "manifest":
            raise ValueError(f"features={source!r}: pass 'manifest', None, a NumPy array or a torch tensor")
        entry = manifest.get("features")
        if entry is None:
            return
        shape = tuple(entry["shape"])
        if entry["encoding"] == "fp32":
            self.kind = "fp32"
            self.host = self._open(root / entry["path"], np.float32, shape)
        elif entry["encoding"] == "int8":
            self.kind = "int8"
            self.host = self._open(root / entry["q"], np.int8, shape)
            self.scale_np = np.load(root / entry["scale"], allow_pickle=False).astype(np.float32)
            self.zero_point_np = np.load(root / entry["zero_point"], allow_pickle=False).astype(np.float32)
            self.scale, self.zero_point = torch.from_numpy(self.scale_np), torch.from_numpy(self.zero_point_np)
        else:
            raise ShardError(f"{root / 'manifest.json'}: unknown feature encoding {entry['encoding']!r}")

    @staticmethod
    def _open(path: Path, dtype, shape) -> np.ndarray:
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise ShardError(f"{path}: feature file named by the manifest is missing; re-materialize") from None
        if arr.dtype != dtype or arr.shape != shape:
            raise ShardError(
                f"{path}: {arr.dtype} {list(arr.shape)} but the manifest expects {np.dtype(dtype)} {list(shape)}; "
                "the features changed since the shards were written, re-materialize minibatch_shards"
            )
        return np.asarray(arr)  # still backed by the file mapping

    def gather_host(self, nodes: np.ndarray, decode: bool) -> torch.Tensor | None:
        """Rows of `nodes` on the CPU, or None; INT8 rows stay compact unless `decode`."""
        if self.kind in ("fp32", "int8"):
            # np.take on the plain ndarray view: ~3x faster than fancy indexing the np.memmap
            rows = np.take(self.host, nodes, axis=0)
            if self.kind == "int8" and decode:
                from graphs.quantize import dequantize_int8_columns

                return torch.from_numpy(dequantize_int8_columns(rows, self.scale_np, self.zero_point_np))
            return torch.from_numpy(rows)
        if self.kind == "tensor":
            return self.host.index_select(0, torch.from_numpy(nodes))
        return None

    def finish(self, rows: torch.Tensor | None, nodes: torch.Tensor) -> torch.Tensor | None:
        """Decoded float rows on the device (rows already moved there)."""
        if self.kind == "int8" and rows is not None and rows.dtype == torch.int8:
            from graphs.quantize import dequantize_rows_torch

            if self.scale.device != rows.device:
                self.scale, self.zero_point = self.scale.to(rows.device), self.zero_point.to(rows.device)
            return dequantize_rows_torch(rows, self.scale, self.zero_point)
        if self.kind == "device":
            return self.device_tensor.index_select(0, nodes.to(self.device_tensor.device))
        return rows


# ----------------------------------------------------------------------------- reading


def _read_shard(root: Path, record: dict, verify: bool) -> dict[str, np.ndarray]:
    """The arrays of one shard file, after checking its size and (with `verify`) SHA-256.

    The file is read once into a buffer; the arrays are views into it
    (`graphs.npzio.read_npz`: no pickle, no second copy, no per-member CRC when the
    file's SHA-256 has been checked).
    """
    path = root / record["path"]
    try:
        size = path.stat().st_size
        if size != record["bytes"]:
            raise ShardError(
                f"{path}: {size} bytes but the manifest says {record['bytes']} (truncated or replaced); "
                "re-materialize minibatch_shards"
            )
        data = aligned_buffer(size)
        with open(path, "rb") as f:
            got = f.readinto(data)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file is missing; re-materialize minibatch_shards") from None
    if got != size:
        raise ShardError(f"{path}: read {got} of {size} bytes (file changed while reading)")
    if verify:
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise ShardError(
                f"{path}: SHA-256 {digest[:16]}... does not match the manifest's {record['sha256'][:16]}... "
                "(file corrupt); re-materialize minibatch_shards"
            )
    try:
        arrays = read_npz(data)
        if int(arrays["format_version"]) != SUPPORTED_FORMAT_VERSION:
            raise ShardError(
                f"{path}: shard format version {int(arrays['format_version'])}, expected {SUPPORTED_FORMAT_VERSION}"
            )
        if int(arrays["minibatches"]) != record["minibatches"]:
            raise ShardError(
                f"{path}: holds {int(arrays['minibatches'])} minibatches, manifest says {record['minibatches']}"
            )
    except ShardError:
        raise
    except (NpzFormatError, KeyError) as exc:
        raise ShardError(f"{path}: cannot be read as a shard .npz ({type(exc).__name__}: {exc})") from exc
    return arrays


@dataclass
class _HostBatch:
    """A minibatch's CPU tensors (pinned for CUDA), before the copy to the device."""

    index: int
    input_nodes: torch.Tensor
    seeds: torch.Tensor
    seed_pos: torch.Tensor
    labels: torch.Tensor
    loss_weight: torch.Tensor | None
    blocks: list[tuple]  # (indptr, indices, num_src, num_dst, weight, weight_q, weight_scale)
    x: torch.Tensor | None


_END = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class ShardStream:
    """Iterates one rank's minibatches of one epoch, in order, prefetching in a thread.

    Args:
        asset_dir: the minibatch_shards folder (holding manifest.json).
        rank, epoch: which stream; ``0 <= epoch < manifest["epochs"]``.
        device: where the minibatches go ("cpu", "cuda:0", ...).
        prefetch: minibatches read ahead by the background thread; 0 reads inline.
        features: "manifest" (the feature file the manifest names), None (no ``x``), or a
            [n, D] array/tensor (e.g. preprocessed features; a CUDA tensor is gathered on
            the device).
        verify: check each file's SHA-256 against the manifest (its size is always checked).
        order_seed: None reads the minibatches in their stored order; an integer shuffles
            them (the files in a permuted order, each file's minibatches permuted too, both
            drawn from this seed) so that a replayed epoch is not the same sequence of steps.
            Each file is still read once.
    """

    def __init__(
        self,
        asset_dir: str | os.PathLike,
        rank: int,
        epoch: int,
        device: str | torch.device = "cpu",
        prefetch: int = 2,
        *,
        features="manifest",
        verify: bool = True,
        manifest: dict | None = None,
        order_seed: int | None = None,
    ):
        if prefetch < 0:
            raise ValueError(f"prefetch={prefetch} must be >= 0")
        self.root = Path(asset_dir)
        self.manifest = manifest if manifest is not None else read_manifest(self.root)
        self.record = stream_files(self.manifest, epoch, rank)
        self.rank, self.epoch, self.prefetch, self.verify = rank, epoch, prefetch, verify
        self.order_seed = order_seed
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" and torch.cuda.is_available()
        self.decode_on_host = self.device.type == "cpu"
        self.features = FeatureRows(features, self.manifest, self.root)
        self.num_layers = int(self.manifest["num_layers"])
        self.shared_block = bool(self.manifest["shared_block"])
        self.wait_seconds = 0.0
        self.load_seconds = 0.0
        self.bytes_read = 0
        self._started = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None

    def __len__(self) -> int:
        return int(self.record["minibatches"])

    def __enter__(self) -> "ShardStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        return {
            "minibatches": len(self),
            "wait_seconds": self.wait_seconds,
            "load_seconds": self.load_seconds,
            "bytes_read": self.bytes_read,
        }

    # ---- producing host batches

    def _host_batches(self) -> Iterator[_HostBatch]:
        index = 0
        files = self.record["files"]
        rng = None if self.order_seed is None else np.random.default_rng(self.order_seed)
        file_order = range(len(files)) if rng is None else rng.permutation(len(files))
        for f in file_order:
            record = files[f]
            t0 = time.perf_counter()
            arrays = _read_shard(self.root, record, self.verify)
            self.bytes_read += record["bytes"]
            self.load_seconds += time.perf_counter() - t0
            count = int(arrays["minibatches"])
            for i in range(count) if rng is None else rng.permutation(count):
                i = int(i)
                t0 = time.perf_counter()
                try:
                    host = self._host_batch(arrays, i, index)
                except KeyError as exc:
                    raise ShardError(f"{self.root / record['path']}: minibatch {i} lacks the entry {exc}") from None
                self.load_seconds += time.perf_counter() - t0
                yield host
                index += 1

    def _host_batch(self, a: dict[str, np.ndarray], i: int, index: int) -> _HostBatch:
        p = f"mb{i}_"
        t = torch.from_numpy

        def long(x: np.ndarray) -> torch.Tensor:  # NumPy's cast: torch's was ~100x slower on a busy CPU
            return t(x.astype(np.int64, copy=False))

        blocks = []
        for layer in range(1 if self.shared_block else self.num_layers):
            q = f"{p}l{layer}_"
            indptr = a[q + "indptr"]
            weight = weight_q = scale = None
            if q + "weight" in a:
                weight = t(a[q + "weight"])
            elif self.decode_on_host:  # CPU training: decode here, in the prefetch thread
                weight = t(a[q + "weight_q"].astype(np.float32) * np.repeat(a[q + "weight_scale"], np.diff(indptr)))
            else:  # moved as INT8 (a quarter of the bytes), decoded on the device
                weight_q, scale = t(a[q + "weight_q"]), t(a[q + "weight_scale"])
            blocks.append(
                (
                    long(indptr),
                    long(a[q + "indices"]),
                    int(a[q + "num_src"]),
                    int(a[q + "num_dst"]),
                    weight,
                    weight_q,
                    scale,
                )
            )
        nodes = a[p + "input_nodes"].astype(np.int64, copy=False)
        host = _HostBatch(
            index=index,
            input_nodes=t(nodes),
            seeds=t(a[p + "seeds"]),
            seed_pos=t(a[p + "seed_pos"]),
            labels=t(a[p + "labels"]),
            loss_weight=t(a[p + "loss_weight"]) if p + "loss_weight" in a else None,
            blocks=blocks,
            x=self.features.gather_host(nodes, decode=self.decode_on_host),
        )
        if self.pin:
            host = _pinned(host)
        return host

    # ---- consuming

    def _to_device(self, h: _HostBatch) -> MiniBatch:
        dev, nb = self.device, self.pin

        def mv(x):
            return None if x is None else x.to(dev, non_blocking=nb)

        blocks = []
        for indptr, indices, num_src, num_dst, weight, weight_q, scale in h.blocks:
            indptr, indices = mv(indptr), mv(indices)
            if weight_q is not None:
                weight = mv(weight_q).to(torch.float32) * torch.repeat_interleave(
                    mv(scale), torch.diff(indptr), output_size=indices.numel()
                )
            else:
                weight = mv(weight)
            blocks.append(Block(indptr, indices, num_src, num_dst, weight))
        if self.shared_block:
            blocks = blocks * self.num_layers  # one object: its cached structure is shared
        input_nodes = mv(h.input_nodes)
        return MiniBatch(
            blocks=blocks,
            x=self.features.finish(mv(h.x), input_nodes),
            input_nodes=input_nodes,
            seeds=mv(h.seeds),
            seed_pos=mv(h.seed_pos),
            labels=mv(h.labels),
            loss_weight=mv(h.loss_weight),
            index=h.index,
        )

    def __iter__(self) -> Iterator[MiniBatch]:
        if self._started:
            raise RuntimeError("a ShardStream is iterated once; create a new one per epoch")
        self._started = True
        if self.prefetch == 0:
            source = self._host_batches()
            while True:
                t0 = time.perf_counter()
                host = next(source, None)
                self.wait_seconds += time.perf_counter() - t0
                if host is None:
                    return
                yield self._to_device(host)
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._produce, name=f"shards-r{self.rank}-e{self.epoch}", daemon=True)
        self._thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = self._queue.get()
                self.wait_seconds += time.perf_counter() - t0
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield self._to_device(item)
        finally:
            self.close()

    def _produce(self) -> None:
        try:
            for host in self._host_batches():
                if not self._put(host):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failure(exc))

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop the background thread (also done when iteration ends or breaks)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


def _pinned(h: _HostBatch) -> _HostBatch:
    def pin(x):
        return None if x is None else x.pin_memory()

    return _HostBatch(
        index=h.index,
        input_nodes=pin(h.input_nodes),
        seeds=pin(h.seeds),
        seed_pos=pin(h.seed_pos),
        labels=pin(h.labels),
        loss_weight=pin(h.loss_weight),
        blocks=[(pin(a), pin(b), c, d, pin(e), pin(f), pin(g)) for a, b, c, d, e, f, g in h.blocks],
        x=pin(h.x),
    )

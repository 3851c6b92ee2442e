"""Reading minibatch shards: one rank's stream of sampled blocks, with features, prefetched.

The minibatch_shards asset (`graphs.sampling`) writes, in the format of `graphs.formats.shard_format`,
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
it without pickle (`graphs.formats.npzio.read_npz`: the arrays are views into the buffer that was
just hashed, sparing ``np.load``'s second copy and per-member CRC; the files also load with
``np.load(..., allow_pickle=False)``), builds CPU tensors, gathers the input nodes'
feature rows (from the memory-mapped ``features.npy``, or the INT8 rows, or a tensor you
pass) and pins them when the device is CUDA. The consuming thread then moves the batch
with ``non_blocking`` copies and builds the blocks; on CUDA it does so on a side stream, one
minibatch ahead of the one it hands over (`training.copy_streams`). INT8 features and edge weights are
decoded on the device for CUDA (a quarter of the bytes cross PCIe) and in the prefetch
thread for CPU training (`graphs.kernels.quantize`, NumPy-only at import; both decode alike). So
the next minibatch is read and gathered while the current one trains; ``wait_seconds`` is the time the loop was
blocked on the queue (with ``prefetch=0`` everything runs inline and all of it counts).

Loss semantics (:func:`cross_entropy`): the logits of ``blocks[-1]``'s destination nodes
are indexed by ``seed_pos``; without ``loss_weight`` the loss is the mean over the seeds;
with it (GraphSAINT) it is ``Σ loss_weight_v · loss_v``, an unbiased estimate of the mean
training loss. A minibatch without seeds (possible for cluster_gcn/saint) gives a zero loss
that still depends on the parameters, so every DDP rank takes the same steps.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from graphs.formats.shard_codec import decode_minibatch
from graphs.formats.shard_format import (
    SUPPORTED_FORMAT_VERSION,
    ShardError,
    read_manifest,
    read_shard,
    stream_record,
)
from graphs.formats.shard_manifest import ShardManifest
from graphs.formats.shard_references import open_features, open_weight_factors
from training.blocks import Block, NodeScales, correction_is_per_dst
from training.copy_streams import CudaCopies, ahead
from training.feature_cache import CacheSpec, HotSplit, TieredFeatures
from training.typed_blocks import typed_blocks, typed_schema

__all__ = [
    "FeatureRows",
    "MiniBatch",
    "SUPPORTED_FORMAT_VERSION",
    "ShardError",
    "ShardStream",
    "cross_entropy",
    "read_manifest",
    "stream_record",
]


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
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """Optional per-minibatch arrays of the shard format (link prediction: ``pos_pairs``, ``neg_pairs``)."""

    @property
    def num_seeds(self) -> int:
        return self.seeds.numel()


def cross_entropy(mb: MiniBatch, logits: torch.Tensor, class_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The minibatch's training loss from the logits of the last block's destination nodes;
    `class_weight` [C] (training.imbalance) makes it the class-weighted mean."""
    if mb.num_seeds == 0:
        return logits.sum() * 0.0
    out = logits[mb.seed_pos]
    weight = None if class_weight is None else class_weight.to(out.device, out.dtype)
    if mb.loss_weight is None:
        return torch.nn.functional.cross_entropy(out, mb.labels, weight=weight)
    per_node = torch.nn.functional.cross_entropy(out, mb.labels, reduction="none")
    if weight is not None:  # SAINT's unbiasing weights times the class weights
        per_node = per_node * weight[mb.labels]
    return (per_node * mb.loss_weight.to(per_node.dtype)).sum()


# ----------------------------------------------------------------------------- features


class FeatureRows:
    """Where the input nodes' feature rows come from, and how they are decoded.

    ``source``: "manifest", None, or an [n, D] array/tensor. From the manifest: an
    `graphs.kernels.quantize.EncodedFeatures` (`graphs.formats.shard_references.open_features`: canonical FP32,
    or compressed_graph's codes with their transform), gathered compact in the prefetch
    thread and decoded there (CPU) or on the device (CUDA). ``gather_host(ids, decode=True)``
    reads just the rows ``ids`` (what the streamed evaluation uses). With ``cache`` (a
    `training.feature_cache.CacheSpec`) the rows come through `training.feature_cache.TieredFeatures`
    (compact codes; thread-safe, so one FeatureRows can serve every stream of a rank across
    epochs): a warm tier in CPU memory and, with a hot share, the highest-degree rows on the
    training device, where `finish` puts them beside the rows the host read.
    """

    def __init__(self, source, manifest: dict, root: Path, cache: CacheSpec | None = None):
        self.kind = "none"
        self.device_tensor = None
        self.cache = None
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
        self.encoded = open_features(manifest, root)
        if self.encoded is not None:
            self.kind = "encoded"
            if cache is not None:
                self.cache = TieredFeatures.from_spec(self.encoded, cache)

    def gather_host(self, nodes: np.ndarray, decode: bool, release: bool = False) -> torch.Tensor | None:
        """Rows of `nodes` on the CPU, or None; compact codes stay compact unless `decode`.
        ``release``: the feature file's pages are dropped from this process's RSS as they are
        read (`graphs.kernels.quantize.EncodedFeatures.gather`; the cache, if any, is bypassed)."""
        if self.kind == "encoded":
            if self.cache is not None and len(self.cache.hot_nodes) and not release:
                # the rows that are not hot; put beside the hot ones here when decoding on the host (CPU
                # training, whose hot tier is in CPU memory), else by `finish` on the device
                split = self.cache.gather_split(nodes)
                return self.cache.assemble(split.to(self.cache.device)) if decode else split
            if self.cache is not None and not release:
                rows = self.cache.gather_codes(nodes)
            else:
                rows = self.encoded.gather(nodes, release=release)
            if decode or self.encoded.encoding == "fp32":
                return torch.from_numpy(self.encoded.decode_gathered(rows, nodes))
            typed = self.encoded.type_offsets is not None  # per-type parameters: decoding needs the ids
            return _Compact(torch.from_numpy(rows), torch.from_numpy(np.asarray(nodes)) if typed else None)
        if self.kind == "tensor":
            return self.host.index_select(0, torch.from_numpy(nodes))
        return None

    def finish(self, rows, nodes: torch.Tensor) -> torch.Tensor | None:
        """Decoded float rows on the device (rows already moved there)."""
        if isinstance(rows, HotSplit):
            return self.cache.assemble(rows)
        if isinstance(rows, _Compact):
            return self.encoded.decode_gathered_torch(rows.codes, rows.nodes)
        if self.kind == "device":
            return self.device_tensor.index_select(0, nodes.to(self.device_tensor.device))
        return rows


class _Compact:
    """Gathered feature codes still to be decoded (on the device), with their node ids where the
    features hold per-type parameters."""

    def __init__(self, codes: torch.Tensor, nodes: torch.Tensor | None = None):
        self.codes, self.nodes = codes, nodes

    def _map(self, f) -> "_Compact":
        return _Compact(f(self.codes), None if self.nodes is None else f(self.nodes))

    def to(self, device, non_blocking: bool = False) -> "_Compact":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "_Compact":
        return self._map(lambda t: t.pin_memory())


# ----------------------------------------------------------------------------- reading


@dataclass
class _HostBlock:
    """A block's CPU tensors (pinned for CUDA), before the copy to the device."""

    indptr: torch.Tensor
    indices: torch.Tensor
    num_src: int
    num_dst: int
    weight: torch.Tensor | None  # None with int8 moved as codes, or weight encoding factors
    weight_q: torch.Tensor | None
    weight_scale: torch.Tensor | None
    correction: torch.Tensor | None  # per edge, or None and the compact form
    correction_first: torch.Tensor | None
    correction_rest: torch.Tensor | None
    per_dst: bool
    etype: torch.Tensor | None = None  # typed graphs: each edge's relation index


@dataclass
class _HostBatch:
    """A minibatch's CPU tensors (pinned for CUDA), before the copy to the device."""

    index: int
    input_nodes: torch.Tensor
    seeds: torch.Tensor
    seed_pos: torch.Tensor
    labels: torch.Tensor
    loss_weight: torch.Tensor | None
    blocks: list[_HostBlock]
    x: torch.Tensor | None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    scales: NodeScales | None = None  # weight encoding factors: Â's scales of input_nodes, gathered when used
    node_types: torch.Tensor | None = None  # typed graphs: each input node's type index


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
        features: "manifest" (the feature file the manifest names), None (no ``x``), a
            [n, D] array/tensor (e.g. preprocessed features; a CUDA tensor is gathered on
            the device), or a `FeatureRows` shared between streams (e.g. with a cache).
        verify: check each file's SHA-256 against the manifest, once per process while the file is
            unchanged (its size is always checked).
        order_seed: None reads the minibatches in their stored order; an integer shuffles
            them (the files in a permuted order, each file's minibatches permuted too, both
            drawn from this seed) so that a replayed epoch is not the same sequence of steps.
            Each file is still read once.
        copies: how minibatches reach the device: by default, on CUDA, copied one minibatch
            ahead on a side stream (`training.copy_streams.CudaCopies`), else on the current
            stream as they are handed over; an object with the same methods stands in for it.
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
        copies=None,
    ):
        if prefetch < 0:
            raise ValueError(f"prefetch={prefetch} must be >= 0")
        self.root = Path(asset_dir)
        self.manifest = manifest if manifest is not None else read_manifest(self.root)
        facts = ShardManifest.from_doc(self.manifest)
        self.record = stream_record(self.manifest, epoch, rank)
        self.rank, self.epoch, self.prefetch, self.verify = rank, epoch, prefetch, verify
        self.order_seed = order_seed
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" and torch.cuda.is_available()
        self.copies = copies if copies is not None else (CudaCopies(self.device) if self.pin else None)
        self.decode_on_host = self.device.type == "cpu"
        if isinstance(features, FeatureRows):
            self.features = features
        else:
            self.features = FeatureRows(features, self.manifest, self.root)
        self.num_layers = facts.num_layers
        self.shared_block = facts.shared_block
        self.weight_encoding = facts.weight_encoding
        self.weight_factors = open_weight_factors(self.manifest, self.root)
        self.typed = typed_schema(self.manifest)
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
            arrays = read_shard(self.root, record, self.verify)
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
        mb = decode_minibatch(a, i, 1 if self.shared_block else self.num_layers, self.weight_encoding)
        t = torch.from_numpy

        def long(x: np.ndarray) -> torch.Tensor:  # NumPy's cast: torch's was ~100x slower on a busy CPU
            return t(x.astype(np.int64, copy=False))

        blocks = []
        for b in mb.blocks:
            weight = weight_q = scale = None
            if self.weight_factors is not None:  # none stored: Â's scales give them (NodeScales)
                pass
            elif b.weight is not None:
                weight = t(b.weight)
            elif self.decode_on_host:  # CPU training: decode here, in the prefetch thread
                weight = t(b.decoded_weight())
            else:  # moved as INT8 (a quarter of the bytes), decoded on the device
                weight_q, scale = t(b.weight_q), t(b.weight_scale)
            per_dst = b.correction_per_dst
            if per_dst is None:
                per_dst = correction_is_per_dst(b.indptr, b.correction)  # here, in the prefetch thread
            first, rest = (None, None) if b.correction_compact is None else map(t, b.correction_compact)
            blocks.append(
                _HostBlock(
                    long(b.indptr),
                    long(b.indices),
                    b.num_src,
                    b.num_dst,
                    weight,
                    weight_q,
                    scale,
                    None if b.correction is None else t(b.correction),
                    first,
                    rest,
                    per_dst,
                    long(b.extra["etype"]) if "etype" in b.extra else None,
                )
            )
        nodes = mb.input_nodes.astype(np.int64, copy=False)
        host = _HostBatch(
            index=index,
            input_nodes=t(nodes),
            seeds=t(mb.seeds),
            seed_pos=t(mb.seed_pos),
            labels=t(mb.labels),
            loss_weight=None if mb.loss_weight is None else t(mb.loss_weight),
            blocks=blocks,
            x=self.features.gather_host(nodes, decode=self.decode_on_host),
            extra={name: long(v) for name, v in mb.extra.items()},
            scales=None if self.weight_factors is None else NodeScales(*self.weight_factors, nodes),
            node_types=None if self.typed is None else t(self.typed.node_types_of(nodes)),
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
        for b in h.blocks:
            indptr, indices = mv(b.indptr), mv(b.indices)
            if b.weight_q is not None:
                weight = mv(b.weight_q).to(torch.float32) * torch.repeat_interleave(
                    mv(b.weight_scale), torch.diff(indptr), output_size=indices.numel()
                )
            else:
                weight = mv(b.weight)
            compact = None if b.correction_first is None else (mv(b.correction_first), mv(b.correction_rest))
            blocks.append(
                Block(
                    indptr,
                    indices,
                    b.num_src,
                    b.num_dst,
                    weight,
                    mv(b.correction),
                    b.per_dst,
                    weight_factors=h.scales,
                    correction_compact=compact,  # expanded on first use (SAGE's mean never uses it)
                )
            )
        if self.shared_block:
            blocks = blocks * self.num_layers  # one object: its cached structure is shared
        input_nodes = mv(h.input_nodes)
        if self.typed is not None:
            etypes = [mv(b.etype) for b in h.blocks]
            blocks = typed_blocks(blocks, etypes, mv(h.node_types), input_nodes, self.typed.schema)
        return MiniBatch(
            blocks=blocks,
            x=self.features.finish(mv(h.x), input_nodes),
            input_nodes=input_nodes,
            seeds=mv(h.seeds),
            seed_pos=mv(h.seed_pos),
            labels=mv(h.labels),
            loss_weight=mv(h.loss_weight),
            index=h.index,
            extra={name: mv(v) for name, v in h.extra.items()},
        )

    def __iter__(self) -> Iterator[MiniBatch]:
        if self._started:
            raise RuntimeError("a ShardStream is iterated once; create a new one per epoch")
        self._started = True
        hosts = self._hosts()
        try:
            if self.copies is None:
                for host in hosts:
                    yield self._to_device(host)
            else:
                yield from ahead(hosts, self._to_device, self.copies)
        finally:
            hosts.close()  # a consumer that stops early stops the reading thread

    def _hosts(self) -> Iterator[_HostBatch]:
        """The host batches in order, read inline (``prefetch=0``) or by the background thread;
        the time spent waiting for them counts in ``wait_seconds``."""
        if self.prefetch == 0:
            source = self._host_batches()
            while True:
                t0 = time.perf_counter()
                host = next(source, None)
                self.wait_seconds += time.perf_counter() - t0
                if host is None:
                    return
                yield host
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
                yield item
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
        blocks=[
            replace(b, **{f.name: pin(v) for f in fields(b) if isinstance(v := getattr(b, f.name), torch.Tensor)})
            for b in h.blocks
        ],
        x=pin(h.x),
        extra={name: pin(v) for name, v in h.extra.items()},
        scales=h.scales,
        node_types=pin(h.node_types),
    )

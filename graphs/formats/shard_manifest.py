"""The minibatch_shards manifest as a typed record: what training and the assets read of it.

`graphs.formats.shard_format` owns the manifest's keys (`MANIFEST_KEYS`), writes it and checks it
(`read_manifest`: format version and required keys); `ShardManifest` is the one reader's view
of it, its values converted once, so no consumer spells a manifest key. The functions of the
format that take the manifest itself (features, weight factors, streams, upstream hashes) get
``manifest.doc``, the checked JSON object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from graphs.formats.shard_format import read_manifest

__all__ = ["GRAPH_PROPERTY", "LINK_PREDICTION", "NODE_CLASSIFICATION", "ShardManifest"]

# the tasks a manifest records (``task``); what each means is `assets.task_registry`'s
NODE_CLASSIFICATION = "node_classification"
LINK_PREDICTION = "link_prediction"
GRAPH_PROPERTY = "graph_property"


@dataclass(frozen=True)
class ShardManifest:
    """The facts of one minibatch_shards folder (`graphs.formats.shard_format.MANIFEST_KEYS` documents each)."""

    sampler: str
    num_layers: int  # blocks per minibatch as sampled (one per fanout)
    shared_block: bool  # one stored block stands for every layer
    non_uniform_draws: str | None  # the settings that draw unequally, or None
    world_size: int
    batch_size: int
    epochs: int  # sampled epochs
    minibatches_per_epoch_per_rank: int
    n: int
    num_classes: int
    feature_dim: int
    train_nodes: int
    weight_encoding: str
    self_loops: bool
    task: str
    inputs: dict = field(repr=False)  # upstream folders, relative to the manifest's folder
    doc: dict = field(repr=False)  # the checked JSON object, for the format's own functions

    @classmethod
    def from_doc(cls, doc: dict) -> ShardManifest:
        """The typed view of a manifest already checked by `graphs.formats.shard_format.check_manifest`."""
        return cls(
            sampler=str(doc["sampler"]),
            num_layers=int(doc["num_layers"]),
            shared_block=bool(doc["shared_block"]),
            non_uniform_draws=doc["non_uniform_draws"],
            world_size=int(doc["world_size"]),
            batch_size=int(doc["batch_size"]),
            epochs=int(doc["epochs"]),
            minibatches_per_epoch_per_rank=int(doc["minibatches_per_epoch_per_rank"]),
            n=int(doc["n"]),
            num_classes=int(doc["num_classes"]),
            feature_dim=int(doc["feature_dim"]),
            train_nodes=int(doc["train_nodes"]),
            weight_encoding=str(doc["weight_encoding"]),
            self_loops=bool(doc["self_loops"]),
            task=str(doc.get("task", NODE_CLASSIFICATION)),
            inputs=dict(doc.get("inputs") or {}),
            doc=doc,
        )

    @classmethod
    def open(cls, shards_dir: str | os.PathLike, *, verify_upstream_files: bool = False) -> ShardManifest:
        """The manifest of the shards in `shards_dir` (`graphs.formats.shard_format.read_manifest`: refused
        when missing, of another format version or lacking a key; with `verify_upstream_files`,
        also when a file it records changed)."""
        return cls.from_doc(read_manifest(shards_dir, verify_upstream_files))

    @property
    def has_features(self) -> bool:
        """Whether the shards name a feature file (else training uses degree features)."""
        return self.doc.get("features") is not None

    @property
    def settings(self) -> dict:
        """The ShardConfig the shards were cut with (every field but ``workers``)."""
        return self.doc["settings"]

    @property
    def loss_scales(self) -> list[float]:
        """Each rank's loss weight ``W s_r`` for shares ``s_r`` of rebalanced shards
        (`graphs.sampling.rebalance`); 1.0 for every rank otherwise."""
        shares = (self.doc.get("rebalance") or {}).get("shares")
        if shares is None:
            return [1.0] * self.world_size
        return [self.world_size * float(s) for s in shares]

    @property
    def replicated_share(self) -> float:
        """The share of feature rows every rank holds (hybrid partitioning, ``replicate``); 0.0 when none."""
        return float(self.settings.get("replicate", 0.0))

    def stream_minibatches(self) -> list[int]:
        """The minibatch count of every (epoch, rank) stream, in manifest order."""
        return [int(s["minibatches"]) for s in self.doc["streams"]]

    def input_dir(self, shards_dir: str | os.PathLike, stage: str) -> Path | None:
        """The folder of upstream `stage` the shards were sampled from (None when not recorded)."""
        rel = self.inputs.get(stage)
        return None if rel is None else (Path(shards_dir) / rel).resolve()

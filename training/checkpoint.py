"""Checkpoints: where a run's work folder is, what a checkpoint holds, saving and loading.

Work folder. A run checkpoints into ``<out parent>/.<out name>.work-<key>/`` (next to the
trained_model folder), where ``key`` hashes the run's config (model + training, minus
settings that do not change the result: profiler, prefetch, checksum verification,
checkpoint interval, inference chunking, device, aggregation kernel) and the input data version (the
shards' manifest and the canonical/adjacency summaries). So re-running the same config
on the same data resumes; changing either starts a fresh folder. A finished run moves its
outputs into the trained_model folder atomically and removes its work folder.

``checkpoint.safetensors`` (format version 3), written by rank 0 after every
``checkpoint_every`` epochs, atomically (temporary file + rename): a `training.state_file`
of kind ``checkpoint`` (tensors in safetensors, the rest as JSON in its header, with a
SHA-256 over both), so reading it never runs code and a damaged byte is refused. It holds:

    format_version  int
    epoch           int, last completed epoch (0-based)
    step            int, optimizer steps taken
    model           state dict of the (unwrapped) model
    optimizer       optimizer state dict (per-parameter tensors as named tensors)
    scaler          GradScaler state dict ({} when loss scaling is off)
    best            {epoch, val_acc, test_acc, model: state dict} (epoch counted from 1 as in the
                    metrics; 0 before any evaluation)
    history         list of metric rows (dicts of numbers, epochs from 1), every rank's
    stopped_early   bool
    config          the RunConfig as a dict
    run_key, data_version, code_version   str

Dropout randomness is re-seeded from (seed, epoch, rank) at the start of every epoch, so a
resumed run continues exactly as an uninterrupted one (no RNG state is stored).

The one-process runs on the same loop (link prediction, graph-level tasks) checkpoint in the same
folder and manner, each under its own kind: `loop_state` is what they hold (``epoch``, ``model``,
``optimizer``, ``rng`` (torch's generator and any of the run's own, as uint8 tensors),
``history``, ``rows``, ``best``, ``stale``, ``stopped_early``, ``run_key``, ``code_version``),
`restore_loop_state` puts it back.

A checkpoint that cannot be used (not a gnnflow checkpoint of this format, truncated, damaged)
is set aside by `resume_state` as ``checkpoint.safetensors.unusable-<tag>`` beside it, with a
warning naming it, and the run starts from its first epoch: one bad file never blocks retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.shard_format import MANIFEST_NAME
from training.state_file import StateFileError, read_state_file, write_state_file

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "StateFileError",
    "code_version",
    "data_version",
    "load_checkpoint",
    "loop_state",
    "restore_loop_state",
    "resume_state",
    "run_key",
    "save_checkpoint",
    "work_dir_for",
]

CHECKPOINT_FORMAT = 3  # 3: safetensors (training.state_file)
CHECKPOINT_NAME = "checkpoint.safetensors"
_KIND = "checkpoint"

# TrainingConfig fields that do not change what is trained (excluded from the run key).
_NOT_IN_KEY = (
    "profiler",
    "prefetch",
    "verify_shards",
    "checkpoint_every",
    "eval_batch_size",
    "device",
    "aggregation",
    "dist_timeout_s",
)


def data_version(shards: str | os.PathLike, canonical: str | os.PathLike, adjacency: str | os.PathLike) -> str:
    """16 hex digits over the shards' manifest.json, the canonical/adjacency summary.json and,
    when the shards name one, compressed_graph's manifest.json and summary.json.

    The manifest lists every shard file's SHA-256; the summaries hold what their stage wrote
    (run statistics live apart, in run_stats.json), so a re-run of any upstream stage that
    gives the same files keeps the version, and checkpoints stay resumable.
    """
    shards, summary = Path(shards), CanonicalGraph.SUMMARY  # every stage's summary.json
    manifest = shards / MANIFEST_NAME
    paths = {
        f"shards/{MANIFEST_NAME}": manifest,
        f"canonical/{summary}": Path(canonical) / summary,
        f"adjacency/{summary}": Path(adjacency) / summary,
    }
    named = json.loads(manifest.read_text()).get("inputs", {}) if manifest.is_file() else {}
    if CompressedGraph.STAGE in named:
        compressed = shards / named[CompressedGraph.STAGE]
        paths[f"compressed/{CompressedGraph.MANIFEST}"] = compressed / CompressedGraph.MANIFEST
        paths[f"compressed/{summary}"] = compressed / summary
    h = hashlib.sha256()
    for role, path in paths.items():
        h.update(role.encode())
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()[:16]


def code_version() -> str:
    """``gnnflow <version>+<hash of the training/ sources>``."""
    try:
        version = metadata.version("gnnflow")
    except metadata.PackageNotFoundError:
        version = "unknown"
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return f"gnnflow {version}+{h.hexdigest()[:12]}"


def run_key(config: dict, data_ver: str) -> str:
    """16 hex digits over the result-relevant config (model, training) and the data version."""
    training = {k: v for k, v in config["training"].items() if k not in _NOT_IN_KEY}
    payload = json.dumps({"model": config["model"], "training": training, "data": data_ver}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def work_dir_for(out_dir: str | os.PathLike, key: str, override: str = "") -> Path:
    """``override`` if set, else ``<out parent>/.<out name>.work-<key>``."""
    if override:
        return Path(override)
    out = Path(out_dir).resolve()
    return out.parent / f".{out.name}.work-{key}"


def save_checkpoint(
    path: str | os.PathLike, state: dict, *, kind: str = _KIND, format_version: int = CHECKPOINT_FORMAT
) -> None:
    """Write the checkpoint to a temporary sibling, then rename: a kill never leaves half a file.
    `kind` and `format_version`: another task's checkpoint (`training.link_train`'s)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write_state_file(tmp, {"format_version": format_version, **state}, kind=kind, format_version=format_version)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(
    path: str | os.PathLike, *, kind: str = _KIND, format_version: int = CHECKPOINT_FORMAT
) -> dict | None:
    """The checkpoint at ``path`` (tensors on the CPU), or None when there is none;
    StateFileError naming it when it is not a usable checkpoint (nothing in it is run)."""
    path = Path(path)
    if not path.is_file():
        return None
    return read_state_file(path, kind=kind, format_version=format_version, remedy="set it aside to start the run over")


def resume_state(
    path: str | os.PathLike,
    warn: Callable[[str], None] | None,
    *,
    kind: str = _KIND,
    format_version: int = CHECKPOINT_FORMAT,
) -> dict | None:
    """The checkpoint to resume from, or None to start from the first epoch.

    A checkpoint that cannot be used is renamed ``<name>.unusable-<tag>`` when `warn` is given
    (the rank that writes checkpoints), which is told the file, the reason and that training
    restarts; without `warn` (the other ranks) it is only skipped."""
    path = Path(path)
    try:
        return load_checkpoint(path, kind=kind, format_version=format_version)
    except StateFileError as exc:
        if warn is None:
            return None
        aside = path.with_name(f"{path.name}.unusable-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            pass
        reason = str(exc).split("; ")[0]
        warn(f"{reason}; set aside as {aside.name}: training restarts from the first epoch")
        return None


def loop_state(run, epoch: int, generators: dict | None = None) -> dict:
    """What a one-process run of `training.loop.run_epochs` checkpoints after `epoch` (module
    docstring): its model, optimizer, torch's generator and `generators` (name -> its state),
    and the loop's and head's progress (``run.history``, ``rows``, ``best``, ``stale``)."""
    return {
        "epoch": epoch,
        "model": run.model.state_dict(),
        "optimizer": run.opt.state_dict(),
        "rng": {"torch": torch.get_rng_state(), **(generators or {})},
        "history": run.history,
        "rows": run.rows,
        "best": run.best,
        "stale": run.stale,
        "stopped_early": run.stopped_early,
        "run_key": run.key,
        "code_version": code_version(),
    }


def restore_loop_state(run, state: dict, path: Path) -> None:
    """Put a `loop_state` back into `run` (its own generators are the caller's, in
    ``state["rng"]``); the run continues after the checkpoint's epoch."""
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    run.history, run.rows, run.best = list(state["history"]), list(state["rows"]), dict(state["best"])
    run.stale, run.stopped_early, run.start_epoch = (
        int(state["stale"]),
        bool(state["stopped_early"]),
        state["epoch"] + 1,
    )
    run.log(f"resuming from {path}: epochs 1..{run.start_epoch} done")

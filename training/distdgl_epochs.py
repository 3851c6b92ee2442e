"""DistDGL checkpoints: what rank 0 saves after every epoch, and how a rerun continues from it.

``checkpoint.safetensors`` in the trainers' ``--out`` (`training.checkpoint.CHECKPOINT_NAME`),
written by rank 0 after every epoch, atomically (temporary sibling + rename): a
`training.state_file` of kind ``distdgl_checkpoint``, format ``DISTDGL_CHECKPOINT_FORMAT``
(tensors in safetensors, the rest JSON, SHA-256 over both; reading it never runs code):

    epoch       int, the last completed epoch (from 1)
    model       state dict of the (unwrapped) model after that epoch
    optimizer   the optimizer's state dict (per-parameter tensors as named tensors)
    rows        the per-epoch rows so far (`training.distdgl` module docstring)
    best        {epoch, val_acc, test_acc, model: state dict}, or None before a validated epoch
    config      the run's identity (:func:`run_identity`): every setting but where the process
                runs (out, machine, index, torch_port, ip_config: the machine count instead) and
                ``stop_after_epoch``

At start, rank 0 reads the checkpoint when there is one (:func:`read_checkpoint`: refused with
the file and the differing setting when it is another run's) and loads the model before DDP
wraps it, so DDP's construction hands its parameters to every rank; the epoch, rows and best
scores reach the other ranks as a JSON header in a uint8 tensor (:func:`broadcast_json`), the
optimizer state as one ``dist.broadcast`` per tensor (:func:`share_optimizer_state`): no
pickle, and no file the other machines must see. Each epoch's shuffling, neighbour sampling
and dropout are seeded from (seed, rank, epoch) (:func:`epoch_seed`), so a resumed run trains
its remaining epochs as an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from training.state_file import read_state_file, write_state_file

__all__ = [
    "DISTDGL_CHECKPOINT_FORMAT",
    "NOT_COMPARED",
    "broadcast_json",
    "epoch_row",
    "history_summary",
    "epoch_seed",
    "optimizer_layout",
    "read_checkpoint",
    "resume_header",
    "run_identity",
    "save_checkpoint",
    "share_optimizer_state",
    "trainer_history",
]

DISTDGL_CHECKPOINT_FORMAT = 1
_KIND = "distdgl_checkpoint"
_REMEDY = "delete it (or train into another --out) to start over"
# settings that say where a process runs, not what is trained: not compared on resume
NOT_COMPARED = ("out", "machine", "index", "torch_port", "ip_config", "stop_after_epoch")


_INTERFACE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def run_identity(config: dict, machines: int) -> dict:
    """The settings a checkpoint must share with a run to be continued by it: `config` (the
    DistDGLConfig as a dict, its model resolved) without ``NOT_COMPARED``, plus the machine count."""
    return {k: v for k, v in config.items() if k not in NOT_COMPARED} | {"machines": int(machines)}


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of one trainer's epoch (shuffle, DGL's sampling, dropout): a function of
    (seed, rank, epoch) only, so a resumed epoch draws what an uninterrupted one would; below
    2**31 (DGL's seed is a C int)."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0]) >> 1


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write the checkpoint to a temporary sibling, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write_state_file(tmp, state, kind=_KIND, format_version=DISTDGL_CHECKPOINT_FORMAT)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_checkpoint(path: str | os.PathLike, identity: dict) -> dict | None:
    """The checkpoint at `path` (tensors on the CPU), None when there is none. ValueError naming
    the file and the first differing setting when it was written by a run of another identity
    (:func:`run_identity`); `training.state_file.StateFileError` when it is not a checkpoint."""
    path = Path(path)
    if not path.is_file():
        return None
    state = read_state_file(path, kind=_KIND, format_version=DISTDGL_CHECKPOINT_FORMAT, remedy=_REMEDY)
    theirs, ours = _flat(state["config"]), _flat(identity)
    differing = [k for k in sorted(theirs.keys() | ours.keys()) if theirs.get(k, "<unset>") != ours.get(k, "<unset>")]
    if differing:
        k = differing[0]
        raise ValueError(
            f"{path}: a checkpoint of another run ({k}={theirs.get(k, '<unset>')!r} there, "
            f"{ours.get(k, '<unset>')!r} here; {len(differing)} setting(s) differ): {_REMEDY}"
        )
    return state


def resume_header(path: Path, identity: dict, rank: int, device) -> tuple[dict | None, dict]:
    """(rank 0's checkpoint at `path` or None, the header every rank gets: epoch, rows, best
    scores and the optimizer state's layout); a checkpoint rank 0 refuses (:func:`read_checkpoint`)
    raises its error on every rank."""
    saved, header = None, None
    if rank == 0:
        try:
            saved = read_checkpoint(path, identity)
        except (ValueError, KeyError, OSError) as exc:  # every rank raises it: none waits in a collective
            header = {"error": str(exc)}
        if header is None and saved is None:
            header = {"epoch": 0, "rows": [], "best": None, "optimizer": []}
        elif header is None:
            best = saved["best"]
            header = {
                "epoch": int(saved["epoch"]),
                "rows": saved["rows"],
                "best": None if best is None else {k: best[k] for k in ("epoch", "val_acc", "test_acc")},
                "optimizer": optimizer_layout(saved["optimizer"]),
            }
    header = broadcast_json(header, device)
    if "error" in header:
        raise ValueError(header["error"])
    return saved, header


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in config.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def broadcast_json(obj, device: torch.device, src: int = 0):
    """`obj` (JSON-serialisable, given on rank `src`) on every rank: its JSON text as a uint8
    tensor, length first."""
    data = json.dumps(obj).encode() if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    buf = torch.zeros(int(size), dtype=torch.uint8, device=device)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src)
    return json.loads(bytes(buf.cpu().numpy()).decode())


def optimizer_layout(state: dict) -> list:
    """[[param id, {key: {"shape", "dtype"} for a tensor, else the value}], ...] of an
    optimizer state dict's ``state``: what the other ranks allocate before the broadcast."""

    def entry(v):
        return {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")} if torch.is_tensor(v) else v

    return [[int(pid), {k: entry(v) for k, v in sorted(per.items())}] for pid, per in sorted(state["state"].items())]


def share_optimizer_state(optim: torch.optim.Optimizer, layout: list, saved: dict | None, device) -> None:
    """Load rank 0's saved optimizer state (`saved`, the checkpoint's ``optimizer``; None on the
    other ranks) into `optim` on every rank: each tensor of `layout` (:func:`optimizer_layout`)
    is broadcast from rank 0; the param groups are this run's (the same config)."""
    state = {}
    for pid, per in layout:
        state[pid] = {}
        for key, spec in per.items():
            if not isinstance(spec, dict):
                state[pid][key] = spec
                continue
            if saved is not None:
                t = saved["state"][pid][key].to(device).contiguous()
            else:
                t = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device=device)
            dist.broadcast(t, 0)
            state[pid][key] = t.cpu()  # load_state_dict places them as the parameters (Adam's step stays on the CPU)
    optim.load_state_dict({"state": state, "param_groups": optim.state_dict()["param_groups"]})


def interface_rx_bytes() -> int:
    """Bytes received so far on the interface the machines reach each other on (the first of
    ``GLOO_SOCKET_IFNAME``, read from /sys/class/net), or -1 where it is unset or unreadable."""
    name = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if not _INTERFACE.fullmatch(name):  # becomes a path: an interface name only
        return -1
    try:
        return int(Path(f"/sys/class/net/{name}/statistics/rx_bytes").read_text())
    except (OSError, ValueError):
        return -1


def epoch_row(epoch: int, per_trainer: torch.Tensor, accs: dict, seconds: dict, lr: float) -> dict:
    """One epoch's row (module docstring) from every trainer's float64 counts, one row per rank:
    [loss x seeds, seeds, correct, steps, input nodes, input nodes of other machines' parts,
    bytes its machine's interface received while it trained (-1: unknown, `interface_rx_bytes`)]."""
    loss_sum, n, correct, steps, inputs, remote, rx = per_trainer.double().T
    seeds = float(n.sum())
    return {
        "epoch": epoch,
        "loss": float(loss_sum.sum()) / max(seeds, 1.0),
        "minibatch_acc": float(correct.sum()) / max(seeds, 1.0),
        "val_acc": accs.get("val_acc"),
        "test_acc": accs.get("test_acc"),
        "lr": lr,
        "steps": int(steps[0]),
        "seeds": int(seeds),
        "seeds_per_s": seeds / max(seconds["train_seconds"], 1e-9),
        **{k: seconds[k] for k in ("epoch_seconds", "train_seconds", "eval_seconds")},
        "trainer_losses": (loss_sum / n.clamp(min=1)).tolist(),
        "trainer_inputs": inputs.long().tolist(),
        "trainer_remote": remote.long().tolist(),
        "trainer_rx_bytes": rx.long().tolist(),
    }


def history_summary(rows: list[dict], best: dict | None) -> dict:
    """The summary's training and accuracy facts over the rows (names as `training.publish`'s
    summary uses them; None where nothing was evaluated)."""
    best, last = best or {}, rows[-1] if rows else {}
    inputs = sum(sum(r["trainer_inputs"]) for r in rows)
    steps = sum(r["steps"] for r in rows)
    # rows resumed from a checkpoint written before the count existed: unknown
    rx = [r.get("trainer_rx_bytes", [-1] * len(r["trainer_losses"])) for r in rows]
    measured = bool(rows) and min(min(r) for r in rx) >= 0
    return {
        "steps_per_trainer": steps,
        # bytes a machine's interface received per training step: every trainer reads its machine's
        # counter over its epochs' training (evaluation left out), averaged over the trainers
        "rx_bytes_per_step": sum(map(sum, rx)) / (len(rx[0]) * max(steps, 1)) if measured else None,
        "epoch_loss_rank0": [r["trainer_losses"][0] for r in rows],
        "remote_input_share": sum(sum(r["trainer_remote"]) for r in rows) / max(inputs, 1),
        "best_epoch": best.get("epoch"),
        "best_val_acc": best.get("val_acc"),
        "test_acc_at_best_val": best.get("test_acc"),
        "final_epoch": last.get("epoch", 0),
        "final_val_acc": last.get("val_acc"),
        "final_test_acc": last.get("test_acc"),
        "final_loss": last.get("loss"),
    }


def trainer_history(rows: list[dict], rank: int) -> dict:
    """One trainer's steps, loss per epoch and remote input share over the rows (its losses.json)."""
    inputs = sum(r["trainer_inputs"][rank] for r in rows)
    return {
        "steps": sum(r["steps"] for r in rows),
        "losses": [r["trainer_losses"][rank] for r in rows],
        "remote_input_share": sum(r["trainer_remote"][rank] for r in rows) / max(inputs, 1),
    }

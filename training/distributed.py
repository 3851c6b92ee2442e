"""torch.distributed setup: process group from torchrun's environment, or a single process.

torchrun (or ``python -m training.launch``) sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` then
joins the process group, backend ``nccl`` when the run uses CUDA and ``gloo`` otherwise, and
pins the rank to ``cuda:LOCAL_RANK``. When every rank is on this node, nothing listens beyond
loopback: rank 0 serves the group's store from a socket it binds to 127.0.0.1:MASTER_PORT
(a `TCPStore` given that socket; one given only the address would listen on every interface)
and gloo and NCCL use the loopback interface. Across nodes it uses ``init_method="env://"``
and the interface the launch names. Without those variables (``python -m training`` or a
test calling ``train()`` directly) it sets up nothing and reports world size 1.

The DDP rules used by the loop, stated once: every rank builds the same model from the
same seed (and DDP broadcasts rank 0's parameters at wrap time anyway); gradients are
averaged over ranks in backward; rank 0 evaluates, logs, checkpoints and writes outputs;
decisions that change control flow (early stopping) are broadcast from rank 0 so every
rank takes the same number of steps.
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "all_gather_objects", "broadcast_flag", "init_distributed", "shutdown", "state_digest"]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def initialized(self) -> bool:
        return self.backend is not None


def pick_device(setting: str, local_rank: int) -> torch.device:
    """``training.device`` -> a torch device for this rank."""
    if setting == "cpu":
        return torch.device("cpu")
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("training.device='cuda' but torch.cuda.is_available() is False; use 'auto' or 'cpu'")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(device_setting: str, timeout_s: float) -> DistInfo:
    """Join torchrun's process group (when launched by torchrun) and pick the device.

    `timeout_s` bounds joining the group and every collective: a rank that stops answering
    (hung, or dead without torchrun noticing) fails the others after that long, with the
    missing rank named in gloo's/NCCL's error. (A rank that dies under torchrun makes the
    launcher stop the others at once and name it: "Root Cause ... rank: N".)"""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return DistInfo(0, 1, 0, pick_device(device_setting, 0), None)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = pick_device(device_setting, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if _one_node(world):
            _use_loopback_interface()
            store = loopback_store(rank, world, int(os.environ["MASTER_PORT"]), timeout)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    return DistInfo(rank, world, local_rank, device, backend)


LOOPBACK = "127.0.0.1"


def _one_node(world: int) -> bool:
    """Every rank runs on this node, and the ranks make their own store (not torchrun's static
    rendezvous, whose agent already serves it on MASTER_PORT)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", -1)) == world and (
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    )


def _use_loopback_interface() -> None:
    """Point gloo and NCCL at the loopback interface (read when the group, for gloo, and its
    first communicator, for NCCL, are made); without it gloo listens on the address of the
    host name, which is often the network's."""
    loopback = next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)
    if loopback is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = loopback


def loopback_store(rank: int, world: int, port: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The process group's key-value store on 127.0.0.1:`port` only: rank 0 serves it from a
    socket bound to loopback, the other ranks connect there."""
    if rank != 0:
        return dist.TCPStore(LOOPBACK, port, world, False, timeout)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"rank 0 cannot serve the process group's store on {LOOPBACK}:{port}: {exc}") from exc
    return dist.TCPStore(LOOPBACK, port, world, True, timeout, master_listen_fd=sock.detach())


def shutdown(info: DistInfo, clean: bool = True) -> None:
    """Leave the process group; ``clean=False`` after a failure (no barrier: the other
    ranks may be stuck in a collective, and the launcher tears them down).

    The DDP wrapper (a reference cycle) is collected first, while the group is still
    registered, and a barrier lets gloo's worker threads finish and release every pending
    work item: torch 2.2's ProcessGroupGloo destructor joins those threads while holding
    the GIL, and a worker still releasing a Python-owned tensor of an all_gather then
    waits for the GIL forever (observed as a hang at interpreter exit).
    """
    if info.initialized and dist.is_initialized():
        gc.collect()
        if clean:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def broadcast_flag(info: DistInfo, flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank."""
    if not info.initialized:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=info.device if info.backend == "nccl" else "cpu")
    dist.broadcast(t, src=0)
    return bool(t.item())


def all_gather_objects(info: DistInfo, obj) -> list:
    """Every rank's ``obj`` (picklable, small), in rank order."""
    if not info.initialized:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def state_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state (names, dtypes, shapes, bytes in order): DDP replicas that
    stayed in sync have equal digests on every rank, on every node."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        # reshape(-1): a 0-dim tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()

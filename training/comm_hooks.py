"""Gradient communication under DDP: compression hooks, bucket size, and bytes counted per step.

``training.comm`` (:class:`CommConfig`) picks a DDP communication hook (``hook``):

==========  =====================================================================  =============
hook        what each rank sends for a gradient bucket of N float32 values          bytes (×N)
==========  =====================================================================  =============
none        DDP's own all-reduce of the fp32 bucket                                4
fp16        all-reduce of the bucket cast to fp16 (torch's ``fp16_compress_hook``)  2
bf16        all-reduce of the bucket cast to bf16 (torch's ``bf16_compress_hook``)  2
powersgd    torch's PowerSGD (Vogels et al. 2019): each gradient matrix M (n×m) as  (n+m)·r·4/(n·m)
            P (n×r) and Q (m×r), error feedback and warm start; vectors and tensors
            too small to gain go uncompressed; plain all-reduce for the first
            ``powersgd_start_step`` steps
int8        :func:`int8_hook`: all-gather of int8 codes of the bucket with one fp32  1 (+4 bytes)
            scale per rank (max |g| / 127), decoded and averaged on every rank
==========  =====================================================================  =============

and the DDP bucket size (``bucket_cap_mb``, torch's default 25 MB: smaller buckets start
communicating earlier in the backward pass, larger ones make fewer collectives).

``count_bytes`` wraps the hook's process group in :class:`CountingGroup`, which counts the
bytes every collective of the hook is handed and estimates what a rank puts on the wire
with the ring algorithms gloo and NCCL use for large tensors: an all-reduce of S bytes sends
2(W−1)/W·S per rank, an all-gather (W−1)·S (each rank's S to every other rank), so for
W = 2 both equal S and for larger W the int8 hook's all-gather loses part of its 4x to the
all-reduce. With ``hook: none`` and counting on, torch's ``allreduce_hook`` (what DDP does
itself: divide by W, all-reduce) is registered so that the baseline is counted the same way.
Training reports the count as ``comm_bytes_per_step`` per epoch row and in the summary.

The int8 hook's error: every rank r sends codes ``round(g_r / s_r)`` with ``s_r = max|g_r| /
127``, so each decoded value is within ``s_r / 2`` of ``g_r`` and the decoded mean within
``Σ_r s_r / (2W)`` of the true mean (``tests/test_comm_hooks.py`` checks the bound). It keeps
no error feedback (the rounding error is dropped, not carried to the next step).
"""

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from graphs.infra.config_checks import MAX_STEPS, bounded_repr, check_fields

__all__ = ["COMM_HOOKS", "CommConfig", "CommCounter", "CountingGroup", "int8_hook", "setup_comm_hook"]

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd", "int8")


@dataclass(kw_only=True)
class CommConfig:
    """DDP gradient communication: compression hook, bucket size, byte counting."""

    hook: str = field(
        default="none",
        metadata={
            "help": f"DDP communication hook, one of {COMM_HOOKS}: none = fp32 all-reduce; fp16/bf16 = all-reduce "
            "in 16 bits; powersgd = low-rank PowerSGD with error feedback; int8 = all-gather of int8 codes with a "
            "per-rank scale (training.comm_hooks)"
        },
    )
    bucket_cap_mb: float = field(
        default=25.0, metadata={"max": 65536.0, "help": "DDP gradient bucket size in MB (torch's default 25)"}
    )
    powersgd_rank: int = field(
        default=1, metadata={"max": 1024, "help": "powersgd: rank r of the low-rank approximation"}
    )
    powersgd_start_step: int = field(
        default=10,
        metadata={
            "max": MAX_STEPS,
            "help": "powersgd: optimizer steps of plain all-reduce before compressing (> 1, torch's rule)",
        },
    )
    count_bytes: bool = field(
        default=False,
        metadata={
            "help": "count the bytes each rank sends for its gradients per optimizer step (comm_bytes_per_step in "
            "the metrics and summary); with hook none this registers torch's allreduce_hook to count DDP's all-reduce"
        },
    )

    def __post_init__(self) -> None:
        p = "training.comm"
        check_fields(self, p)
        if self.hook not in COMM_HOOKS:
            raise ValueError(f"{p}.hook={bounded_repr(self.hook)}: must be one of {COMM_HOOKS}")
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"{p}.bucket_cap_mb={bounded_repr(self.bucket_cap_mb)}: must be > 0")
        if self.powersgd_rank < 1:
            raise ValueError(f"{p}.powersgd_rank={bounded_repr(self.powersgd_rank)}: must be >= 1")
        if self.powersgd_start_step < 2:
            raise ValueError(
                f"{p}.powersgd_start_step={bounded_repr(self.powersgd_start_step)}: must be >= 2 (torch's PowerSGD needs "
                "plain all-reduce steps before error feedback and warm start begin)"
            )


class CommCounter:
    """Bytes handed to collectives (``payload``) and the ring-algorithm estimate of bytes sent
    (``sent``), per rank, since the last :meth:`take`."""

    def __init__(self, world_size: int):
        self.world_size = int(world_size)
        self.payload = self.sent = 0.0
        self.calls = 0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        w, s = self.world_size, tensor.numel() * tensor.element_size()
        self.payload += s
        self.sent += 2 * (w - 1) / w * s
        self.calls += 1

    def all_gather(self, tensor: torch.Tensor) -> None:
        s = tensor.numel() * tensor.element_size()
        self.payload += s
        self.sent += (self.world_size - 1) * s
        self.calls += 1

    def take(self) -> dict:
        """The counts so far (and reset them)."""
        out = {"payload": self.payload, "sent": self.sent, "calls": self.calls}
        self.payload = self.sent = 0.0
        self.calls = 0
        return out


class CountingGroup:
    """A process group that counts what the collectives called on it carry, then runs them on
    the real group ``pg``. `torch.distributed.all_reduce` / ``all_gather`` call the group's
    ``allreduce`` / ``allgather`` methods, which is where the count happens; everything else
    is the real group's."""

    def __init__(self, pg, counter: CommCounter):
        self._pg, self.counter = pg, counter

    def allreduce(self, tensors, *args, **kwargs):
        for t in tensors:
            self.counter.all_reduce(t)
        return self._pg.allreduce(tensors, *args, **kwargs)

    def allgather(self, output_lists, inputs, *args, **kwargs):
        for t in inputs:
            self.counter.all_gather(t)
        return self._pg.allgather(output_lists, inputs, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._pg, name)


def int8_quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, fp32 scale [1]): ``codes = round(t / s)`` with ``s = max|t| / 127`` (1 for t = 0)."""
    amax = t.detach().abs().max().float()
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).reshape(1)
    codes = torch.round(t.float() / scale).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def int8_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: all-gather every rank's int8 codes and scale, average the decoded values.

    One collective per bucket: the scale's four bytes ride at the end of the codes.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    world = group.size()
    buffer = bucket.buffer()
    codes, scale = int8_quantize(buffer)
    packed = torch.cat([codes, scale.view(torch.int8)])
    gathered = [torch.empty_like(packed) for _ in range(world)]
    fut = dist.all_gather(gathered, packed, group=group, async_op=True).get_future()

    def decode(_fut) -> torch.Tensor:
        rows = torch.stack(gathered)  # [W, N + 4]
        scales = rows[:, -4:].contiguous().view(torch.float32)  # [W, 1]
        mean = (rows[:, :-4].float() * scales).sum(0) / world
        return buffer.copy_(mean.to(buffer.dtype))

    return fut.then(decode)


_powersgd_groups: list = []  # one entry per group created in this process (its store prefix)
POWERSGD_GLOO_THREADS = 8


def powersgd_gloo_group(timeout_s: float):
    """A gloo process group over the default group's ranks with `POWERSGD_GLOO_THREADS` worker
    threads, for torch's PowerSGD hook (see `SerialPowerSGD`). Private torch API
    (``ProcessGroupGloo._Options``), pinned with torch 2.2.1."""
    from torch._C._distributed_c10d import ProcessGroupGloo

    opts = ProcessGroupGloo._Options()
    interfaces = [i for i in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if i]
    opts._devices = (
        [ProcessGroupGloo.create_device(interface=i) for i in interfaces]
        if interfaces
        else [ProcessGroupGloo.create_default_device()]
    )
    opts._threads = POWERSGD_GLOO_THREADS
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    # a fresh key space per group: every rank creates its groups in the same order
    _powersgd_groups.append(None)
    store = dist.PrefixStore(f"gnnflow/powersgd/{len(_powersgd_groups)}", dist.distributed_c10d._get_default_store())
    return ProcessGroupGloo(store, dist.get_rank(), dist.get_world_size(), opts)


class SerialPowerSGD:
    """torch's PowerSGD hook, one bucket at a time (for gloo).

    Why: PowerSGD's callbacks issue their next all-reduce and wait for it (``fut.wait()``)
    inside the callback, which on gloo runs on one of the group's worker threads. With several
    buckets in flight (Cora's GraphSAGE has two: DDP's first bucket holds at most 1 MB) the
    callbacks of different buckets (a) block gloo's 2 default worker threads, so the run hangs at
    the first compressed step, or, given more threads, (b) issue their all-reduces in a different
    order on different ranks, which gloo rejects ("op.preamble.length <= op.nbytes"). Here bucket
    k's hook starts only when bucket k−1's has finished, on a group with spare threads
    (`powersgd_gloo_group`), so every rank issues the same collectives in the same order. The
    price is less overlap of communication with the backward pass. NCCL needs none of this.
    """

    def __init__(self, state):
        self.state = state
        self.tail: torch.futures.Future | None = None

    def hook(self, bucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        if bucket.index() == 0 or self.tail is None:
            start = torch.futures.Future()
            start.set_result(None)
        else:
            start = self.tail
        state = self.state
        self.tail = start.then(lambda _fut: powerSGD_hook.powerSGD_hook(state, bucket).wait())
        return self.tail


def _serial_powersgd_hook(serial: SerialPowerSGD, bucket) -> torch.futures.Future[torch.Tensor]:
    return serial.hook(bucket)


def setup_comm_hook(ddp_model, cfg: CommConfig, process_group=None, timeout_s: float = 1800) -> "CommCounter | None":
    """Register ``cfg.hook`` on the DDP model (nothing for ``none`` without counting); the
    counter when ``cfg.count_bytes``, else None.

    (No ``from __future__ import annotations`` in this module: DDP checks that a hook's return
    annotation *is* ``torch.futures.Future[torch.Tensor]``, not a string.)"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if cfg.hook == "none" and not cfg.count_bytes:
        return None
    pg = process_group if process_group is not None else dist.group.WORLD
    serial = cfg.hook == "powersgd" and process_group is None and dist.get_backend() == "gloo"
    if serial:
        pg = powersgd_gloo_group(timeout_s)
    counter = CommCounter(dist.get_world_size(pg)) if cfg.count_bytes else None
    group = CountingGroup(pg, counter) if counter is not None else pg
    if cfg.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start_step,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )
        if serial:
            ddp_model.register_comm_hook(SerialPowerSGD(state), _serial_powersgd_hook)
        else:
            ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        hook = {
            "none": default_hooks.allreduce_hook,
            "fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook,
            "int8": int8_hook,
        }[cfg.hook]
        ddp_model.register_comm_hook(group, hook)
    return counter

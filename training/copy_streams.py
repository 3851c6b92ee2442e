"""Host-to-device copies one minibatch ahead, on a side CUDA stream.

While the device computes minibatch t, minibatch t+1 (already read, gathered and pinned by the
shard stream's thread) is copied on a second stream; an event recorded after its copy orders it
before its compute: `ahead` issues the copy of t+1, then makes the compute stream wait for t's
event and hands t over. Each handed-over tensor is marked as used by the compute stream
(``record_stream``), so the caching allocator does not reuse its memory before that stream is
done with it. The pinned host tensors are kept alive by the allocator's own events.

`ShardStream` selects `CudaCopies` when its device is CUDA (``pin``); on the CPU there is nothing
to copy and batches pass through. The streams are an object with four methods (`CudaCopies`'s),
so a test can stand in one that records the order of copies, events and waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, TypeVar

import torch

H = TypeVar("H")
B = TypeVar("B")


class CudaCopies:
    """The side stream of `device` and the calls `ahead` makes on it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def side(self) -> contextlib.AbstractContextManager:
        """Kernels and copies issued inside run on the side stream."""
        return torch.cuda.stream(self.stream)

    def record(self) -> torch.cuda.Event:
        """An event at the side stream's current end (after the copies issued so far)."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: torch.cuda.Event) -> None:
        """The compute (current) stream waits for `event` before what is issued next."""
        torch.cuda.current_stream(self.device).wait_event(event)

    def keep(self, tensor: torch.Tensor) -> None:
        """`tensor`, made on the side stream, is used on the compute stream."""
        tensor.record_stream(torch.cuda.current_stream(self.device))


def ahead(hosts: Iterator[H], to_device: Callable[[H], B], copies) -> Iterator[B]:
    """``to_device(h)`` of each host batch in order, each issued inside ``copies.side()`` one
    batch before it is handed over (module docstring)."""
    pending = None
    for host in hosts:
        with copies.side():
            moved = to_device(host)
            event = copies.record()
        if pending is not None:
            yield _hand_over(*pending, copies)
        pending = moved, event
    if pending is not None:
        yield _hand_over(*pending, copies)


def _hand_over(moved, event, copies):
    copies.wait(event)
    seen = set()
    for tensor in tensors_of(moved):  # a shared block appears once per layer
        if id(tensor) not in seen:
            seen.add(id(tensor))
            copies.keep(tensor)
    return moved


def tensors_of(obj) -> Iterator[torch.Tensor]:
    """Every tensor in `obj`: itself, or within its dataclass fields, lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_of(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_of(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_of(item)

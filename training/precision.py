"""Mixed precision: which autocast dtype a run uses, and a GradScaler shim across torch versions.

``training.precision`` means, per device:

=================  ==================================  ===============================
precision          CUDA                                CPU
=================  ==================================  ===============================
``fp32``           no autocast                         no autocast
``mixed_float16``  fp16 autocast + GradScaler          bf16 autocast where supported
                   (dynamic loss scaling)              (fp32 otherwise); logged once
``bf16``           bf16 autocast, no scaler            bf16 autocast, no scaler
=================  ==================================  ===============================

fp16 needs loss scaling (small gradients underflow in fp16); bf16 has fp32's exponent
range, so it does not. Normalization layers and the graph structure stay fp32 (autocast
runs batch/layer norm in fp32), and the sparse aggregation upcasts to fp32 itself
(`training.aggregate`: torch 2.2.1 has no bf16 CPU kernel for CSR matmul).

GradScaler: ``torch.amp.GradScaler("cuda")`` exists from torch 2.3 on and
``torch.cuda.amp.GradScaler`` is deprecated there; torch 2.2.1 (our pin) only has the
latter. :func:`grad_scaler` picks whichever exists.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

__all__ = ["Precision", "grad_scaler", "grad_scaler_class", "resolve_precision"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    """What a precision setting resolved to on one device."""

    requested: str
    device_type: str
    autocast_dtype: torch.dtype | None  # None: no autocast
    loss_scaling: bool
    note: str

    def autocast(self):
        """The autocast context for forward passes (a no-op context for fp32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)


def cpu_bf16_supported() -> bool:
    """Whether CPU autocast runs a bf16 matmul here (torch builds without it raise or warn)."""
    try:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(3, 4))
        return out.dtype == torch.bfloat16
    except (RuntimeError, TypeError):
        return False


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """The autocast dtype and loss scaling that ``requested`` means on ``device``."""
    dev = torch.device(device).type
    if requested == "fp32":
        return Precision(requested, dev, None, False, "fp32")
    if dev == "cuda":
        if requested == "mixed_float16":
            return Precision(requested, dev, torch.float16, True, "CUDA: fp16 autocast with dynamic loss scaling")
        return Precision(requested, dev, torch.bfloat16, False, "CUDA: bf16 autocast")
    if dev == "cpu":
        if cpu_bf16_supported():
            return Precision(
                requested,
                dev,
                torch.bfloat16,
                False,
                f"CPU: {requested} runs as bf16 autocast (no fp16 loss scaling on CPU); sparse "
                "aggregation and normalization layers stay fp32",
            )
        return Precision(requested, dev, None, False, f"CPU: bf16 autocast unsupported here, {requested} runs in fp32")
    return Precision(requested, dev, None, False, f"{dev}: no autocast support assumed, fp32")


def grad_scaler_class():
    """``torch.amp.GradScaler`` when this torch has it (>= 2.3), else ``torch.cuda.amp.GradScaler``."""
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None:
        return amp_scaler
    return torch.cuda.amp.GradScaler


def grad_scaler(enabled: bool):
    """A CUDA GradScaler (disabled: every call passes through unchanged)."""
    cls = grad_scaler_class()
    if cls is getattr(torch.amp, "GradScaler", None):
        return cls("cuda", enabled=enabled)
    return cls(enabled=enabled)

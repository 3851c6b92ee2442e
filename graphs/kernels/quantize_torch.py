"""Torch decoders of the encodings of `graphs.kernels.quantize`, run on the device of the codes.

A training loop keeps the compact arrays (int8 codes, 4-bit or bit-packed bytes, per-row INT8
CSR weights; layouts in `graphs.kernels.quantize`'s docstring) on the device and decodes each
gathered batch there: ``q.float() * scale + zero_point``, rounded as NumPy rounds it (the
product, then the sum; no fused multiply-add), so both decode bit-identically. torch is
imported inside the functions: importing this module costs nothing where only NumPy decodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "torch_param",
    "dequantize_rows_torch",
    "unpack_int4_torch",
    "dequantize_int4_rows_torch",
    "unpack_binary_torch",
    "dequantize_int8_rows_csr_torch",
]


def torch_param(p, like: "torch.Tensor") -> "torch.Tensor":
    """`p` (a scale or zero point, NumPy or torch) as float32 on `like`'s device."""
    import torch

    return torch.as_tensor(p, dtype=torch.float32).to(like.device, non_blocking=True)


def dequantize_rows_torch(
    q_rows: "torch.Tensor",
    scale: "torch.Tensor | np.ndarray",
    zero_point: "torch.Tensor | np.ndarray",
) -> "torch.Tensor":
    """float32 [..., d] = q_rows * scale + zero_point on q_rows' device (q_rows int8 [..., d],
    typically the gathered rows of one batch; scale / zero_point float32 [d]). Keep scale and
    zero_point as tensors on the device to avoid a copy per call."""
    import torch

    return q_rows.to(torch.float32) * torch_param(scale, q_rows) + torch_param(zero_point, q_rows)


def unpack_int4_torch(packed: "torch.Tensor", num_cols: int) -> "torch.Tensor":
    """torch uint8 [n, num_cols] of 4-bit codes from packed uint8 [n, ceil(num_cols/2)]."""
    import torch

    nib = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return nib.reshape(packed.shape[0], -1)[:, :num_cols]


def dequantize_int4_rows_torch(packed_rows: "torch.Tensor", scale, zero_point, num_cols: int) -> "torch.Tensor":
    """float32 [n, num_cols] on packed_rows' device from gathered packed 4-bit rows."""
    import torch

    codes = unpack_int4_torch(packed_rows, num_cols)
    return codes.to(torch.float32) * torch_param(scale, codes) + torch_param(zero_point, codes)


def unpack_binary_torch(packed: "torch.Tensor", num_cols: int) -> "torch.Tensor":
    """float32 [n, num_cols] of 0/1 on packed's device from packed uint8 [n, ceil(num_cols/8)]."""
    import torch

    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(packed.shape[0], -1)[:, :num_cols].to(torch.float32)


def dequantize_int8_rows_csr_torch(indptr: "torch.Tensor", q: "torch.Tensor", scale: "torch.Tensor") -> "torch.Tensor":
    """torch float32 [nnz] = q * scale[row of each entry], on q's device."""
    import torch

    counts = torch.diff(torch.as_tensor(indptr, device=q.device))
    return q.to(torch.float32) * torch.repeat_interleave(torch_param(scale, q), counts)

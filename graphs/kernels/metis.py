"""What a call into METIS (pymetis, or DGL's METIS) needs, shared by `graphs.stages.partition` and
`graphs.kernels.coarsen`: METIS's index dtype, and a stdout kept free of the native libraries' prints."""

from __future__ import annotations

import contextlib
import io

import numpy as np


@contextlib.contextmanager
def quiet_stdout():
    """Keep DGL's and METIS's progress prints out of stdout (Dagster's compute log)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def metis_idx_dtype() -> np.dtype:
    """METIS's idx_t as built into pymetis (int64 in the PyPI wheels): CSR arrays of this
    dtype reach METIS without a copy."""
    import pymetis

    return np.dtype(pymetis.zero_copy_dtype())


__all__ = ["metis_idx_dtype", "quiet_stdout"]

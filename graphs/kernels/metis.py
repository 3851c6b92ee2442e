"""What a call into METIS (pymetis, or DGL's METIS) needs, shared by `graphs.stages.partition` and
`graphs.kernels.coarsen`: METIS's index dtype, a stdout kept free of the native libraries' prints,
and `metis_kway_multi`, multi-constraint k-way partitioning."""

from __future__ import annotations

import contextlib
import ctypes
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


METIS_OK = 1
METIS_NOPTIONS = 40


def metis_kway_multi(
    indptr: np.ndarray, indices: np.ndarray, k: int, vweights: np.ndarray, eweights: np.ndarray | None, seed: int
) -> np.ndarray:
    """Part id per node from METIS_PartGraphKway with ``vweights.shape[1]`` balance constraints
    (`vweights`: int [n, ncon]; each column is balanced over the parts), seeded.

    pymetis cannot pass several constraints (its wrapper derives ``ncon`` as
    ``len(vweights) // len(xadj)``, which is 1 for any ``ncon * n`` weights), and DGL's METIS
    (``balance_ntypes``) gives a different assignment on every call; so this calls the METIS
    that pymetis's extension module carries, through ctypes, with METIS's own types."""
    import pymetis._internal as native

    idx = metis_idx_dtype()
    c_idx = ctypes.c_int64 if idx.itemsize == 8 else ctypes.c_int32
    lib = ctypes.CDLL(native.__file__)
    n = len(indptr) - 1
    xadj, adjncy = np.ascontiguousarray(indptr, dtype=idx), np.ascontiguousarray(indices, dtype=idx)
    vwgt = np.ascontiguousarray(vweights, dtype=idx)
    adjwgt = None if eweights is None else np.ascontiguousarray(eweights, dtype=idx)
    options = np.zeros(METIS_NOPTIONS, dtype=idx)
    lib.METIS_SetDefaultOptions(options.ctypes.data_as(ctypes.c_void_p))
    options[native.options_indices.SEED] = seed
    part = np.zeros(n, dtype=idx)
    nvtxs, ncon, nparts, cut = c_idx(n), c_idx(vwgt.shape[1]), c_idx(k), c_idx(0)

    def ptr(a):
        return None if a is None else a.ctypes.data_as(ctypes.c_void_p)

    with quiet_stdout():
        status = lib.METIS_PartGraphKway(
            ctypes.byref(nvtxs), ctypes.byref(ncon), ptr(xadj), ptr(adjncy), ptr(vwgt), None, ptr(adjwgt),
            ctypes.byref(nparts), None, None, ptr(options), ctypes.byref(cut), ptr(part),
        )  # fmt: skip
    if status != METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway with {vwgt.shape[1]} constraints failed (status {status})")
    return part


__all__ = ["metis_idx_dtype", "metis_kway_multi", "quiet_stdout"]

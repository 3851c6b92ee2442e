"""Uncompressed ``.npz`` files written and read fast: streamed, hashed, 64-byte aligned, zero-copy.

The files are ordinary uncompressed NumPy ``.npz`` archives (ZIP_STORED members
``<key>.npy`` in NPY format 1.0), so ``np.load(path, allow_pickle=False)`` reads them. Two
things differ from ``np.savez``, for speed (the shard files of minibatch_shards are many GB):

- `write_npz` streams every array straight from its memory into the file (no in-memory
  copy of the archive), computing each member's CRC-32 (ISA-L's, where the isal package is
  installed) and the whole file's SHA-256 on the way, and pads each member's local ZIP
  header with an extra field (id 0xD935, as Android's zipalign does) so that every array's
  data starts at a file offset that is a multiple of 64 (the NPY header is itself a
  multiple of 64 bytes long).
- `read_npz` parses the archive from a bytes-like buffer (e.g. the file read once, after its
  SHA-256 was checked) and returns NumPy *views* into that buffer: no per-member copy and no
  per-member CRC-32 (the caller's SHA-256 of the whole file covers that). Object dtypes are
  refused, so nothing is ever unpickled; compressed, encrypted or ZIP64 archives are refused
  with a clear error (use ``np.load`` for those).

Member mtimes are fixed (1980-01-01), so equal arrays give byte-identical files.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np

try:  # ISA-L's CRC-32 (carry-less multiplication): the checksum zlib computes, several times faster
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # a platform without isal wheels
    _crc32 = zlib.crc32

__all__ = ["NpzFormatError", "aligned_buffer", "read_npz", "read_npz_file", "write_npz"]

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # signature .. extra length (30 bytes)
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # 46 bytes
_END = struct.Struct("<IHHHHIIH")  # 22 bytes
_LOCAL_SIG, _CENTRAL_SIG, _END_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_ALIGN = 64
_PAD_ID = 0xD935
_DOS_DATE = 0x21  # 1980-01-01, time 00:00
_MAX32 = 0xFFFFFFFF


class NpzFormatError(ValueError):
    """The buffer is not an uncompressed .npz archive this module can read."""


def _npy_header(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
    return buf.getvalue()


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> tuple[int, str]:
    """Write `arrays` as an uncompressed .npz to `path`; return (bytes, SHA-256 hex digest)."""
    sha = hashlib.sha256()
    central = []
    offset = 0
    with open(path, "wb") as f:

        def put(data) -> None:
            nonlocal offset
            f.write(data)
            sha.update(data)
            offset += len(data)

        for key, value in arrays.items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"write_npz: array {key!r} has an object dtype; only plain dtypes are stored")
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            header = _npy_header(arr)
            payload = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b""
            size = len(header) + len(payload)
            name = f"{key}.npy".encode()
            pad = (-(offset + _LOCAL.size + len(name))) % _ALIGN
            if 0 < pad < 4:
                pad += _ALIGN
            if size >= _MAX32 or offset >= _MAX32:
                raise ValueError(f"write_npz: {path} would exceed 4 GiB (member {key!r}); write fewer arrays per file")
            extra = struct.pack("<HH", _PAD_ID, pad - 4) + bytes(pad - 4) if pad else b""
            crc = _crc32(payload, _crc32(header))
            local_offset = offset
            put(_LOCAL.pack(_LOCAL_SIG, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(name), len(extra)) + name + extra)
            put(header)
            if len(payload):
                put(payload)
            central.append((name, crc, size, local_offset))
        cd_start = offset
        for name, crc, size, local_offset in central:
            put(
                _CENTRAL.pack(
                    _CENTRAL_SIG, 20, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(name), 0, 0, 0, 0, 0, local_offset
                )
                + name
            )
        cd_size = offset - cd_start
        put(_END.pack(_END_SIG, 0, 0, len(central), len(central), cd_size, cd_start, 0))
    return offset, sha.hexdigest()


def read_npz(buffer) -> dict[str, np.ndarray]:
    """Arrays of an uncompressed .npz held in `buffer` (bytes, bytearray, memoryview),
    as views into it (writable when the buffer is). Raises NpzFormatError when damaged."""
    mv = memoryview(buffer).cast("B")
    n = len(mv)
    if n < _END.size:
        raise NpzFormatError(f"{n} bytes is too short for a .npz archive")
    end = _END.unpack_from(mv, n - _END.size)
    if end[0] != _END_SIG:
        raise NpzFormatError("no ZIP end-of-central-directory record at the end (truncated, or has a comment)")
    entries, cd_size, cd_start = end[4], end[5], end[6]
    if cd_start + cd_size + _END.size != n:
        raise NpzFormatError("ZIP central directory does not end where the archive ends (truncated or ZIP64)")
    out: dict[str, np.ndarray] = {}
    pos = cd_start
    for _ in range(entries):
        if pos + _CENTRAL.size > n:
            raise NpzFormatError("ZIP central directory is cut short")
        c = _CENTRAL.unpack_from(mv, pos)
        if c[0] != _CENTRAL_SIG:
            raise NpzFormatError(f"bad ZIP central directory entry at byte {pos}")
        flags, method, csize, usize, name_len, extra_len, comment_len, local = (
            c[3],
            c[4],
            c[8],
            c[9],
            c[10],
            c[11],
            c[12],
            c[16],
        )
        name = bytes(mv[pos + _CENTRAL.size : pos + _CENTRAL.size + name_len]).decode()
        pos += _CENTRAL.size + name_len + extra_len + comment_len
        if method != 0 or flags & 1 or csize != usize:
            raise NpzFormatError(f"member {name!r} is compressed or encrypted; only uncompressed .npz is read here")
        if local + _LOCAL.size > n:
            raise NpzFormatError(f"member {name!r} starts beyond the end of the archive")
        h = _LOCAL.unpack_from(mv, local)
        if h[0] != _LOCAL_SIG:
            raise NpzFormatError(f"member {name!r}: bad ZIP local header at byte {local}")
        start = local + _LOCAL.size + h[9] + h[10]
        if start + usize > n:
            raise NpzFormatError(f"member {name!r} runs past the end of the archive (truncated)")
        out[name[:-4] if name.endswith(".npy") else name] = _npy_view(mv, start, usize, name)
    return out


def _npy_view(mv: memoryview, start: int, size: int, name: str) -> np.ndarray:
    head = io.BytesIO(mv[start : start + min(size, 65536 + 16)])
    try:
        version = np.lib.format.read_magic(head)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
    except Exception as exc:
        raise NpzFormatError(f"member {name!r}: not an NPY array ({exc})") from exc
    if dtype.hasobject:
        raise NpzFormatError(f"member {name!r} has an object dtype; refusing to unpickle")
    count = int(np.prod(shape, dtype=np.int64))
    data_start = start + head.tell()
    if data_start + count * dtype.itemsize > start + size:
        raise NpzFormatError(f"member {name!r}: array data is cut short")
    arr = np.frombuffer(mv, dtype=dtype, count=count, offset=data_start)
    if arr.ctypes.data % dtype.alignment:
        arr = arr.copy()  # e.g. a file written by np.savez: members are not aligned
    return arr.reshape(shape, order="F" if fortran else "C")


def aligned_buffer(size: int) -> np.ndarray:
    """A writable uint8 buffer of `size` bytes starting at a 64-byte aligned address, so the
    views `read_npz` returns from a `write_npz` file are aligned too."""
    raw = np.empty(size + _ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + size]


def read_npz_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """`read_npz` of a whole file (read into one aligned, writable buffer)."""
    data = aligned_buffer(Path(path).stat().st_size)
    with open(path, "rb") as f:
        f.readinto(data)
    return read_npz(data)

"""graphs.formats.npzio: streamed, aligned .npz files that np.load reads, and the zero-copy reader."""

import numpy as np
import pytest

from graphs.formats.npzio import NpzFormatError, read_npz, read_npz_file, write_npz
from graphs.infra.storage import file_sha256


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "weights": rng.normal(size=(7, 3)).astype(np.float32),
        "count": np.int64(7),
        "indices": np.arange(13, dtype=np.int32),
        "empty": np.empty(0, dtype=np.int8),
        "fortran": np.asfortranarray(rng.normal(size=(4, 6))),
        "mask": np.array([True, False, True]),
    }


def test_write_npz_is_a_valid_npz_with_aligned_members_and_its_sha256(tmp_path):
    arrays = _arrays()
    size, digest = write_npz(tmp_path / "a.npz", arrays)
    assert size == (tmp_path / "a.npz").stat().st_size
    assert digest == file_sha256(tmp_path / "a.npz")
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:  # zipfile checks every CRC-32 here
        assert sorted(z.files) == sorted(arrays)
        for k, v in arrays.items():
            assert np.array_equal(z[k], v) and z[k].dtype == np.asarray(v).dtype
    ours = read_npz_file(tmp_path / "a.npz")
    for k, v in arrays.items():
        assert np.array_equal(ours[k], v) and ours[k].shape == np.shape(v) and ours[k].dtype == np.asarray(v).dtype
        if ours[k].size:
            assert ours[k].ctypes.data % 64 == 0  # a view into the buffer, 64-byte aligned
    assert write_npz(tmp_path / "b.npz", arrays)[1] == digest  # deterministic bytes


def test_read_npz_returns_views_and_reads_np_savez_files(tmp_path):
    arrays = _arrays()
    write_npz(tmp_path / "a.npz", arrays)
    buf = bytearray((tmp_path / "a.npz").read_bytes())  # any writable buffer
    views = read_npz(buf)
    views["indices"][0] = 99  # writes through to the buffer: no copy was made
    assert read_npz(buf)["indices"][0] == 99
    np.savez(tmp_path / "s.npz", **arrays)  # unaligned members are copied, still correct
    assert all(np.array_equal(read_npz_file(tmp_path / "s.npz")[k], v) for k, v in arrays.items())


def test_damaged_or_unsupported_archives_are_refused(tmp_path):
    write_npz(tmp_path / "a.npz", _arrays())
    data = (tmp_path / "a.npz").read_bytes()
    for cut in (10, len(data) // 2, len(data) - 1):
        with pytest.raises(NpzFormatError):
            read_npz(data[:cut])
    np.savez_compressed(tmp_path / "c.npz", x=np.arange(100))
    with pytest.raises(NpzFormatError, match="compressed"):
        read_npz_file(tmp_path / "c.npz")
    np.savez(tmp_path / "o.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(NpzFormatError, match="object dtype"):
        read_npz_file(tmp_path / "o.npz")
    with pytest.raises(TypeError, match="object dtype"):
        write_npz(tmp_path / "p.npz", {"x": np.array([None], dtype=object)})

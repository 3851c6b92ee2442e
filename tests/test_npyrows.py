"""graphs.formats.npyrows: windowed gathers that drop mapped pages, row-range reads, pwrite-written .npy files."""

import numpy as np
import pytest

from graphs.formats.npyrows import NpyRowWriter, read_rows, release, take_rows
from graphs.kernels.quantize import EncodedFeatures, quantize_int8_columns


@pytest.fixture
def mapped(tmp_path):
    x = np.arange(5000 * 6, dtype=np.float32).reshape(5000, 6) * 0.5 - 7.0
    np.save(tmp_path / "x.npy", x)
    return x, np.load(tmp_path / "x.npy", mmap_mode="r")


@pytest.mark.parametrize(
    "ids",
    [
        np.arange(100, 4000, 7),  # one ascending run
        np.concatenate([np.arange(2000, 2100), [0, 5, 5, 1999, 2100, 4999]]),  # a chunk then its neighbours
        np.array([4999, 3, 3, 2500, 0, 17, 4000, 12, 1, 4998, 2, 8, 7, 6]),  # many runs: sorted first
        np.array([], dtype=np.int64),
    ],
)
def test_take_rows_equals_np_take_in_small_windows(mapped, ids):
    x, m = mapped
    # a window of 3 rows: hundreds of windows, each dropped after its rows are copied
    got = take_rows(m, ids, window_bytes=3 * 6 * 4)
    assert got.dtype == np.float32 and got.shape == (len(ids), 6)
    np.testing.assert_array_equal(got, x[ids])
    out = np.full((len(ids), 6), np.nan, dtype=np.float32)
    assert take_rows(m, ids, out=out) is out
    np.testing.assert_array_equal(out, x[ids])
    np.testing.assert_array_equal(take_rows(x, ids), x[ids])  # a plain array: nothing to drop


def test_take_rows_refuses_ids_out_of_range_and_a_wrong_out(mapped):
    _, m = mapped
    with pytest.raises(IndexError, match=r"\[0, 5000\)"):
        take_rows(m, np.array([1, 5000]))
    with pytest.raises(IndexError):
        take_rows(m, np.array([-1, 2]))
    with pytest.raises(ValueError, match="out is"):
        take_rows(m, np.array([1, 2]), out=np.empty((3, 6), dtype=np.float32))


def test_read_rows_and_release_keep_the_values(mapped):
    x, m = mapped
    np.testing.assert_array_equal(read_rows(m, 17, 4321), x[17:4321])
    one_d = m[:, 2]  # a strided view: copied, nothing dropped
    np.testing.assert_array_equal(read_rows(one_d, 3, 9), x[3:9, 2])
    release(m)
    release(x)  # no mapping: a no-op
    np.testing.assert_array_equal(np.asarray(m), x)  # the pages come back from the page cache


def test_npy_row_writer_writes_an_npy_file_by_row_ranges(tmp_path):
    x = np.random.default_rng(0).standard_normal((1000, 3, 4)).astype(np.float32)
    path = tmp_path / "out.npy"
    with NpyRowWriter(path, np.float32, x.shape) as w:
        for start in (600, 0, 200):  # any order
            w.write(start, x[start : start + 200])
        w.write(800, x[800:].astype(np.float64))  # cast to the file's dtype
        with pytest.raises(ValueError, match="do not fit"):
            w.write(900, x[:200])
    got = np.load(path)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got[:400], x[:400])
    np.testing.assert_array_equal(got[600:], x[600:])
    assert not got[400:600].any()  # never written: zeros
    np.testing.assert_array_equal(np.load(path, mmap_mode="r")[600:800], x[600:800])


@pytest.mark.parametrize("encoding", ["fp32", "int8"])
def test_encoded_gather_with_release_equals_the_plain_gather(tmp_path, encoding):
    x = np.random.default_rng(1).standard_normal((3000, 16)).astype(np.float32)
    if encoding == "fp32":
        np.save(tmp_path / "x.npy", x)
        feats = EncodedFeatures("fp32", 3000, 16, {"x": np.load(tmp_path / "x.npy", mmap_mode="r")})
    else:
        q, scale, zero = quantize_int8_columns(x)
        np.save(tmp_path / "q.npy", q)
        arrays = {"q": np.load(tmp_path / "q.npy", mmap_mode="r"), "scale": scale, "zero_point": zero}
        feats = EncodedFeatures("int8", 3000, 16, arrays)
    ids = np.concatenate([np.arange(1000, 1500), np.array([2, 2999, 7, 1500])])
    np.testing.assert_array_equal(feats.gather(ids, release=True), feats.gather(ids))


def test_page_runs_merge_touching_pages_and_rows_spanning_pages():
    from graphs.formats.npyrows import _PAGE, page_runs

    # 512-byte rows: two on page 0, one on page 2, one across pages 2-3, one on page 10
    starts = np.array([0, 512, 2 * _PAGE, 3 * _PAGE - 100, 10 * _PAGE])
    first, last = page_runs(starts, 512)
    assert list(zip(first.tolist(), last.tolist())) == [(0, 0), (2, 3), (10, 10)]
    # rows longer than a page: [0, 10000) and [10000, 20000) share page 2, so one run to page 4;
    # a row starting on the page right after a run's last page joins it
    first, last = page_runs(np.array([0, 10000, 5 * _PAGE]), 10000)
    assert list(zip(first.tolist(), last.tolist())) == [(0, 7)]


def test_prefetch_rows_advises_each_page_run_of_a_mapping_and_nothing_else(mapped):
    from graphs.formats.npyrows import _PAGE, page_runs, prefetch_rows

    x, m = mapped
    ids = np.array([4000, 3, 2, 2500, 2501, 4999])  # any order: sorted first
    row = 6 * 4
    first, _ = page_runs(m.offset + np.sort(ids) * row, row)
    # 24-byte rows after a 128-byte header: rows 2-3 share page 0, 2500-2501 page 14; 4000 and 4999
    # are on pages 23 and 29
    assert ((m.offset + np.sort(ids) * row) // _PAGE).tolist() == [0, 0, 14, 14, 23, 29]
    assert prefetch_rows(m, ids) == len(first) == 4
    assert prefetch_rows(x, ids) == 0  # not memory-mapped: nothing to advise
    assert prefetch_rows(m, np.array([], dtype=np.int64)) == 0
    np.testing.assert_array_equal(np.take(np.asarray(m), ids, axis=0), x[ids])  # reads are unchanged

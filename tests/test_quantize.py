"""INT8 / 4-bit / bit-packed encodings: error bounds, exact cases, torch == NumPy, layouts."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from graphs.kernels.quantize import (
    ENCODINGS,
    choose_encoding,
    column_min_max,
    dequantize_int4_columns,
    dequantize_int8_columns,
    encode_features,
    is_binary,
    pack_binary,
    quantize_int4_columns,
    quantize_int8_columns,
    reconstruction_error,
    unpack_binary,
    unpack_int4,
)
from graphs.kernels.quantize_csr import dequantize_int8_rows_csr, quantize_int8_rows_csr
from graphs.kernels.quantize_torch import (
    dequantize_int4_rows_torch,
    dequantize_int8_rows_csr_torch,
    dequantize_rows_torch,
    unpack_binary_torch,
    unpack_int4_torch,
)


def _features(seed: int = 0, n: int = 3000) -> np.ndarray:
    """Columns of different shapes: normal, offset, log-normal, tiny range, constant, +-1e6."""
    rng = np.random.default_rng(seed)
    cols = [
        rng.normal(size=n),
        rng.normal(loc=1000.0, scale=0.01, size=n),
        rng.lognormal(mean=0.0, sigma=2.0, size=n),
        rng.uniform(-1e-6, 1e-6, size=n),
        np.full(n, -3.25),
        rng.uniform(-1e6, 1e6, size=n),
        rng.integers(0, 2, size=n).astype(float),
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def _float_slack(x: np.ndarray) -> np.ndarray:
    """Per-column float32 rounding allowance on top of scale / 2."""
    return 4 * np.spacing(np.abs(x).max(axis=0))


def test_int8_error_at_most_half_a_step_per_column():
    x = _features()
    q, scale, zero = quantize_int8_columns(x)
    assert q.dtype == np.int8 and scale.dtype == zero.dtype == np.float32
    x_hat = dequantize_int8_columns(q, scale, zero)
    err = np.abs(x_hat.astype(np.float64) - x).max(axis=0)
    assert (err <= scale / 2 + _float_slack(x)).all()
    lo, hi = x.min(axis=0), x.max(axis=0)
    np.testing.assert_allclose(scale, (hi.astype(np.float64) - lo) / 255, rtol=1e-6)
    # the whole code range is used: min -> -128, max -> 127 (except the constant column)
    assert q.min() == -128 and q.max() == 127


def test_constant_and_binary_columns_are_exact_under_int8_and_int4():
    x = _features()
    for enc in ("int8", "int4"):
        x_hat = encode_features(x, enc).decode()
        np.testing.assert_array_equal(x_hat[:, 4], x[:, 4])  # constant
        np.testing.assert_array_equal(x_hat[:, 6], x[:, 6])  # 0/1
    _, scale, zero = quantize_int8_columns(x)
    assert scale[4] == 0.0 and zero[4] == np.float32(-3.25)


def test_int8_column_min_and_max_decode_exactly_after_the_scale_nudge():
    # with scale = fl((hi - lo) / 255) this column's min decodes 1 ulp off; the nudged
    # scale (a few ulps away) makes both endpoints exact
    x = np.array([[1.042513370513916], [4.248000144958496], [2.0]], dtype=np.float32)
    plain = np.float32((np.float64(x[1, 0]) - np.float64(x[0, 0])) / 255)
    plain_zero = x[0, 0] + np.float32(128) * plain
    assert np.float32(-128) * plain + plain_zero != x[0, 0]
    q, scale, zero = quantize_int8_columns(x)
    x_hat = dequantize_int8_columns(q, scale, zero)
    assert x_hat[0, 0] == x[0, 0] and x_hat[1, 0] == x[1, 0]
    assert scale[0] != plain and abs(scale[0] - plain) <= 3 * np.spacing(plain)


def test_chunked_equals_one_block_and_works_on_a_memmap(tmp_path):
    x = _features(n=1001)
    path = tmp_path / "feat.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    out = np.lib.format.open_memmap(tmp_path / "q.npy", mode="w+", dtype=np.int8, shape=x.shape)
    q_chunked, s1, z1 = quantize_int8_columns(mm, chunk_rows=37, out=out)
    q_whole, s2, z2 = quantize_int8_columns(x)
    assert q_chunked is out
    np.testing.assert_array_equal(np.asarray(q_chunked), q_whole)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(z1, z2)
    p1, *_ = quantize_int4_columns(mm, chunk_rows=10)
    p2, *_ = quantize_int4_columns(x)
    np.testing.assert_array_equal(p1, p2)


def test_memmap_passes_hold_one_block_at_a_time(tmp_path):
    # 100k x 64 float32 = 25.6 MB on disk; a float64 copy of it would be 51 MB
    rng = np.random.default_rng(4)
    x = np.lib.format.open_memmap(tmp_path / "f.npy", mode="w+", dtype=np.float32, shape=(100_000, 64))
    for a in range(0, 100_000, 25_000):
        x[a : a + 25_000] = rng.normal(size=(25_000, 64))
    out = np.lib.format.open_memmap(tmp_path / "q.npy", mode="w+", dtype=np.int8, shape=x.shape)
    tracemalloc.start()
    try:
        quantize_int8_columns(x, chunk_rows=2_000, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # a few 2000-row float64 blocks (1 MB each), not the array


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_is_rejected_with_its_position(bad):
    x = _features(n=50)
    x[17, 2] = bad
    with pytest.raises(ValueError, match="row 17, column 2"):
        quantize_int8_columns(x, chunk_rows=8)
    with pytest.raises(ValueError, match="row 17, column 2"):
        quantize_int4_columns(x)
    with pytest.raises(ValueError, match="no rows"):
        column_min_max(np.zeros((0, 3), dtype=np.float32))


def test_torch_int8_dequantize_equals_numpy():
    x = _features()
    q, scale, zero = quantize_int8_columns(x)
    rows = np.array([5, 0, 2999, 5, 17])
    got = dequantize_rows_torch(torch.from_numpy(q[rows]), torch.from_numpy(scale), zero)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), dequantize_int8_columns(q, scale, zero)[rows])


@pytest.mark.parametrize("d", [6, 7])
def test_int4_error_bound_packing_and_torch(d):
    x = _features()[:, :d]
    packed, scale, zero = quantize_int4_columns(x)
    assert packed.shape == (x.shape[0], (d + 1) // 2) and packed.dtype == np.uint8
    x_hat = dequantize_int4_columns(packed, scale, zero, d)
    assert (np.abs(x_hat.astype(np.float64) - x).max(axis=0) <= scale / 2 + _float_slack(x)).all()
    codes = unpack_int4(packed, d)
    assert codes.max() <= 15
    np.testing.assert_array_equal(unpack_int4_torch(torch.from_numpy(packed), d).numpy(), codes)
    got = dequantize_int4_rows_torch(torch.from_numpy(packed), scale, zero, d)
    np.testing.assert_array_equal(got.numpy(), x_hat)


def test_int4_nibble_order_by_hand():
    # column 0 -> low nibble, column 1 -> high nibble; an odd last column pads with 0
    x = np.array([[0.0, 15.0, 1.0], [15.0, 0.0, 2.0]], dtype=np.float32)
    x[:, 2] = [0.0, 15.0]
    packed, scale, zero = quantize_int4_columns(x)
    np.testing.assert_array_equal(scale, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(packed, [[0xF0, 0x00], [0x0F, 0x0F]])


def test_binary_pack_is_exact_and_laid_out_little_endian():
    rng = np.random.default_rng(3)
    x = (rng.random((257, 19)) < 0.2).astype(np.float32)
    assert is_binary(x) and not is_binary(_features())
    packed = pack_binary(x, chunk_rows=16)
    assert packed.shape == (257, 3) and packed.dtype == np.uint8
    np.testing.assert_array_equal(unpack_binary(packed, 19), x)
    np.testing.assert_array_equal(unpack_binary_torch(torch.from_numpy(packed), 19).numpy(), x)
    one = np.zeros((1, 10), dtype=np.float32)
    one[0, [0, 3, 9]] = 1.0
    np.testing.assert_array_equal(pack_binary(one), [[0b00001001, 0b00000010]])
    with pytest.raises(ValueError, match="row 1, column 2"):
        pack_binary(np.array([[0, 1, 1], [1, 0, 0.5]], dtype=np.float32))


def _csr(rng, rows: int, max_deg: int) -> tuple[np.ndarray, np.ndarray]:
    deg = rng.integers(0, max_deg + 1, size=rows)
    deg[[0, rows // 2, rows - 1]] = 0  # empty rows first, in the middle and last
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return indptr, rng.uniform(0.0, 1.0, size=indptr[-1]).astype(np.float32)


def test_csr_row_int8_error_bound_and_empty_rows():
    rng = np.random.default_rng(5)
    indptr, w = _csr(rng, 500, 12)
    w[indptr[3] : indptr[4]] = 0.0  # an all-zero row
    q, scale = quantize_int8_rows_csr(indptr, w, block_nnz=100)
    assert q.dtype == np.int8 and scale.shape == (500,) and scale.dtype == np.float32
    counts = np.diff(indptr)
    assert (scale[counts == 0] == 0).all() and scale[3] == 0
    rowmax = np.array([np.abs(w[a:b]).max() if b > a else 0.0 for a, b in zip(indptr, indptr[1:])])
    np.testing.assert_allclose(scale, rowmax / 127, rtol=1e-6)
    w_hat = dequantize_int8_rows_csr(indptr, q, scale)
    bound = np.repeat(scale, counts) / 2 + 2 * np.spacing(np.float32(1.0))
    assert (np.abs(w_hat - w) <= bound).all()
    np.testing.assert_array_equal(w_hat[indptr[3] : indptr[4]], 0.0)
    # chunking does not change the result
    q2, scale2 = quantize_int8_rows_csr(indptr, w)
    np.testing.assert_array_equal(q, q2)
    np.testing.assert_array_equal(scale, scale2)
    got = dequantize_int8_rows_csr_torch(torch.from_numpy(indptr), torch.from_numpy(q), scale)
    np.testing.assert_array_equal(got.numpy(), w_hat)


def test_csr_all_rows_empty_and_bad_indptr():
    q, scale = quantize_int8_rows_csr(np.zeros(4, dtype=np.int64), np.zeros(0, dtype=np.float32))
    assert q.size == 0 and np.array_equal(scale, np.zeros(3))
    with pytest.raises(ValueError, match="end at nnz=3"):
        quantize_int8_rows_csr(np.array([0, 2]), np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match="not finite"):
        quantize_int8_rows_csr(np.array([0, 1, 2]), np.array([1.0, np.nan], dtype=np.float32))


def test_encode_features_bytes_and_decode_rows_torch():
    x = (np.random.default_rng(1).random((100, 20)) < 0.5).astype(np.float32)
    sizes = {enc: encode_features(x, enc).nbytes for enc in ENCODINGS}
    assert sizes == {
        "fp32": 100 * 20 * 4,
        "int8": 100 * 20 + 2 * 20 * 4,
        "int4": 100 * 10 + 2 * 20 * 4,
        "binary": 100 * 3,
    }
    for enc in ENCODINGS:
        e = encode_features(x, enc)
        np.testing.assert_array_equal(e.decode(), x)  # 0/1 data is exact everywhere
        np.testing.assert_array_equal(e.decode_rows_torch([4, 2]).numpy(), x[[4, 2]])
    assert encode_features(x, "int8").saving == pytest.approx(1 - 2160 / 8000)
    with pytest.raises(ValueError, match="unknown feature encoding"):
        encode_features(x, "int2")


def test_choose_encoding():
    rng = np.random.default_rng(2)
    assert choose_encoding((rng.random((50, 4)) < 0.5).astype(np.float32)) == "binary"
    uniform = rng.random((5000, 4)).astype(np.float32)  # int4 rel RMS ~ 0.033
    assert choose_encoding(uniform, max_rel_rms=0.05) == "int4"
    assert choose_encoding(uniform, max_rel_rms=0.01) == "int8"
    assert choose_encoding(uniform, max_rel_rms=1e-9) == "fp32"


def test_reconstruction_error_by_hand():
    x = np.array([[3.0, 4.0]], dtype=np.float32)
    err = reconstruction_error(x, np.array([[3.0, 3.5]], dtype=np.float32))
    assert err == {"max_abs_error": 0.5, "rel_rms_error": pytest.approx(0.1)}
    z = np.zeros((2, 2), dtype=np.float32)
    assert reconstruction_error(z, z) == {"max_abs_error": 0.0, "rel_rms_error": 0.0}

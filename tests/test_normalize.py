"""normalized_adjacency library: Â·X against DGL's GraphConv, hand-checked entries, the checks."""

import json
import warnings

import dgl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from graphs.infra.storage import CorruptFileError, write_file_hashes
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
from graphs.stages.normalize import (
    CSR,
    AdjacencyConfig,
    asymmetric_entries,
    build_normalized_adjacency,
    largest_eigenvalue,
    load_csr,
    load_scale_factors,
    perron_guess,
    spectral_radius_bound,
    weight_stats,
)
from tests.conftest import write_edges


def canonical_random(tmp_path, n=300, m=1200, isolated=25, seed=0, symmetrize=True):
    """A random canonical graph whose last `isolated` nodes have no edges."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - isolated, m), rng.integers(0, n - isolated, m)
    write_edges(tmp_path / "in" / "edges.parquet", src, dst)
    pq.write_table(pa.table({"node_id": np.arange(n)}), tmp_path / "in" / "nodes.parquet")
    build_canonical_graph(tmp_path / "in", tmp_path / "canonical", CanonicalConfig(symmetrize=symmetrize))
    return tmp_path / "canonical"


def dgl_graph_of(canonical):
    e = pq.read_table(canonical / "edges.parquet")
    n = json.loads((canonical / "summary.json").read_text())["nodes"]
    src, dst = np.array(e["src"].to_numpy()), np.array(e["dst"].to_numpy())
    return dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)


def spmm(csr: CSR, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        mat = torch.sparse_csr_tensor(
            torch.from_numpy(np.array(csr.indptr)),
            torch.from_numpy(np.array(csr.indices, dtype=np.int64)),
            torch.from_numpy(np.array(csr.weights)),
            size=(csr.n, csr.n),
        )
    return mat @ x


def graphconv(g, x, norm):
    conv = dgl.nn.GraphConv(x.shape[1], x.shape[1], norm=norm, weight=False, bias=False)
    return conv(dgl.add_self_loop(g), x)


@pytest.mark.parametrize("norm", ["both", "right"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_graph_matches_dgl_graphconv(tmp_path, norm, seed):
    canonical = canonical_random(tmp_path, seed=seed)
    # small batches: rows (and their self loops) straddle batch boundaries
    s = build_normalized_adjacency(canonical, tmp_path / "adj", AdjacencyConfig(degree_norm=norm, batch_rows=97))
    csr = load_csr(tmp_path / "adj")
    g = dgl_graph_of(canonical)
    assert s["nnz"] == g.num_edges() + g.num_nodes() == csr.nnz
    assert s["isolated_nodes"] == 25
    assert csr.indptr.dtype == np.int64 and csr.indices.dtype == np.int32 and csr.weights.dtype == np.float32
    x = torch.randn(g.num_nodes(), 7, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(spmm(csr, x), graphconv(g, x, norm), atol=1e-5, rtol=1e-5)
    # isolated node: its only entry is the self loop, weight 1
    last = g.num_nodes() - 1
    assert csr.indptr[last + 1] - csr.indptr[last] == 1
    assert (csr.indices[-1], csr.weights[-1]) == (last, 1.0)


def test_right_norm_is_row_mean_of_a_plus_i(tmp_path):
    canonical = canonical_random(tmp_path, seed=3)
    build_normalized_adjacency(canonical, tmp_path / "adj", AdjacencyConfig(degree_norm="right"))
    csr = load_csr(tmp_path / "adj")
    g = dgl_graph_of(canonical)
    a = g.adj_external(scipy_fmt="csr").toarray() + np.eye(g.num_nodes())
    x = np.random.default_rng(0).normal(size=(g.num_nodes(), 4))
    expected = (a @ x) / a.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(spmm(csr, torch.from_numpy(x).float()).numpy(), expected, atol=1e-5)


def test_hand_checked_path_graph(tmp_path):
    # path 0 - 1 - 2 and isolated 3: degrees with self loops 2, 3, 2, 1
    write_edges(tmp_path / "in" / "edges.parquet", [0, 1], [1, 2])
    pq.write_table(pa.table({"node_id": [0, 1, 2, 3]}), tmp_path / "in" / "nodes.parquet")
    build_canonical_graph(tmp_path / "in", tmp_path / "canonical")
    build_normalized_adjacency(tmp_path / "canonical", tmp_path / "adj")
    csr = load_csr(tmp_path / "adj")
    assert csr.indptr.tolist() == [0, 2, 5, 7, 8]
    assert csr.indices.tolist() == [0, 1, 0, 1, 2, 1, 2, 3]
    r6 = 1 / np.sqrt(6)
    np.testing.assert_allclose(csr.weights, [1 / 2, r6, r6, 1 / 3, r6, r6, 1 / 2, 1.0], rtol=1e-6)

    build_normalized_adjacency(tmp_path / "canonical", tmp_path / "plain", AdjacencyConfig(add_self_loops=False))
    plain = load_csr(tmp_path / "plain")
    assert plain.indptr.tolist() == [0, 1, 3, 4, 4]
    assert plain.indices.tolist() == [1, 0, 2, 1]
    np.testing.assert_allclose(plain.weights, [1 / np.sqrt(2)] * 4, rtol=1e-6)


def test_directed_graph_matches_graphconv_on_reversed_graph(tmp_path):
    canonical = canonical_random(tmp_path, seed=4, symmetrize=False)
    build_normalized_adjacency(canonical, tmp_path / "adj", AdjacencyConfig(degree_norm="both"))
    csr = load_csr(tmp_path / "adj")
    g = dgl_graph_of(canonical)
    x = torch.randn(g.num_nodes(), 5)
    torch.testing.assert_close(spmm(csr, x), graphconv(dgl.reverse(g), x, "both"), atol=1e-5, rtol=1e-5)


def test_cora_matches_dgl_graphconv_and_passes_checks(tmp_path, shared_datasets):
    build_canonical_graph(shared_datasets / "cora", tmp_path / "canonical")
    s = build_normalized_adjacency(tmp_path / "canonical", tmp_path / "adj")
    csr = load_csr(tmp_path / "adj")
    g = dgl_graph_of(tmp_path / "canonical")
    assert (s["nodes"], s["nnz"]) == (2708, 10556 + 2708)
    x = torch.from_numpy(np.load(tmp_path / "canonical" / "features.npy"))
    torch.testing.assert_close(spmm(csr, x), graphconv(g, x, "both"), atol=1e-5, rtol=1e-5)
    assert asymmetric_entries(csr) == 0
    w = weight_stats(csr)
    # no isolated nodes in Cora: the largest weight is a degree-1 node's self loop, 1 / (1 + 1)
    assert w["nonfinite"] == 0 and w["outside_0_1"] == 0 and w["max"] == 0.5
    assert largest_eigenvalue(csr) <= 1 + 1e-4


def test_checks_catch_corrupted_weights(tmp_path):
    canonical = canonical_random(tmp_path, seed=5)
    build_normalized_adjacency(canonical, tmp_path / "adj")
    good = load_csr(tmp_path / "adj", mmap=False)
    assert asymmetric_entries(good) == 0
    assert weight_stats(good) | {"min": 0, "max": 0} == {"nonfinite": 0, "outside_0_1": 0, "min": 0, "max": 0}
    lam = largest_eigenvalue(good)
    assert 0.99 < lam <= 1 + 1e-4

    w = good.weights.copy()
    assert good.indices[10] != 0 and good.indptr[1] > 10  # entry 10 is off-diagonal, in row 0
    w[10] = 2.0  # (0, j) no longer matches (j, 0), nor (j, 0) it
    assert asymmetric_entries(CSR(good.indptr, good.indices, w)) == 2
    assert weight_stats(CSR(good.indptr, good.indices, w))["outside_0_1"] == 1

    w = good.weights.copy()
    w[[3, 7]] = [np.nan, np.inf]
    assert weight_stats(CSR(good.indptr, good.indices, w))["nonfinite"] == 2

    # an entry moved to another column: both it and its old partner lose their mirror
    indices = good.indices.copy()
    row0 = slice(good.indptr[0], good.indptr[1])
    free = np.setdiff1d(np.arange(1, good.n), indices[row0])[0]
    indices[good.indptr[1] - 1] = free
    order = np.argsort(indices[row0])
    indices[row0] = indices[row0][order]
    weights = good.weights.copy()
    weights[row0] = weights[row0][order]
    assert asymmetric_entries(CSR(good.indptr, indices, weights)) == 2

    # every weight 3% too large: still in (0, 1] nearly everywhere, but the spectrum is off
    assert largest_eigenvalue(CSR(good.indptr, good.indices, good.weights * np.float32(1.03))) > 1 + 1e-4


def test_right_norm_eigenvalue_is_one(tmp_path):
    build_normalized_adjacency(
        canonical_random(tmp_path, seed=6), tmp_path / "adj", AdjacencyConfig(degree_norm="right")
    )
    assert abs(largest_eigenvalue(load_csr(tmp_path / "adj")) - 1) < 1e-5


def test_config_validation():
    with pytest.raises(ValueError, match="degree_norm must be one of"):
        AdjacencyConfig(degree_norm="left")
    with pytest.raises(ValueError, match="batch_rows"):
        AdjacencyConfig(batch_rows=0)


# ----------------------------------------------------------------------------- weighted graphs


def canonical_weighted(tmp_path, name, weight_fn, n=250, m=1500, isolated=20, seed=3, symmetrize=True, combine="sum"):
    """A canonical graph with a weight column (weights = weight_fn(rng, m)); last `isolated` nodes bare."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - isolated, m), rng.integers(0, n - isolated, m)
    landing = tmp_path / f"in-{name}"
    landing.mkdir()
    pq.write_table(pa.table({"src": src, "dst": dst, "weight": weight_fn(rng, m)}), landing / "edges.parquet")
    pq.write_table(pa.table({"node_id": np.arange(n)}), landing / "nodes.parquet")
    build_canonical_graph(landing, tmp_path / name, CanonicalConfig(symmetrize=symmetrize, weight_combine=combine))
    return tmp_path / name


def scipy_normalized(canonical, norm: str, loop_weight: float):
    import scipy.sparse as sp

    e = pq.read_table(canonical / "edges.parquet")
    n = json.loads((canonical / "summary.json").read_text())["nodes"]
    a = sp.csr_matrix((e["weight"].to_numpy(), (e["src"].to_numpy(), e["dst"].to_numpy())), shape=(n, n))
    a = a + loop_weight * sp.identity(n, format="csr")
    d_r = np.asarray(a.sum(axis=1)).ravel()
    d_c = np.asarray(a.sum(axis=0)).ravel()
    if norm == "both":
        return sp.diags(d_r**-0.5) @ a @ sp.diags(d_c**-0.5)
    return sp.diags(1.0 / d_r) @ a


@pytest.mark.parametrize("symmetrize", [True, False])
@pytest.mark.parametrize("norm", ["both", "right"])
@pytest.mark.parametrize("loop_weight", [1.0, 2.5])
def test_weighted_adjacency_equals_scipy_and_passes_the_checks(tmp_path, norm, symmetrize, loop_weight):
    canonical = canonical_weighted(
        tmp_path, "canonical", lambda rng, m: rng.lognormal(0.0, 1.5, m), symmetrize=symmetrize
    )
    cfg = AdjacencyConfig(degree_norm=norm, self_loop_weight=loop_weight, batch_rows=333)
    s = build_normalized_adjacency(canonical, tmp_path / "adj", cfg)
    assert s["weighted"] and s["self_loop_weight"] == loop_weight
    csr = load_csr(tmp_path / "adj")
    ref = scipy_normalized(canonical, norm, loop_weight).tocsr()
    ref.sort_indices()
    np.testing.assert_array_equal(np.asarray(csr.indptr), ref.indptr)
    np.testing.assert_array_equal(np.asarray(csr.indices), ref.indices)
    np.testing.assert_allclose(np.asarray(csr.weights), ref.data, rtol=1e-6, atol=0)
    # the asset checks hold for weighted graphs
    stats = weight_stats(csr)
    assert stats["nonfinite"] == 0 and stats["outside_0_1"] == 0
    if norm == "both" and symmetrize:
        assert asymmetric_entries(csr) == 0
    if symmetrize or norm == "right":
        assert largest_eigenvalue(csr, 200) <= 1 + 1e-4


def test_all_one_weights_equal_the_unweighted_adjacency(tmp_path):
    # 'max' keeps duplicate and reverse rows at 1 ('sum' would give them 2, by design)
    weighted = canonical_weighted(tmp_path, "w", lambda rng, m: np.ones(m), combine="max")
    rng = np.random.default_rng(3)
    n, m, isolated = 250, 1500, 20
    src, dst = rng.integers(0, n - isolated, m), rng.integers(0, n - isolated, m)
    write_edges(tmp_path / "in-u" / "edges.parquet", src, dst)
    pq.write_table(pa.table({"node_id": np.arange(n)}), tmp_path / "in-u" / "nodes.parquet")
    build_canonical_graph(tmp_path / "in-u", tmp_path / "u")
    for norm in ("both", "right"):
        build_normalized_adjacency(weighted, tmp_path / f"adj-w-{norm}", AdjacencyConfig(degree_norm=norm))
        build_normalized_adjacency(tmp_path / "u", tmp_path / f"adj-u-{norm}", AdjacencyConfig(degree_norm=norm))
        a, b = load_csr(tmp_path / f"adj-w-{norm}"), load_csr(tmp_path / f"adj-u-{norm}")
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("symmetrize", [True, False])
@pytest.mark.parametrize("norm", ["both", "right"])
@pytest.mark.parametrize("loops", [True, False])
def test_scale_factors_give_every_entry_bit_for_bit(tmp_path, norm, symmetrize, loops):
    canonical = canonical_random(tmp_path, symmetrize=symmetrize, seed=4)
    build_normalized_adjacency(canonical, tmp_path / "adj", AdjacencyConfig(degree_norm=norm, add_self_loops=loops))
    csr, f = load_csr(tmp_path / "adj"), load_scale_factors(tmp_path / "adj", n=300)
    rows = np.repeat(np.arange(csr.n), np.diff(csr.indptr))
    cols = np.asarray(csr.indices)
    if norm == "right":
        assert f.col is None and f.col_path is None
        got = f.row[rows].astype(np.float32)
    else:
        # a symmetric Â keeps one vector: the column scale is the row scale
        assert (f.col is f.row) == symmetrize and (f.col_path == f.row_path) == symmetrize
        got = (f.row[rows] * f.col[cols]).astype(np.float32)
    np.testing.assert_array_equal(got, np.asarray(csr.weights))  # exactly, not within a tolerance


def test_no_scale_factors_where_the_entries_do_not_factor(tmp_path):
    weighted = canonical_weighted(tmp_path, "w", lambda rng, m: rng.lognormal(0.0, 1.5, m))
    s = build_normalized_adjacency(weighted, tmp_path / "adj-w")
    assert s["scale_factors"] is None and load_scale_factors(tmp_path / "adj-w") is None
    canonical = canonical_random(tmp_path)
    s = build_normalized_adjacency(canonical, tmp_path / "adj-s", AdjacencyConfig(self_loop_weight=2.0))
    assert s["scale_factors"] is None and not (tmp_path / "adj-s" / "row_scale.npy").exists()
    build_normalized_adjacency(canonical, tmp_path / "adj", AdjacencyConfig())
    np.save(tmp_path / "adj" / "row_scale.npy", np.ones(299))  # a file that no longer matches
    with pytest.raises(CorruptFileError, match="row_scale.npy: is 2520 bytes, adj published 2528"):
        load_scale_factors(tmp_path / "adj", n=300)
    write_file_hashes(tmp_path / "adj")  # as if published so: the shape check refuses it
    with pytest.raises(ValueError, match="row_scale.npy.*re-materialize normalized_adjacency"):
        load_scale_factors(tmp_path / "adj", n=300)


def test_heavy_edges_get_larger_entries(tmp_path):
    # path 0 - 1 - 2 with w(0,1) = 9, w(1,2) = 1: by hand, D = [10, 11, 2] with s = 1
    landing = tmp_path / "in"
    landing.mkdir()
    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 2], "weight": [9, 1]}), landing / "edges.parquet")
    build_canonical_graph(landing, tmp_path / "c")
    build_normalized_adjacency(tmp_path / "c", tmp_path / "a")
    csr = load_csr(tmp_path / "a")
    d = np.array([10.0, 11.0, 2.0])
    expect = [1 / d[0], 9 / np.sqrt(d[0] * d[1]), 9 / np.sqrt(d[0] * d[1]), 1 / d[1], 1 / np.sqrt(d[1] * d[2])]
    expect += [1 / np.sqrt(d[1] * d[2]), 1 / d[2]]
    np.testing.assert_allclose(np.asarray(csr.weights), expect, rtol=1e-6)


def test_self_loop_weight_validated():
    with pytest.raises(ValueError, match="self_loop_weight"):
        AdjacencyConfig(self_loop_weight=0.0)


def test_asset_checks_pass_on_a_weighted_graph(tmp_path):
    from assets.normalized_adjacency import check_adjacency

    canonical = canonical_weighted(tmp_path, "c", lambda rng, m: rng.pareto(1.5, m) + 0.01)
    cfg = AdjacencyConfig(self_loop_weight=0.5)
    build_normalized_adjacency(canonical, tmp_path / "adj", cfg)
    results = check_adjacency(tmp_path / "adj", cfg, symmetrized=True)
    assert [r.passed for r in results] == [True] * 4
    assert results[0].metadata["asymmetric_entries"].value == 0


# ----------------------------------------------------------------------------- spectral-radius bound


@pytest.mark.parametrize(
    "cfg",
    [
        AdjacencyConfig(),
        AdjacencyConfig(self_loop_weight=2.5),
        AdjacencyConfig(add_self_loops=False),
        AdjacencyConfig(degree_norm="right"),
        AdjacencyConfig(degree_norm="right", add_self_loops=False),
    ],
    ids=["both", "both-s2.5", "both-no-loops", "right", "right-no-loops"],
)
def test_perron_guess_proves_the_spectral_radius_of_a_correct_adjacency(tmp_path, cfg):
    build_normalized_adjacency(canonical_random(tmp_path, seed=8), tmp_path / "adj", cfg)
    csr = load_csr(tmp_path / "adj")
    x = perron_guess(csr, cfg)
    assert (x > 0).all()
    # exact up to float32 weights: the guess is the Perron vector, so the bound is the radius, 1
    assert abs(spectral_radius_bound(csr, x) - 1) < 1e-6
    dense = np.zeros((csr.n, csr.n))
    dense[np.repeat(np.arange(csr.n), np.diff(csr.indptr)), csr.indices] = csr.weights
    assert abs(np.abs(np.linalg.eigvals(dense)).max() - 1) < 1e-5
    # the same in row chunks of a few entries (chunk edges inside and between rows)
    assert spectral_radius_bound(csr, x, chunk=7) == pytest.approx(spectral_radius_bound(csr, x), abs=1e-12)


def test_weighted_perron_guess_uses_the_self_loops(tmp_path):
    canonical = canonical_weighted(tmp_path, "c", lambda rng, m: rng.lognormal(0.0, 1.5, m))
    cfg = AdjacencyConfig(self_loop_weight=0.5)
    build_normalized_adjacency(canonical, tmp_path / "adj", cfg)
    csr = load_csr(tmp_path / "adj")
    assert abs(spectral_radius_bound(csr, perron_guess(csr, cfg), chunk=50) - 1) < 1e-6


def test_spectral_radius_bound_is_an_upper_bound_for_any_positive_vector():
    rng = np.random.default_rng(0)
    n = 40
    dense = rng.random((n, n)) * (rng.random((n, n)) < 0.2)
    indptr = np.concatenate([[0], np.cumsum((dense > 0).sum(axis=1))])
    rows, cols = np.nonzero(dense)
    csr = CSR(indptr, cols.astype(np.int32), dense[rows, cols].astype(np.float32))
    exact = np.zeros((n, n))  # the float32 matrix the bound sees
    exact[rows, cols] = csr.weights
    radius = np.abs(np.linalg.eigvals(exact)).max()
    for _ in range(20):
        x = rng.random(n) + 0.01
        assert spectral_radius_bound(csr, x, chunk=9) >= radius - 1e-9
    # the Perron vector itself gives the radius
    vals, vecs = np.linalg.eig(exact)
    perron = np.abs(vecs[:, np.argmax(np.abs(vals))].real)
    assert spectral_radius_bound(csr, perron + 1e-15) == pytest.approx(radius, rel=1e-6)
    with pytest.raises(ValueError, match="positive"):
        spectral_radius_bound(csr, np.zeros(n))


def test_radius_check_fails_a_mis_scaled_adjacency_and_falls_back_to_power_iteration(tmp_path):
    from assets.normalized_adjacency import SPECTRAL_RADIUS, check_adjacency

    cfg = AdjacencyConfig()
    build_normalized_adjacency(canonical_random(tmp_path, seed=9), tmp_path / "adj", cfg)
    good = {r.check_name: r for r in check_adjacency(tmp_path / "adj", cfg, symmetrized=True)}[SPECTRAL_RADIUS]
    assert good.passed and good.metadata["method"].value == "Collatz-Wielandt bound"
    # off-diagonal weights 3 % too large: every weight stays in (0, 1], the radius does not
    w = np.load(tmp_path / "adj" / "weights.npy")
    csr = load_csr(tmp_path / "adj", mmap=False)
    off = csr.indices != np.repeat(np.arange(csr.n), np.diff(csr.indptr))
    w[off] *= np.float32(1.03)
    assert w.max() <= 1
    np.save(tmp_path / "adj" / "weights.npy", w)
    write_file_hashes(tmp_path / "adj")  # a writer that published these weights
    bad = {r.check_name: r for r in check_adjacency(tmp_path / "adj", cfg, symmetrized=True)}[SPECTRAL_RADIUS]
    assert not bad.passed
    assert bad.metadata["method"].value == "power iteration"
    assert bad.metadata["largest_eigenvalue"].value > 1 + 1e-4

"""benchmarks/frameworks.py: the table's figures from the runs, the records against each peer,
PyG left out (and said why) when it is not installed, and one real run on Cora."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import frameworks  # noqa: E402  (benchmarks/frameworks.py)
import harness  # noqa: E402  (benchmarks/harness.py)


def args_for():
    return frameworks.argparse.Namespace(fanouts="10,5", fanout_list=[10, 5], hidden=8, repeat=2, seed=0)


def fake_runs():
    return {
        "pyg": [
            {"epoch_seconds": [4.0, 2.0], "test_acc": 0.70, "rss": 3 << 30},
            {"epoch_seconds": [3.0, 9.0], "test_acc": 0.72, "rss": 2 << 30},
        ],
        "dgl": [
            {"epoch_seconds": [2.0, 2.0], "test_acc": 0.71, "rss": 1 << 30},
            {"epoch_seconds": [2.0, 6.0], "test_acc": 0.71, "rss": 1 << 30},
        ],
        "gnnflow": [
            {"epoch_seconds": [1.0, 1.0], "test_acc": 0.715, "rss": 1 << 29, "shard_seconds": 4.0},
            {"epoch_seconds": [1.0, 3.0], "test_acc": 0.725, "rss": 1 << 30, "shard_seconds": 6.0},
        ],
    }


def test_summary_and_records_against_each_peer():
    graph = frameworks.GraphRun("generated", 1000, 9000, epochs=2, batch_size=64)
    rows = frameworks.summarize(graph, fake_runs())
    assert rows["pyg"] == {"median": 3.5, "min": 2.0, "max": 9.0, "acc": pytest.approx(0.71), "rss": 3 << 30}
    assert rows["dgl"]["median"] == 2.0 and rows["gnnflow"]["median"] == 1.0
    # the median shard writing (5 s) over 2 epochs added to every epoch figure
    assert rows["amortized"]["median"] == 3.5 and rows["amortized"]["max"] == 5.5
    assert rows["amortized"]["shard_seconds"] == 5.0
    records = frameworks.records(graph, rows, args_for())
    by = {(r.stage.split(": ")[1].split(",")[0], r.peer_name): r for r in records}
    assert len(records) == 6
    epoch = by[("training epoch from shards", "PyG NeighborLoader + SAGEConv")]
    assert epoch.ratio == pytest.approx(1.0 / 3.5) and epoch.met is True and epoch.peer_rss_bytes == 3 << 30
    assert by[("training epoch", "DGL DataLoader + SAGEConv")].ratio == pytest.approx(3.5 / 2.0)
    acc = by[("test accuracy", "DGL DataLoader + SAGEConv")]
    assert acc.ours == pytest.approx(72.0) and "gnnflow - dgl = +1.00 points" in acc.notes
    assert all(r.stage.startswith("DC-SBM 1,000 nodes: ") and r.nodes == 1000 for r in records)
    text = frameworks.table(graph, rows, args_for())
    assert "PyG NeighborLoader + SAGEConv" in text and "gnnflow, shard writing amortized" in text
    assert "3.500   2.000   9.000      71.00        3.00" in text


def test_records_without_pyg_compare_with_dgl_only():
    runs = fake_runs()
    del runs["pyg"]
    graph = frameworks.GraphRun("cora", 2708, 10556, epochs=2, batch_size=32)
    records = frameworks.records(graph, frameworks.summarize(graph, runs), args_for())
    assert {r.peer_name for r in records} == {"DGL DataLoader + SAGEConv"} and len(records) == 3
    assert records[0].stage.startswith("cora: ")


def test_pyg_missing_says_what_to_run(monkeypatch):
    real = frameworks.importlib.util.find_spec
    monkeypatch.setattr(frameworks.importlib.util, "find_spec", lambda m: None if m == "torch_geometric" else real(m))
    assert frameworks.pyg_missing() == "torch_geometric is not installed (`make peers` installs the [peers] extra)"
    monkeypatch.setattr(
        frameworks.importlib.util, "find_spec", lambda m: None if m in ("pyg_lib", "torch_sparse") else object()
    )
    assert "neither is installed" in frameworks.pyg_missing()
    with pytest.raises(SystemExit, match="unknown graph 'reddit'"):
        frameworks.graph_runs(
            frameworks.argparse.Namespace(graphs="cora,reddit", planetoid_epochs=1, planetoid_batch_size=1)
        )


def test_in_make_bench():
    assert "frameworks" in harness.BENCHMARKS
    tiny = harness.bench_args("frameworks", "tiny")
    assert tiny[:4] == ["--graphs", "cora", "--planetoid-epochs", "2"]
    small = harness.bench_args("frameworks", "small")
    assert small[small.index("--repeat") + 1] == "2" and "--graphs" not in small
    large = harness.bench_args("frameworks", "large")
    assert large[large.index("--nodes") + 1] == "1000000"


def test_one_run_on_cora(tmp_path, capsys):
    record = tmp_path / "records.jsonl"
    frameworks.main(
        ["--graphs", "cora", "--planetoid-epochs", "2", "--repeat", "1"]
        + ["--work", str(tmp_path / "work"), "--record", str(record)]
    )
    out = capsys.readouterr().out
    records = harness.read_records(record)
    peers = {r.peer_name for r in records}
    if frameworks.pyg_missing():
        assert "PyG left out: " in out and peers == {"DGL DataLoader + SAGEConv"}
    else:
        assert peers == {"DGL DataLoader + SAGEConv", "PyG NeighborLoader + SAGEConv"}
    assert len(records) == 3 * len(peers)
    for r in records:
        assert r.nodes == 2708 and r.edges == 10556 and r.ratio == pytest.approx(r.ours / r.peer)
        if r.metric == "test accuracy %":
            assert 14 < r.ours <= 100 and 14 < r.peer <= 100  # above chance (7 classes) after 2 epochs
        else:
            assert 0 < r.ours < 60 and 0 < r.peer < 60
    assert "cora: SAGE-mean 2x128, fanouts 10,5, batch 32, 2 epochs x 1 alternating runs" in out

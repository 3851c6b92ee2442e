"""benchmarks/frameworks.py: the table's figures from the runs (seeds, time to target), the records
against each peer, the layer types each side builds, PyG left out (and said why) when it is not
installed, and real runs on Cora."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import frameworks  # noqa: E402  (benchmarks/frameworks.py)
import harness  # noqa: E402  (benchmarks/harness.py)
import train_vs_dgl  # noqa: E402  (benchmarks/train_vs_dgl.py)


def args_for(**kw):
    base = dict(fanouts="10,5", fanout_list=[10, 5], hidden=8, heads=2, repeat=2, seed=0, dropout=0.5, conv="sage")
    return frameworks.argparse.Namespace(**(base | kw))


def fake_runs():
    return {
        "pyg": [
            {"epoch_seconds": [4.0, 2.0], "val_acc": [0.5, 0.8], "test_acc": 0.70, "rss": 3 << 30},
            {"epoch_seconds": [3.0, 9.0], "val_acc": [0.5, 0.6], "test_acc": 0.72, "rss": 2 << 30},
        ],
        "dgl": [
            {"epoch_seconds": [2.0, 2.0], "val_acc": [0.8, 0.9], "test_acc": 0.71, "rss": 1 << 30},
            {"epoch_seconds": [2.0, 6.0], "val_acc": [0.6, 0.7], "test_acc": 0.71, "rss": 1 << 30},
        ],
        "gnnflow": [
            {
                "epoch_seconds": [1.0, 1.0],
                "val_acc": [0.6, 0.7],
                "test_acc": 0.715,
                "rss": 1 << 29,
                "shard_seconds": 4.0,
            },
            {
                "epoch_seconds": [1.0, 3.0],
                "val_acc": [0.6, 0.7],
                "test_acc": 0.725,
                "rss": 1 << 30,
                "shard_seconds": 6.0,
            },
        ],
    }


def test_summary_and_records_against_each_peer():
    graph = frameworks.GraphRun("generated", 1000, 9000, epochs=2, batch_size=64)
    rows = frameworks.summarize(graph, fake_runs())
    assert rows["pyg"] == {
        "median": 3.5,
        "min": 2.0,
        "max": 9.0,
        "acc": pytest.approx(0.71),
        "acc_std": pytest.approx(0.0141421356),  # sample std of 0.70, 0.72
        "runs": 2,
        "rss": 3 << 30,
        "to_target": [],  # no target, no time to it
    }
    assert rows["dgl"]["median"] == 2.0 and rows["gnnflow"]["median"] == 1.0
    # the median shard writing (5 s) over 2 epochs added to every epoch figure
    assert rows["amortized"]["median"] == 3.5 and rows["amortized"]["max"] == 5.5
    assert rows["amortized"]["shard_seconds"] == 5.0
    records = frameworks.records(graph, "sage", rows, args_for())
    by = {(r.stage.split(": ")[1].split(",")[0], r.peer_name): r for r in records}
    assert len(records) == 6
    epoch = by[("training epoch from shards", "PyG NeighborLoader + SAGEConv")]
    assert epoch.ratio == pytest.approx(1.0 / 3.5) and epoch.met is True and epoch.peer_rss_bytes == 3 << 30
    assert by[("training epoch", "DGL DataLoader + SAGEConv")].ratio == pytest.approx(3.5 / 2.0)
    acc = by[("test accuracy", "DGL DataLoader + SAGEConv")]
    assert acc.ours == pytest.approx(72.0) and "gnnflow - dgl = +1.00 points" in acc.notes
    assert all(r.stage.startswith("DC-SBM 1,000 nodes: ") and r.nodes == 1000 for r in records)
    text = frameworks.table(graph, "sage", rows, args_for())
    assert "| PyG NeighborLoader + SAGEConv | 3.500 (2.000–9.000) | 71.00 ± 1.41 | - | 3.00 |" in text
    assert "| gnnflow, shard writing amortized | 3.500 (3.500–5.500) | 72.00 ± 0.71 | - | 1.00 |" in text


def test_time_to_target_per_run_and_amortized():
    graph = frameworks.GraphRun("cora", 2708, 10556, epochs=2, batch_size=32, seeds=(0, 1), target=0.7)
    rows = frameworks.summarize(graph, fake_runs())
    # the training seconds up to the first epoch at or above 0.7; PyG's second run never gets there
    assert rows["pyg"]["to_target"] == [6.0, None] and rows["dgl"]["to_target"] == [2.0, 8.0]
    assert rows["gnnflow"]["to_target"] == [2.0, 4.0]
    assert rows["amortized"]["to_target"] == [7.0, 9.0]  # + 2.5 s of shard writing per epoch trained
    assert frameworks.target_cell(rows["pyg"]["to_target"]) == "6.00 (1/2)"
    assert frameworks.target_cell([None, None]) == "not reached (0/2)"
    records = frameworks.records(graph, "gat", rows, args_for())
    timed = [r for r in records if "validation accuracy 0.7" in r.stage]
    assert [(r.peer_name, r.ours, r.peer) for r in timed] == [
        ("PyG NeighborLoader + GATConv", 3.0, 6.0),
        ("DGL DataLoader + GATConv", 3.0, 5.0),
    ]
    assert timed[0].stage == "cora: training seconds to validation accuracy 0.7, GAT 2x8 (2 heads), fanouts 10,5"
    text = frameworks.table(graph, "gat", rows, args_for())
    assert "| cora (2 epochs, batch 32, 2 seed(s) x 2 run(s), target val acc 0.7) | GAT 2x8 (2 heads) |" in text
    assert "| DGL DataLoader + GATConv | 2.000 (2.000–6.000) | 71.00 ± 0.00 | 5.00 (2/2) |" in text


def test_records_without_pyg_compare_with_dgl_only():
    runs = fake_runs()
    del runs["pyg"]
    graph = frameworks.GraphRun("cora", 2708, 10556, epochs=2, batch_size=32)
    records = frameworks.records(graph, "gcn", frameworks.summarize(graph, runs), args_for())
    assert {r.peer_name for r in records} == {"DGL DataLoader + GraphConv"} and len(records) == 3
    assert records[0].stage.startswith("cora: ") and "GCN 2x8, fanouts 10,5" in records[0].stage


def planetoid_args(**kw):
    base = dict(graphs="cora,citeseer", planetoid_epochs=1, planetoid_batch_size=1, seed=0, seeds=1)
    return frameworks.argparse.Namespace(**(base | {"target_val_acc": frameworks.DEFAULT_TARGETS} | kw))


def test_graphs_seeds_targets_and_convs():
    cora, citeseer = frameworks.graph_runs(planetoid_args(seed=3, seeds=2))
    assert cora.seeds == (3, 4) and (cora.target, citeseer.target) == (0.75, 0.65)
    (cora,) = frameworks.graph_runs(planetoid_args(graphs="cora", target_val_acc="0.5"))
    assert cora.seeds == (0,) and cora.target == 0.5
    (cora,) = frameworks.graph_runs(planetoid_args(graphs="cora", target_val_acc="citeseer=0.5"))
    assert cora.target is None  # no target for this graph: no per-epoch evaluation
    assert frameworks.conv_list("sage,gat") == ["sage", "gat"]
    with pytest.raises(SystemExit, match=r"unknown layer type\(s\) \['gin'\]"):
        frameworks.conv_list("gcn,gin")


def test_compare_runs_every_seed_and_side_alternating(monkeypatch):
    calls = []
    monkeypatch.setattr(frameworks, "run_in_child", lambda fn, side, can, adj, ns: calls.append((side, ns)) or {})
    graph = frameworks.GraphRun("cora", 1, 1, epochs=2, batch_size=4, seeds=(0, 1), target=0.7)
    args = args_for(repeat=2, work="w", batch_size=0, epochs=0)
    runs = frameworks.compare(graph, "gat", {"can": "c", "adj": "a"}, args, ("dgl", "gnnflow"))
    assert [(side, ns.seed) for side, ns in calls] == [(s, seed) for seed in (0, 1) for _ in range(2) for s in runs]
    ns = calls[0][1]
    assert (ns.conv, ns.epochs, ns.batch_size, ns.eval_each_epoch) == ("gat", 2, 4, True)
    assert len(runs["dgl"]) == len(runs["gnnflow"]) == 4


def test_dgl_models_per_conv():
    import dgl
    import torch

    g = dgl.add_self_loop(dgl.graph(([0, 1, 2], [1, 2, 0]), num_nodes=3))
    x = torch.randn(3, 5)
    for conv, layer in (("sage", "SAGEConv"), ("gcn", "GraphConv"), ("gat", "GATConv")):
        model = train_vs_dgl.dgl_model(args_for(conv=conv), 5, 3)
        assert [type(m).__name__ for m in model.layers] == [layer, layer]
        assert model([g, g], x).shape == (3, 3)
    heads = [m._num_heads for m in train_vs_dgl.dgl_model(args_for(conv="gat"), 5, 3).layers]
    assert heads == [2, 1]  # hidden 8 = 2 heads x 4, concatenated; output 1 head


def test_pyg_models_per_conv():
    pytest.importorskip("torch_geometric", reason="PyTorch Geometric is not installed: `make peers`")
    import torch

    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.randn(3, 5)
    for conv, layer in (("sage", "SAGEConv"), ("gcn", "GCNConv"), ("gat", "GATConv")):
        model = frameworks.pyg_model(args_for(conv=conv), 5, 3)
        assert [type(m).__name__ for m in model.layers] == [layer, layer]
        assert model(x, edge_index).shape == (3, 3)
    gat = frameworks.pyg_model(args_for(conv="gat"), 5, 3).layers
    assert [(m.heads, m.out_channels, m.concat) for m in gat] == [(2, 4, True), (1, 3, False)]
    gcn = frameworks.pyg_model(args_for(conv="gcn"), 5, 3).layers
    assert all(m.add_self_loops and m.normalize for m in gcn)


def test_pyg_missing_says_what_to_run(monkeypatch):
    real = frameworks.importlib.util.find_spec
    monkeypatch.setattr(frameworks.importlib.util, "find_spec", lambda m: None if m == "torch_geometric" else real(m))
    assert frameworks.pyg_missing() == "torch_geometric is not installed (`make peers` installs the [peers] extra)"
    monkeypatch.setattr(
        frameworks.importlib.util, "find_spec", lambda m: None if m in ("pyg_lib", "torch_sparse") else object()
    )
    assert "neither is installed" in frameworks.pyg_missing()
    with pytest.raises(SystemExit, match="unknown graph 'reddit'"):
        frameworks.graph_runs(planetoid_args(graphs="cora,reddit"))


def test_in_make_bench():
    assert "frameworks" in harness.BENCHMARKS
    tiny = harness.bench_args("frameworks", "tiny")
    assert tiny[:4] == ["--graphs", "cora", "--planetoid-epochs", "2"]
    small = harness.bench_args("frameworks", "small")
    assert int(small[small.index("--repeat") + 1]) >= 2 and "--graphs" not in small
    large = harness.bench_args("frameworks", "large")
    assert large[large.index("--nodes") + 1] == "1000000"


def run_cora(tmp_path, capsys, *extra: str) -> tuple[str, list]:
    record = tmp_path / "records.jsonl"
    frameworks.main(
        ["--graphs", "cora", "--planetoid-epochs", "2", "--repeat", "1", *extra]
        + ["--work", str(tmp_path / "work"), "--record", str(record)]
    )
    return capsys.readouterr().out, harness.read_records(record)


def check_records(records, out: str, layer: str) -> set[str]:
    peers = {r.peer_name for r in records}
    if frameworks.pyg_missing():
        assert "PyG left out: " in out and peers == {f"DGL DataLoader + {layer}"}
    else:
        assert peers == {f"DGL DataLoader + {layer}", f"PyG NeighborLoader + {layer.replace('GraphConv', 'GCNConv')}"}
    for r in records:
        assert r.nodes == 2708 and r.edges == 10556 and r.ratio == pytest.approx(r.ours / r.peer)
        if r.metric == "test accuracy %":
            assert 14 < r.ours <= 100 and 14 < r.peer <= 100  # above chance (7 classes) after 2 epochs
        else:
            assert 0 < r.ours < 60 and 0 < r.peer < 60
    return peers


def test_one_run_on_cora(tmp_path, capsys):
    out, records = run_cora(tmp_path, capsys)
    peers = check_records(records, out, "SAGEConv")
    assert len([r for r in records if "validation accuracy" not in r.stage]) == 3 * len(peers)
    assert "cora: SAGE 2x128, fanouts 10,5, batch 32, 2 epochs x 1 alternating runs, seeds 0" in out


def test_gcn_and_gat_on_cora_with_two_seeds(tmp_path, capsys):
    out, records = run_cora(tmp_path, capsys, "--convs", "gcn,gat", "--seeds", "2", "--target-val-acc", "0.3")
    gcn = [r for r in records if "GCN 2x128" in r.stage]
    gat = [r for r in records if "GAT 2x128 (4 heads)" in r.stage]
    check_records(gcn, out, "GraphConv")
    check_records(gat, out, "GATConv")
    assert len(gcn) + len(gat) == len(records)
    # every side passes 30% validation accuracy within 2 epochs: a time-to-target record per peer
    assert all(any("validation accuracy 0.3" in r.stage for r in rs) for rs in (gcn, gat))
    assert "| cora (2 epochs, batch 32, 2 seed(s) x 1 run(s), target val acc 0.3) | GCN 2x128 |" in out
    assert "All runs:" in out and "(2/2) |" in out

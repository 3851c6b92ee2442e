"""Stage contracts as objects (`graphs.formats.stage_artifact`): each stage's file names are spelled in
its format owner only, and each stage's reader refuses a folder of another format version,
naming the file, both versions and the stage to re-materialize. Each stage's asset name is one
constant (`STAGE`) of one owner module."""

import ast
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets import evaluation, predictions
from graphs.formats import shard_format
from graphs.formats.stage_artifact import StageArtifact, StageFormatError
from graphs.infra.storage import write_file_hashes
from graphs.stages.canonical import CanonicalGraph, build_canonical_graph, edge_batches, read_summary
from graphs.stages.compress import CompressConfig, CompressedGraph, build_compressed_graph, load_features
from graphs.stages.edge_split import EdgeSplit, EdgeSplitConfig, build_edge_split, load_edge_split
from graphs.stages.normalize import Adjacency, build_normalized_adjacency, load_csr, load_scale_factors
from graphs.stages.partition import PartitionConfig, Partitions, build_partitions, load_parts
from pipelines.definitions import defs
from tests.conftest import write_edges
from training import distdgl, outputs, promotion

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("graphs", "training", "assets", "pipelines", "benchmarks")

# Each owned file name and the one module that may spell it (the writer and every reader use
# the owner's constant). summary.json is every stage's: `StageArtifact.SUMMARY`, whose value
# graphs.infra.storage holds beside its other folder-wide names (hashes.json, run_stats.json).
OWNERS = {
    "graphs/infra/storage.py": [StageArtifact.SUMMARY],
    "graphs/formats/canonical_files.py": [
        CanonicalGraph.EDGES,
        CanonicalGraph.NODES,
        CanonicalGraph.FEATURES,
        CanonicalGraph.DEGREE_PLOT,
    ],
    "graphs/formats/label_classes.py": [CanonicalGraph.LABEL_CLASSES],
    "graphs/stages/normalize.py": [*Adjacency.CSR_FILES, Adjacency.ROW_SCALE, Adjacency.COL_SCALE],
    "graphs/formats/partition_files.py": [
        Partitions.PART_ID,
        Partitions.CLUSTER_ID,
        Partitions.CORE_NODES,
        Partitions.HALO_NODES,
        Partitions.ORIG_NIDS.split("/")[-1],
        Partitions.SIZES_PLOT,
    ],
    "graphs/formats/compress_files.py": [
        *CompressedGraph.FEATURE_FILES.values(),
        CompressedGraph.FEATURE_SCALES,
        CompressedGraph.WEIGHTS_INT8,
        CompressedGraph.WEIGHT_SCALES,
    ],
    "graphs/stages/edge_split.py": list(EdgeSplit.SPLIT_FILES.values()),
}
# A landing folder (user input, `graphs.stages.landing`) shares two names with the canonical graph:
# its writers and readers spell them, and so may a line that names a landing folder.
LANDING_NAMES = {CanonicalGraph.EDGES, CanonicalGraph.NODES}
LANDING_MODULES = {
    "graphs/stages/landing.py",
    "graphs/stages/user_files.py",
    "graphs/synthetic/generate.py",
    "benchmarks/ingest.py",
}


def spelled_outside_owner(rel: str, text: str) -> list[str]:
    """'file:line: name' for each owned file name quoted as a literal in `text` (module `rel`)
    outside its owner, landing uses excepted."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for owner, names in OWNERS.items():
            for name in names:
                if rel == owner or not re.search(rf"[\"']{re.escape(name)}[\"']", line):
                    continue
                if name in LANDING_NAMES and (rel in LANDING_MODULES or "landing" in line):
                    continue
                found.append(f"{rel}:{number}: {name} (owner: {owner})")
    return found


def test_stage_file_names_are_spelled_only_by_their_owner():
    offenders = [
        problem
        for package in PRODUCTION
        for path in sorted((ROOT / package).rglob("*.py"))
        for problem in spelled_outside_owner(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "use the stage artifact's constant instead:\n" + "\n".join(offenders)


def test_the_scan_finds_a_literal_and_spares_the_owner_and_landing_folders():
    assert spelled_outside_owner("training/x.py", 'np.load(d / "part_id.npy")') == [
        "training/x.py:1: part_id.npy (owner: graphs/formats/partition_files.py)"
    ]
    assert spelled_outside_owner("assets/x.py", "f\"{d / 'summary.json'}\"") == [
        "assets/x.py:1: summary.json (owner: graphs/infra/storage.py)"
    ]
    assert spelled_outside_owner("graphs/formats/partition_files.py", 'PART_ID = "part_id.npy"') == []
    assert spelled_outside_owner("benchmarks/x.py", 'if (landing / "nodes.parquet").exists():') == []
    assert spelled_outside_owner("benchmarks/x.py", 'pq.read_table(can / "nodes.parquet")') != []


# ----------------------------------------------------------------------------- version checks


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> dict[str, Path]:
    """Every stage written by its real writer on a 6-node graph with features."""
    root = tmp_path_factory.mktemp("stages")
    write_edges(root / "landing" / "edges.parquet", [0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3])
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    pq.write_table(
        pa.table({"node_id": np.arange(6), "feat": pa.array(list(x), type=pa.list_(pa.float32(), 2))}),
        root / "landing" / "features.parquet",
    )
    d = {name: root / name for name in ("canonical", "adjacency", "partitions", "compressed", "split")}
    build_canonical_graph(root / "landing", d["canonical"])
    build_normalized_adjacency(d["canonical"], d["adjacency"])
    build_partitions(d["canonical"], d["partitions"], PartitionConfig(num_parts=2, write_distdgl=False))
    cfg = CompressConfig(fpr_queries=100, compare_encodings=False)
    build_compressed_graph(d["canonical"], d["adjacency"], d["partitions"], d["compressed"], cfg)
    build_edge_split(d["canonical"], d["split"], EdgeSplitConfig(val_fraction=0.2, test_fraction=0.2, eval_negatives=2))
    return d


def _another_version(folder: Path, tmp_path: Path, name: str = StageArtifact.SUMMARY, nested: str = "") -> Path:
    """A copy of `folder` whose `name` declares format version 99 (in `nested` when given), published
    so (its hashes re-recorded): only the version check can refuse it."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    doc = json.loads((copy / name).read_text())
    (doc[nested] if nested else doc)["format_version"] = 99
    (copy / name).write_text(json.dumps(doc))
    write_file_hashes(copy)
    return copy


def _refused(stage: str, path: Path):
    return pytest.raises(
        StageFormatError,
        match=rf"{re.escape(str(path))}: {stage} format version 99, this reader reads 1; re-materialize {stage}",
    )


def test_each_stage_opens_as_written(stages):
    assert CanonicalGraph.open(stages["canonical"]).num_nodes == 6
    assert Adjacency.open(stages["adjacency"], verify=True).num_nodes == 6
    assert Partitions.open(stages["partitions"]).num_parts == 2
    assert CompressedGraph.open(stages["compressed"], verify=True).manifest["bloom_parts"] == 2
    assert EdgeSplit.open(stages["split"]).summary["split"]["format_version"] == EdgeSplit.FORMAT_VERSION
    assert CanonicalGraph.open(stages["split"]).num_edges == read_summary(stages["split"])["edges"]


def test_canonical_readers_refuse_another_format_version(stages, tmp_path):
    bad = _another_version(stages["canonical"], tmp_path)
    for read in (
        read_summary,
        lambda d: next(edge_batches(d)),
        lambda d: build_normalized_adjacency(d, tmp_path / "a"),
    ):
        with _refused("canonical_graph", bad / "summary.json"):
            read(bad)


def test_adjacency_readers_refuse_another_format_version(stages, tmp_path):
    bad = _another_version(stages["adjacency"], tmp_path)
    for read in (load_csr, load_scale_factors):
        with _refused("normalized_adjacency", bad / "summary.json"):
            read(bad)


def test_partition_readers_refuse_another_format_version(stages, tmp_path):
    bad = _another_version(stages["partitions"], tmp_path)
    with _refused("metis_partitions", bad / "summary.json"):
        load_parts(bad)
    with _refused("metis_partitions", bad / "summary.json"):
        build_compressed_graph(stages["canonical"], stages["adjacency"], bad, tmp_path / "c", CompressConfig())


def test_compressed_readers_refuse_another_version_of_summary_or_manifest(stages, tmp_path):
    bad = _another_version(stages["compressed"], tmp_path / "s")
    with _refused("compressed_graph", bad / "summary.json"):
        load_features(bad)
    bad = _another_version(stages["compressed"], tmp_path / "m", CompressedGraph.MANIFEST)
    with _refused("compressed_graph", bad / "manifest.json"):
        load_features(bad, verify=False)


def test_edge_split_reader_refuses_another_split_version(stages, tmp_path):
    bad = _another_version(stages["split"], tmp_path, nested="split")
    with _refused("edge_split", bad / "summary.json"):
        load_edge_split(bad)
    assert CanonicalGraph.open(bad).num_nodes == 6  # its message-passing graph is still canonical's layout


def test_a_folder_without_its_summary_is_refused_naming_the_stage(stages, tmp_path):
    copy = tmp_path / "adjacency"
    shutil.copytree(stages["adjacency"], copy)
    (copy / "summary.json").unlink()
    with pytest.raises(StageFormatError, match=r"summary.json: missing.*re-materialize normalized_adjacency"):
        load_csr(copy)


# ----------------------------------------------------------------------------- stage (asset) names

# Each stage's asset name and the one module that spells it, as its `STAGE` constant; every other
# module (Dagster's deps, asset keys, folders under storage) uses that constant.
STAGE_OWNERS = {
    CanonicalGraph.STAGE: "graphs/formats/canonical_files.py",
    Adjacency.STAGE: "graphs/stages/normalize.py",
    Partitions.STAGE: "graphs/formats/partition_files.py",
    CompressedGraph.STAGE: "graphs/formats/compress_files.py",
    EdgeSplit.STAGE: "graphs/stages/edge_split.py",
    shard_format.STAGE: "graphs/formats/shard_format.py",
    outputs.STAGE: "training/outputs.py",
    promotion.STAGE: "training/promotion.py",
    evaluation.STAGE: "assets/evaluation.py",
    predictions.STAGE: "assets/predictions.py",
    distdgl.STAGE: "training/distdgl.py",
}
STAGE_PACKAGES = ("graphs", "training", "assets", "pipelines")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of `tree` (module, classes, functions)."""
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _stage_definitions(tree: ast.AST) -> set[int]:
    """ids of the values of ``STAGE = "..."`` assignments (module or class level)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["STAGE"]
    }


def stage_names_outside_owner(rel: str, source: str) -> list[str]:
    """'file:line: name' for each string literal of `source` (module `rel`) that is exactly a stage
    name, docstrings and the owner's ``STAGE = "<name>"`` excepted (comments are not in the ast)."""
    tree = ast.parse(source)
    docstrings, definitions = _docstrings(tree), _stage_definitions(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STAGE_OWNERS):
            continue
        owner = STAGE_OWNERS[node.value]
        if id(node) in docstrings or (rel == owner and id(node) in definitions):
            continue
        found.append((node.lineno, f"{rel}:{node.lineno}: {node.value} (owner: {owner})"))
    return [text for _, text in sorted(found)]


def test_stage_names_are_spelled_only_by_their_owner():
    offenders = [
        problem
        for package in STAGE_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for problem in stage_names_outside_owner(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "use the stage's STAGE constant instead:\n" + "\n".join(offenders)


def test_the_stage_constants_are_the_asset_names():
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == set(STAGE_OWNERS)


@pytest.mark.parametrize(
    "rel,source,expected",
    [
        ("assets/x.py", 'd = storage.asset_dir(dataset, "trained_model")', ["assets/x.py:1: trained_model"]),
        ("assets/x.py", "m = f\"{d / 'canonical_graph'}\"", ["assets/x.py:1: canonical_graph"]),
        ("pipelines/x.py", 'deps = [\n    "promotion",\n]', ["pipelines/x.py:2: promotion"]),
        ("training/x.py", '"""trained_model"""\ndef f():\n    """edge_split"""', []),
        ("training/x.py", 'm = "re-materialize canonical_graph"  # "canonical_graph"', []),
        ("training/outputs.py", 'STAGE = "trained_model"', []),
        ("training/outputs.py", 'OTHER = "trained_model"', ["training/outputs.py:1: trained_model"]),
        ("assets/x.py", 'STAGE = "trained_model"', ["assets/x.py:1: trained_model"]),
    ],
)
def test_the_stage_name_scan_reads_literals_only(rel, source, expected):
    found = [line.split(" (owner")[0] for line in stage_names_outside_owner(rel, source)]
    assert found == expected

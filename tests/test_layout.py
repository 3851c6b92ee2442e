"""The dependency direction of docs/architecture.md: graphs/ and training/ never import Dagster, and
training/ never imports DGL at module level (it must run where DGL cannot be installed)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ["graphs", "training"])
def test_library_packages_never_import_dagster_or_assets(package):
    for path in sorted((ROOT / package).glob("*.py")):
        found = _imports(path, top_level_only=False)
        assert not found & {"dagster", "assets", "pipelines"}, (
            f"{path.name} imports {found & {'dagster', 'assets', 'pipelines'}}"
        )


def test_training_imports_dgl_only_lazily():
    for path in sorted((ROOT / "training").glob("*.py")):
        assert "dgl" not in _imports(path, top_level_only=True), f"{path.name} imports dgl at module level"


def test_graphs_does_not_import_training():
    for path in sorted((ROOT / "graphs").glob("*.py")):
        assert "training" not in _imports(path, top_level_only=False), path.name

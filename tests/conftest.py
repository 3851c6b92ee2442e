import os
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPO_DATASETS = ROOT / "datasets"  # Cora, CiteSeer, email-Eu-core, ego-Facebook (datasets/README.md)
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"


def write_edges(path: Path, src, dst, type_=None) -> Path:
    """Write an edge file with the given columns (type_ e.g. pa.int32(), pa.string())."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"src": pa.array(src, type=type_), "dst": pa.array(dst, type=type_)}), path)
    return path


def datasets_folder() -> Path:
    """The real datasets: the repository's own ``datasets/`` (a fresh clone has them), else a
    ``shared/datasets`` folder beside the checkout."""
    for folder in (REPO_DATASETS, SHARED_DATASETS):
        if (folder / "cora" / "edges.parquet").is_file():
            return folder
    raise FileNotFoundError(f"no datasets in {REPO_DATASETS} (part of the repository) nor {SHARED_DATASETS}")


@pytest.fixture
def shared_datasets() -> Path:
    """The folder holding cora/, citeseer/, email-eu-core/, ego-facebook/ (`datasets_folder`)."""
    return datasets_folder()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> its bytes): what "byte for byte untouched" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def wait_for_path(pattern: str, parent: Path, proc, seconds: float = 300) -> Path:
    """The first path under `parent` matching `pattern`, polled while the process `proc` runs."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(parent.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"{pattern} never appeared under {parent} (exit code {proc.poll()})")


@pytest.fixture
def storage(tmp_path):
    """The storage resource over `tmp_path/home` and `tmp_path/landing`."""
    from assets.common import GnnflowStorage

    return GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))


@pytest.fixture
def instance():
    """A Dagster instance of its own (runs, materializations, partitions), removed afterwards."""
    import dagster as dg

    with dg.instance_for_test() as inst:
        yield inst

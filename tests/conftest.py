import os
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def write_edges(path: Path, src, dst, type_=None) -> Path:
    """Write an edge file with the given columns (type_ e.g. pa.int32(), pa.string())."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"src": pa.array(src, type=type_), "dst": pa.array(dst, type=type_)}), path)
    return path


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS

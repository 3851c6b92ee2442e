"""DuckDB connections whose settings never pass through SQL text.

Settings go in `duckdb.connect(config=...)`; file paths go in as query parameters
(`read_parquet(?)`) or through the relation API (`con.read_parquet(paths)`), never formatted
into a statement. A size such as `memory_limit` is checked against `MEMORY_SIZE` first, so a
run config value like `"1GB'; COPY ... TO '/x'; --"` is refused with a clear error.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

MEMORY_SIZE = re.compile(r"(?i)\d+(\.\d+)?\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)")


def check_memory_size(value: str, name: str = "memory_limit") -> str:
    """`value` when it reads like '4GB' / '512 MiB' / '1.5gb', else ValueError naming `name`."""
    if not isinstance(value, str) or not MEMORY_SIZE.fullmatch(value.strip()):
        raise ValueError(f"{name}={value!r} is not a memory size; write a number and a unit, e.g. '4GB' or '512MiB'")
    return value.strip()


def connect(
    memory_limit: str, *, threads: int = 0, temp_directory: str | os.PathLike | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with these settings (threads 0 = DuckDB's default)."""
    import duckdb  # here: modules that only validate a size (config classes read by training) stay light

    config: dict = {"memory_limit": check_memory_size(memory_limit), "preserve_insertion_order": False}
    if threads:
        config["threads"] = int(threads)
    if temp_directory is not None:
        config["temp_directory"] = str(temp_directory)
    return duckdb.connect(config=config)

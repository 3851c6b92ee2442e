"""DuckDB connections whose settings never pass through SQL text.

Settings go in `duckdb.connect(config=...)`; file paths go through the relation API, never
formatted into a statement, and every file is read by `read_parquet` or `read_csv` here, which
pass each path as a literal (`literal_path`): DuckDB expands `*`, `?` and `[...]` in the paths it reads,
so a landing file named `*.parquet` would otherwise read every file of its folder. A size
such as `memory_limit` is checked against `MEMORY_SIZE` first, so a run config value like
`"1GB'; COPY ... TO '/x'; --"` is refused with a clear error.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Iterable

from graphs.infra.config_checks import bounded_repr

if TYPE_CHECKING:
    import duckdb

# Characters DuckDB's file globbing gives a meaning (braces `{a,b}` it reads as they are); each
# is matched literally as a one-character class, `[*]`: backslash escapes do not work.
GLOB_CHARACTER = re.compile(r"[*?\[]")
MEMORY_SIZE = re.compile(r"(?i)\d+(\.\d+)?\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)")


def check_memory_size(value: str, name: str = "memory_limit") -> str:
    """`value` when it reads like '4GB' / '512 MiB' / '1.5gb', else ValueError naming `name`."""
    if not isinstance(value, str) or not MEMORY_SIZE.fullmatch(value.strip()):
        raise ValueError(
            f"{name}={bounded_repr(value)} is not a memory size; write a number and a unit, e.g. '4GB' or '512MiB'"
        )
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


def literal_path(path: str | os.PathLike) -> str:
    """`path`, made absolute, as a DuckDB file pattern that matches exactly that file: each
    `*`, `?`, `[` becomes a one-character class (`[*]`). Spaces, quotes, braces, `%` and
    other characters need nothing (the path never enters SQL text). A path holding a
    backslash and one of those three cannot be read (DuckDB's globbing matches no name that
    holds a backslash): ValueError naming it."""
    given, path = path, os.path.abspath(os.fspath(path))
    if "\\" in path and GLOB_CHARACTER.search(path):
        raise ValueError(
            f"{given}: DuckDB cannot read a path that holds both a backslash and one of * ? [ "
            "(its file globbing matches no name with a backslash); rename the file or its folder"
        )
    return GLOB_CHARACTER.sub(lambda m: f"[{m.group()}]", path)


def read_parquet(
    con: duckdb.DuckDBPyConnection, paths: Iterable[str | os.PathLike], **options
) -> duckdb.DuckDBPyRelation:
    """A relation over exactly these Parquet files, in this order (each path literal, see
    `literal_path`; no hive partition columns guessed from folder names). `options` go to
    DuckDB's `read_parquet` (e.g. `union_by_name=True`, `file_row_number=True`)."""
    patterns = [literal_path(p) for p in paths]
    if not patterns:
        raise ValueError("read_parquet needs at least one file")
    return con.read_parquet(patterns, hive_partitioning=False, **options)


def read_csv(con: duckdb.DuckDBPyConnection, path: str | os.PathLike, **options) -> duckdb.DuckDBPyRelation:
    """A relation over exactly this text file (the path literal, see `literal_path`; no hive
    partition columns). `options` go to DuckDB's `read_csv` (e.g. `delimiter`, `header`)."""
    return con.read_csv(literal_path(path), hive_partitioning=False, **options)

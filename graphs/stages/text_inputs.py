"""Reading users' text files with DuckDB: first rows, SNAP-style edge lists, errors by line.

The steps of `graphs.stages.user_files` that read a text file and know nothing of the column
mapping: `read_first_row` (the fields that may be a header), `single_delimiter` (whether a
``.txt`` edge list's head uses one tab or one space, so DuckDB's CSV reader can take it),
`whitespace_edges` (the general reader of whitespace-separated lines, blank lines and lines
starting with ``#`` or ``%`` skipped), `strict_read_error` (a read without dialect detection,
whose error names the line at fault). Every DuckDB error becomes an InputError naming the
user's file (`read_error`); `write_relation` and `fetch_table` run a relation with that rule.
"""

from __future__ import annotations

import csv
from pathlib import Path

import duckdb
import pyarrow as pa

from graphs.infra import duck
from graphs.infra.config_checks import bounded_repr, bounded_text
from graphs.stages.landing import InputError

COMMENT_STARTS = ("#", "%")
FIRST_LINE_BYTES = 1 << 20  # of a text file's first line read to find its header
HEAD_BYTES = 1 << 16  # of a .txt edge list read to find its delimiter


def read_first_row(path: Path, delimiter: str) -> list[str]:
    """The fields of a text file's first line (at most `FIRST_LINE_BYTES` read), trimmed."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        line = f.readline(FIRST_LINE_BYTES)
    return [v.strip() for v in next(csv.reader([line], delimiter=delimiter), [])]


def is_number(text: str) -> bool:
    """Whether `text` reads as a number (decimal, float or 0x / 0o / 0b integer)."""
    for parse in (float, lambda t: int(t, 0)):
        try:
            parse(text)
            return True
        except ValueError:
            pass
    return False


def strict_read_error(con, path: Path, delimiter: str, header: bool, width: int) -> Exception | None:
    """The error of reading the file with `width` text columns and no dialect detection (it names
    the first line that does not fit), None when that read succeeds."""
    columns = {f"column{i}": "VARCHAR" for i in range(max(width, 1))}
    try:
        duck.read_csv(
            con,
            path,
            delimiter=delimiter,
            header=header,
            auto_detect=False,
            columns=columns,
            quotechar='"',
            escapechar='"',
        ).aggregate("count(*)").fetchall()
    except duckdb.Error as exc:
        return exc
    return None


def read_error(path: Path, exc: Exception) -> InputError:
    """InputError naming the file, with the first lines of DuckDB's message (they name the line)."""
    lines = [line for line in str(exc).splitlines() if line.strip()][:3]
    return InputError(f"{path}: cannot be read as {path.suffix[1:].upper()}: {bounded_text(' / '.join(lines), 400)}")


def write_relation(rel, target: Path, path: Path) -> None:
    """Write the relation `rel` as the Parquet file `target`; a DuckDB error as `read_error` of `path`."""
    try:
        rel.write_parquet(str(target))
    except duckdb.Error as exc:
        raise read_error(path, exc) from None


def fetch_table(rel, path: Path) -> pa.Table:
    """The relation `rel` as an Arrow table; a DuckDB error as `read_error` of `path`."""
    try:
        table = rel.to_arrow_table()
    except duckdb.Error as exc:
        raise read_error(path, exc) from None
    return table


# ----------------------------------------------------------------------------- whitespace edge lists


def single_delimiter(path: Path) -> tuple[str, str, tuple[str, ...]] | None:
    """(delimiter, comment character, column types) when the data lines among a .txt file's
    first `HEAD_BYTES` split into 2 or 3 non-empty fields on one tab or one space each, and its
    comment lines all start with one character; else None. The ids are read as text
    (`graphs.stages.user_files` types them), a weight as DOUBLE."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read(HEAD_BYTES + 1)
    head = text.splitlines()[:-1] if len(text) > HEAD_BYTES else text.splitlines()  # the last may be cut
    comments = {line.lstrip()[:1] for line in head if line.lstrip()[:1] in COMMENT_STARTS}
    data = [line for line in head if line.strip() and line.lstrip()[:1] not in COMMENT_STARTS]
    if len(comments) > 1 or not data:
        return None
    for delimiter in ("\t", " "):
        rows = [line.split(delimiter) for line in data]
        widths = {len(r) for r in rows}
        if (
            len(widths) == 1
            and widths <= {2, 3}
            and all(f and f == f.strip() and f.isprintable() for r in rows for f in r)
        ):
            width = widths.pop()
            return delimiter, (comments or {"#"}).pop(), ("VARCHAR",) * 2 + ("DOUBLE",) * (width - 2)
    return None


def _column_count_error(rows, path: Path) -> InputError:
    """InputError naming the first line of a .txt edge list whose column count is not 2 or 3, or
    differs from the first edge line's."""
    first_line, first = rows.order("line_number").limit(1).fetchall()[0]
    line, tokens = (first_line, first)
    if len(first) in (2, 3):
        line, tokens = rows.filter(f"len(t) <> {len(first)}").order("line_number").limit(1).fetchall()[0]
    than = f", the first edge line (line {first_line}) {len(first)}" if line != first_line else ""
    return InputError(
        f"{path}: line {line} has {len(tokens)} column(s){than}; an edge list has 2 columns (src dst) or 3 "
        "(src dst weight) on every line"
    )


def whitespace_edges(con, path: Path):
    """A relation (src, dst[, weight]) of a SNAP-style .txt edge list (see `graphs.stages.user_files`):
    ids as text (`graphs.stages.user_files` types them); InputError naming a line whose
    column count differs from the first data line's or whose weight is not a number."""
    try:
        lines = duck.read_csv(
            con, path, columns={"line": "VARCHAR"}, header=False, delimiter="\x01", quotechar="", escapechar=""
        ).project("row_number() OVER () AS line_number, regexp_replace(line, '^\\s+|\\s+$', '', 'g') AS s")
        comment = " OR ".join(f"starts_with(s, '{c}')" for c in COMMENT_STARTS)
        rows = lines.filter(f"s <> '' AND NOT ({comment})").project(
            "line_number, regexp_split_to_array(s, '\\s+') AS t"
        )
        stats = rows.aggregate(
            "count(*), min(len(t)), max(len(t)), "
            "count(*) FILTER (WHERE len(t) > 2 AND TRY_CAST(t[3] AS DOUBLE) IS NULL)"
        ).fetchall()[0]
        count, narrow, wide, bad_weight = stats
        if not count:
            raise InputError(f"{path}: holds no edge lines (only comments or blank lines)")
        if narrow != wide or narrow not in (2, 3):
            raise _column_count_error(rows, path)
        if bad_weight:
            line, tokens = rows.filter("TRY_CAST(t[3] AS DOUBLE) IS NULL").order("line_number").limit(1).fetchall()[0]
            raise InputError(
                f"{path}: line {line}: weight {bounded_repr(tokens[2])} is not a number (the third column is the weight)"
            )
        weight = ", CAST(t[3] AS DOUBLE) AS weight" if wide == 3 else ""
        # file order without a sort: the connection preserves insertion order
        return rows.project(f"t[1] AS src, t[2] AS dst{weight}")
    except duckdb.Error as exc:
        raise read_error(path, exc) from None

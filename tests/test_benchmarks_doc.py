"""BENCHMARKS.md states the current figures: its generated tables are what benchmarks/harness.py
renders from the committed results files. It, the README and docs/ read as documentation, not as
a lab notebook (no tracker references, work rounds, timestamps, commit hashes or machine paths;
outside BENCHMARKS.md no dates)."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402  (benchmarks/harness.py)

BENCHMARKS = ROOT / "BENCHMARKS.md"
PERFORMANCE = ROOT / "docs" / "performance.md"


def test_the_generated_tables_are_rendered_from_the_committed_results():
    regions = harness.generated_regions(BENCHMARKS.read_text())
    sources = [source for source, _ in regions]
    for scale in ("small", "medium", "large"):
        assert f"benchmarks/harness.py {scale}" in sources, f"BENCHMARKS.md has no generated table of {scale}"
        assert (ROOT / "benchmarks" / "results" / f"{scale}.json").is_file()
    assert len(sources) == len(set(sources)), "a generated region appears twice"
    for source, committed in regions:
        assert committed == harness.generated_block(source), (
            f"BENCHMARKS.md's region {source!r} is stale: run `.venv/bin/python benchmarks/harness.py --update-doc`"
        )


def test_every_record_of_a_scale_is_in_its_table_with_its_run():
    for scale in ("small", "medium", "large"):
        results = harness.read_results(harness.RESULTS_DIR / f"{scale}.json")
        table = harness.render_markdown(scale)
        rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| stage ")]
        assert len(rows) == len(results["records"]) + 1  # + the separator row
        days = {results["date"][:10]} | {run["date"][:10] for run in results.get("earlier_runs", [])}
        for row in rows[1:]:
            assert row.rstrip(" |").rsplit(", ", 1)[-1] in days, row  # the run column ends with its day
        assert not re.search(r"\d\d:\d\d", table), "the tables give days, not times of day"


def test_update_doc_rewrites_a_stale_region_and_leaves_the_rest(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "intro `<!-- generated: not a region -->`\n\n"
        "<!-- generated: benchmarks/harness.py large -->\nold table\n<!-- end generated -->\n\ntail\n"
    )
    assert harness.update_doc(doc) == ["benchmarks/harness.py large"]
    text = doc.read_text()
    assert text.startswith("intro `<!-- generated: not a region -->`\n\n") and text.endswith("\ntail\n")
    assert harness.generated_regions(text) == [("benchmarks/harness.py large", harness.render_markdown("large"))]
    assert harness.update_doc(doc) == []  # up to date
    with pytest.raises(ValueError, match="unknown source"):
        harness.generated_block("benchmarks/nothing.py")


# What a lab notebook leaves behind and the current state does not carry.
NOTEBOOK = {
    "a tracker reference": re.compile(r"\bissues?\s+#?\d+[a-z]?\b", re.IGNORECASE),
    "a time of day": re.compile(r"\b\d\d:\d\d(?::\d\d)?\s*UTC\b|\bUTC\b"),
    "a development machine's path": re.compile(r"(?<![\w.])/(?:work|root|home|tmp)/"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
}
ROUND_HEADING = re.compile(r"^#+ .*\bround\s+\d+", re.IGNORECASE | re.MULTILINE)


DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", [BENCHMARKS, ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_no_lab_notebook_traces(path):
    text = path.read_text()
    found = [
        f"{what} at line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for what, pattern in NOTEBOOK.items()
        for m in pattern.finditer(text)
    ]
    found += [f"a heading of a work round: {m.group(0)!r}" for m in ROUND_HEADING.finditer(text)]
    assert not found, f"{path.name}: " + "; ".join(found)


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_the_readme_and_the_docs_carry_no_dates(path):
    """They describe the project as it is; only BENCHMARKS.md dates its runs."""
    found = re.findall(r"\b20\d\d-\d\d-\d\d\b", path.read_text())
    assert not found, f"{path.name}: dates {found}"


def test_performance_doc_has_no_dates_and_covers_every_stage():
    text = PERFORMANCE.read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "docs/performance.md is design knowledge: no dates"
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    for stage in ("Ingest", "Normalization", "METIS", "Compression", "Shard writing", "Shard reading", "Training"):
        assert any(h.startswith(stage) for h in headings), f"docs/performance.md has no section on {stage}"
    assert any(h.startswith("Evaluation") for h in headings)


def test_the_hygiene_patterns_catch_what_they_are_for():
    notebook = (
        "## Ingest, round 5 (issue 13)\nissue 13a; 2026-12-02 18:25 UTC; --baseline-code /work/main; commit f24b87e\n"
    )
    assert ROUND_HEADING.search(notebook)
    for what, pattern in NOTEBOOK.items():
        assert pattern.search(notebook), what
    clean = "1,964,556 edges at 3.0e-08; 0.25 GB; DGL 2.1; `/dev/null`; tissue 3; a fanout of 15,10,5"
    assert not any(pattern.search(clean) for pattern in NOTEBOOK.values())

"""The README and docs/ stay true: every command of the README's bash blocks is one a test runs,
its landing example and settings are read by gnnflow as written, and every relative link of
README.md and docs/*.md (file and #heading) resolves.

The commands themselves run in tests/test_cli_backfill.py (`readme_command(prefix)` finds the one
README line starting with that prefix and runs it verbatim) and below; COMMANDS names, for every
prefix a README command may start with, the test file that runs it, and each file must really
ask for that prefix. A new command in a README bash block fails here until a test runs it.
"""

import re
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from tests.test_cli_backfill import readme_commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# README command prefix -> the test file that runs it, as `readme_command("<prefix>")` or by name.
COMMANDS = {
    ".venv/bin/gnnflow datasets sync": "tests/test_cli_backfill.py",
    ".venv/bin/gnnflow launch --assets canonical_graph": "tests/test_cli_backfill.py",
    ".venv/bin/dagster job backfill": "tests/test_cli_backfill.py",
    ".venv/bin/dagster-daemon run": "tests/test_cli_backfill.py",
    ".venv/bin/gnnflow backfills": "tests/test_cli_backfill.py",
    ".venv/bin/dagster sensor stop landing_sensor": "tests/test_cli_backfill.py",
    ".venv/bin/dagster schedule start retrain_schedule": "tests/test_cli_backfill.py",
    "make ui": "tests/test_cli_backfill.py",  # test_make_ui_takes_a_port dry-runs each `make ui` line
    "export DAGSTER_HOME=": "tests/test_readme.py",  # test_readme_dagster_home_is_the_makefiles
}
# Run outside pytest, so accepted by name: CI's .ci/run is exactly `make test` (which runs this
# suite), and the project's hook runs `make demo` (the whole pipeline on the generated graph).
NOT_BY_PYTEST = {"make demo", "make test"}


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    untested = [c for c in commands if c not in NOT_BY_PYTEST and not any(c.startswith(p) for p in COMMANDS)]
    assert not untested, f"README bash commands no test runs (add a test and its prefix to COMMANDS): {untested}"
    assert NOT_BY_PYTEST <= set(commands), "the README's two commands are `make demo` and `make test`"
    unused = [p for p in COMMANDS if not any(c.startswith(p) for c in commands)]
    assert not unused, f"prefixes no README command starts with (remove them): {unused}"
    for prefix, test_file in COMMANDS.items():
        source = (ROOT / test_file).read_text()
        assert f'"{prefix}' in source, f"{test_file} does not run the README's {prefix!r}"
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)


def test_readme_dagster_home_is_the_makefiles(tmp_path):
    """The README's `export DAGSTER_HOME=...` line, run by bash, names the folder the Makefile exports."""
    (line,) = [c for c in readme_commands() if c.startswith("export DAGSTER_HOME=")]
    out = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$DAGSTER_HOME"'], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == str(tmp_path / ".dagster_home")
    assert re.search(r"^export DAGSTER_HOME\s*:=\s*\$\(CURDIR\)/\.dagster_home$", (ROOT / "Makefile").read_text(), re.M)


def test_readme_landing_example_is_ingested_as_written(tmp_path, monkeypatch):
    """The README's Python example writes a dataset that canonical_graph ingests with its column
    mapping, string ids, weights, word labels and features; its gnnflow.yaml passes the settings check."""
    from assets.settings import read_settings_file, registered_configs
    from graphs.stages.canonical import build_canonical_graph

    (example,) = _blocks(README.read_text(), "python")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    dataset = tmp_path / "landing" / "shop"
    assert read_settings_file(dataset / "gnnflow.yaml", registered_configs())["canonical_graph"] == {
        "weight_combine": "max"
    }
    summary = build_canonical_graph(dataset, tmp_path / "out")
    assert (summary["nodes"], summary["id_type"], summary["weighted"], summary["num_classes"]) == (4, "string", True, 2)
    assert (summary["feature_dim"], summary["null_labels_as_unknown"], summary["train_nodes"]) == (2, 1, 2)
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet").to_pydict()
    assert nodes["original_id"] == ["ann", "bob", "cy", "dee"] and nodes["label"] == [0, 1, 0, -1]


def test_readme_settings_blocks_are_valid_settings(tmp_path):
    """Every ```yaml block of README.md with `ops:` is a gnnflow.yaml the settings check accepts."""
    from assets.settings import read_settings_file, registered_configs

    blocks = [b for b in _blocks(README.read_text(), "yaml") if b.lstrip().startswith(("ops:", "task:", "columns:"))]
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"{i}.yaml"
        path.write_text(block)
        assert isinstance(yaml.safe_load(block), dict)
        read_settings_file(path, registered_configs())  # raises naming the key when one is wrong


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_relative_link_resolves():
    """Every `](target)` of README.md and docs/*.md that is not a URL names an existing file, and its
    #fragment (or a bare #fragment) a heading of that file."""
    broken = []
    for page in [README, *DOCS]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, fragment = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_readme_links_every_docs_page_and_stays_short():
    text = README.read_text()
    for page in DOCS:
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    assert len(text.splitlines()) <= 320, "README.md is a map: the depth goes to docs/"

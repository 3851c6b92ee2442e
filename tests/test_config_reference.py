"""docs/configuration.md is what `gnnflow config-reference` writes, and it covers every setting."""

from pathlib import Path

from assets.settings import registered_configs
from pipelines.cli import main
from pipelines.config_reference import render

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_generated_one(tmp_path):
    out = tmp_path / "configuration.md"
    assert main(["config-reference", "--out", str(out)]) == 0
    assert out.read_text() == REFERENCE.read_text(), "docs/configuration.md is stale: run `make docs`"


def test_every_setting_of_every_asset_has_a_row_with_its_default():
    sections = {part.split("\n", 1)[0]: part for part in render().split("\n## ")[1:]}
    for asset, cls in registered_configs().items():
        text = sections[asset]
        defaults = cls().model_dump()
        for key, value in _leaves(defaults, cls):
            assert f"| `{key}` |" in text, f"{asset}: {key} has no row"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
                assert f"| {value}" in row, row  # the dataclass default, e.g. | 0.003; link_prediction: ...


def test_task_defaults_and_readers_are_shown_for_trained_model():
    row = next(line for line in render().splitlines() if line.startswith("| `training.early_stopping_patience` |"))
    assert "| 50; graph_property: 20; link_prediction: 5 |" in row
    precision = next(line for line in render().splitlines() if line.startswith("| `training.precision` |"))
    assert "| node_classification |" in precision  # the only task whose training reads it


def _leaves(block: dict, cls, prefix: str = ""):
    """(dotted key, default) of the settings of `cls` (a Config class) and its nested blocks,
    leaving out the blocks of variants a test module registered (their module is tests')."""
    for key, value in block.items():
        sub = cls.model_fields[key].annotation
        if isinstance(value, dict):
            if not sub.__module__.startswith("tests"):
                yield from _leaves(value, sub, f"{prefix}{key}.")
        else:
            yield prefix + key, value

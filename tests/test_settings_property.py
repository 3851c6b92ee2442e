"""Property test: hostile `gnnflow.yaml` files through `read_settings_file` and `resolve`.

Hypothesis writes a dataset's settings file from the real settings of every asset with
settings (nested blocks included), each value drawn from plain valid ones and hostile ones:
YAML anchors and aliases (an alias bomb among them), NaN and infinities in every spelling,
counts far beyond any bound (`10**18`, `2**63`, `1e18` which YAML reads as text), booleans for
numbers, 100k-character strings, deep nesting, unknown keys. Every file must end either in
settings whose numbers are finite and within their declared bounds, or in a `SettingsError`
that starts with the file's path and stays short (a value is never shown in full), and within
two seconds: nothing is expanded, nothing runs unbounded.

CI runs 150 examples; `GNNFLOW_SLOW=1` runs 1,500.
"""

import dataclasses
import json
import math
import os
import time

import pydantic
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from assets.settings import SettingsError, read_settings_file, registered_configs, resolve
from graphs.infra.config_checks import check_fields

EXAMPLES = int(os.environ.get("GNNFLOW_EXAMPLES", 1500 if os.environ.get("GNNFLOW_SLOW") else 150))
CONFIGS = registered_configs()

ALIAS_BOMB = "&a [x, x, x, x, x, x, x, x]"  # the anchor; the aliases follow in the same flow value
HOSTILE = [
    ".nan",
    ".NaN",
    ".inf",
    "-.inf",
    "1e18",
    "1000000000000000000",
    str(2**63),
    "-" + str(2**63),
    "true",
    "null",
    "'" + "z" * 100_000 + "'",
    "[" * 200 + "]" * 200,
    "*undefined",
    "&anchor 1",
    "!!python/object/apply:os.system ['true']",
    "{nested: {deeper: 1}}",
]
VALID = ["0", "1", "2", "16", "0.5", "0.01", "false", "'sage'", "[5, 5]"]


def _leaves(cls: type[pydantic.BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(key path, its default as YAML) of every setting of a Config class, nested blocks included."""
    paths = []
    for name, field in cls.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel):
            paths.extend(_leaves(sub, (*prefix, name)))
        else:
            default = field.get_default(call_default_factory=True)
            paths.append(((*prefix, name), json.dumps(default)))  # JSON is YAML
    return paths


LEAVES = {asset: _leaves(cls) for asset, cls in CONFIGS.items()}


def _block(path: tuple[str, ...], value: str, indent: int) -> str:
    lines = []
    for depth, key in enumerate(path[:-1]):
        lines.append(" " * (indent + 2 * depth) + f"{key}:")
    lines.append(" " * (indent + 2 * (len(path) - 1)) + f"{path[-1]}: {value}")
    return "\n".join(lines)


@st.composite
def settings_files(draw) -> str:
    """The text of a gnnflow.yaml: a few assets, a few settings each, valid or hostile values."""
    lines = []
    if draw(st.integers(0, 9)) == 0:
        lines.append(f"task: {draw(st.sampled_from(['node_classification', 'link_prediction', *HOSTILE]))}")
    if draw(st.integers(0, 9)) == 0:  # the alias bomb, under a key that must be a mapping
        bomb = [f"bomb0: {ALIAS_BOMB}"] + [f"bomb{i}: [{', '.join([f'*b{i - 1}'] * 8)}]" for i in range(1, 9)]
        bomb[0] = bomb[0].replace("&a", "&b0")
        for i in range(1, 8):
            bomb[i] = bomb[i].replace(f"bomb{i}: ", f"bomb{i}: &b{i} ")
        lines.append("ops:\n  canonical_graph:\n    config:\n" + "\n".join("      " + b for b in bomb))
        return "\n".join(lines) + "\n"
    lines.append("ops:")
    for asset in draw(st.lists(st.sampled_from(sorted(CONFIGS)), min_size=1, max_size=3, unique=True)):
        lines.append(f"  {asset}:\n    config:")
        paths = draw(st.lists(st.sampled_from(LEAVES[asset]), min_size=1, max_size=3, unique=True))
        for path, default in paths:
            if draw(st.integers(0, 19)) == 0:
                path = (*path[:-1], path[-1] + "_unknown")
            value = draw(st.sampled_from([default] * 24 + VALID + HOSTILE))
            lines.append(_block(path, value, 6))
    return "\n".join(lines) + "\n"


def _numbers(obj, name=""):
    """(name, value) of every number in a library config dataclass, nested ones included."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _numbers(getattr(obj, f.name), f"{name}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{name}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield name, obj


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=settings_files())
def test_hostile_settings_files_are_refused_naming_the_file_or_resolve_to_bounded_settings(tmp_path, text):
    path = tmp_path / "landing" / "d" / "gnnflow.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    start = time.process_time()  # CPU time: a loaded host does not inflate it
    try:
        blocks = read_settings_file(path, CONFIGS)
        resolved = []
        for asset, block in blocks.items():
            built = resolve(CONFIGS[asset], asset, {}, block, path)[0].to_dataclass()
            resolved.extend(built if isinstance(built, tuple) else [built])
    except SettingsError as exc:
        message = str(exc)
        event("refused")
        assert message.startswith(f"{path}: "), message[:300]
        assert len(message) < len(str(path)) + 600, message[:300]
        assert "z" * 100 not in message
    else:
        event("resolved")
        assert not any(h in text for h in ("&b0", "*undefined", "!!python", "z" * 100))
        for config in resolved:
            check_fields(config)  # every number within its declared bound, again
            for name, value in _numbers(config):
                assert math.isfinite(value), (name, value)
                assert abs(value) < 2**63, (name, value)
    cpu_seconds = time.process_time() - start
    event(f"CPU seconds > 0.2: {cpu_seconds > 0.2}")
    assert cpu_seconds < 2.0

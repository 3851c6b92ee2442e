"""Per-dataset settings: `landing/<dataset>/gnnflow.yaml`, read by every asset at run time.

A dataset may carry its own settings in its landing folder, in the same blocks as a run
config file (`dagster asset materialize -c run.yaml`):

    ops:
      canonical_graph:
        config: {symmetrize: false}
      trained_model:
        config:
          model: {conv: gcn, hidden: 64}

Every asset resolves its settings when it runs (`GnnflowStorage.settings`), so manual UI
and CLI runs, the landing sensor, the retraining schedule and backfills all see the file
(none of them has to carry run config). Precedence, key by key (nested blocks merge):

    1. values written explicitly in the run's config (launchpad, `-c run.yaml`, a request)
    2. the dataset's gnnflow.yaml
    3. the defaults of the stage's config dataclass

"Explicit" is read from the run's raw config (`context.run.run_config`, what was submitted,
before Dagster fills in defaults), so a default never hides a value from the file. The
effective settings and which keys came from where go into each materialization's metadata.

The file is untrusted input: it is size-limited, parsed with `yaml.safe_load`, only the
`ops.<asset>.config` blocks of known assets and the keys of their config classes are
accepted, and the values are validated by the same pydantic fields and dataclass
`__post_init__` checks as run config. Every error names the file and the key.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Mapping

import dagster as dg
import pydantic
import yaml

SETTINGS_FILE = "gnnflow.yaml"
MAX_SETTINGS_BYTES = 1 << 20


class SettingsError(ValueError):
    """A dataset's gnnflow.yaml is unreadable or holds an unknown key or an invalid value."""


_CONFIGS: dict[str, type[dg.Config]] = {}


def register_config(asset: str, cls: type[dg.Config]) -> None:
    """Declare `cls` (with a `to_dataclass()` method) as the run config class of `asset`."""
    _CONFIGS[asset] = cls


def registered_configs() -> dict[str, type[dg.Config]]:
    """Asset name -> run config class, for every module of the `assets` package."""
    import assets

    for mod in pkgutil.iter_modules(assets.__path__):
        importlib.import_module(f"assets.{mod.name}")
    return dict(_CONFIGS)


def read_settings_file(path: Path, assets: Mapping[str, type[dg.Config]]) -> dict[str, dict]:
    """`{asset: config block}` from a gnnflow.yaml (`{}` when there is none), its shape and keys
    checked against `assets` (asset name -> its Config class); values are checked by `resolve`."""
    if not path.is_file():
        return {}
    size = path.stat().st_size
    if size > MAX_SETTINGS_BYTES:
        raise SettingsError(f"{path}: {size} bytes, more than the {MAX_SETTINGS_BYTES} allowed for a settings file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SettingsError(f"{path}: expected a mapping with an 'ops' key, got {type(doc).__name__}")
    unknown = [k for k in doc if k != "ops"]
    if unknown:
        raise SettingsError(f"{path}: key {unknown[0]!r} is not allowed; settings go under 'ops.<asset>.config'")
    ops = doc.get("ops") or {}
    if not isinstance(ops, dict):
        raise SettingsError(f"{path}: key 'ops' must be a mapping of asset names, got {type(ops).__name__}")
    blocks: dict[str, dict] = {}
    for name, block in ops.items():
        where = f"ops.{name}"
        if name not in assets:
            raise SettingsError(
                f"{path}: key {where!r}: no asset with settings is named {name!r} (those with settings: "
                f"{', '.join(sorted(assets))})"
            )
        if block is None:
            continue
        if not isinstance(block, dict) or any(k != "config" for k in block):
            raise SettingsError(f"{path}: key {where!r} must hold only a 'config' mapping")
        config = block.get("config") or {}
        if not isinstance(config, dict):
            raise SettingsError(f"{path}: key '{where}.config' must be a mapping, got {type(config).__name__}")
        _check_keys(assets[name], config, f"{where}.config", path)
        blocks[name] = config
    return blocks


def _check_keys(cls: type[pydantic.BaseModel], block: dict, where: str, path: Path) -> None:
    """Every key of `block` is a field of `cls` (recursing into nested Config blocks)."""
    fields = cls.model_fields
    for key, value in block.items():
        if not isinstance(key, str) or key not in fields:
            raise SettingsError(f"{path}: key '{where}.{key}' is not a setting of {where.split('.')[1]}")
        sub = fields[key].annotation
        if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel):
            if not isinstance(value, dict):
                raise SettingsError(f"{path}: key '{where}.{key}' must be a mapping, got {type(value).__name__}")
            _check_keys(sub, value, f"{where}.{key}", path)


def explicit_run_config(run_config: Mapping[str, Any], asset: str) -> dict:
    """The config block written for `asset` in a run's raw config ({} when none)."""
    ops = run_config.get("ops") or {}
    block = ops.get(asset) or {}
    return dict(block.get("config") or {})


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """`base` updated by `over`, nested mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _leaf_keys(block: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            keys.extend(_leaf_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _validate(cls: type[dg.Config], block: dict) -> dg.Config:
    config = cls(**block)
    config.to_dataclass()  # the library dataclass's __post_init__ checks
    return config


def resolve(
    cls: type[dg.Config], asset: str, explicit: Mapping[str, Any], from_file: Mapping[str, Any], path: Path
) -> tuple[dg.Config, dict]:
    """The effective config (explicit run config > file > defaults) and its provenance.

    The file's block is validated on its own first, so an invalid value there fails naming
    the file and the key even when the run config would have overridden another key."""
    where = f"ops.{asset}.config"
    if from_file:
        try:
            _validate(cls, dict(from_file))
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise SettingsError(f"{path}: key '{where}.{key}': {err['msg']} (got {err.get('input')!r})") from exc
        except (ValueError, TypeError) as exc:
            raise SettingsError(f"{path}: {where}: {exc}") from exc
    config = cls(**merge(from_file, explicit))
    provenance = {
        "settings_file": str(path) if from_file else None,
        "from_file": sorted(set(_leaf_keys(from_file)) - set(_leaf_keys(explicit))),
        "from_run_config": sorted(_leaf_keys(explicit)),
    }
    return config, provenance


def config_metadata(config: dg.Config, provenance: dict) -> dict[str, dg.MetadataValue]:
    """Metadata entries: the effective config and where its non-default values came from."""
    return {
        "config": dg.MetadataValue.json(config.model_dump(mode="json")),
        "config_sources": dg.MetadataValue.json(provenance),
    }

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

One more top-level key, ``task``, says what the dataset is trained for:
``node_classification`` (the default) or ``link_prediction`` (`assets.task_registry`).
It is not an asset's setting because it changes the asset graph's behaviour upstream: with
link prediction, edge_split holds out edges and its message-passing graph feeds
normalized_adjacency and the shards (`GnnflowStorage.task`, docs/link-prediction.md)::

    task: link_prediction
    ops:
      edge_split:
        config: {val_fraction: 0.05, test_fraction: 0.1}

One more top-level key, ``columns``, names the dataset's columns where they differ from the
landing layout's (`graphs.stages.user_files`; any of src, dst, weight, node_id, label, split, feat)::

    columns: {src: from_id, dst: to_id, node_id: customer_id, label: segment, weight: amount}

"Explicit" is read from the run's raw config (`context.run.run_config`, what was submitted,
before Dagster fills in defaults), so a default never hides a value from the file. The
effective settings and which keys came from where go into each materialization's metadata.

The file is untrusted input: it is size-limited and parsed by `graphs.infra.config_checks.read_yaml_file`
(the safe loader, anchors and aliases refused, so a few hundred bytes cannot expand to
gigabytes), only the `ops.<asset>.config` blocks of known assets and the keys of their config
classes are accepted, and the values are validated by the same pydantic fields and dataclass
`__post_init__` checks as run config (finite numbers, each count at most its declared bound).
Every error names the file and the key, and shows a value cut to `config_checks.MAX_REPR` characters.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Mapping

import dagster as dg
import pydantic

import assets
from assets.task_registry import DEFAULT_TASK, GRAPH_TASK, task_class, task_names
from graphs.infra.config_checks import (
    RunConfigShapeError,
    asset_config_block,
    bounded_repr,
    bounded_text,
    read_yaml_file,
    run_config_ops,
)
from graphs.stages.collection import is_collection_folder
from graphs.stages.landing import InputError, checked_dataset_file
from graphs.stages.user_files import check_column_mapping

SETTINGS_FILE = "gnnflow.yaml"


class SettingsError(ValueError):
    """A dataset's gnnflow.yaml is unreadable or holds an unknown key or an invalid value."""


_CONFIGS: dict[str, type[dg.Config]] = {}


def register_config(asset: str, cls: type[dg.Config]) -> None:
    """Declare `cls` (with a `to_dataclass()` method) as the run config class of `asset`."""
    _CONFIGS[asset] = cls


def registered_configs() -> dict[str, type[dg.Config]]:
    """Asset name -> run config class, for every module of the `assets` package."""
    for mod in pkgutil.iter_modules(assets.__path__):
        importlib.import_module(f"assets.{mod.name}")
    return dict(_CONFIGS)


def moved_keys(run_config: Mapping[str, Any]) -> list[str]:
    """ "'ops.<asset>.config.<key>' is now '...'" for every key of a run config that a setting's
    older shape used (a Config class's ``moved_settings``, in the asset's block or a nested one,
    each naming the new key under the asset's config); Dagster's own check would only call them
    unexpected."""
    out: list[str] = []
    ops = run_config.get("ops")
    if not isinstance(ops, Mapping):
        return out  # Dagster's check names a misshapen run config
    for asset, cls in registered_configs().items():
        block = ops.get(asset)
        config = block.get("config") if isinstance(block, Mapping) else None
        if isinstance(config, Mapping):
            out.extend(_moved_in(cls, config, f"ops.{asset}.config", f"ops.{asset}.config"))
    return out


def _moved_in(cls: type[pydantic.BaseModel], block: Mapping, where: str, root: str) -> list[str]:
    """The moved keys of `block` (a `cls` block at `where`) and of its nested blocks."""
    out = []
    for key, value in block.items():
        moved = getattr(cls, "moved_settings", {}).get(key) if isinstance(key, str) else None
        if moved is not None:
            out.append(f"'{where}.{key}' is now '{root}.{moved}'")
            continue
        field = cls.model_fields.get(key) if isinstance(key, str) else None
        sub = field.annotation if field is not None else None
        if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel) and isinstance(value, Mapping):
            out.extend(_moved_in(sub, value, f"{where}.{key}", root))
    return out


def read_settings_file(path: Path, assets: Mapping[str, type[dg.Config]]) -> dict[str, dict]:
    """`{asset: config block}` from a gnnflow.yaml (`{}` when there is none), its shape and keys
    checked against `assets` (asset name -> its Config class); values are checked by `resolve`."""
    return _config_blocks(_read_document(path), path, assets)


def _config_blocks(doc: dict, path: Path, assets: Mapping[str, type[dg.Config]]) -> dict[str, dict]:
    blocks: dict[str, dict] = {}
    try:
        for name, block in run_config_ops(doc).items():
            if name not in assets:
                raise SettingsError(
                    f"{path}: key 'ops.{bounded_text(str(name))}': no asset with settings has this name (those "
                    f"with settings: {', '.join(sorted(assets))})"
                )
            if block is None:
                continue
            config = asset_config_block(doc, name, only_config=True)
            _check_keys(assets[name], config, f"ops.{name}.config", path)
            blocks[name] = config
    except RunConfigShapeError as exc:
        raise SettingsError(f"{path}: {exc}") from None
    return blocks


def _read_document(path: Path) -> dict:
    """The top level of a gnnflow.yaml (`{}` when there is none), its keys and `task` checked."""
    try:
        if checked_dataset_file(path) is None:
            return {}
    except InputError as exc:
        raise SettingsError(str(exc)) from None
    try:
        doc = read_yaml_file(path)
    except (OSError, ValueError) as exc:
        raise SettingsError(str(exc) if isinstance(exc, ValueError) else f"{path}: unreadable: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SettingsError(f"{path}: expected a mapping with an 'ops' key, got {type(doc).__name__}")
    unknown = [k for k in doc if k not in ("ops", "task", "columns")]
    if unknown:
        raise SettingsError(
            f"{path}: key {bounded_repr(unknown[0])} is not allowed; settings go under 'ops.<asset>.config' "
            "(and 'task', 'columns')"
        )
    _check_task(doc.get("task", DEFAULT_TASK), path)
    try:
        check_column_mapping(doc.get("columns"), str(path))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return doc


def _check_task(task: Any, path: Path) -> str:
    if not isinstance(task, str) or task not in task_names():
        raise SettingsError(f"{path}: key 'task': {bounded_repr(task)} is not one of {', '.join(task_names())}")
    return task


def read_task(path: Path) -> str:
    """The dataset's task from its gnnflow.yaml `path` in the dataset's landing folder; without a
    file or key the default of the folder's kind: `DEFAULT_TASK` for a graph, `GRAPH_TASK` for a
    graph collection (`graphs.stages.collection`). The file is read and checked as in
    `read_settings_file`; a task of the other kind (a node-level task named for a collection, a
    graph-level one for a graph) is refused, naming both."""
    doc = _read_document(path)
    _config_blocks(doc, path, registered_configs())
    collection = is_collection_folder(path.parent)
    named = doc.get("task")
    if named is None:
        return GRAPH_TASK if collection else DEFAULT_TASK
    if task_class(named).traits.graph_level != collection:
        kind = "a graph collection (it holds graphs.parquet)" if collection else "one graph (no graphs.parquet)"
        raise SettingsError(
            f"{path}: key 'task': {named} does not apply to {path.parent}, which is {kind}; "
            f"{'remove the key' if collection else 'name a node or edge task'}"
        )
    return named


def read_columns(path: Path) -> dict[str, str]:
    """The dataset's column mapping from its gnnflow.yaml (`{}` without a file or key); the file
    is read and checked as in `read_settings_file`."""
    return check_column_mapping(_read_document(path).get("columns"), str(path))


def _check_keys(cls: type[pydantic.BaseModel], block: dict, where: str, path: Path) -> None:
    """Every key of `block` is a field of `cls` (recursing into nested Config blocks)."""
    fields = cls.model_fields
    root = ".".join(where.split(".")[:3])  # ops.<asset>.config: moved keys are named from there
    for key, value in block.items():
        moved = getattr(cls, "moved_settings", {}).get(key) if isinstance(key, str) else None
        if moved is not None:
            raise SettingsError(f"{path}: key '{where}.{key}' is now '{root}.{moved}'")
        if not isinstance(key, str) or key not in fields:
            raise SettingsError(
                f"{path}: key '{where}.{bounded_text(str(key))}' is not a setting of {where.split('.')[1]}"
            )
        sub = fields[key].annotation
        if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel):
            if not isinstance(value, dict):
                raise SettingsError(f"{path}: key '{where}.{key}' must be a mapping, got {type(value).__name__}")
            _check_keys(sub, value, f"{where}.{key}", path)


def explicit_run_config(run_config: Mapping[str, Any], asset: str) -> dict:
    """The config block written for `asset` in a run's raw config ({} when none)."""
    return asset_config_block(run_config, asset)


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


def _mark_set(config: pydantic.BaseModel, keys: list[str]) -> None:
    """Record every key given (dotted) as set in `config`'s blocks: Dagster's Config leaves a value
    equal to its default out of ``model_fields_set``, and a task's or a typed graph's own
    defaults (`assets.config.resolve_blocks`) must not replace a value the user wrote."""
    for key in keys:
        obj = config
        for name in key.split("."):
            if not isinstance(obj, pydantic.BaseModel) or name not in type(obj).model_fields:
                break
            obj.__pydantic_fields_set__.add(name)
            obj = getattr(obj, name)


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
            raise SettingsError(f"{path}: {_validation_message(exc, where)}") from None
        except (ValueError, TypeError) as exc:
            raise SettingsError(f"{path}: {where}: {exc}") from exc
    config = cls(**merge(from_file, explicit))
    _mark_set(config, _leaf_keys(from_file) + _leaf_keys(explicit))
    provenance = {
        "settings_file": str(path) if from_file else None,
        "from_file": sorted(set(_leaf_keys(from_file)) - set(_leaf_keys(explicit))),
        "from_run_config": sorted(_leaf_keys(explicit)),
    }
    return config, provenance


def _validation_message(exc: pydantic.ValidationError, where: str) -> str:
    """The first error of `exc` as "key '<where>.<field>': <what> (got <value>)"."""
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(p) for p in err["loc"])
    message = f"key '{where}.{key}': {err['msg']} (got {bounded_repr(err.get('input'))})"
    if isinstance(err.get("input"), str) and err["type"].startswith("int_"):
        message += "; write an integer as digits, e.g. 1000000 (YAML reads 1e6 as text)"
    return message


def config_metadata(config: dg.Config, provenance: dict) -> dict[str, dg.MetadataValue]:
    """Metadata entries: the effective config and where its non-default values came from."""
    return {
        "config": dg.MetadataValue.json(config.model_dump(mode="json")),
        "config_sources": dg.MetadataValue.json(provenance),
    }

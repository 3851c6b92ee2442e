"""Dagster run config generated from the library's config dataclasses.

Each stage's settings live once, in a keyword-only dataclass in `graphs/` or `training/`
(one field, one help text, validation in `__post_init__`). `dagster_config` turns such a
dataclass into a `dagster.Config` class with the same fields, defaults and descriptions,
so the Dagster UI's launchpad shows them and no default is written twice. The bounds a
field declares in its metadata (`graphs.infra.config_checks`) become pydantic constraints: ``le``
from ``max``, ``max_length`` for strings, finite floats and ints that are not bools, so run
config and a dataset's gnnflow.yaml are refused with the field's name before the dataclass
is built.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Mapping, TypeVar

import dagster as dg
import pydantic
from pydantic import Field

from graphs.infra.config_checks import MAX_TEXT, help_text
from training.task_settings import block_values, read_by, with_values

T = TypeVar("T")


def dagster_config(dataclass_type: type[T], name: str | None = None) -> type[dg.Config]:
    """A `dagster.Config` subclass mirroring `dataclass_type` field for field.

    The returned class has a `to_dataclass()` method that builds (and so validates) the
    library config from the run config. A field whose type is itself a config dataclass
    becomes a nested `Config` block (generated the same way).
    """
    hints = typing.get_type_hints(dataclass_type)
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    nested: dict[str, type[dg.Config]] = {}
    for f in dataclasses.fields(dataclass_type):
        annotations[f.name] = hints[f.name]
        if "blocks" in f.metadata:  # one block per variant, e.g. minibatch_shards.samplers.<sampler>
            sub = nested[f.name] = _blocks_config(f.metadata["blocks"](), f"{dataclass_type.__name__}_{f.name}")
            annotations[f.name] = sub
            namespace[f.name] = Field(default_factory=sub, description=f.metadata.get("help"))
            continue
        if dataclasses.is_dataclass(hints[f.name]):  # a nested block, e.g. training.optimizer
            sub = nested[f.name] = dagster_config(hints[f.name])
            annotations[f.name] = sub
            namespace[f.name] = Field(default_factory=sub, description=f.metadata.get("help"))
            continue
        kwargs = {"description": help_text(f) or None, **_constraints(hints[f.name], f.metadata)}
        if f.default is not dataclasses.MISSING:
            namespace[f.name] = Field(default=f.default, **kwargs)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            namespace[f.name] = Field(default_factory=f.default_factory, **kwargs)
        else:
            namespace[f.name] = Field(**kwargs)
    moved = getattr(dataclass_type, "MOVED_SETTINGS", {})
    annotations["moved_settings"] = ClassVar[dict[str, str]]
    namespace["moved_settings"] = dict(moved)  # keys of an older shape: refused naming their new place
    namespace["__annotations__"] = annotations
    namespace["__doc__"] = dataclass_type.__doc__
    namespace["__module__"] = dataclass_type.__module__

    def to_dataclass(self) -> T:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(dataclass_type)}
        for name in nested:
            values[name] = values[name].to_dataclass()
        return dataclass_type(**values)

    namespace["to_dataclass"] = to_dataclass
    return type(name or f"{dataclass_type.__name__}RunConfig", (dg.Config,), namespace)


def _blocks_config(classes: dict[str, type], name: str) -> type[dg.Config]:
    """A `dagster.Config` with one nested block per entry of `classes` ({key: config dataclass},
    e.g. each registered sampler's settings); its `to_dataclass()` is {key: dataclass instance}."""
    blocks = {key: dagster_config(classes[key], f"{name}_{key}") for key in sorted(classes)}
    namespace: dict[str, Any] = {
        key: Field(default_factory=sub, description=(classes[key].__doc__ or "").strip() or None)
        for key, sub in blocks.items()
    }
    namespace["__annotations__"] = dict(blocks)
    namespace["__module__"] = __name__

    def to_dataclass(self) -> dict[str, Any]:
        return {key: getattr(self, key).to_dataclass() for key in blocks}

    namespace["to_dataclass"] = to_dataclass
    return type(name, (dg.Config,), namespace)


def _constraints(hint: Any, metadata: typing.Mapping) -> dict[str, Any]:
    """pydantic `Field` constraints of a scalar field from its type and declared bounds."""
    if hint is int:
        return {"strict": True, **({"le": metadata["max"]} if "max" in metadata else {})}
    if hint is float:
        return {"allow_inf_nan": False, **({"le": metadata["max"]} if "max" in metadata else {})}
    if hint is str or hint == str | None:
        return {"max_length": metadata.get("max_len", MAX_TEXT)}
    return {}


@dataclasses.dataclass
class ResolvedSettings:
    """A run config resolved for what reads it (a task, an engine): each block as its dataclass,
    the own defaults that applied (dotted key -> value) and the keys set that it does not read."""

    blocks: dict[str, Any]
    own_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    ignored: list[str] = dataclasses.field(default_factory=list)


def resolve_blocks(config: pydantic.BaseModel, defaults: Mapping[str, Any], reads: tuple[str, ...]) -> ResolvedSettings:
    """`config` (an asset's effective run config, whose set fields are the ones the run config or
    gnnflow.yaml wrote: `assets.settings.resolve`) block by block as dataclasses, with `defaults`
    (values by dotted key, `training.task_settings`) where a key is unset; the keys set outside
    `reads` (dotted keys or blocks) are listed as ignored."""
    applied = {k: v for k, v in defaults.items() if not _is_set(config, k.split("."))}
    blocks = {
        name: with_values(getattr(config, name).to_dataclass(), block_values(applied, name))
        for name in type(config).model_fields
    }
    ignored = [k for k in _set_keys(config) if not read_by(k, reads)]
    return ResolvedSettings(blocks, applied, ignored)


def with_settings(config: pydantic.BaseModel, values: Mapping[str, Any]) -> pydantic.BaseModel:
    """`config` with each value of `values` (dotted keys under it) set, as if the run config had."""
    for key, value in values.items():
        config = _with_setting(config, key.split("."), value)
    return config


def _with_setting(obj: pydantic.BaseModel, parts: list[str], value: Any) -> pydantic.BaseModel:
    inner = value if len(parts) == 1 else _with_setting(getattr(obj, parts[0]), parts[1:], value)
    return obj.model_copy(update={parts[0]: inner})


def _is_set(obj: pydantic.BaseModel, parts: list[str]) -> bool:
    for name in parts:
        if not isinstance(obj, pydantic.BaseModel) or name not in obj.model_fields_set:
            return False
        obj = getattr(obj, name)
    return True


def _set_keys(obj: pydantic.BaseModel, prefix: str = "") -> list[str]:
    """The dotted keys of the leaves set in `obj` (a nested block Dagster filled in is no leaf)."""
    out = []
    for name in sorted(obj.model_fields_set):
        value = getattr(obj, name)
        if isinstance(value, pydantic.BaseModel):
            out.extend(_set_keys(value, f"{prefix}{name}."))
        else:
            out.append(prefix + name)
    return out


def resolved_metadata(resolved: ResolvedSettings, reader: str, log: typing.Callable[[str], None]) -> dict[str, Any]:
    """Metadata entries of `resolved` for `reader` (a task's or engine's name): the effective
    settings (``config``, own defaults applied), the own defaults that applied
    (``own_defaults``) and the keys set that it does not read (``ignored_settings``, also
    logged as a warning)."""
    entries = {
        "config": dg.MetadataValue.json({name: dataclasses.asdict(block) for name, block in resolved.blocks.items()}),
        "own_defaults": dg.MetadataValue.json(resolved.own_defaults),
    }
    if resolved.ignored:
        log(f"{reader} does not read {', '.join(resolved.ignored)}")
        entries["ignored_settings"] = dg.MetadataValue.json(resolved.ignored)
    return entries

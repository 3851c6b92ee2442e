"""Dagster run config generated from the library's config dataclasses.

Each stage's settings live once, in a keyword-only dataclass in `graphs/` or `training/`
(one field, one help text, validation in `__post_init__`). `dagster_config` turns such a
dataclass into a `dagster.Config` class with the same fields, defaults and descriptions,
so the Dagster UI's launchpad shows them and no default is written twice.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

import dagster as dg
from pydantic import Field

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
        help_text = f.metadata.get("help")
        if dataclasses.is_dataclass(hints[f.name]):  # a nested block, e.g. training.optimizer
            sub = nested[f.name] = dagster_config(hints[f.name])
            annotations[f.name] = sub
            namespace[f.name] = Field(default_factory=sub, description=help_text)
        elif f.default is not dataclasses.MISSING:
            namespace[f.name] = Field(default=f.default, description=help_text)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            namespace[f.name] = Field(default_factory=f.default_factory, description=help_text)
        else:
            namespace[f.name] = Field(description=help_text)
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

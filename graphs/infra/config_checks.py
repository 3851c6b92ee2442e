"""Checks shared by every stage's config dataclass, for settings that come from untrusted files.

Settings reach the config dataclasses from a dataset's ``gnnflow.yaml``, Dagster run config and
training's ``--config run.yaml``. This module holds what all of them need:

- `read_yaml_file` / `load_yaml`: a YAML document of at most `MAX_YAML_BYTES`, parsed with
  the safe loader, refusing anchors and aliases (a few hundred bytes of nested aliases expand
  to gigabytes) and nesting deeper than `MAX_DEPTH`; every error names the file and the line.
  `dump_yaml` is the writers' side: YAML without anchors, so every file gnnflow writes reads back.
- `bounded_repr` / `bounded_text`: a value's repr (or a text) cut to `MAX_REPR` characters,
  for error messages.
- `check_fields`: called first in each config dataclass's ``__post_init__``. It walks the
  dataclass's fields and checks, by declared type: ``int`` fields hold an integer (not a
  bool) at most ``metadata["max"]``, which every int field declares; ``float`` fields hold a
  finite number, at most ``metadata["max"]`` where declared; ``str`` fields hold at most
  ``metadata.get("max_len", MAX_TEXT)`` characters and ``list`` fields at most
  ``metadata.get("max_len", MAX_ITEMS)`` items, floats among them finite. Lower bounds and
  choices stay in each ``__post_init__``.
- `help_text`: a field's help text with its upper bound, for the Dagster launchpad and
  ``python -m training --help-config``.
- `asset_config_block`: an asset's block of the Dagster run-config shape
  ``{"ops": {<asset>: {"config": {...}}}}``, the one parser of that shape (a dataset's
  gnnflow.yaml, a run's raw config, a Dagster run-config file given to ``python -m training``);
  a malformed shape raises `RunConfigShapeError` naming the key.

`assets.config.dagster_config` turns the same metadata into pydantic constraints (``le``,
``max_length``, ``allow_inf_nan=False``, ``strict`` ints), so the launchpad refuses the same
values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import reprlib
import types
import typing
from typing import Any, Mapping

import numpy as np
import yaml

MAX_REPR = 80
MAX_TEXT = 4096  # characters of a string setting (a path is at most PATH_MAX = 4096 bytes)
MAX_ITEMS = 64  # items of a list setting
MAX_DEPTH = 32  # nesting of a settings YAML document
MAX_YAML_BYTES = 1 << 20  # size of a settings YAML file

# upper bounds shared by fields of several stages
MAX_SEED = 2**31 - 1  # METIS takes a 32-bit seed; every other generator accepts it too
MAX_EPOCHS = 100_000
MAX_STEPS = 1 << 31  # optimizer steps or minibatches
MAX_ROWS = 1 << 31  # rows, edges or nodes per streamed batch or chunk
MAX_BATCH = 1 << 30  # seeds, nodes or edges in one minibatch
MAX_THREADS = 4096  # threads or worker processes of one machine
MAX_LAYERS = 1024
MAX_FANOUT = 1 << 20  # neighbours sampled per node and layer
MAX_PREFETCH = 1024  # minibatches read ahead
MAX_WIDTH = 1 << 20  # hidden width, feature dimension, classes
MAX_RANKS = 1 << 16  # ranks, machines, parts of one run
MAX_RATE = 100.0  # a learning rate or weight decay
MAX_SCALE = 1e9  # a weight, norm or threshold given in the data's own units
# Labels are class indices 0..C-1 and the model has one output per class up to the largest
# label, so one stray large label (a raw id, a hash) would size the output layer and every
# batch's logits by it. 65,536 classes (64 MiB of weights over a 256-wide layer) is far above
# node classification datasets (OGB's largest has 172 classes) and keeps that mistake a clear error.
MAX_CLASSES = 1 << 16

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_REPR
_REPR.maxlevel = 3


def bounded_text(text: str, limit: int = MAX_REPR) -> str:
    """`text` cut to at most `limit` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


DEFAULT_FANOUTS = "10,10"  # the default of every fanouts setting


def parse_fanouts(text: Any, what: str = "fanouts") -> list[int]:
    """The neighbours sampled per layer, input layer first (DGL's order), from ``"15,10,5"``:
    1 to MAX_LAYERS values, each -1 (every neighbour) or in [1, MAX_FANOUT]; ValueError naming
    `what` otherwise. The one parser of every fanouts setting (shards, DistDGL)."""
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v != ""]
    except ValueError as exc:
        raise ValueError(f"{what}={bounded_repr(text)}: expected comma-separated integers, e.g. '15,10,5'") from exc
    if not 0 < len(values) <= MAX_LAYERS or any(f == 0 or f < -1 or f > MAX_FANOUT for f in values):
        raise ValueError(
            f"{what}={bounded_repr(text)}: need 1 to {MAX_LAYERS} layers, each -1 (all) or in [1, {MAX_FANOUT}]"
        )
    return values


def bounded_repr(value: Any, limit: int = MAX_REPR) -> str:
    """``repr(value)`` of at most `limit` characters, cut with "..." (never builds the whole repr
    of a long string or a deeply nested container)."""
    return bounded_text(_REPR.repr(value), limit)


# ----------------------------------------------------------------------------- YAML


class _SettingsLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses anchors, aliases, nesting deeper than `MAX_DEPTH` and a key
    written twice in one mapping (YAML would keep the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise _Refused(
                        f"line {key_node.start_mark.line + 1}: key {bounded_repr(key_node.value)} is written twice "
                        "in one mapping; write it once"
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            what = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise _Refused(
                f"line {line}: YAML {what}{bounded_text(anchor)}: anchors and aliases are not allowed in a "
                "settings file; write each value out"
            )
        if self.depth >= MAX_DEPTH:
            raise _Refused(f"line {line}: nested more than {MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Refused(ValueError):
    pass


class _NoAnchorDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    """`data` as YAML, each repeated object written out in full (no anchors or aliases)."""
    return yaml.dump(data, Dumper=_NoAnchorDumper, sort_keys=False)


def load_yaml(text: str, where: str) -> Any:
    """The YAML document `text` (from `where`, a file name for the messages) as plain Python
    values; anchors, aliases and deep nesting are refused. Raises ValueError naming `where`."""
    loader = _SettingsLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise ValueError(f"{where}: {exc}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: e.g. an int of > 4300 digits
        raise ValueError(f"{where}: not valid YAML: {bounded_text(str(exc), 400)}") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | os.PathLike) -> Any:
    """`load_yaml` of the file at `path`, refused naming the file when it holds more than
    `MAX_YAML_BYTES` bytes (read no further) or is not UTF-8."""
    with open(path, "rb") as f:
        data = f.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise ValueError(f"{path}: more than the {MAX_YAML_BYTES} bytes allowed for a settings file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid YAML: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return load_yaml(text, str(path))


# ----------------------------------------------------------------------------- fields


def help_text(f: dataclasses.Field) -> str:
    """The field's help text, with its upper bound when it declares one."""
    text = f.metadata.get("help", "")
    bound = f.metadata.get("max")
    return f"{text} (at most {bound})" if bound is not None else text


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(config: Any, prefix: str = "") -> None:
    """Check every field of the dataclass instance `config` against its declared type and
    bounds (see the module docstring); errors name the field as ``prefix.name``."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        if f.init:
            name = f"{prefix}.{f.name}" if prefix else f.name
            _check_value(getattr(config, f.name), hints[f.name], f.metadata, name)


def _check_value(value: Any, hint: Any, meta: typing.Mapping, name: str) -> None:
    if dataclasses.is_dataclass(hint):
        return  # a nested config checks itself
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        if not isinstance(value, (bool, np.bool_)):
            _fail(name, value, "must be true or false")
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            _fail(name, value, "must be an integer")
        _check_max(value, meta, name)
    elif hint is float:
        _check_number(value, name)
        _check_max(value, meta, name)
    elif hint is str:
        if not isinstance(value, str):
            _fail(name, value, "must be a string")
        if len(value) > meta.get("max_len", MAX_TEXT):
            _fail(name, value, f"must be at most {meta.get('max_len', MAX_TEXT)} characters long")
    elif typing.get_origin(hint) is list:
        if not isinstance(value, (list, tuple)):
            _fail(name, value, "must be a list")
        if len(value) > meta.get("max_len", MAX_ITEMS):
            _fail(name, value, f"must hold at most {meta.get('max_len', MAX_ITEMS)} items")
        if typing.get_args(hint) == (float,):
            for i, item in enumerate(value):
                _check_number(item, f"{name}[{i}]")


def _check_number(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(name, value, "must be a number")
    if not math.isfinite(value):
        _fail(name, value, "must be a finite number")


def _check_max(value: Any, meta: typing.Mapping, name: str) -> None:
    bound = meta.get("max")
    if bound is not None and value > bound:
        _fail(name, value, f"must be at most {bound}")


def _fail(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name}={bounded_repr(value)}: {why}")


class RunConfigShapeError(ValueError):
    """A run config (or settings file) is not shaped ``{"ops": {<asset>: {"config": {...}}}}``."""


def run_config_ops(run_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``ops`` mapping of a Dagster-shaped run config (``{}`` without one)."""
    ops = run_config.get("ops") or {}
    if not isinstance(ops, Mapping):
        raise RunConfigShapeError(f"key 'ops' must be a mapping of asset names, got {type(ops).__name__}")
    return ops


def asset_config_block(
    run_config: Mapping[str, Any], asset: str, *, needs: str | None = None, only_config: bool = False
) -> dict:
    """`asset`'s ``config`` mapping in a run config ``{"ops": {<asset>: {"config": {...}}}}``.

    Without a block for `asset` (or with ``config: null``) it is ``{}``; with `needs` (what the
    block must hold, for the message) a missing block or ``config`` key is an error instead.
    `only_config` refuses a block holding any key besides ``config`` (a settings file: Dagster's
    own run config may carry other op keys)."""
    ops = run_config_ops(run_config)
    block = ops.get(asset)
    if needs is not None and not (isinstance(block, Mapping) and "config" in block):
        raise RunConfigShapeError(f"a Dagster run config needs ops: {asset}: config: {needs}")
    if block is None:
        return {}
    if not isinstance(block, Mapping) or (only_config and any(k != "config" for k in block)):
        raise RunConfigShapeError(f"key 'ops.{asset}' must hold only a 'config' mapping")
    config = block.get("config") or {}
    if not isinstance(config, Mapping):
        raise RunConfigShapeError(f"key 'ops.{asset}.config' must be a mapping, got {type(config).__name__}")
    return dict(config)

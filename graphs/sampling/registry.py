"""The samplers of the minibatch_shards stage, by name, each with the traits it declares.

A sampler is a `graphs.sampling.base.MinibatchSampler` subclass in its own module of
`graphs.sampling.kinds`, registered with `register_sampler` under its ``name``. Every module
of that package is imported on the first lookup, so adding a sampler is one new file there
(plus its test); a sampler defined elsewhere (a test, a user's package imported before the
stage runs) registers the same way. Checks read the declared `SamplerTraits`, never a name:
the settings check in `ShardConfig`, the manifest the writer records
(``shared_block``, ``non_uniform_draws``), and through the manifest the layer check in
training. docs/extending.md walks through a new sampler.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

from graphs.config_checks import bounded_repr

__all__ = ["SamplerTraits", "register_sampler", "sampler_class", "sampler_names"]

KINDS_PACKAGE = "graphs.sampling.kinds"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True, kw_only=True)
class SamplerTraits:
    """What a sampler is, as the rest of gnnflow needs to know it.

    - ``seeds``: minibatches grow around seed nodes drawn from the training nodes, so
      ``batch_size``, ``placement: partition`` and ``seed_weighting`` apply (else the sampler
      draws whole subgraphs and its loss nodes are their training nodes).
    - ``shares_block``: one stored block stands for every layer (an induced subgraph).
    - ``non_uniform``: edges are drawn with unequal probabilities, so each carries a
      correction that only a (weighted) sum or mean can use (a layer's ``linear`` trait).
    - ``needs_clusters``: reads metis_partitions' clusters (``cluster_id.npy``).
    """

    seeds: bool
    shares_block: bool = False
    non_uniform: bool = False
    needs_clusters: bool = False


_REGISTRY: dict[str, type] = {}
_DISCOVERED = False


def register_sampler(cls: type) -> type:
    """Class decorator: register `cls` under ``cls.name``, with its ``cls.traits``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{cls.__qualname__}.name={name!r}: a sampler needs a lower-case name ([a-z][a-z0-9_]*)")
    if not isinstance(getattr(cls, "traits", None), SamplerTraits):
        raise TypeError(f"sampler {name!r} ({cls.__qualname__}) declares no SamplerTraits in `traits`")
    held = _REGISTRY.get(name)
    if held is not None and held.__qualname__ != cls.__qualname__:
        raise ValueError(f"sampler {name!r} is already registered by {held.__module__}.{held.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def _discover() -> None:
    """Import every module of `graphs.sampling.kinds` once (each registers its sampler)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    package = importlib.import_module(KINDS_PACKAGE)
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        importlib.import_module(f"{KINDS_PACKAGE}.{module}")


def sampler_names() -> tuple[str, ...]:
    """The registered sampler names, in registration order (the built-in ones first)."""
    _discover()
    return tuple(_REGISTRY)


def sampler_class(name: str) -> type:
    """The sampler class registered as `name` (ValueError naming the registered ones otherwise)."""
    _discover()
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"sampler={bounded_repr(name)} is not one of {sampler_names()}")
    return cls

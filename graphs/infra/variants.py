"""A registry of variants (samplers, layer types): classes found by name, each declaring its traits.

`Registry` holds the classes registered under their ``name`` and imports every module of its
package the first time a name is looked up, so a variant is one module in that folder (or a
class registered from anywhere before the lookup). The samplers' registry is
`graphs.sampling.registry`, the layer types' `training.layer_registry`; each checks the traits
its variants declare before registering them.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import threading
from typing import Callable

from graphs.infra.config_checks import bounded_repr

__all__ = ["Registry"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


class Registry:
    """Classes of one kind of variant by name; `setting` is the setting that names one (in messages)."""

    def __init__(self, kind: str, setting: str, package: str, check: Callable[[type], None]):
        self.kind, self.setting, self.package, self._check = kind, setting, package, check
        self._classes: dict[str, type] = {}
        self._discovered = False
        self._lock = threading.RLock()  # a lookup in another thread waits for the discovery

    def register(self, cls: type) -> type:
        """Class decorator: register `cls` under ``cls.name`` once `check` accepts its traits."""
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{cls.__qualname__}.name={name!r}: a {self.kind} needs a lower-case name ([a-z][a-z0-9_]*)"
            )
        self._check(cls)
        held = self._classes.get(name)
        if held is not None and held.__qualname__ != cls.__qualname__:
            raise ValueError(f"{self.kind} {name!r} is already registered by {held.__module__}.{held.__qualname__}")
        self._classes[name] = cls
        return cls

    def _discover(self) -> None:
        """Import every module of the package once (each registers its variants); a module that
        fails to import fails every lookup, naming it, until it imports."""
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            package = importlib.import_module(self.package)
            for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
                name = f"{self.package}.{module}"
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    raise ImportError(f"{self.kind} module {name} cannot be imported: {exc}") from exc
            self._discovered = True

    def names(self) -> tuple[str, ...]:
        """The registered names, the package's modules in alphabetical order, then the others."""
        self._discover()
        return tuple(self._classes)

    def get(self, name: str) -> type:
        """The class registered as `name` (ValueError naming the registered ones otherwise)."""
        self._discover()
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"{self.setting}={bounded_repr(name)} is not one of {self.names()}")
        return cls

"""Dataset names: the one check a dataset name passes before it becomes any path.

`validate_dataset_name` (used by the assets through `assets.common`, by training and by the
command lines): a letter or digit, then letters, digits, `_`, `.`, `-`; no `..`, no `/`, no
quotes, not empty, at most 128 characters.
"""

from __future__ import annotations

import re

DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class DatasetNameError(ValueError):
    """A dataset name that cannot be used as a folder name."""


def validate_dataset_name(name: object) -> str:
    """`name` when it is a safe dataset folder name, else DatasetNameError saying why.

    Allowed: a letter or digit first, then letters, digits, `_`, `.`, `-` (at most 128
    characters), and no `..` anywhere. Everything else (empty, `/`, `\\`, quotes, spaces,
    a leading dot, control characters) is refused before the name reaches any path.
    """
    if not isinstance(name, str) or not name:
        raise DatasetNameError(f"dataset name {name!r} is empty or not a string")
    if ".." in name or not DATASET_NAME.fullmatch(name):
        raise DatasetNameError(
            f"dataset name {name!r} is not allowed: use 1-128 letters, digits, '_', '.', '-', starting with a "
            "letter or digit, without '..' (it becomes a folder name)"
        )
    return name


def is_valid_dataset_name(name: object) -> bool:
    """Whether `validate_dataset_name` accepts `name`."""
    try:
        validate_dataset_name(name)
    except DatasetNameError:
        return False
    return True

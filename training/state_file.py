"""Model and checkpoint files: tensors in safetensors, everything else as JSON in its header.

A state file is one safetensors file: a little-endian u64 header length, a JSON header giving
each tensor's dtype, shape and byte range, then the raw tensor bytes. Reading one parses JSON
and copies bytes: nothing is unpickled and no code runs, whatever the file holds. Any other
file (a ``torch.save`` pickle or ZIP archive, a TorchScript archive, a truncated file) is
refused with :class:`StateFileError` before a byte of it is interpreted. gnnflow's entries in
the header's string metadata:

    gnnflow.kind            what the file is (``model``, ``checkpoint``, ``link_model``, ...)
    gnnflow.format_version  the format version of its owner module (decimal)
    gnnflow.state           the state as JSON, every tensor replaced by {"__tensor__": "<name>"}
                            (the tensor is stored under that name: the dotted path of keys to
                            it, e.g. ``state_dict.layers.0.weight``), tuples as
                            {"__tuple__": [...]}, dicts whose keys are not all strings (an
                            optimizer's per-parameter state) as {"__items__": [[key, value], ...]}
    gnnflow.sha256          SHA-256 over gnnflow.kind, gnnflow.state and every tensor's name,
                            dtype, shape and bytes (sorted by name): a damaged byte anywhere
                            is refused, not loaded

So any nesting of dicts, lists, tuples, tensors, str, int, float (NaN and infinities too), bool
and None round-trips exactly (bit for bit for tensors): what ``torch.load(weights_only=True)``
accepted, without pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import torch

__all__ = ["StateFileError", "read_state_file", "write_state_file"]

_KIND, _VERSION, _STATE, _DIGEST = "gnnflow.kind", "gnnflow.format_version", "gnnflow.state", "gnnflow.sha256"
_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__items__"
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on the header


class StateFileError(ValueError):
    """A file that is not a gnnflow state file of the expected kind and format version, or a
    damaged one; the message names the file and says what to do."""


# ----------------------------------------------------------------------------- writing


def write_state_file(path: str | os.PathLike, state: dict, *, kind: str, format_version: int) -> None:
    """Write `state` (nested dicts, lists, tuples, tensors and plain values) to `path` as a
    safetensors file (module docstring). Not atomic: callers write into a staging folder or a
    temporary sibling."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, (), tensors, set())
    text = json.dumps(tree, separators=(",", ":"))
    metadata = {_KIND: kind, _VERSION: str(int(format_version)), _STATE: text, _DIGEST: _digest(kind, text, tensors)}
    save_file(tensors, str(path), metadata=metadata)


def _encode(obj, path: tuple, tensors: dict, storages: set):
    if isinstance(obj, torch.Tensor):
        name = _tensor_name(path, tensors)
        t = obj.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if ptr in storages else t  # safetensors refuses shared storage
        storages.add(ptr)
        return {_TENSOR: name}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, (*path, i), tensors, storages) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, (*path, i), tensors, storages) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not {_TENSOR, _TUPLE, _ITEMS} & obj.keys():
            return {k: _encode(v, (*path, k), tensors, storages) for k, v in obj.items()}
        return {
            _ITEMS: [[_encode(k, (), {}, set()), _encode(v, (*path, k), tensors, storages)] for k, v in obj.items()]
        }
    where = ".".join(map(str, path)) or "the top level"
    raise TypeError(f"state entry {where}: a {type(obj).__name__}, which a state file cannot hold")


def _tensor_name(path: tuple, taken: dict) -> str:
    base = ".".join(map(str, path)) or "tensor"
    name, n = base, 1
    while name in taken:
        name, n = f"{base}#{n}", n + 1
    return name


def _digest(kind: str, text: str, tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for part in (kind, text):
        h.update(part.encode())
        h.update(b"\0")
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


# ----------------------------------------------------------------------------- reading


def read_state_file(path: str | os.PathLike, *, kind: str, format_version: int, remedy: str) -> dict:
    """The state written by `write_state_file` (tensors on the CPU). StateFileError naming
    `path` and ending with `remedy` (what to do) when the file is not a safetensors file, not
    one of `kind` and `format_version`, or damaged. Never unpickles, never runs code."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    _check_layout(path, kind, remedy)
    try:
        metadata = _header_metadata(path)
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RecursionError) as exc:
        raise StateFileError(f"{path}: unreadable safetensors file ({_short(exc)}); {remedy}") from None
    if metadata.get(_KIND) != kind:
        found = f"a {_short(metadata[_KIND])!r} file" if _KIND in metadata else "not written by gnnflow"
        raise StateFileError(f"{path}: {found}, expected a gnnflow {kind} file; {remedy}")
    if metadata.get(_VERSION) != str(format_version):
        raise StateFileError(
            f"{path}: {kind} file format {_short(metadata.get(_VERSION))}, this code reads {format_version}; {remedy}"
        )
    text = metadata.get(_STATE, "")
    if metadata.get(_DIGEST) != _digest(kind, text, tensors):
        raise StateFileError(f"{path}: damaged (its content differs from the SHA-256 it was written with); {remedy}")
    try:
        return _decode(json.loads(text), tensors)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise StateFileError(f"{path}: malformed gnnflow.state ({_short(exc)}); {remedy}") from None


def _check_layout(path: Path, kind: str, remedy: str) -> None:
    """StateFileError unless `path` starts like a safetensors file (a header length that fits
    the file, then a JSON object): pickles and ZIP archives (torch.save, TorchScript) are
    recognised and named."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(9)
    except FileNotFoundError:
        raise StateFileError(f"{path}: missing; {remedy}") from None
    if len(head) == 9 and head[8:9] == b"{" and 0 < struct.unpack("<Q", head[:8])[0] <= min(size - 8, _MAX_HEADER):
        return  # a safetensors layout (the first byte is the header length's lowest: any value)
    if head.startswith(b"PK\x03\x04"):
        what = "a ZIP archive (a torch.save or TorchScript file)"
    elif head[:1] == b"\x80":
        what = "a pickle (a torch.save file)"
    else:
        what = "not a safetensors file (or a truncated one)"
    raise StateFileError(
        f"{path}: {what}; gnnflow reads {kind} files in safetensors format only and never loads pickled or "
        f"TorchScript files (they can run code); {remedy}"
    )


def _header_metadata(path: Path) -> dict[str, str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _decode(obj, tensors: dict[str, torch.Tensor]):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _TENSOR in obj:
        return tensors[obj[_TENSOR]]
    if _TUPLE in obj:
        return tuple(_decode(v, tensors) for v in obj[_TUPLE])
    if _ITEMS in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _short(value: object, limit: int = 120) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."

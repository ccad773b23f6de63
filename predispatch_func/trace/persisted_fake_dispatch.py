"""FakeTensorMode's dispatch results for a model, kept on disk between processes.

Most of a first export in a fresh process is fake dispatch missing torch's cache: each
op meeting new input metadata runs its meta kernel or decomposition once (torchvision
lraspp_mobilenet_v3_large: a first export 1.0 s, the next one in the same process
0.4 s). A result depends only on the op, the key torch builds from what it reads of the
inputs and of the global state (default dtype and device, inference mode, the shape
environment's settings), the torch build and the kernels registered, which is why torch
keeps it for the life of a process. Here the aten entries an export met are kept in a
file per torch build, our compat layer's code (it registers a few meta kernels) and the
model's signature, and seed torch's cache before the next export of that model in a new
process. The signature (the model's class, its state's and inputs' dtypes and shapes)
only picks the file: a wrong pick loads entries that no lookup hits, it cannot change
a result.

Kept: entries of aten ops whose key and result hold only plain values (numbers,
strings, dtypes, devices, layouts, memory formats, sizes, the types torch puts before
each value, torch's metadata records). Ops of other namespaces (a user's op may change
between runs under its name) and keys holding objects (graph modules, generators) are
not. A file is read by an unpickler that builds those classes only; any other class,
or a file that does not read, is ignored. ``$PREDISPATCH_FUNC_CACHE`` set empty turns
it off. Not covered: a library that replaces an aten op's meta kernel in one process
and not the other.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import io
import itertools
import pickle
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import _torch_compat as tc
from ..disk_cache import cache_root, files_fingerprint, keep_recent, torch_build, touch, write_atomically

_COMPAT_CODE = sorted((Path(__file__).resolve().parent.parent / "_torch_compat").glob("*.py"))
_NAME = "fake-dispatch"
_KEEP = 64  # files (models) kept per torch build
_MAX_BYTES = 64 << 20
_PENDING_MODELS = 64  # models whose new entries a process remembers for the write at exit

# path -> {torch's key: entry} learned by this process, written (merged) at exit
_learned: dict[Path, dict[Any, Any]] = {}
_seeded: set[Path] = set()  # the files this process has read


@contextlib.contextmanager
def seeded(model: torch.nn.Module, fakes: Sequence[Any]) -> Iterator[None]:
    """Around an export's trace: torch's cache seeded from the model's file; what the trace
    added is remembered and merged into the file at exit."""
    path = _path_for(model, fakes)
    if path is None:
        yield
        return
    cache = tc.fake_dispatch_cache()
    if path not in _seeded:  # once a process: torch's cache keeps what was read
        _seeded.add(path)
        _seed(cache, path)
    size = len(cache)
    try:
        yield
    finally:
        added = len(cache) - size
        if added > 0:
            _remember(path, itertools.islice(reversed(cache.items()), added))


def _path_for(model: torch.nn.Module, fakes: Sequence[Any]) -> Path | None:
    root = cache_root()
    if root is None:
        return None
    cls = type(model)
    signature = repr((cls.__module__, cls.__qualname__, model.training,
                      [(t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t) for t in fakes]))
    return root / f"{_NAME}-{torch_build()}-{_compat_fingerprint()}-{zlib.crc32(signature.encode()):08x}.pkl"


@functools.cache
def _compat_fingerprint() -> str:
    return files_fingerprint(_COMPAT_CODE)  # read once a process: an export should not read our sources


def _seed(cache: dict[Any, Any], path: Path) -> None:
    entries = _read(path)
    if not entries:
        return
    touch(path)  # in use: the last to be pruned
    for parts, entry in entries:
        cache.setdefault(tc.fake_dispatch_key(parts), entry)


def _remember(path: Path, items: Iterator[tuple[Any, Any]]) -> None:
    """Kept as torch made them: which may be written is decided at exit, off the export's time."""
    _learned.setdefault(path, {}).update(items)
    while len(_learned) > _PENDING_MODELS:  # a long process (a test run) exports hundreds of models
        del _learned[next(iter(_learned))]


def save() -> None:
    """Merge what this process learned into each model's file (another process may have
    written it meanwhile); files beyond the bounds, least recently used first, go."""
    for path, learned in list(_learned.items()):
        merged = {parts: entry for parts, entry in _read(path)}
        merged.update((parts, entry) for key, entry in learned.items()
                      if _persistable(parts := tc.fake_dispatch_key_parts(key)) and _plain_entry(entry))
        if _write(path, list(merged.items())):
            del _learned[path]
            keep_recent(path.parent, f"{_NAME}-{torch_build()}-*.pkl", _KEEP, in_use=path, max_bytes=_MAX_BYTES)


atexit.register(save)  # nothing to do where nothing was learned


def forget() -> None:
    """Drop what this process learned and which files it read (tests of the cache)."""
    _learned.clear()
    _seeded.clear()


# --- what may be kept -------------------------------------------------------------------

_PLAIN_TYPES = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
# the types torch puts before a value or a container in a key
_TYPE_MARKERS = frozenset({type(None), bool, int, float, str, list, tuple, dict, torch.Size, torch.dtype,
                           torch.device, torch.layout, torch.memory_format})


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN_TYPES) or value is _SINGLETON:  # torch's "no constant" marker
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, type):
        return value in _TYPE_MARKERS
    if isinstance(value, tc.OpOverload):
        return value.namespace == "aten"
    return type(value) in _RECORDS and all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))


def _persistable(parts: tuple[Any, ...]) -> bool:
    return bool(parts) and isinstance(parts[0], tc.OpOverload) and parts[0].namespace == "aten" and _plain(parts)


def _plain_entry(entry: Any) -> bool:
    return type(entry) in _RECORDS and _plain(entry)


_BY_NAME = tc.fake_dispatch_record_classes()
_NAMED: dict[str, Any] = {cls.__name__: cls for cls in _BY_NAME.values()}
_SINGLETON, _VALID, _BYPASS = _NAMED["SingletonConstant"], _NAMED["_DispatchCacheValidEntry"], _NAMED["_DispatchCacheBypassEntry"]
_OUTPUT, _METADATA = _NAMED["_DispatchCacheEntryOutputInfo"], _NAMED["TensorMetadata"]
_RECORDS = frozenset(cls for cls in _BY_NAME.values() if dataclasses.is_dataclass(cls))


# --- the file ----------------------------------------------------------------------------


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return tuple(str(obj).split(".")) if isinstance(obj, tc.OpOverload) else None  # aten.add.Tensor


class _RecordsOnly(pickle.Unpickler):
    """Builds the plain values and torch's records a kept entry holds, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed().get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not in a fake dispatch entry")
        return found

    def persistent_load(self, pid: Any) -> Any:
        namespace, packet, overload = pid
        if namespace != "aten":
            raise pickle.UnpicklingError(f"op of namespace {namespace!r}")
        return getattr(getattr(torch.ops.aten, packet), overload)


def _type_of_none(value: Any) -> type:
    if value is not None:  # pickle writes NoneType as type(None); type() does more than that
        raise pickle.UnpicklingError("type() of something other than None")
    return type(None)


@functools.cache
def _allowed() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {("builtins", cls.__name__): cls
                                           for cls in (bool, int, float, str, list, tuple, dict)}
    allowed[("builtins", "type")] = _type_of_none
    allowed.update({("torch", cls.__name__): cls for cls in (torch.Size, torch.device, torch.dtype, torch.layout,
                                                              torch.memory_format)})
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
        elif isinstance(value, (torch.layout, torch.memory_format)):
            # pickle names them by what their __reduce__ gives: a dotted name, or a call of torch's
            allowed[("torch", name)] = value
            allowed[("torch._utils", f"torch.{name}")] = value
    allowed[("torch.serialization", "_get_layout")] = _layout_named
    allowed.update(_BY_NAME)
    return allowed


def _layout_named(name: str) -> torch.layout:
    layout = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(layout, torch.layout):
        raise pickle.UnpicklingError(f"no layout {name!r}")
    return layout


def _read(path: Path) -> list[tuple[tuple[Any, ...], Any]]:
    try:
        with open(path, "rb") as f:
            entries = _RecordsOnly(f).load()
    except Exception:  # noqa: BLE001 (a file of another torch, truncated, or not ours: only time is lost)
        return []
    if not isinstance(entries, list):
        return []
    # what the reader can build is plain already (it builds nothing else): only the shape is checked
    return [item for item in entries if type(item) is tuple and len(item) == 2 and _well_formed(*item)]


def _well_formed(parts: Any, entry: Any) -> bool:
    """A key of an aten op and an entry torch can answer from (a record in another's place
    would fail inside torch's cache hit)."""
    if type(parts) is not tuple or not parts or not isinstance(parts[0], tc.OpOverload):
        return False
    if type(entry) is _BYPASS:
        return type(entry.reason) is str
    return type(entry) is _VALID and type(entry.output_infos) is tuple and all(
        type(info) is _OUTPUT and type(info.metadata) in (_METADATA, type(None)) for info in entry.output_infos)


def _write(path: Path, entries: list[tuple[tuple[Any, ...], Any]]) -> bool:
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(entries)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return write_atomically(path, buffer.getvalue())

"""A target's traced kernels and its key's registrations, kept on disk between processes.

A new process entering ``pf.eager.on(target)`` for the first time decides a
plan for some two thousand aten ops (which of them get a kernel on the key)
and traces every decomposition it meets with fake tensors: over a second
before its first step ends, for work whose result depends only on the torch
build, the target and floor, and this package's lowering code. So what one
process learned (the registrations and each kernel traced per signature; not
a signature that could not be traced, tried again by the next process) is
written at its exit to one file,
``eager-kernels-<torch build>-<fingerprint>.pkl`` under the package's cache
directory (``disk_cache``; the 64 files of a torch build used last are kept, 256 MB
at most), and a later process starts from it: no plans are decided for registering, and a call whose signature is on file replays the
kernel (compiled on its first call) without tracing or deciding anything.

Each op's kernels are pickled apart inside the file, after a header indexing them, and read
and unpickled when a process first asks for that op (``take``): the file holds the kernels of
every model run with the target (some 1,500 for a few hundred ops after a benchmark, 4.5 MB
after op_db), a process calls a few dozen, and unpickling them all was most of a small model's
first step; reading the whole file still cost 6.6 ms of one at 4.5 MB (format 3), the header
alone some 0.2 ms.

The fingerprint covers the target and floor by name and the code that
decides plans and decompositions (``eager/``, ``opsets/``, ``op_schema.py``,
``_torch_compat/``) and the C++ replay's sources (``eager/native/``, whose keys
the file keeps): a change to any starts a new file. Each kernel is kept as its
source and its compiled code (the file's name carries the Python version), so a
later process neither traces nor compiles it, and with the program the C++ replay ran
for it and the replay's keys of those calls (``graph_programs``), so the next process's
replay serves the op from its first call (a first call through Python, and reading the
kernel's source back into a program, cost some 3 ms of a small transformer's first step). A signature is kept
only when it is made of plain values (tensor metadata, numbers, strings,
dtypes...), which compare equal in another process; one that holds an
object (a generator) stays in memory only.
"""

from __future__ import annotations

import atexit
import gc
import io
import marshal
import os
import pickle
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import torch

from .. import _torch_compat as tc
from ..disk_cache import cache_root, keep_recent, torch_build, touch
from . import cache
from .replay import TracedKernel

_PACKAGE = Path(__file__).resolve().parent.parent
# 2: each kernel's compiled code beside its source; 3: each op's kernels pickled apart; 4: after a
# header that indexes them (``_write``), read one op at a time; 5: with each kernel, its C++ replay's
# program and the keys it ran it for (``graph_programs``)
_FORMAT = 5
_LENGTH = struct.Struct("<Q")  # the header's length, first in the file
# files kept per torch build, the targets (and code versions) used most recently: at most 64 and
# 256 MB (the test suite alone uses some 30 targets; a benchmark's file holds 5-9 MB)
_KEEP, _KEEP_BYTES = 64, 256 << 20


def _code() -> list[str]:
    """The files of the code the kernels depend on (``os`` rather than ``pathlib``: a third of a
    millisecond instead of 0.8 of each process's start)."""
    found = [os.path.join(_PACKAGE, "op_schema.py")]
    for folder, recursive in (("eager", False), ("opsets", True), ("_torch_compat", False)):
        for root, folders, files in os.walk(os.path.join(_PACKAGE, folder)):
            found += [os.path.join(root, name) for name in files if name.endswith(".py")]
            if not recursive:
                folders.clear()
    # the C++ replay's sources: the file keeps its programs under the keys it computes
    native = os.path.join(_PACKAGE, "eager", "native")
    found += [os.path.join(native, name) for name in os.listdir(native) if name.endswith((".cpp", ".h"))]
    return sorted(found)


def fingerprint(names: list[str]) -> str:
    """The target's names and the code's files by name, size and modification time (as Python's
    own bytecode cache checks its sources): reading every file cost 4 ms of each process's start."""
    crc = zlib.crc32("\n".join(sorted(names)).encode())
    for path in _code():
        stat = os.stat(path)
        crc = zlib.crc32(f"{os.path.basename(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode(), crc)
    return f"{crc:08x}"


class PersistedKernels:
    """What one (target, floor) learned, read from disk once and written back at exit.

    ``registrations``: (op name, how) of each kernel on the key, and ``lifted``: the ops
    decomposed above autograd, each None until known. ``save`` keeps what the file holds
    besides (another process's kernels, written since this one read it).
    ``restore(graphs)`` fills ``Kernels.graphs`` from the file; ``save`` writes what
    the process holds (the file's entries and every kernel traced since)."""

    def __init__(self, names: list[str] | None, graphs: dict[int, dict[tuple, Any]], ops: dict[int, tc.OpOverload],
                 lifted_graphs: dict[int, dict[tuple, Any]]):
        self._names, self._graphs, self._ops = names, graphs, ops  # Kernels' graphs, and the op of each id
        # the file's tables of kernels by op id: below autograd, and the traces of the ops decomposed above it
        self._tables = {"kernels": graphs, "lifted_kernels": lifted_graphs}
        # per table: op name -> where its kernels lie in the file read (pickled), until a process asks
        self._pending: dict[str, dict[str, tuple[int, int]]] = {table: {} for table in self._tables}
        self._file: _OpenFile | None = None  # the file read: blobs are read from it on ``take``
        self._path: Path | None = None
        self.registrations: list[tuple[str, str]] | None = None
        self.lifted: list[str] | None = None  # names of the ops decomposed above autograd
        self._saved_count = -1
        atexit.register(self.save)

    def path(self) -> Path | None:
        if self._path is None:
            root = cache_root()
            if root is None or self._names is None:  # a target no file can name
                return None
            python = f"py{sys.version_info[0]}{sys.version_info[1]}"  # the compiled code's bytecode
            self._path = root / f"eager-kernels-{torch_build()}-{python}-{fingerprint(self._names)}.pkl"
        return self._path

    def restore(self) -> None:
        path = self.path()
        opened = _OpenFile.of(path)
        if opened is None or path is None:
            return
        touch(path)  # in use: the last to be pruned
        self._file = opened
        header = opened.header
        self.registrations = header.get("registrations")
        self.lifted = header.get("lifted")
        for table in self._tables:
            self._pending[table] = dict(header["index"].get(table, {}))
        self._saved_count = self._count()

    def holds(self, table: str, op: Any) -> bool:
        """Whether the file's kernels of ``op`` in ``table`` are still pickled."""
        pending = self._pending[table]
        return bool(pending) and op.name() in pending

    def take(self, table: str, op: Any) -> None:
        """Unpickle the file's kernels of ``op`` into ``table`` (once; nothing if it has none)."""
        pending = self._pending[table]
        where = pending.pop(op.name(), None) if pending else None
        if where is None or self._file is None:
            return
        try:
            entries = _unpickled(self._file.blob(*where))
        except Exception:  # noqa: BLE001  (an unreadable entry only costs its traces)
            return
        self._ops[id(op)] = op
        by_signature = self._tables[table].setdefault(id(op), {})
        restored = 0
        for signature, saved in entries:
            kernel = _restored(saved)
            if kernel is not None and signature not in by_signature:
                by_signature[signature] = kernel
                restored += 1
        self._saved_count += restored  # read, not learned: nothing new to write

    def _count(self) -> int:
        return (sum(len(entries) for graphs in self._tables.values() for entries in graphs.values())
                + (self.registrations is not None) + (self.lifted is not None))

    def save(self) -> None:
        path = self.path()
        if path is None or self._count() == self._saved_count:
            return
        on_disk = _OpenFile.of(path)  # another process may have written since this one read
        tables: dict[str, dict[str, bytes]] = {}
        for table, graphs in self._tables.items():
            pending = self._file.blobs(self._pending[table]) if self._file is not None else {}
            written = on_disk.blobs(on_disk.header["index"].get(table, {})) if on_disk is not None else {}
            tables[table] = self._merged(graphs, {**pending, **written})
        if on_disk is not None:
            on_disk.close()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            _write(tmp, {"format": _FORMAT, "registrations": self.registrations, "lifted": self.lifted}, tables)
            tmp.replace(path)
        except (OSError, pickle.PicklingError, TypeError, AttributeError):
            return
        self._saved_count = self._count()
        keep_recent(path.parent, f"eager-kernels-{torch_build()}-*.pkl", _KEEP, in_use=path, max_bytes=_KEEP_BYTES)

    def _merged(self, graphs: dict[int, dict[tuple, Any]], on_disk: dict[str, bytes]) -> dict[str, bytes]:
        """What one table of the file holds, each op's kernels pickled apart: this process's
        kernels, then what the file holds besides (another process's, written since this one
        read it); an op this process never asked for is written back as it was read."""
        kernels: dict[str, list[tuple[tuple, Any]]] = {}
        for key, entries in graphs.items():
            op = self._ops.get(key)
            for signature, kernel in entries.items():
                if op is not None and _plain(signature):
                    written = _written(kernel)
                    if written is not False:
                        kernels.setdefault(op.name(), []).append((signature, written))
        merged = {name: blob for name, blob in on_disk.items() if name not in kernels}
        for name, ours in kernels.items():
            if name in on_disk:
                known = {signature for signature, _ in ours}
                try:
                    ours += [entry for entry in _unpickled(on_disk[name]) if entry[0] not in known]
                except Exception:  # noqa: BLE001  (an unreadable entry is dropped)
                    pass
            merged[name] = _dumps(ours)
        return merged


def _layout_named(name: str) -> torch.layout:
    """A layout by its attribute name (``strided``). torch pickles a layout as a call of
    ``torch.serialization._get_layout``, which scans every attribute of ``torch`` on its first
    call: 1 ms of each process's first step, for the layouts a kernel's signature names."""
    return getattr(torch, name)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.layout):
            return _layout_named, (str(obj).rpartition(".")[2],)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    """``pickle.dumps``, a layout pickled by name (``_layout_named``)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _unpickled(data: bytes) -> Any:
    """``pickle.loads`` without the garbage collector: the thousands of small objects it makes
    would set off a full collection of a process holding a model and its libraries (a third of
    a second, measured with transformers loaded), and none of them is garbage."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)  # noqa: S301  (our own file, in our own cache directory)
    finally:
        if enabled:
            gc.enable()


_PLAIN_LEAVES = (bool, int, str, type(None), type, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):  # torch.Size too
        return all(_plain(item) for item in value)
    return isinstance(value, _PLAIN_LEAVES)


def _write(path: Path, header: dict[str, Any], tables: dict[str, dict[str, bytes]]) -> None:
    """The file: the header's length, the header (``header`` and ``index``: per table, each op's
    (offset, length) after the header), then each op's pickled kernels, one after another."""
    index: dict[str, dict[str, tuple[int, int]]] = {}
    blobs: list[bytes] = []
    offset = 0
    for table, by_name in tables.items():
        index[table] = {}
        for name, blob in by_name.items():
            index[table][name] = (offset, len(blob))
            blobs.append(blob)
            offset += len(blob)
    encoded = _dumps({**header, "index": index})
    with open(path, "wb") as f:
        f.write(_LENGTH.pack(len(encoded)))
        f.write(encoded)
        f.writelines(blobs)


class _OpenFile:
    """A kernel file opened for reading: its header read, its blobs read on demand. It stays open
    until the process ends (or ``close``): a process writing the file meanwhile replaces it with
    another (``save`` writes a new file and renames it), so what this one indexed stays readable."""

    def __init__(self, handle: Any, header: dict[str, Any], base: int):
        self._handle, self.header, self._base = handle, header, base

    @classmethod
    def of(cls, path: Path | None) -> _OpenFile | None:
        """``path`` opened, or None where it is missing, unreadable or of another format."""
        if path is None:
            return None
        try:
            handle = open(path, "rb")  # noqa: SIM115  (kept open: blobs are read from it later)
        except OSError:
            return None
        try:
            length = _LENGTH.unpack(handle.read(_LENGTH.size))[0]
            header = _unpickled(handle.read(length))
            if isinstance(header, dict) and header.get("format") == _FORMAT and isinstance(header.get("index"), dict):
                return cls(handle, header, _LENGTH.size + length)
        except Exception:  # noqa: BLE001, S110  (an unreadable file only costs the time it was to save)
            pass
        handle.close()
        return None

    def blob(self, offset: int, length: int) -> bytes:
        data = os.pread(self._handle.fileno(), length, self._base + offset)
        if len(data) != length:
            raise OSError("the kernel file is shorter than its index says")
        return data

    def blobs(self, where: dict[str, tuple[int, int]]) -> dict[str, bytes]:
        """The blobs named (an unreadable one left out: it only costs its traces)."""
        found = {}
        for name, (offset, length) in where.items():
            try:
                found[name] = self.blob(offset, length)
            except OSError:
                continue
        return found

    def close(self) -> None:
        self._handle.close()


def _written(kernel: Any) -> Any:
    """What the file holds for a kernel: its code and constants (ops by name); False where it
    is not kept: a signature that could not be traced (the failure may have been this process's
    own, a mode active around the session: the next process tries once more), or a constant
    that would not survive another process."""
    if kernel is cache.UNCACHEABLE:
        return False
    program, keys = _native_program(kernel)
    if kernel.saved is not None:  # restored from the file: written back as it was read
        return kernel.code, kernel.saved[0], kernel.saved[1], program, keys
    constants: list[tuple[str, Any]] = []
    for value in kernel.constants:
        if isinstance(value, tc.OpOverload):
            constants.append(("op", value.name()))
        elif isinstance(value, torch.Tensor) or _plain(value) or isinstance(value, (float, complex)):
            constants.append(("value", value))
        else:
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001  (kept in memory only)
                return False
            constants.append(("value", value))
    return kernel.code, constants, marshal.dumps(kernel.compiled()), program, keys


def _native_program(kernel: TracedKernel) -> tuple[Any, tuple[tuple[int, ...], ...]]:
    """The kernel's C++ program and the keys the replay ran it for, where it ran (and the program
    pickles: its constants are the kernel's); else (None, ())."""
    keys = tuple(sorted(kernel.native_keys))
    if not keys or not isinstance(kernel.native, tuple):
        return None, ()
    try:
        _dumps(kernel.native)
    except Exception:  # noqa: BLE001  (the next process learns it again from its first call)
        return None, ()
    return kernel.native, keys


def _restored(saved: Any) -> TracedKernel | None:
    if not isinstance(saved, tuple) or len(saved) != 5:
        return None
    code, constants, compiled, program, keys = saved
    return TracedKernel.restored(code, constants, compiled, program, keys)

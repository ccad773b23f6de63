"""The torch files whose frames fx's tracer drops from a node's ``stack_trace``, kept on disk.

torch computes the set by importing every module it names, torch.export's tracer
among them (aot_autograd and networkx: a tenth to a third of a second), which a
first export needs for nothing else. The set is a list of paths of the installed
torch, so it is kept in a file per torch build and install directory and read
back by later processes; a file that cannot be read, is not a list of paths, or
names a file that no longer exists is ignored and the set computed again.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import torch

from .. import _torch_compat as tc
from ..disk_cache import cache_root, read_json, torch_build, write_json

_dropped: frozenset[str] | None = None


def cache_path() -> Path | None:
    """This torch install's file (None: ``$PREDISPATCH_FUNC_CACHE`` is empty): the paths are absolute,
    so two environments with the same torch build in different places keep different files."""
    root = cache_root()
    if root is None:
        return None
    where = zlib.crc32(os.path.dirname(os.path.abspath(torch.__file__)).encode())
    return root / f"stack-trace-dropped-{torch_build()}-{where:08x}.json"


def _trusted(value: object) -> frozenset[str] | None:
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        return None
    if not all(os.path.exists(p) for p in value if os.path.isabs(p)):
        return None  # torch moved or changed under the same name
    return frozenset(value)


def dropped_files() -> frozenset[str]:
    """torch's uninteresting files, from this process, the disk, or torch (then written to disk)."""
    global _dropped
    if _dropped is None:
        path = cache_path()
        _dropped = _trusted(read_json(path))
        if _dropped is None:
            _dropped = frozenset(tc.uninteresting_stack_files())
            if path is not None:
                write_json(path, sorted(_dropped))
    return _dropped


def forget() -> None:
    """Drop this process's copy (tests: a new process)."""
    global _dropped
    _dropped = None

"""The session's C++ kernels (``native/``: in-place ops through their twins, decomposed ops'
cached kernels replayed, ops of the target run with the key off, sdpa's math path, ``where`` and
the comparisons as vector loops), built once per torch build and machine.

Built with torch's own extension builder (``torch.utils.cpp_extension``: the machine's C++
compiler and ninja) the first time a process asks, into ``$PREDISPATCH_FUNC_NATIVE_DIR``
(default ``~/.cache/predispatch_func_native``), under a name that carries the torch version
the Python version and the source's hash; a later process loads the built module directly. Where it cannot be
built (no compiler), or ``PREDISPATCH_FUNC_NATIVE=0``, ``module()`` is None and the session's
Python kernels serve every call, with the same results: the C++ kernel only takes the calls
whose outcome it does not decide (``keyed_kernels._through_twin_in_place``, ``keyed_kernels._replaying``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

_NATIVE = Path(__file__).parent / "native"
_SOURCES = tuple(_NATIVE / name for name in ("kernels.cpp", "through_twin.cpp", "graph_replay.cpp", "key_off.cpp",
                                               "math_attention.cpp", "first_meeting.cpp",
                                               "mask_kernels.cpp"))
_HEADERS = (_NATIVE / "registry.h", _NATIVE / "mask_kernels.h")
_lock = threading.Lock()
_loaded: list[ModuleType | None] = []
why_unavailable = ""  # set where ``module()`` is None


def _name() -> str:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (*_SOURCES, *_HEADERS))).hexdigest()[:12]
    release = torch.__version__.replace(".", "_").replace("+", "_")
    return f"pf_native_py{sys.version_info[0]}{sys.version_info[1]}_{release}_{digest}"


def _directory() -> Path:
    return Path(os.environ.get("PREDISPATCH_FUNC_NATIVE_DIR") or Path.home() / ".cache" / "predispatch_func_native")


def module() -> ModuleType | None:
    """The built module, loaded once per process (built first where this machine has none)."""
    global why_unavailable
    with _lock:
        if not _loaded:
            try:
                _loaded.append(_load())
            except Exception as exc:  # noqa: BLE001 (no compiler, a failed build: the Python kernels serve)
                why_unavailable = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                _loaded.append(None)
        return _loaded[0]


def loaded() -> bool:
    """Whether ``module()`` has been asked for in this process (built or found unavailable)."""
    return bool(_loaded)


def _load() -> ModuleType | None:
    global why_unavailable
    if os.environ.get("PREDISPATCH_FUNC_NATIVE", "1") == "0":
        why_unavailable = "PREDISPATCH_FUNC_NATIVE=0"
        return None
    name = _name()
    directory = _directory() / name
    built = directory / f"{name}.so"
    if not built.exists():
        from torch.utils import cpp_extension

        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(directory)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cpp_extension.load(name=name, sources=[str(path) for path in _SOURCES], build_directory=str(directory),
                                      extra_cflags=["-O2"], verbose=False)
    spec = importlib.util.spec_from_file_location(name, built)
    assert spec is not None and spec.loader is not None
    # bound lazily: Python loads extensions with RTLD_NOW, resolving every libtorch symbol the
    # module names up front (1.0 -> 0.7 ms of a session's first step); it was built for this torch
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY)
    try:
        loaded = importlib.util.module_from_spec(spec)
    finally:
        sys.setdlopenflags(flags)
    spec.loader.exec_module(loaded)
    return loaded


STALE_AFTER_S = 600.0  # a build takes some 20 s; a lock this old was left by a process that died


def clear_stale_lock(directory: Path) -> None:
    """torch's extension builder waits for its ``lock`` file to go away, forever: a process killed
    while building (a test run interrupted) would hang every later one. A lock older than any build
    is removed."""
    lock = directory / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_AFTER_S:
            lock.unlink()
    except FileNotFoundError:
        pass

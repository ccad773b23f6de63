"""Where this package keeps what it computed once per torch build, between processes.

One directory, ``$PREDISPATCH_FUNC_CACHE`` (default ``~/.cache/predispatch_func``;
empty turns every disk cache off). Each cache is a file named after the torch
build it is valid for; files are replaced whole (write then rename), so a
process never reads a half-written one, and a file that cannot be read or
written only costs the time it was meant to save.

Kept here: the composite guard's verdicts and eager-kernel checks
(``trace/persisted_guards.py``), fake dispatch results per model
(``trace/persisted_fake_dispatch.py``), aten entries audited lazily on a torch without a
shipped table (``schema_audit/lazy.py``), OpInfo samples (``schema_audit/opinfo.py``), and
``pf.eager``'s registrations and traced kernels per target (``eager/persisted_kernels.py``).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def cache_root() -> Path | None:
    """The cache directory, or None where ``$PREDISPATCH_FUNC_CACHE`` is set empty."""
    root = os.environ.get("PREDISPATCH_FUNC_CACHE")
    if root == "":
        return None
    return Path(root) if root else Path.home() / ".cache" / "predispatch_func"


def torch_build() -> str:
    """The installed torch's release and build commit, as cache file names carry them."""
    return f"{torch.__version__.split('+')[0]}-{(torch.version.git_version or '')[:12] or 'unknown'}"


def files_fingerprint(paths: Iterable[Path]) -> str:
    """A CRC of the files' bytes: the code a cached result depends on besides torch, so that a
    change to it starts a new file."""
    crc = 0
    for path in paths:
        crc = zlib.crc32(path.read_bytes(), crc)
    return f"{crc:08x}"


def write_atomically(path: Path, data: bytes) -> bool:
    """Replace ``path`` by ``data`` (written beside it, then renamed: a reader never sees half a
    file); False where it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def write_json(path: Path, value: Any) -> bool:
    """Replace ``path`` by ``value`` as JSON, atomically; False where it cannot be written."""
    return write_atomically(path, json.dumps(value).encode())


def read_json(path: Path | None) -> Any:
    """``path``'s JSON, or None where there is none or it cannot be read."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def keep_recent(directory: Path, pattern: str, keep: int, in_use: Path, max_bytes: int | None = None) -> None:
    """Remove the files of ``directory`` matching ``pattern`` beyond the ``keep`` most recently
    used (written, or read and touched), and beyond ``max_bytes`` in all, ``in_use`` always kept
    and counted first. A cache keyed by a fingerprint of the code and the target starts a new
    file at every upgrade of this package and every new target: without a bound the directory
    only grows (hundreds of files of a few megabytes each on a machine that ran a few hundred
    targets)."""
    try:
        total = in_use.stat().st_size if in_use.exists() else 0
        files = sorted(((path.stat().st_mtime_ns, path) for path in directory.glob(pattern) if path != in_use),
                       reverse=True)
        kept, full = 1, False
        for _, path in files:  # newest first: once one is over a bound, it and every older one go
            size = path.stat().st_size
            full = full or kept >= keep or (max_bytes is not None and total + size > max_bytes)
            if full:
                path.unlink(missing_ok=True)
            else:
                kept, total = kept + 1, total + size
    except OSError:  # another process removed or replaced one meanwhile: the next write prunes again
        return


def touch(path: Path) -> None:
    """Mark ``path`` as used now (``keep_recent`` orders by it); nothing where it cannot."""
    try:
        os.utime(path)
    except OSError:
        return

"""The composite guard's verdicts for static shapes, kept on disk between processes.

The trace-time guard (:mod:`.composite_policy`) runs a composite's decomposition
on fresh fake tensors. For inputs without symbolic sizes its verdict depends only
on the op, the inputs' metadata, the torch build and this package's guard code,
so a first export in a new process (the CLI, a conversion script, a CI job) can
take the verdicts earlier processes found instead of re-running decompositions
(a third of bert's first export). Only aten ops are kept on disk: a user's own
composite may change between runs under the same name. Keys that print an object
address are kept in memory only, since another process may reuse the address.
"""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from .. import _torch_compat as tc
from ..disk_cache import cache_root, files_fingerprint, keep_recent, read_json, torch_build, touch, write_json

_PACKAGE = Path(__file__).resolve().parent.parent
# the code a verdict depends on besides torch: a change to it starts a new file
_GUARD_CODE = (_PACKAGE / "trace" / "composite_policy.py", Path(__file__).resolve(),
               *sorted((_PACKAGE / "_torch_compat").glob("*.py")))


_KEEP = 8  # files kept per cache and torch build


class PersistedVerdicts:
    """A mapping from a guard key to its verdict: in memory for the process, seeded
    from a file on first use and written back at exit when it learned something."""

    __slots__ = ("name", "_memory", "_disk", "_learned")

    def __init__(self, name: str):
        self.name = name
        self._memory: dict[Any, Any] = {}
        self._disk: dict[str, Any] | None = None  # read on first miss
        self._learned: dict[str, Any] = {}
        atexit.register(self.save)

    def path(self) -> Path | None:
        root = cache_root()
        return None if root is None else root / f"{self.name}-{torch_build()}-{files_fingerprint(_GUARD_CODE)}.json"

    def __contains__(self, key: Any) -> bool:
        if key in self._memory:
            return True
        text = _disk_key(key)
        if text is None:
            return False
        if self._disk is None:
            path = self.path()
            found = read_json(path)
            self._disk = found if isinstance(found, dict) else {}
            if self._disk and path is not None:
                touch(path)  # in use: the last to be pruned
        if text in self._disk:
            self._memory[key] = self._disk[text]
            return True
        return False

    def __getitem__(self, key: Any) -> Any:
        return self._memory[key]

    def __setitem__(self, key: Any, verdict: Any) -> None:
        self._memory[key] = verdict
        text = _disk_key(key)
        if text is not None:
            self._learned[text] = verdict

    def save(self) -> None:
        """Merge what this process learned into the file (another process may have added to it)."""
        path = self.path()
        if not self._learned or path is None:
            return
        found = read_json(path)
        merged = {**(found if isinstance(found, dict) else {}), **self._learned}
        if write_json(path, merged):
            self._learned = {}
            # one file per code version: the ones used last are kept
            keep_recent(path.parent, f"{self.name}-{torch_build()}-*.json", _KEEP, in_use=path)

    def forget(self) -> None:
        """Drop the process's verdicts and what was read from disk (tests of the cache)."""
        self._memory.clear()
        self._disk = None
        self._learned = {}


def _disk_key(key: Any) -> str | None:
    op = key[0]
    if not isinstance(op, tc.OpOverload) or op.namespace != "aten":
        return None
    text = repr(key)
    return None if " at 0x" in text else text

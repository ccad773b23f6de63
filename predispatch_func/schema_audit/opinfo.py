"""torch's OpInfo sample inputs (``op_db``), matched to aten packets and cached on disk.

Importing ``op_db`` takes seconds, longer than auditing an op. So the samples
of each packet are saved once per torch build under the user's cache
directory (``$PREDISPATCH_FUNC_CACHE``, default ``~/.cache/predispatch_func``),
with an index of which packets have any; a later audit of one op loads a small
file instead of importing ``op_db``. Samples are generated with a seed derived
from the packet name, so they do not depend on what ran before.
"""

from __future__ import annotations

import functools
import itertools
import json
import zlib
from pathlib import Path
from typing import Any

import torch

from .. import _torch_compat as tc
from ..disk_cache import cache_root, write_atomically
from .samples import Sample

MAX_OPINFO_SAMPLES = 6
_CACHE_FORMAT = 2


def _cache_dir() -> Path | None:
    root = cache_root()
    if root is None:
        return None  # caching disabled
    build = (torch.version.git_version or torch.__version__)[:12]
    return root / f"opinfo-{build}-n{MAX_OPINFO_SAMPLES}-f{_CACHE_FORMAT}"


def _packet_name_of(opinfo: Any) -> str:
    name = opinfo.aten_name or opinfo.name
    for prefix in ("torch.ops.aten.", "nn.functional.", "torch."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split(".default")[0].replace(".", "_")


@functools.lru_cache(maxsize=1)
def _opinfos_by_packet() -> dict[str, list[Any]]:
    """op_db grouped by the aten packet each OpInfo most likely calls (imports op_db)."""
    index: dict[str, list[Any]] = {}
    for info in tc.opinfo_db():
        names = {_packet_name_of(info), info.name.split(".")[-1]}
        names |= {a.name.replace(".", "_") for a in info.aliases}
        for n in names:
            index.setdefault(n, []).append(info)
    cache = _cache_dir()
    if cache is not None:
        write_atomically(cache / "index.json", json.dumps(sorted(index)).encode())
    return index


@functools.lru_cache(maxsize=1)
def _packets_with_opinfo() -> frozenset[str]:
    cache = _cache_dir()
    if cache is not None and (cache / "index.json").exists():
        try:
            return frozenset(json.loads((cache / "index.json").read_text()))
        except (OSError, ValueError):
            pass
    return frozenset(_opinfos_by_packet())


def _pick_dtype(info: Any) -> torch.dtype | None:
    dtypes = info.supported_dtypes("cpu")
    for preferred in (torch.float32, torch.float64, torch.int64, torch.bool):
        if preferred in dtypes:
            return preferred
    return next(iter(sorted(dtypes, key=str)), None)


def _generate(info: Any, dtype: torch.dtype) -> list[Any]:
    gen = info.sample_inputs("cpu", dtype, requires_grad=False)
    try:
        return list(itertools.islice(gen, MAX_OPINFO_SAMPLES))
    finally:
        # close now: OpInfo generators run under no_grad(), and one left to the
        # garbage collector toggles grad mode wherever it is finalised, e.g.
        # inside a later export trace
        close = getattr(gen, "close", None)
        if close is not None:
            close()


def _build(packet: str) -> tuple[Sample, ...]:
    out: list[Sample] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(packet.encode()))
        for info in _opinfos_by_packet().get(packet, ()):
            dtype = _pick_dtype(info)
            if dtype is None:
                continue
            tag = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
            try:
                made = _generate(info, dtype)
            except Exception:  # an OpInfo that cannot build CPU samples offers nothing
                continue
            out += [Sample(f"opinfo:{tag}", (s.input, *s.args), dict(s.kwargs)) for s in made]
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _samples_for_packet(packet: str) -> tuple[Sample, ...]:
    if packet not in _packets_with_opinfo():
        return ()
    cache = _cache_dir()
    path = cache / f"{packet}.pt" if cache is not None else None
    if path is not None and path.exists():
        try:
            # stored as plain data and read back with weights_only=True: the cache
            # folder may hold anything, and nothing in it may run code when loaded
            return tuple(Sample(source, tuple(args), dict(kwargs))
                         for source, args, kwargs in torch.load(path, weights_only=True))
        except Exception:
            pass  # unreadable, or not plain data: rebuild below
    samples = _build(packet)
    if path is not None:
        try:
            import io

            buf = io.BytesIO()
            torch.save([(s.source, tuple(s.args), dict(s.kwargs)) for s in samples], buf)
            write_atomically(path, buf.getvalue())
        except Exception:
            pass  # a sample holding something unpicklable is simply not cached
    return samples


def _packet(op: tc.OpOverload) -> str:
    return tc.schema_of(op).name.split("::")[-1]


def opinfo_samples(op: tc.OpOverload) -> list[Sample]:
    """OpInfo samples for ``op``'s packet; the checker drops those that do not bind."""
    return list(_samples_for_packet(_packet(op)))


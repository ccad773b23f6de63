"""Every private PyTorch API this project touches, in one package, sorted by how
it can break on a torch upgrade (we support torch 2.13, 2.14 and 2.15):

- ``reexports``: private names re-exported or wrapped in a line. A name that
  moved fails loudly, at import or in ``tests/torch_compat/test_torch_assumptions.py``.
- ``patches``: context managers that patch torch's globals for the length of a
  trace, each restoring on every path (checked, error path included).
- ``reimplemented``: code restating torch internals, each with a drift test
  running our path and torch's on the same programs (``tests/torch_compat/test_torch_drift.py``).
- ``error_texts``: the texts of torch's error messages we translate into
  refusals, each provoked on the installed torch by a test.

Where releases differ, one path serves all if it can (``Function.apply``
became a C classmethod in 2.14). When a difference must be decided, the
installed torch is probed for the feature once, here, rather than by comparing
version strings (``PYTHON_FALLBACK_ON_SPARE_KEY``: where a keyed ``pf.eager``
session registers its kernels on first call or up front).

Call sites import from here (``from .. import _torch_compat as tc``); nothing
outside this package imports ``torch._*`` (ruff's banned-api rule).
"""

from __future__ import annotations

from . import error_texts
from .autograd_tracing import *  # noqa: F403
from .autograd_tracing import __all__ as _autograd_tracing
from .patches import *  # noqa: F403
from .patches import __all__ as _patches
from .reexports import *  # noqa: F403
from .reexports import __all__ as _reexports
from .reimplemented import *  # noqa: F403
from .reimplemented import __all__ as _reimplemented

__all__ = ["error_texts", *_reexports, *_patches, *_reimplemented, *_autograd_tracing]

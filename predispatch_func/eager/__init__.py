"""Eager execution on a backend's op set: ``pf.eager.on(target)``, ``pf.eager.register``.

See ``docs/eager.md``. ``session`` is what a user enters, ``session_key`` its
fast path (kernels on a dispatch key, no Python mode), ``mode`` the dispatch
mode that runs the plans (and observes every op), ``plans`` decides how an
op outside the target runs, ``cache`` traces decompositions per signature,
``above_autograd`` the few ops autograd must see decomposed, ``floor`` what
any backend needs besides a functional set, ``register`` the same kernels on
a real backend's dispatch key.
"""

from .floor import RUNTIME_FLOOR
from .mode import EagerMode, EagerUnreachableError
from .register import BackendLacksFloorError, Registration, register
from .session import on
from .stats import EagerStats

__all__ = ["RUNTIME_FLOOR", "BackendLacksFloorError", "EagerMode", "EagerStats", "EagerUnreachableError",
           "Registration", "on", "register"]

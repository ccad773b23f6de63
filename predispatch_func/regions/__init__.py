"""Grad-mode and autocast regions.

Pre-dispatch tracing records ``torch._C._set_grad_enabled`` and autocast
enter/exit calls as marker nodes in the flat functional graph.
:func:`outline_regions` is the pipeline stage that turns them into calls of
the region HOPs of ``ops.py`` (``pf_grad_region``, ``pf_autocast_region``),
nested as in the model, with mutated values threaded out as results.
"""

from .regions import outline_regions

__all__ = ["outline_regions"]

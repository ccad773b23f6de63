"""Grad-mode and autocast regions.

Pre-dispatch tracing records ``torch._C._set_grad_enabled`` and autocast
enter/exit calls as marker nodes in the flat functional graph.
:func:`outline_regions` is the pipeline stage that turns them into region
HOP calls; until region HOPs land, a marker that actually changes the mode is
refused with an error naming the call and the user's source line.
"""

from .regions import outline_regions

__all__ = ["outline_regions"]

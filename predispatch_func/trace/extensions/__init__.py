"""What the trace must see that the dispatcher never shows it, in one context.

Entered by the tracer around the user's code:

* custom ``torch.autograd.Function``s become ``pf_autograd_function`` calls
  that keep their backward (``function_trace.py``);
* ``Tensor.register_hook`` and ``requires_grad_()`` are recorded (``hooks.py``);
* ``torch.inference_mode()`` is a grad-mode change, so it becomes a ``no_grad``
  region (C++ inference mode cannot be traced: its tensors cannot re-enter
  autograd, and its values equal ``no_grad``'s wherever eager runs);
* ``torch.compile``-d submodules run the module they wrap;
* ``torch.func`` transforms (``torch.vmap``, ``grad``, ...) are traced below autograd, where functorch
  runs them (``func_transforms.py``);
* torch's HOPs find a rule for our mode (``torch_hops.py``), and where torch
  cannot trace one, a clear refusal (``torch_limits.py``);
* ``torch.autograd.grad`` and ``backward()`` called by the model are refused
  before autograd, with what to write instead (``autograd_calls.py``).
"""

from __future__ import annotations

import contextlib

from ... import _torch_compat as tc
from ...mode_capabilities import TraceBody
from .autograd_calls import autograd_calls_refused
from .func_transforms import func_transforms_traced_below_autograd
from .function_trace import tracing_autograd_functions
from .torch_hops import let_torch_hops_through
from .torch_limits import torch_hop_limits_refused


@contextlib.contextmanager
def traced_extensions(trace_body: TraceBody, *, pre_dispatch: bool = True):
    """``trace_body`` traces the bodies of Functions and hooks (the driver's pipeline)."""
    mode = tc.active_functional_mode()
    if mode is not None:
        let_torch_hops_through(type(mode))
    with tracing_autograd_functions(trace_body, pre_dispatch=pre_dispatch), \
            tc.inference_mode_as_grad_mode(), tc.compiled_modules_run_eagerly(), \
            torch_hop_limits_refused(), tc.hop_capture_static(), func_transforms_traced_below_autograd(), \
            autograd_calls_refused():
        yield

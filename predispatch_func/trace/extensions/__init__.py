"""What the trace must see that the dispatcher never shows it.

Each is entered around the user's code by the trace's environment
(``trace/environment.py``, the traced function's layer):

* custom ``torch.autograd.Function``s become ``pf_autograd_function`` calls
  that keep their backward (``function_trace.py``); a later call that nothing
  distinguishes reuses the first call's traced bodies (``function_reuse.py``);
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
  before autograd, with what to write instead (``autograd_calls.py``);
* a tensor subclass's own attributes and methods read on its traced value, and a
  subclass built in forward, become torch.export's nodes for them
  (``tensor_subclasses.py``).
"""


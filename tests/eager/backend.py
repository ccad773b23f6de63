"""A test backend that implements only Core ATen plus the runtime floor, without hardware.

(And the few ops of ``EXTRA``, which torch cannot lower into Core ATen.)

torch's Python PrivateUse1 setup gives the device ``pfdev`` a device guard and
hooks; a tensor on it is a wrapper (its ``__torch_dispatch__``
redispatches straight to the PrivateUse1 kernels) holding a CPU tensor. Every op of Core ATen
and of the floor has a PrivateUse1 kernel that runs it on the CPU tensors;
every other op that reaches the backend raises, naming it (torch's composite
kernels aside: every backend runs those, and their ops come back here). What
this backend runs beyond its set is exactly what ``pf.eager.register`` adds,
or what a keyed ``pf.eager.on`` session lowers (its key is passed on as a C++
tensor's dispatch would).
"""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
from torch.utils.backend_registration import _DummyBackendModule, _setup_privateuseone_for_python_backend

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import session_key
from predispatch_func.eager.keyed_kernels import numbers_as_tensors
from predispatch_func.opsets import Lowering

DEVICE = "pfdev"


class _DeviceModule(_DummyBackendModule):
    """torch.pfdev: the device has no generator of its own (random ops run on CPU tensors), but
    code that saves and restores every device's RNG (fork_rng) asks it for one."""

    def get_rng_state(self, device=None):
        return torch.empty(0, dtype=torch.uint8)

    def set_rng_state(self, new_state, device=None):
        pass

    def manual_seed(self, seed):
        pass

    def get_amp_supported_dtype(self):
        # torch.utils.checkpoint enters autocast on the default device type, which a registered
        # PrivateUse1 backend becomes for the rest of the process: autocast asks its module this
        return [torch.bfloat16, torch.float16]


class NotOnBackend(RuntimeError):
    pass


class OnDevice(torch.Tensor):
    """A ``pfdev`` tensor: its value is ``self.value``, a CPU tensor of the same geometry."""

    value: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, value: torch.Tensor, requires_grad: bool = False):
        out = torch.Tensor._make_wrapper_subclass(
            cls, value.size(), strides=value.stride(), storage_offset=value.storage_offset(), dtype=value.dtype,
            layout=value.layout, device=torch.device(DEVICE, 0), requires_grad=requires_grad)
        out.value = value
        return out

    def __repr__(self) -> str:
        return f"OnDevice({self.value!r})"

    def tolist(self):  # a C++ device tensor copies to the host for it; torch refuses wrapper subclasses
        return self.value.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # wrapper subclasses must define it; go straight on to the backend's key, as a C++ tensor would
        # Python numbers where the schema says Tensor reach a mode as numbers; the boxed call wants tensors
        # (as pf.eager's kernels make them: eager's dtype and value, not the default dtype's rounding)
        tensor_typed = tuple(i for i, a in enumerate(func._schema.arguments) if str(a.type) == "Tensor")
        args = numbers_as_tensors(tuple(args), tensor_typed)
        # a C++ tensor's dispatch passes the keys its thread includes: a keyed pf.eager session's too
        # (where it has a kernel there: redispatch does not skip a fallthrough as dispatch does)
        session = tc.spare_key_active()
        if session and session_key.kind_of_op(func) not in (None, session_key.THROUGH):
            return func.redispatch(_BACKEND_KEYS | _SESSION_KEYS, *args, **(kwargs or {}))
        if session and (func.is_view or func.name() in session_key.VIEWS_BY_ANOTHER_NAME) and \
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeExplicitAutograd"):
            # the session leaves these views to torch's composite kernel, which a C++ backend runs in
            # metadata; a wrapper tensor cannot, so the view is made here, on the CPU value
            return _kernel(func)(*args, **(kwargs or {}))
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # a decomposition run below autograd (by the session's key, or a registered kernel) calls
            # composite ops: a C++ backend runs torch's composite kernel for them, as here
            return func.decompose(*args, **(kwargs or {}))
        if not _runs_on_backend(func):
            raise NotOnBackend(f"test backend: {func} is not in Core ATen nor the runtime floor, and nothing "
                               "registered a kernel for it")
        return func.redispatch(_BACKEND_KEYS, *args, **(kwargs or {}))


def _runs_on_backend(op) -> bool:
    """A kernel on PrivateUse1 itself (ours, or registered by pf.eager), or torch's composite
    kernel, which every backend runs without registering it (its ops come back here); but not
    a view's, which builds the view's TensorImpl itself and cannot for a wrapper tensor."""
    name = op.name()
    return (torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
            or (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")
                and not op.is_view))


_BACKEND_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_SESSION_KEYS = torch._C.DispatchKeySet(torch._C._parse_dispatch_key(tc.SPARE_KEY))
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _to_cpu(x):
    return x.value if isinstance(x, OnDevice) else (torch.device("cpu") if _is_backend_device(x) else x)


def _is_backend_device(x) -> bool:
    if isinstance(x, str):  # a device string, or another string argument (rounding_mode="floor")
        return x.split(":")[0] == DEVICE
    return isinstance(x, torch.device) and x.type == DEVICE


def _kernel(op):
    def run(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and not isinstance(a, OnDevice) and a.device.type == "meta"
               for a in pytree.tree_leaves((args, kwargs))):
            # a fake tensor's bookkeeping: FakeTensor.__new__ detaches its meta value, which carries this
            # device's keys (a decomposition traced on fake pfdev tensors, then replayed on that value):
            # metadata alone, as a C++ backend's view kernels compute it
            return op.redispatch(_META_KEYS, *args, **kwargs)
        cpu_args, cpu_kwargs = pytree.tree_map(_to_cpu, (args, kwargs))
        to_cpu = "device" in kwargs and kwargs["device"] is not None and not _is_backend_device(kwargs["device"])
        with tc.excluding_spare_key():  # the backend's own work on its CPU values: no session sees it
            if op is torch.ops.aten.histc.default and not cpu_args[0].is_floating_point():
                # transformers gives histc integers on any device but the CPU (CUDA's histc takes them)
                out = op(cpu_args[0].double(), *cpu_args[1:], **cpu_kwargs).to(cpu_args[0].dtype)
            else:
                out = op(*cpu_args, **cpu_kwargs)
        schema = op._schema
        if schema.is_mutable:  # in-place and out=: return the caller's tensors
            written = [a for a, s in zip(args, schema.arguments) if s.alias_info and s.alias_info.is_write]
            written += [kwargs[s.name] for s in schema.arguments if s.name in kwargs and s.alias_info
                        and s.alias_info.is_write]
            if len(schema.returns) == 1 and written and schema.returns[0].alias_info is not None:
                return written[0]
            if written and all(r.alias_info is not None for r in schema.returns):
                return tuple(written)
        if to_cpu:
            return out
        return pytree.tree_map_only(torch.Tensor, OnDevice, out)
    return run


def _not_lowerable(names: list[str]) -> pf.OpSet:
    lowering = Lowering(pf.OpSet.core_aten() | pf.eager.RUNTIME_FLOOR)
    return pf.OpSet.from_names([n for n in names if lowering.decomposition(*pf.OpSet.from_names([n])) is None],
                               name="not lowerable")


# ops the corpus models call that cannot be lowered into Core ATen on this release (histc and
# linalg_vector_norm wherever neither torch nor opsets/decompositions lowers them: none left on the supported
# torches): a backend must have them itself, as the mode says (EagerUnreachableError, Registration.unreachable)
EXTRA = _not_lowerable(["aten.histc.default", "aten.linalg_vector_norm.default"])
TARGET = pf.OpSet.core_aten() | EXTRA  # what the backend implements, the floor aside


@functools.lru_cache(maxsize=1)
def setup() -> torch.library.Library:
    """Once per process: the device and a kernel for each op of ``TARGET`` and the floor."""
    _setup_privateuseone_for_python_backend(DEVICE, backend_module=_DeviceModule())
    library = torch.library.Library("aten", "IMPL")
    ops = TARGET | pf.eager.RUNTIME_FLOOR
    for op in ops:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            library.impl(op, _kernel(op), "PrivateUse1")
    return library


def to_device(t: torch.Tensor) -> OnDevice:
    return OnDevice(t.detach().clone(), requires_grad=t.requires_grad)


def from_device(t: torch.Tensor) -> torch.Tensor:
    return t.value if isinstance(t, OnDevice) else t

"""What ``predispatch_func/_torch_compat/`` assumes of the installed torch, checked on it.

- every private torch name the package reaches for inside a function (imported
  lazily, or read as ``torch._x.y``) resolves;
- every context manager of ``patches.py`` restores what it patched when its
  body raises;
- torch never caches a PreDispatch handler (the mode-push shortcut's premise);
- the torch limits we refuse *before* torch raises (so no strict xfail can turn
  green when torch fixes them) are still torch's limits.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import math
import pathlib

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func._torch_compat import patches

COMPAT = pathlib.Path(tc.__file__).parent


# --- private names resolve ----------------------------------------------------------------


def _resolve(dotted: str):
    """The object at ``a.b.c``: attributes from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _dotted(node: ast.AST) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


def _lazy_private_names() -> list[tuple[str, str]]:
    """(file:line, dotted name) for each name the package resolves only when a function runs:
    ``import``/``from ... import`` inside a function, attributes read through such an
    import, and ``torch._x...`` attribute chains inside functions."""
    found = []
    for path in sorted(COMPAT.glob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            bound = {"torch": "torch"}  # local name -> dotted path
            for node in ast.walk(func):
                where = f"{path.name}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        found.append((where, alias.name))
                        bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname \
                            else alias.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        found.append((where, f"{node.module}.{alias.name}"))
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            for node in ast.walk(func):
                if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_pf_parent", None), ast.Attribute):
                    chain = _dotted(node)
                    if chain and chain[0] in bound and any(p.startswith("_") and not p.startswith("__")
                                                           for p in chain[1:]):
                        found.append((f"{path.name}:{node.lineno}", ".".join([bound[chain[0]], *chain[1:]])))
                for child in ast.iter_child_nodes(node):
                    child._pf_parent = node  # type: ignore[attr-defined]
    return sorted(set(found))


LAZY_NAMES = _lazy_private_names()


def test_the_walk_finds_the_lazy_imports():
    names = {name for _, name in LAZY_NAMES}
    assert "torch._ops.get_cached_ops" in names
    assert "torch.utils._python_dispatch.return_and_correct_aliasing" in names
    assert "torch._C._dispatch_tls_local_include_set" in names  # an attribute chain, not an import
    assert len(LAZY_NAMES) > 40


@pytest.mark.parametrize("where,name", LAZY_NAMES, ids=[f"{n}@{w}" for w, n in LAZY_NAMES])
def test_private_name_resolves(where, name):
    _resolve(name)


# private attributes of objects (not modules) the package reads
INSTANCE_ATTRIBUTES = [
    (lambda: torch.ops.aten.add.Tensor, ("_op_dk", "_schema", "_overloadname", "_dispatch_cache", "py_kernels")),
    (lambda: tc.FunctionalTensor, ("_extra_dispatch_keys", "metadata_fns", "elem", "to_functional")),
    (lambda: torch.Tensor, ("_version", "_indices", "_values")),
    (lambda: torch.nn.Module(), ("_parameters", "_buffers", "_non_persistent_buffers_set")),
    (lambda: torch.fx.Node, ("_rename",)),
    (lambda: torch.fx.Graph(), ("_root",)),
    (lambda: torch.fx.proxy.TracerBase, ("_filter_traceback_frames",)),
    (lambda: torch.fx._symbolic_trace._Patcher, ("patch_method",)),
    (lambda: torch.fx.Tracer(), ("_autowrap_function_ids",)),
]


@pytest.mark.parametrize("index", range(len(INSTANCE_ATTRIBUTES)))
def test_private_attributes_exist(index):
    make, names = INSTANCE_ATTRIBUTES[index]
    obj = make()
    for name in names:  # a per-instance attribute shows as the class's annotation
        assert hasattr(obj, name) or name in getattr(obj, "__annotations__", {}), f"{obj} has no {name}"


# --- probes: where torch releases differ, what the installed torch has decides --------------


def test_functional_mode_probe_says_whether_torch_asks_the_modes_can_decompose_method():
    """``FUNCTIONAL_MODE_ASKS_CAN_DECOMPOSE``: torch 2.12 on asks the method our mode overrides;
    2.11 decides in a closure, and our mode decides before handing an op to torch. Either way
    a custom composite our policy decomposes (torch's own answer at pre-dispatch is to keep
    it) is decomposed: the probe must say which path serves it."""
    import inspect

    source = inspect.getsource(tc.FunctionalTensorMode.__torch_dispatch__)
    assert tc.FUNCTIONAL_MODE_ASKS_CAN_DECOMPOSE == ("self._can_decompose(" in source)


def test_functional_tensors_of_one_base_share_a_storage_and_a_copy_joins_none():
    """``tc.storage_key`` (Mutations.output_views): which outputs eager returned as views of a
    written input is read from it, as aot autograd reads its output aliasing."""
    plain = torch.zeros(3), torch.ones(3)
    with tc.FunctionalTensorMode():
        base, other = (tc.to_functional(t) for t in plain)
        view = base[1:]
        base.add_(1)
        other.copy_(view.sum().expand(3))
        doubled = other * 2
        assert tc.storage_key(view) == tc.storage_key(base)
        assert tc.storage_key(other) != tc.storage_key(base)
        assert tc.storage_key(doubled) not in (tc.storage_key(base), tc.storage_key(other))


def test_view_replay_sync_is_a_method_of_the_mode_or_done_by_us():
    """torch 2.12 on syncs view replays in ``FunctionalTensorMode._sync_view_replay_annotations``;
    on 2.11 ``reimplemented._sync_view_replay_annotations`` runs the steps its dispatch runs inline."""
    import inspect

    from predispatch_func._torch_compat import reimplemented

    if hasattr(tc.FunctionalTensorMode, "_sync_view_replay_annotations"):
        return
    source = inspect.getsource(tc.FunctionalTensorMode.__torch_dispatch__)
    assert "set_current_replay_node" in source and "tensor_tracker" in source
    assert "set_current_replay_node" in inspect.getsource(reimplemented._sync_view_replay_annotations)


def test_tracer_decompositions_are_where_proxy_call_reads_them():
    """``_tracer_decompositions``: the proxy mode's table (2.13 on) or proxy_tensor's
    ``CURRENT_DECOMPOSITION_TABLE`` (a dict on 2.11, a ContextVar on 2.12), as proxy_call's
    ``maybe_handle_decomp`` reads it."""
    import inspect

    import torch.fx.experimental.proxy_tensor as proxy_tensor

    from predispatch_func._torch_compat.reimplemented import _tracer_decompositions

    proxy_call = inspect.getsource(proxy_tensor.maybe_handle_decomp)
    table = {torch.ops.aten.sin.default: lambda x: x}

    if "proxy_mode.decomposition_table" in proxy_call:
        mode = proxy_tensor.ProxyTorchDispatchMode(proxy_tensor.PythonKeyTracer(), "real")
        mode.decomposition_table = table
        assert _tracer_decompositions(mode) is table
    else:
        assert "CURRENT_DECOMPOSITION_TABLE" in proxy_call
        with proxy_tensor.decompose(table):
            assert torch.ops.aten.sin.default in _tracer_decompositions(object())


def test_stack_trace_anchors_are_torchs_registry_or_none():
    import torch.fx.proxy as fx_proxy

    anchors = tc.stack_trace_anchors()
    if hasattr(fx_proxy, "_STACK_TRACE_ANCHORS"):
        assert anchors is fx_proxy._STACK_TRACE_ANCHORS
    else:
        import inspect

        assert not anchors and "forward" in inspect.getsource(fx_proxy.TracerBase._filter_traceback_frames)


# --- patches restore on the error path ----------------------------------------------------


def _state() -> dict:
    """Everything a patch of patches.py may change."""
    import torch.fx._lazy_graph_module as lazy
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    import torch.random
    import torch.utils._python_dispatch as python_dispatch
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.variables.misc import AutogradFunctionVariable

    inference = torch.autograd.grad_mode.inference_mode
    return {
        "compiling": torch.compiler._is_compiling_flag,
        "exporting": torch.compiler._is_exporting_flag,
        "push_mode": python_dispatch._push_mode,
        "lazy_graph_module": lazy._use_lazy_graph_module_flag,
        "autocast_cache": torch.is_autocast_cache_enabled(),
        "autocast": tc.autocast_state(),
        "grad": torch.is_grad_enabled(),
        "include": str(torch._C._dispatch_tls_local_include_set()),
        "exclude": str(torch._C._dispatch_tls_local_exclude_set()),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "function_apply": torch.autograd.Function.__dict__["apply"],
        "tensor_methods": {n: torch.Tensor.__dict__.get(n) for n in ("register_hook", "requires_grad_")},
        "rng": {n: (getattr(torch.random, n), getattr(torch, n)) for n in ("manual_seed", "seed", "set_rng_state")},
        "inference_mode": (inference.__enter__, inference.__exit__),
        "optimized_module_call": OptimizedModule.__dict__.get("__call__"),
        "tracing_context": torch._guards.TracingContext.try_get(),
        "automatic_dynamic_shapes": torch._dynamo.config.automatic_dynamic_shapes,
        "dynamo_call_apply": AutogradFunctionVariable.call_apply,
        "builtins": (builtins.max, builtins.min, math.pow),
        "functional_bool": tc.FunctionalTensor.__dict__["__bool__"],
        "module_getattr": torch.nn.Module.__dict__["__getattr__"],
        "module_call": torch.nn.Module.__dict__["__call__"],
        "module_setattr": torch.nn.Module.__dict__["__setattr__"],
        "cudnn_reserve_size": getattr(torch._C, "_get_cudnn_batch_norm_reserve_space_size", None),
        "meta_kernels": tuple(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta")
                              for name in ("cudnn_grid_sampler", "cudnn_grid_sampler_backward")),
        "encoder_forward": torch.nn.TransformerEncoder.__dict__["forward"],
        "node_is_impure": torch.fx.node.Node.__dict__["is_impure"],
        "tracer_create_node": torch.fx.proxy.TracerBase.__dict__["create_node"],
        "fx_patch_method": torch.fx._symbolic_trace._Patcher.__dict__["patch_method"],
        "function_modes": torch._C._len_torch_function_stack(),
        "sdp_backends": [getattr(torch._C, n)() for n in dir(torch._C) if n.startswith("_get_") and n.endswith("_sdp_enabled")],
        "backends": (torch._C._get_mkldnn_enabled(), torch._C._get_nnpack_enabled(), torch._C._get_cudnn_enabled()),
        "pre_dispatch_modes": torch._ops._len_torch_dispatch_stack_pre_dispatch(),
        "func_transform_levels": _func_transform_names(),
        "exported_program_module": torch.export.exported_program._create_graph_module_for_export,
        "tensor_metadata": proxy_tensor._extract_tensor_metadata,
        "sdpa_kernels": torch._C._dispatch_dump("aten::scaled_dot_product_attention"),
        "node_values": (proxy_tensor.snapshot_fake, proxy_tensor.proxy_call),
        "direct_recorder": patches._direct_recorder_installed,
        "autograd_engine": torch.autograd._engine_run_backward,
        "autocast_init": torch.amp.autocast_mode.autocast.__dict__["__init__"],
        "functional_tensor_dispatch": tc.FunctionalTensor.__dict__["__torch_dispatch__"],
        "pipeline_exporter": _pipeline_exporter(),
        "functional_tensor_getattr": tc.FunctionalTensor.__dict__.get("__getattr__"),
        "export_wrapper_finder": _export_wrappers()._maybe_find_pre_dispatch_tf_mode_for_export,
        "lstm_layer_choice": torch._decomp.decompositions.select_one_layer_lstm_function,
        "rnn_flatten": torch.nn.RNNBase.__dict__["flatten_parameters"],

    }


def _pipeline_exporter():
    if not torch.distributed.is_available():
        return None
    from torch.distributed.pipelining._IR import Pipe

    return Pipe.__dict__["_trace_with_export"]


def _export_wrappers():
    import torch._export.wrappers as wrappers

    return wrappers


def _func_transform_names() -> tuple:
    import torch._export.utils as export_utils
    import torch._functorch.eager_transforms as eager_transforms
    import torch._functorch.vmap as vmap_module
    import torch._higher_order_ops.utils as hop_utils

    return (vmap_module.vmap_increment_nesting, eager_transforms.grad_increment_nesting,
            eager_transforms.jvp_increment_nesting, eager_transforms._autograd_grad,
            export_utils._maybe_find_pre_dispatch_tf_mode_for_export, hop_utils._set_compilation_env)


@contextlib.contextmanager
def _moved_below_autograd():
    """trace_moved_below_autograd needs a tracing proxy mode on the PreDispatch key to move."""
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, PythonKeyTracer

    with ProxyTorchDispatchMode(PythonKeyTracer(), "real", pre_dispatch=True), \
            patches.trace_moved_below_autograd(_NoopMode()):
        yield


class _NoopMode(torch.utils._python_dispatch.TorchDispatchMode):
    """A mode on the stack, so that the patches that pop modes have one to pop."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


PATCHES = {  # name -> () -> the context manager, entered with a body that raises
    "below_pre_dispatch": lambda: patches.below_pre_dispatch(),
    "exporting_state": lambda: patches.exporting_state(),
    "lazy_graph_modules": lambda: patches.lazy_graph_modules(),
    "stack_capture_only_under_a_recordable_frame": lambda: patches.stack_capture_only_under_a_recordable_frame(),
    "module_methods_left_unpatched": lambda: patches.module_methods_left_unpatched(),
    "pre_dispatch_pushes_without_uncache": lambda: patches.pre_dispatch_pushes_without_uncache(),
    "autocast_cache_as": lambda: patches.autocast_cache_as(not torch.is_autocast_cache_enabled()),
    "grad_mode_untraced": lambda: patches.grad_mode_untraced(not torch.is_grad_enabled()),
    "outside_all_modes": lambda: patches.outside_all_modes(),
    "patched_function_apply": lambda: patches.patched_function_apply(lambda cls, original, *a, **k: original(*a, **k)),
    "outside_trace": lambda: patches.outside_trace(),
    "autocast_state_as": lambda: patches.autocast_state_as({"cpu": (True, torch.float16)}),
    "patched_tensor_methods": lambda: patches.patched_tensor_methods(
        register_hook=lambda original, t, *a: original(t, *a), requires_grad_=lambda original, t, *a: original(t, *a)),
    "rng_reseeds_routed": lambda: patches.rng_reseeds_routed(lambda name: None),
    "autograd_engine_runs_routed": lambda: patches.autograd_engine_runs_routed(lambda what: None),
    "inference_mode_as_grad_mode": lambda: patches.inference_mode_as_grad_mode(),
    "compiled_modules_run_eagerly": lambda: patches.compiled_modules_run_eagerly(),
    "hop_capture_static": lambda: patches.hop_capture_static(),
    "dynamo_function_capture_refused": lambda: patches.dynamo_function_capture_refused(lambda cls: None),
    "below_autograd": lambda: patches.below_autograd(),
    "non_strict_call_rewrites": lambda: patches.non_strict_call_rewrites(),
    "module_getattr_wrapped": lambda: patches.module_getattr_wrapped(lambda module, name, value: value),
    "func_transform_levels_wrapped": lambda: patches.func_transform_levels_wrapped(contextlib.nullcontext),
    "trace_moved_below_autograd": _moved_below_autograd,
    "exported_program_code_on_first_use": lambda: patches.exported_program_code_on_first_use(),
    "tensor_metadata_recorded_through": lambda: patches.tensor_metadata_recorded_through(lambda t: None),
    "node_values_unsnapshotted": lambda: patches.node_values_unsnapshotted(),
    "op_calls_recorded_through": lambda: patches.op_calls_recorded_through(lambda *call: patches.NOT_RECORDED),
    "module_methods_wrapped": lambda: patches.module_methods_wrapped(
        lambda name, original: lambda self, *a: original(self, *a), ("__setattr__", "register_buffer"),
        (torch.nn.Linear(2, 2), torch.nn.LSTM(2, 2))),
    "method_replaced": lambda: patches.method_replaced(torch.nn.TransformerEncoder, "forward",
                                                       lambda original: lambda self, *a, **k: original(self, *a, **k)),
    "cuda_autocast_kept_without_gpu": lambda: patches.cuda_autocast_kept_without_gpu(),
    "cuda_sdpa_choice_without_gpu": lambda: patches.cuda_sdpa_choice_without_gpu(),
    "fused_attention_switched_off": lambda: patches.fused_attention_switched_off(),
    "cuda_batch_norm_reserve_without_gpu": lambda: patches.cuda_batch_norm_reserve_without_gpu(),
    "cuda_grid_sampler_faked_without_gpu": lambda: patches.cuda_grid_sampler_faked_without_gpu(),
    "calls_kept_by_dead_code_elimination": lambda: patches.calls_kept_by_dead_code_elimination(lambda node: False),
    "functional_tensor_detach_without_mode": lambda: patches.functional_tensor_detach_without_mode(),
    "pipeline_traced_by": lambda: patches.pipeline_traced_by(lambda mod, args, kwargs: None),
    "functional_tensor_attributes": lambda: patches.functional_tensor_attributes(lambda t, name: None),
    "subclass_constructors_unrecorded": lambda: patches.subclass_constructors_unrecorded(),
    "rnn_decompositions_as_eager": lambda: patches.rnn_decompositions_as_eager(),
    "rnn_weights_left_unflattened": lambda: patches.rnn_weights_left_unflattened(),
}
NOT_CONTEXT_MANAGERS = {"ops_with_cached_pre_dispatch_handler", "push_mode_is_torchs", "NOT_RECORDED",
                        "cudnn_draws_rnn_dropout",
                        "hop_rule_tables", "CUDA_AUTOCAST_KEPT_WARNING", "non_strict_export_handler"}
# change something only inside a fake mode, or a functional one: their own tests
# or a fully_shard'ed model's hook dicts (a process group: test_dtensor_assumptions.py)
# autocast_nesting_restored changes nothing on entry; it undoes what the body left: its own test
CHECKED_APART = {"callers_fake_mode_unset", "functional_mode_off", "fsdp_forward_hooks_suspended",
                 "autocast_nesting_restored", "only_function_modes"}
if torch.cuda.is_available():  # changes nothing where a GPU answers sdpa's kernel choice itself
    for name in ("cuda_sdpa_choice_without_gpu", "cuda_batch_norm_reserve_without_gpu",
                 "cuda_grid_sampler_faked_without_gpu"):
        CHECKED_APART.add(name)
        del PATCHES[name]


class _Boom(Exception):
    pass


def test_every_patch_is_checked():
    assert sorted(PATCHES) == sorted(set(patches.__all__) - NOT_CONTEXT_MANAGERS - CHECKED_APART)


def test_the_functional_mode_is_off_inside_and_back_after_a_raise():
    with tc.FunctionalTensorMode() as mode:
        assert tc.active_functional_mode() is mode
        with pytest.raises(_Boom):
            with patches.functional_mode_off():
                assert tc.active_functional_mode() is None
                raise _Boom
        assert tc.active_functional_mode() is mode


def test_callers_fake_mode_is_unset_inside_and_back_after_a_raise():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def active_fake_mode():
        return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)

    with FakeTensorMode() as mode:
        assert active_fake_mode() is mode
        with pytest.raises(_Boom):
            with patches.callers_fake_mode_unset():
                assert active_fake_mode() is None
                raise _Boom
        assert active_fake_mode() is mode


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_restores_what_it_changed_when_the_body_raises(name):
    with _NoopMode():
        before = _state()
        inside = None
        with pytest.raises(_Boom):
            with PATCHES[name]():
                inside = _state()
                raise _Boom
        after = _state()
    assert inside != before, f"{name} changed nothing this test sees: add what it patches to _state()"
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def test_only_the_kept_function_modes_are_on_the_stack_inside_and_all_back_in_place_after_a_raise():
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    class Kept(TorchFunctionMode):
        pass

    class Other(TorchFunctionMode):
        pass

    outer, kept, inner = Other(), Kept(), Other()
    with outer, kept, inner:
        before = _get_current_function_mode_stack()
        with pytest.raises(_Boom):
            with patches.only_function_modes(lambda mode: isinstance(mode, Kept)):
                inside = _get_current_function_mode_stack()
                raise _Boom
        after = _get_current_function_mode_stack()
    assert inside == [m for m in before if not isinstance(m, Other)] and kept in inside
    assert after == before


def test_torch_exports_handler_is_known_by_its_class():
    """A body keeps torch.export's handler (trace/environment.py): its class is where we look."""
    from torch._export.non_strict_utils import _NonStrictTorchFunctionHandler
    from torch.overrides import TorchFunctionMode

    assert patches.non_strict_export_handler(_NonStrictTorchFunctionHandler())
    assert not patches.non_strict_export_handler(TorchFunctionMode())


def _autocast_nesting() -> int:
    depth = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return depth


def test_autocast_nesting_is_put_back_when_the_body_enters_autocast_and_raises():
    """torch's increment/decrement return the new count, and a region left open keeps it raised."""
    before = _autocast_nesting()
    with patches.autocast_state_as(patches.autocast_state()):  # the open region's dtype and flag
        with pytest.raises(_Boom):
            with patches.autocast_nesting_restored():
                torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
                assert _autocast_nesting() == before + 1
                raise _Boom
    assert _autocast_nesting() == before


def test_every_backward_entry_point_reaches_the_routed_engine_run():
    """``autograd_engine_runs_routed`` sees torch.autograd.grad, torch.autograd.backward and
    Tensor.backward (also ``from torch.autograd import grad``, imported before the patch)."""
    from torch.autograd import grad as grad_imported_early

    seen = []
    x = torch.randn(3, requires_grad=True)
    with patches.autograd_engine_runs_routed(seen.append):
        torch.autograd.grad(x.sin().sum(), x)
        grad_imported_early(x.sin().sum(), x)
        torch.autograd.backward(x.sin().sum())
        x.sin().sum().backward()
    assert seen == ["torch.autograd.grad", "torch.autograd.grad", "backward()", "backward()"]


# --- the mode-push shortcut ---------------------------------------------------------------


class _Decomposed(torch.nn.Module):
    """Decompositions (reshape, contiguous, dropout, to) re-enter the functional mode."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = torch.nn.functional.dropout(self.lin(x).reshape(2, 8).t().contiguous(), 0.0, training=False)
        with torch.no_grad():
            z = y.to(torch.float64).sum()
        return torch.cond(z > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))


class TestModePushShortcut(TestCase):
    """The trace pushes PreDispatch modes without torch's loop that drops every op's cached
    PreDispatch handler (``patches.pre_dispatch_pushes_without_uncache``): sound only while
    torch never caches one."""

    def test_no_op_caches_a_pre_dispatch_handler_after_ours_and_torch_export(self):
        from tests.support.reference import export_checked

        model, x = _Decomposed(), torch.randn(4, 4)
        export_checked(model, (x,))
        torch.export.export(model, (x,))
        self.assertEqual(tc.ops_with_cached_pre_dispatch_handler(), [])
        self.assertTrue(tc.push_mode_is_torchs())

    def test_torchs_push_is_restored_when_the_trace_fails(self):
        class Fails(torch.nn.Module):
            def forward(self, x):
                raise ValueError("boom")

        with self.assertRaises(pf.ExportError):  # the model's ValueError, wrapped with its line
            pf.export(Fails(), (torch.randn(2),))
        self.assertTrue(tc.push_mode_is_torchs())


# --- torch limits we refuse before torch raises --------------------------------------------
# These refusals fire before torch would fail, so a strict xfail of the case cannot turn
# green when torch fixes it: each test here runs torch's own path and fails once the limit
# is gone (then lift the refusal on that release, and name it in the xfail's lifted_in).


def test_torch_still_fails_to_functionalize_fused_adam_out():
    """OUT_WITH_OTHER_WRITES (trace/out_variants.py)."""
    from tests.trace.test_out_variants import FusedAdamOut

    args = (torch.randn(3), torch.randn(3), torch.rand(3), torch.rand(3), torch.ones(()), torch.zeros(3))
    with pytest.raises(RuntimeError, match="mutating a non-functional tensor with a functional tensor"):
        tc.torch_aot_export_module(FusedAdamOut(), args)


def test_torch_still_drops_the_backward_of_a_function_inside_a_hop_body():
    """AUTOGRAD_FUNCTION_IN_HOP_BODY (trace/extensions/function_trace.py): torch.export's program of a
    cond branch calling a Function has the gradient of the Function's forward, not its backward."""
    from tests.hops.test_torch_hops import FunctionInsideCond

    x = torch.randn(2, 3).abs()
    ep = torch.export.export(FunctionInsideCond(), (x,))
    eager_x, program_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    FunctionInsideCond()(eager_x).sum().backward()
    ep.module()(program_x).sum().backward()
    assert not torch.allclose(eager_x.grad, program_x.grad)


@pytest.mark.parametrize("name", ["hop/invoke_quant.simple/0", "hop/local_map_hop.simple/0"])
@pytest.mark.parametrize("strict", [False, True])
def test_torch_export_still_cannot_represent(name, strict):
    """HOP_NOT_REPRESENTABLE (trace/extensions/torch_hops.py): torch.export fails these hop_db cases."""
    from tests.support.hop_db_cases import hop_db_cases

    model, args = next((m, a) for n, m, a, _ in hop_db_cases(1) if n == name)
    with pytest.raises(Exception):  # noqa: B017  (torch's errors differ per release: see test_hop_db.py)
        torch.export.export(model, args, strict=strict)


def test_a_torch_limit_is_strict_until_the_release_that_lifts_it():
    """tests/support/torch_release.py: the xfail applies before ``lifted_in`` and not from it on."""
    from tests.support.torch_release import torch_limit, torch_release

    release = torch_release()
    assert release[:2] >= (2, 11) and torch.__version__.startswith(".".join(map(str, release[:2])))
    assert torch_limit("r").args[0] is True  # (the mark's condition) no release named: strict everywhere
    assert torch_limit("r", lifted_in=(release[0], release[1] + 1)).args[0] is True
    assert torch_limit("r", lifted_in=release[:2]).args[0] is False
    assert torch_limit("r").kwargs["strict"] is True


# --- torch.func transforms open their levels through the names func_transform_levels_wrapped wraps


_TRANSFORMS = {
    "vmap": lambda x: torch.vmap(torch.sin)(x),
    "grad": lambda x: torch.func.grad(lambda a: a.sin().sum())(x),
    "vjp": lambda x: torch.func.vjp(torch.sin, x)[1](torch.ones_like(x)),
    "jvp": lambda x: torch.func.jvp(torch.sin, (x,), (x,)),
    "jacrev": lambda x: torch.func.jacrev(torch.sin)(x),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_func_transform_enters_a_wrapped_level(name):
    entered = []

    @contextlib.contextmanager
    def around():
        entered.append(name)
        yield

    with patches.func_transform_levels_wrapped(around):
        _TRANSFORMS[name](torch.randn(3))
    assert entered, f"torch.func.{name} opened no level through the names we wrap (torch moved them)"


@pytest.mark.parametrize("op,tagged", [(torch.ops.aten.batch_norm.default, True),
                                       (torch.ops.aten.instance_norm.default, False)],
                         ids=["batch_norm", "instance_norm"])
def test_norms_write_running_stats_only_when_normalising_by_the_input_with_them(op, tagged):
    """``WRITES_ONLY_WHEN`` keeps ``aten.batch_norm`` and ``aten.instance_norm`` for the calls
    that write nothing: their schemas mark no write (torch tags batch_norm
    maybe-aliasing-or-mutating, not instance_norm), and their kernels write the running
    statistics exactly when the flag (``training``, ``use_input_stats``) is true and they
    are given; the result never shares the input's storage."""
    assert (torch.Tag.maybe_aliasing_or_mutating in op.tags) is tagged
    assert not tc.schema_of(op).is_mutable
    x = torch.randn(2, 3, 4)
    for flag in (False, True):
        mean, var = torch.zeros(3), torch.ones(3)
        out = op(x, None, None, mean, var, flag, 0.5, 1e-5, False)
        assert (not torch.equal(mean, torch.zeros(3))) is flag
        assert (not torch.equal(var, torch.ones(3))) is flag
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    versions = x._version
    op(x, None, None, None, None, True, 0.5, 1e-5, False)
    assert x._version == versions


# --- torch-function modes stand aside where the compat layer turns them off ----------------


def test_wrapping_for_functionalization_bypasses_torch_function_modes():
    """tc.to_functional turns torch-function modes off while it builds the wrapper: the
    tracer's modes would see a dozen metadata reads per tensor and record nothing."""
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with tc.FunctionalTensorMode(), Watch():
        x = torch.ones(2, 3)
        x.stride()
        assert seen, "a torch-function mode sees tensor method calls"
        seen.clear()
        wrapped = tc.to_functional(x)
        assert seen == []
    assert isinstance(wrapped, tc.FunctionalTensor) and wrapped.shape == x.shape


def test_functional_tensor_bool_skips_eager_s_numel_check():
    """non_strict_call_rewrites checks the element count before ``FunctionalTensor.__bool__``, which
    goes straight to ``item()``; eager's ``Tensor.__bool__`` refuses a many-element tensor first.
    When torch checks it there too, the patch can go."""
    import inspect

    source = inspect.getsource(tc.FunctionalTensor.__bool__)
    assert "item()" in source and "numel" not in source


def test_torchs_subclass_constructor_wrapper_asks_the_finder_we_set_aside():
    """torch's export wrapper of a subclass ``__init__`` records the construction only when
    ``_maybe_find_pre_dispatch_tf_mode_for_export`` (read from its module at call time) finds a
    tracer; ``subclass_constructors_unrecorded`` answers None there. Were the name moved, the
    wrapper would record over our functional tensors again and fail ("Unable to cast NotImplemented")."""
    import inspect

    import torch._export.wrappers as wrappers
    from torch.testing._internal.two_tensor import TwoTensor

    assert callable(wrappers._maybe_find_pre_dispatch_tf_mode_for_export)
    assert "_maybe_find_pre_dispatch_tf_mode_for_export()" in inspect.getsource(
        wrappers.mark_subclass_constructor_exportable_experimental)
    assert TwoTensor.__init__.__qualname__.endswith("mark_subclass_constructor_exportable_experimental.<locals>.wrapper")
    with tc.subclass_constructors_unrecorded():
        assert wrappers._maybe_find_pre_dispatch_tf_mode_for_export() is None


def test_functional_tensor_has_no_getattr_of_its_own_and_holds_its_wrapper_as_elem():
    """``functional_tensor_attributes`` adds ``FunctionalTensor.__getattr__``: only names the
    wrapper lacks reach it. Its own attributes shadow a subclass's: ``elem`` (the C++ wrapper) is
    the one a subclass's inner tensor is often named (docs/limits.md, TENSOR_SUBCLASS_IN_FORWARD)."""
    assert "__getattr__" not in vars(tc.FunctionalTensor)
    with tc.functional_tensor_attributes(lambda t, name: name):
        assert vars(tc.FunctionalTensor)["__getattr__"] is not None
    assert "__getattr__" not in vars(tc.FunctionalTensor)
    with tc.FunctionalTensorMode():
        t = tc.to_functional(torch.ones(2))
    assert isinstance(t.elem, torch.Tensor) and not isinstance(t.elem, tc.FunctionalTensor)
    assert tc.is_bare_functional_wrapper(t.elem) and not tc.is_bare_functional_wrapper(t)
    assert not tc.is_bare_functional_wrapper(torch.ones(2))


def test_torch_exports_inner_tensor_op_returns_the_attribute_itself():
    """``ACCESS_SUBCLASS_INNER_TENSOR`` (torch.export's op for ``t.a``) is functional by its schema and
    its kernels return the subclass's inner tensor itself: replayed, the program's ``t.a`` is eager's."""
    from torch.testing._internal.two_tensor import TwoTensor

    op = tc.ACCESS_SUBCLASS_INNER_TENSOR
    assert str(op._schema) == "export::access_subclass_inner_tensor(Tensor src_subclass_tensor, str attr) -> Tensor"
    t = TwoTensor(torch.randn(2), torch.randn(2))
    assert op(t, "a") is t.a and op(t, "b") is t.b
    p = torch.nn.Parameter(TwoTensor(torch.randn(2), torch.randn(2)))
    assert op(p, "b") is p.b and not op(p, "b").requires_grad  # as eager's p.b


def test_flat_apply_replays_a_constant_function_with_the_recorded_operands():
    """A ``flat_apply`` node ``record_flat_apply`` writes calls the function its first argument's
    spec holds on the operands its second describes: the rebuild of a subclass built in forward."""
    from torch._higher_order_ops.flat_apply import _ConstantFunction, flat_apply

    _, func_spec = torch.utils._pytree.tree_flatten(_ConstantFunction(torch.add))
    x, y = torch.randn(3), torch.randn(3)
    flat, in_spec = torch.utils._pytree.tree_flatten(((x, y), {}))
    assert torch.equal(flat_apply(func_spec, in_spec, *flat), x + y)


# --- the ExportedProgram's module, its code generated on first use ---------------------------


def test_an_exported_program_made_inside_generates_its_code_on_first_use():
    """torch's ExportedProgram constructor builds its graph module through
    ``_create_graph_module_for_export`` (what the patch swaps): if it stops doing so, the
    program's module is eager again and this test names why export got slower."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1

    eager = torch.export.export(Add(), (torch.ones(2),))
    with patches.exported_program_code_on_first_use():
        lazy = torch.export.ExportedProgram(
            root=eager.graph_module, graph=eager.graph, graph_signature=eager.graph_signature,
            state_dict=eager.state_dict, range_constraints=eager.range_constraints,
            module_call_graph=eager.module_call_graph, constants=eager.constants)
    assert isinstance(lazy.graph_module, _LazyGraphModule)
    assert _LazyGraphModule._needs_recompile.__func__(type(lazy.graph_module))  # nothing generated yet
    assert lazy.graph_module.code == eager.graph_module.code
    assert torch.equal(lazy.module()(torch.ones(2)), torch.full((2,), 2.0))



# --- fx's proxy tracer makes a node's arguments as record_op_call makes them ---------------------


def test_the_proxy_tracer_makes_nodes_through_create_proxy_create_arg_and_create_node():
    """``record_op_call`` restates ``proxy_call`` for tracers whose ``create_proxy``, ``proxy``
    and ``create_arg`` are these of torch's; make_fx's tracer is one."""
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer

    from predispatch_func._torch_compat.reimplemented import _records_as_torch

    assert _records_as_torch(PythonKeyTracer)
    seen = []

    def f(x):
        seen.append(type(torch.fx.experimental.proxy_tensor.get_proxy_mode().tracer))
        return x + 1
    tc.make_fx(f, pre_dispatch=True)(torch.randn(2))
    assert seen and all(_records_as_torch(t) for t in seen)


def test_create_arg_keeps_plain_arguments_and_turns_proxies_into_their_nodes():
    """What ``record_op_call`` hands ``create_node`` is what ``create_proxy`` would: plain values
    as they are, a proxy as its node, in the same tuples and lists."""
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer

    from predispatch_func._torch_compat.reimplemented import _PLAIN_ARGUMENTS

    tracer = PythonKeyTracer()
    tracer.graph = torch.fx.Graph()
    tracer.root = torch.nn.Module()
    node = tracer.graph.placeholder("x")
    proxy = tracer.proxy(node)
    plain = {int: 3, float: float("nan"), bool: True, complex: 1j, str: "tanh", type(None): None,
             torch.dtype: torch.float16, torch.layout: torch.strided, torch.memory_format: torch.channels_last}
    assert set(plain) == set(_PLAIN_ARGUMENTS)
    for value in (*plain.values(), torch.device("cpu")):  # a device unless compile-on-one-rank rewrites it
        made = tracer.create_arg(value)
        assert made is value or (made != made and value != value)
    made = tracer.create_arg((proxy, [proxy, 2, (None, 1.5)], "s"))
    assert made == (node, [node, 2, (None, 1.5)], "s")
    assert type(made) is tuple and type(made[1]) is list and type(made[1][2]) is tuple
    assert tracer.create_arg({"dim": [proxy, 0]}) == {"dim": [node, 0]}


def test_while_loop_has_its_own_autograd_kernel():
    """export_joint replays a while_loop through its autograd kernel (tc.hop_autograd_kernel) so
    that the per-iteration values torch keeps on the Function's ctx are recorded."""
    assert tc.hop_autograd_kernel(torch.ops.higher_order.while_loop) is not None
    assert tc.hop_autograd_kernel(torch.ops.aten.add.Tensor) is None

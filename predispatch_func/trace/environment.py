"""The trace's environment: every context manager around a traced ``forward``, in one declared order.

An export runs the user's ``forward`` once, inside layers that open at different points of
the pipeline (the tracer's layer needs the fake inputs; the traced function's only exists
inside ``make_fx``, where the proxy mode is pushed; the model's call only inside that).
Each layer is one function here, outermost first; it enters its managers on one
``contextlib.ExitStack`` in the order written, each with one line saying why it is there::

    export()                                  EXPORT        (export.py)
      input check and aot_export_module       CALL          (export.py)
        the trace and the step after it       MODEL_STATE   (aot.py)
          make_fx                             TRACER        (trace/stack.py)
            make_fx's traced function         TRACED        (trace/stack.py)
              the body: the caller's modes    CALLER        (trace/stack.py)
                the model's call              MODEL_CALL    (program/mutations.py)
    a Function's or hook's body, met while tracing:
      outside the trace in progress           BODY_TRACE    (pipeline.py)
        then TRACER, TRACED, CALLER as above; around the body itself:
                                              BODY          (pipeline.py)

What later stages record around the model's call (node metadata, preserved call
brackets, the state guard's memo entries) is handed in by the driver as
:class:`CallRecorders` (this stage cannot import them); it is entered here, in
its place. Every patch of a torch global among these restores it on every path
(tests/torch_compat/test_torch_globals_restored.py); tests/trace/test_environment.py
lists the entries in order, as an export enters them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .. import _torch_compat as tc
from ..mode_capabilities import CarriedIntoBodies, TraceBody
from ..state import leaks
from ..state.tensor_attribute_writes import warning_on_assigned_tensor_attributes
from .extensions.autograd_calls import autograd_calls_refused
from .extensions.func_transforms import func_transforms_traced_below_autograd
from .extensions.function_trace import tracing_autograd_functions
from .extensions.torch_hops import let_torch_hops_through
from .extensions.torch_limits import torch_hop_limits_refused
from .fast_paths import eager_fast_paths
from .tensor_data import HiddenWrites, StorageAliases, TensorDataMode

if TYPE_CHECKING:
    from ..state.state_guard import StateGuard
    from .ambient import AmbientModes

Manager = contextlib.AbstractContextManager[Any]

EXPORT, CALL, MODEL_STATE, TRACER, TRACED, CALLER, MODEL_CALL, BODY_TRACE, BODY = (
    "export", "call", "model state", "tracer", "traced function", "caller", "model call", "body trace", "body")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One manager of a layer: its name, why it is there, and how to make it (made when entered)."""

    name: str
    why: str
    make: Callable[[], Manager]


@dataclasses.dataclass(frozen=True)
class CallRecorders:
    """What the stages after the trace record around the model's call, made by the driver (aot.py).

    Read by :func:`around_the_model_call`, which enters them in their place."""

    node_metadata: Callable[[], Manager]  # passes/node_meta.recording
    preserved_calls: Callable[[], Manager]  # program/module_signatures.PreservedCalls.bracketing
    after_the_call: Callable[[], None]  # state_guard.StateGuard.note_memo_entries


def around_the_export() -> Manager:
    """EXPORT: all of ``export()``, from the inputs to the finished program."""
    return _entered(EXPORT, [
        Entry("caller's fake mode unset", "inside the user's `with FakeTensorMode()` the export runs outside "
              "it, as torch.export: the program's values belong to the export's own fake mode",
              tc.callers_fake_mode_unset),
    ])


@contextlib.contextmanager
def around_the_call(inputs: tuple[tuple, dict]) -> Iterator[leaks.LeakWatch | None]:
    """CALL: the input check and ``aot_export_module``; yields the leak watch (or None)."""
    with _entered(CALL, [
        Entry("module inputs flattened", "an nn.Module among the inputs is its tensors, as torch.export "
              "and ep.module() take it", lambda: tc.module_inputs_flattened(inputs)),
        Entry("fake tensor leaks watched", "torch's leak check, when asked for, reports fakes the export "
              "left behind", leaks.watching),
    ]) as entered:
        yield entered[-1]


def around_the_model_state(guard: StateGuard, fake_dispatch_seeded: Callable[[], Any]) -> Manager:
    """MODEL_STATE: the trace and the step after it, which judges what forward wrote."""
    return _entered(MODEL_STATE, [
        Entry("state guard", "the model's Python state is snapshotted and restored on every path; "
              "attribute writes are recorded for the judgement after the trace", lambda: guard),
        Entry("fake dispatch seeded", "speed: torch's fake dispatch cache starts from what earlier processes "
              "found for this model (trace/persisted_fake_dispatch.py)", fake_dispatch_seeded),
    ])


def around_the_tracer(ambient: AmbientModes, fake_mode: Any) -> Manager:
    """TRACER: around ``make_fx``'s trace, outside the traced function."""
    return _entered(TRACER, [
        Entry("caller's modes neutral", "grad on, inference mode and autocast off: the state the region "
              "pass starts from (the caller's modes are entered again inside, as regions)", ambient.neutral),
        Entry("autocast nesting", "a model entering autocast and raising leaves its nesting count raised, "
              "and the caller's later autocast regions would reuse stale weight casts", tc.autocast_nesting_restored),
        Entry("exporting", "torch.compiler.is_exporting() is true, as under torch.export (transformers "
              "branches on it)", tc.exporting_state),
        Entry("rnn decompositions as eager", "torch's decomposition of lstm takes oneDNN's inference "
              "layer when only the weights require grad (its backward fails when run), and its RNN helper "
              "drops no dropout between layers",
              tc.rnn_decompositions_as_eager),
        Entry("rnn weights left unflattened", "an RNN on CUDA flattens new weights for cuDNN by their "
              "data pointers, which a trace's fakes have none of", tc.rnn_weights_left_unflattened),
        Entry("HOP partitioner quiet", "torch 2.11/2.12 log every partition of a HOP body (scan with grad) "
              "at DEBUG", tc.hop_partitioner_quiet),
        Entry("pre-dispatch pushes without uncache", "speed: torch's loop over every used op on each push "
              "of a PreDispatch mode is not needed", tc.pre_dispatch_pushes_without_uncache),
        Entry("lazy graph modules", "speed: graph modules made while tracing generate code on first use",
              tc.lazy_graph_modules),
        Entry("stack capture only under a recordable frame", "speed: a node made with no frame fx's stack "
              "filter keeps on the stack skips fx's capture of the whole stack, whose filtered result is empty",
              tc.stack_capture_only_under_a_recordable_frame),
        Entry("module methods left unpatched", "speed: fx's trace sets nn.Module.__call__ and __getattr__ "
              "to wrappers make_fx's tracer passes through; each set invalidates every subclass's type cache",
              tc.module_methods_left_unpatched),
        Entry("static tensor metadata", "speed: tensor_meta of dense int-sized tensors from ints",
              lambda: tc.tensor_metadata_recorded_through(tc.static_tensor_metadata)),
        Entry("op calls recorded directly", "speed: the common op call recorded without proxy_call; "
              "before node_values_unsnapshotted, whose write guard must see every call",
              lambda: tc.op_calls_recorded_through(tc.record_op_call)),
        Entry("node values unsnapshotted", "speed: a node's meta['val'] is the fake result itself "
              "(below functionalization no op writes it)", tc.node_values_unsnapshotted),
        Entry("fake mode", "tensors the trace makes are fakes of the inputs' mode, also with no "
              "tensor input", lambda: fake_mode if fake_mode is not None else contextlib.nullcontext()),
    ])


def inside_the_traced_function(mode: Manager, *, autocast_cache: bool, trace_body: TraceBody,
                               pre_dispatch: bool) -> Manager:
    """TRACED: inside ``make_fx``'s traced function, around the body and the checks after it."""
    return _entered(TRACED, [
        Entry("functional mode", "functionalization with our composite policy and observers (stack.py)",
              lambda: mode),
        Entry("grad on", "the tracer's grad mode; the caller's is entered inside as a region",
              torch.enable_grad),
        Entry("caller's autocast cache", "make_fx turns autocast's weight cache off; a region records the "
              "flag eager used",
              lambda: tc.autocast_cache_as(autocast_cache)),
        Entry("torch HOP rules", "torch's HOPs find a rule for our mode by its exact type (torch_hops.py)",
              lambda: _on_entry(_let_torch_hops_through_active_mode)),
        Entry("autograd Functions traced", "custom Functions become HOP calls keeping their backward; "
              "hooks and requires_grad_() are recorded (function_trace.py, hooks.py)",
              lambda: tracing_autograd_functions(trace_body, pre_dispatch=pre_dispatch)),
        Entry("inference mode as grad mode", "torch.inference_mode() in forward becomes a no_grad region "
              "(its tensors could not re-enter autograd)", tc.inference_mode_as_grad_mode),
        Entry("compiled modules run eagerly", "a torch.compile-d submodule runs the module it wraps",
              tc.compiled_modules_run_eagerly),
        Entry("torch HOP limits refused", "where torch cannot trace a HOP, a clear refusal (torch_limits.py)",
              torch_hop_limits_refused),
        Entry("HOP capture static", "dynamo's capture of a HOP body keeps Python ints constants, also after "
              "a first capture in the process",
              tc.hop_capture_static),
        Entry("func transforms below autograd", "torch.func transforms are traced below autograd, where "
              "functorch runs them (func_transforms.py)", func_transforms_traced_below_autograd),
        Entry("autograd calls refused", "torch.autograd.grad and backward() in forward are refused before "
              "autograd, with what to write instead (autograd_calls.py)", autograd_calls_refused),
        Entry("tensor subclass API", "a subclass's own attributes and methods read on its traced value "
              "(t.a becomes torch.export's access op, tensor_subclasses.py)",
              lambda: tc.functional_tensor_attributes(mode.subclasses.attribute)),  # type: ignore[attr-defined]
        Entry("subclass constructors unrecorded", "torch's export wrapper of a subclass __init__ records "
              "nothing; an op's first read of the built subclass records it (tensor_subclasses.py)",
              tc.subclass_constructors_unrecorded),
    ])


def around_the_body(ambient: AmbientModes, storage_aliases: StorageAliases, hidden_writes: HiddenWrites | None, *,
                    on_reseed: Callable[[str], None]) -> Manager:
    """CALLER: around the traced body itself (the model's call, or a Function's body); the
    arguments after ``ambient`` are the functional mode's (stack.py)."""
    return _entered(CALLER, [
        Entry("caller's modes", "the caller's grad, inference and autocast modes, recorded as the "
              "program's outer regions (ambient.py)", ambient.entered),
        Entry("eager fast paths", "TransformerEncoder's nested-tensor path computed as eager does "
              "(fast_paths.py)", eager_fast_paths),
        Entry(".data as functional ops", ".data reads and writes against live aliases (tensor_data.py)",
              lambda: TensorDataMode(storage_aliases, hidden_writes)),
        Entry("reseeds routed", "a draw after forward reseeds the global RNG is refused (refusals.py)",
              lambda: tc.rng_reseeds_routed(on_reseed)),
        Entry("CUDA autocast without a GPU", "a CUDA autocast region stays a region on a host without a "
              "GPU, where torch would turn it off",
              tc.cuda_autocast_kept_without_gpu),
        Entry("CUDA sdpa choice without a GPU", "fake CUDA sdpa takes the kernel an H200 would pick, so a "
              "host without a GPU records the GPU host's strides (sdpa_choice.py)",
              tc.cuda_sdpa_choice_without_gpu),
        Entry("CUDA batch norm reserve without a GPU", "fake CUDA training batch norm traces on a host "
              "without a GPU (its reserve size asks cuDNN)", tc.cuda_batch_norm_reserve_without_gpu),
        Entry("CUDA grid sampler without a GPU", "cuDNN's grid sampler, which a GPU host records inside "
              "CUDA autocast, traces on a host without a GPU", tc.cuda_grid_sampler_faked_without_gpu),
        Entry("detach without the mode", "a FunctionalTensor's detach with no mode in the way returns it, "
              "as torch 2.15 does (2.11/2.12 raise)",
              tc.functional_tensor_detach_without_mode),
    ])


def around_the_model_call(mod: torch.nn.Module, state: dict[str, Any], recorders: CallRecorders) -> Manager:
    """MODEL_CALL: around ``mod``'s call on traced inputs (``state``: fqn -> traced parameter or buffer)."""
    return _entered(MODEL_CALL, [
        Entry("state swapped for traced inputs", "the model reads the functional wrappers of the fakes; "
              "nothing of the user's module is touched", lambda: tc.reparametrize(mod, state)),
        Entry("tracer noted for leaks", "the leak report names the node a leaked fake came from",
              lambda: _on_entry(leaks.note_tracer)),
        Entry("non-strict call rewrites", "torch.export's rewrites of calls non-strict tracing cannot take "
              "as they are (SymInt indexing, max/min of SymInts, collectives)", tc.non_strict_call_rewrites),
        Entry("node metadata", "nn_module_stack, torch_fn and stack traces on every node (node_meta.py)",
              recorders.node_metadata),
        Entry("preserved call brackets", "preserve_module_call_signature's submodule calls bracketed "
              "(module_signatures.py)", recorders.preserved_calls),
        Entry("tensor attribute warning", "torch.export's warning about tensor attributes assigned in forward",
              lambda: warning_on_assigned_tensor_attributes(mod)),
        Entry("after the call", "the caches forward filled, read while the trace can still tell what "
              "they hold (state_guard.py)", lambda: _on_success(recorders.after_the_call)),
    ])


def outside_the_trace_in_progress(off: dict[str, tuple[bool, Any]]) -> Manager:
    """BODY_TRACE: a Function's or hook's body traced into its own graph, from inside a trace."""
    return _entered(BODY_TRACE, [
        Entry("outside the trace", "the body gets its own tracer and modes; the trace in progress "
              "resumes after", tc.outside_trace),
        Entry("the caller's torch-function modes hidden", "torch records an autocast block into the "
              "first pre-dispatch recorder of the stack (the body's block must reach the body's graph), "
              "and each mode sees every tensor property the body's trace reads; the body's trace pushes "
              "its own, and keeps the caller's node metadata mode and torch.export's handler",
              lambda: tc.only_function_modes(carried_into_bodies)),
        Entry("autocast off", "the body's trace records no autocast region of the caller's "
              "(the caller's graph records it)", lambda: tc.autocast_state_as(off)),
    ])


def carried_into_bodies(mode: Any) -> bool:
    """A torch-function mode of the trace in progress that a body's trace keeps: one that says so
    (``CarriedIntoBodies``: the node metadata mode names the body's calls in the caller's count,
    as eager's user code calls them) and torch.export's handler (its rewrites apply to a body's
    code too). The caller's pre-dispatch recorder is never kept: torch's ``autocast.__enter__``
    records into the first one of the stack, which would put the body's block in the caller's graph."""
    return (isinstance(mode, CarriedIntoBodies) and mode.carried_into_bodies()) or tc.non_strict_export_handler(mode)


def around_a_traced_body(ambient: dict[str, tuple[bool, Any]]) -> Manager:
    """BODY: around the body's code inside its own trace."""
    return _entered(BODY, [
        Entry("caller's autocast, unrecorded", "the body computes in its caller's autocast, as eager runs it",
              lambda: tc.autocast_state_as(ambient)),
    ])


@contextlib.contextmanager
def _entered(layer: str, entries: Sequence[Entry]) -> Iterator[list[Any]]:
    """Enter ``entries`` in order (the first outermost); exit them in reverse, on every path."""
    with contextlib.ExitStack() as stack:
        yield [_enter(stack, layer, entry) for entry in entries]


def _enter(stack: contextlib.ExitStack, layer: str, entry: Entry) -> Any:
    return stack.enter_context(entry.make())


@contextlib.contextmanager
def _on_entry(step: Callable[[], None]) -> Iterator[None]:
    step()
    yield


@contextlib.contextmanager
def _on_success(step: Callable[[], None]) -> Iterator[None]:
    yield
    step()


def _let_torch_hops_through_active_mode() -> None:
    mode = tc.active_functional_mode()
    if mode is not None:
        let_torch_hops_through(type(mode))


__all__ = ["BODY", "BODY_TRACE", "CALL", "CALLER", "EXPORT", "MODEL_CALL", "MODEL_STATE", "TRACED", "TRACER",
           "CallRecorders", "Entry", "around_a_traced_body", "around_the_body", "around_the_call",
           "around_the_export", "around_the_model_call", "around_the_model_state", "around_the_tracer",
           "inside_the_traced_function", "outside_the_trace_in_progress"]

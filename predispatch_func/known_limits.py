"""The known limits as users read them: one paragraph per :class:`~predispatch_func.errors.Refusal` kind.

``docs/limits.md`` is generated from this module (``python scripts/gen_limits.py``;
a test fails while the file is stale), so a new kind cannot ship without its text,
and the *(torch)* mark comes from the kind's ``torch_limit`` flag, not from a hand
edit. The texts are Markdown; the order of ``WHAT_IS_REFUSED`` is the table's.
"""

from __future__ import annotations

from .errors import Refusal

TITLE = "# Known limits"

INTRO = """\
Every refusal is an `UnsupportedError` naming the op and the model's source
line, with a `kind` (`pf.Refusal`, an enum) that tests and scripts match on.
Marked *(torch)*: torch itself blocks the case, on every supported release
(checked on 2.11.0, 2.13.0, 2.14.1 and 2.15.0: none is lifted yet; 2.12.1 in part). Each has a strict
xfail asking for eager's result (`torch_limit` in `tests/support/torch_release.py`),
which fails loudly on the first release that fixes it; that release is then
named there (`lifted_in`, older releases keep the xfail) and in its row here,
as "(fixed in torch 2.x)". The three refused before torch raises
(`OUT_WITH_OTHER_WRITES`, `AUTOGRAD_FUNCTION_IN_HOP_BODY`,
`HOP_NOT_REPRESENTABLE`) are watched by running torch's own path
(`tests/torch_compat/test_torch_assumptions.py`); the error texts the others are recognised
by are provoked in `tests/torch_compat/test_torch_error_texts.py`.
"""

WHAT_IS_REFUSED: dict[Refusal, str] = {
    Refusal.GRAD_MODE_AFTER_AUTOGRAD: ('a grad-mode change with `pre_dispatch=False` (after autograd a '
                                       'region cannot be recorded)'),
    Refusal.MODE_LEFT_CHANGED: 'autocast left enabled when `forward` returns',
    Refusal.INPUT_METADATA_MUTATION: ('an in-place shape/stride change of a graph input to a symbolic '
                                      'layout (dynamic shapes), of a parameter, or a `resize_()` that grows '
                                      'a tensor that is not contiguous, has memory past its end (a view) or '
                                      'requires grad (*torch*: its functionalization refuses); static ones, '
                                      'and growing a contiguous input or intermediate, are carried (see '
                                      '[State outside the functional view](state.md))'),
    Refusal.WRITE_TO_ALIASED_INPUTS: ('a write to inputs that share memory where one synthetic base cannot stand '
                                      'for them: a parameter or buffer also passed as an input, members of '
                                      'different dtypes, strides that do not nest (no narrow/view/select chain '
                                      'reads a member from the shared memory) or dynamic shapes. Inputs passed '
                                      'twice, a view and its base, overlapping views are carried, also when the '
                                      'model relays one of them (`b.t_()`) (see [State outside the functional '
                                      'view](state.md))'),
    Refusal.WRITE_TO_TENSOR_ATTRIBUTE: 'a write to a plain tensor attribute (register it as a buffer)',
    Refusal.STATE_REPLACED: ('a parameter, or a buffer by one of another dtype, replaced by assignment '
                             '(another shape is carried; `ep.module()` then refuses to run on the new shape, '
                             'which a second call meets: the program is traced for the exported one)'),
    Refusal.PYTHON_STATE_CHANGED: ('a Python attribute, container, buffer, parameter or submodule set '
                                   "in `forward` that eager's later calls keep changing (a counter, a log) "
                                   'or read back differently (a stale cache); judged by eager over three '
                                   'calls on copies (`python_state="warn"` to bake the traced value)'),
    Refusal.RNG_STATE_SET: ('a draw from the global RNG after `torch.manual_seed`, `torch.seed` or a '
                            "state-changing `torch.set_rng_state` in `forward` (OpInfo's "
                            '`wrapper_set_seed`), or a reseed left in place when `forward` returns: '
                            'eager draws from that seed on every call, a program would draw from the '
                            "caller's RNG state (torch.export's program does, silently). A reseed "
                            'undone before returning with nothing drawn after it (dropout in eval '
                            'under `freeze_rng_state`) is carried. Seed outside the model or pass a '
                            '`torch.Generator`'),
    Refusal.DATA_ASSIGN_NEW_METADATA: '`tensor.data = value` with another shape, dtype or device',
    Refusal.DATA_ASSIGN_ALIASED: ('`tensor.data = value` while another alias of the tensor is alive (a '
                                  "view taken before, a kept `.data`, its base: eager's alias keeps "
                                  'the old storage); a later write to the tensor or to `value` while '
                                  "the other is alive (eager's two then share one storage); and "
                                  '`w.data = v` between two parameters, buffers or inputs (eager '
                                  'leaves them sharing memory after the call). Assign a fresh value '
                                  '(`w.data = v.clone()`), or write in place (`w.data.copy_(v)`)'),
    Refusal.DATA_WRITE_AFTER_SAVED_READ: ('a write through `.data` (or `t.data = v`) to a tensor that '
                                          'an op recorded with grad read earlier at a value that is '
                                          "not a graph input's own, where a result of that op can "
                                          'carry a gradient (a comparison, `argmax` or `.item()` has '
                                          'no backward and saves nothing) (an intermediate, an input '
                                          'written before the read, or any operand of a torch HOP such '
                                          'as `scan`, whose rule may hand its body a copy), or to the '
                                          'result of an op whose backward reads its own result (`exp`, '
                                          '`sigmoid`, `tanh`, `relu`, `softmax`, CPU '
                                          '`scaled_dot_product_attention`: any op outside the table '
                                          '`tensor_data.SAVES_NO_RESULT`, which a test checks in '
                                          "eager): eager's backward of that op reads the storage "
                                          "`.data` changed (no version bump), a program's the value it "
                                          'was given. Also `t.data = v` on an input that a kept '
                                          'composite read with grad on (`linear(x, w)` then `w.data = '
                                          "v`): eager swaps `w`'s storage while the view `w.t()` that "
                                          "the composite's `mm` saved keeps the old one, so its "
                                          'backward mixes both; write in place (`w.data.copy_(v)`)'),
    Refusal.WRITE_AFTER_UNCHECKED_HOP_READ: ('an in-place write to a tensor that `while_loop` or '
                                             "`scan` read with grad on: torch's backward of these two "
                                             "(2.13 to 2.15) reads its operands without autograd's "
                                             "version check, so eager's gradient silently uses the "
                                             "written value (an op's backward, `cond`'s and `map`'s "
                                             'raise instead); write to a clone'),
    Refusal.HOP_OPERAND_OF_WHILE_LOOP: ('a `while_loop` result computed with grad on passed to another '
                                        'torch HOP (`cond`, `map`, `while_loop`): under autograd torch '
                                        'returns the last slice of a stack of the iterations, whose '
                                        "storage offset depends on the trip count, and torch's capture "
                                        "of the next HOP's operands (dynamo) fails on it (torch.export "
                                        'too); pass a `.clone()`'),
    Refusal.IDENTITY_IN_NESTED_GRAD_REGION: ('a tensor that may require grad, written in place with '
                                             'grad off, then read in a grad-on region nested in that '
                                             "grad-off region, which in practice means the caller's "
                                             "`torch.no_grad()` around `export` with the model's own "
                                             "`enable_grad()` inside (the model's own nested regions "
                                             'are split where they change mode, so the identity is '
                                             'carried). A region carries identities on its results '
                                             "only, so inside, eager's gradient to the written tensor "
                                             'would be lost'),
    Refusal.OUT_WITH_OTHER_WRITES: ('an `out=` overload that also writes other arguments and has no '
                                    'overload without `out=` to run instead (`_fused_adam.out`: '
                                    "torch's functionalization of it fails an internal assert). Those "
                                    'that have one (`_native_batch_norm_legit.out`, '
                                    '`_batch_norm_with_update.out`, `rrelu_with_noise.out`, '
                                    "`_fused_moving_avg_obs_fq_helper.out`, which torch's "
                                    'functionalization pairs with the wrong results) are carried'),
    Refusal.OVERLAPPING_WRITES: ('one tensor (or overlapping views of it) passed as two arguments one '
                                 'op writes (`torch.batch_norm(x, None, None, s, s, True, 0.1, 1e-5, '
                                 'False)`: eager applies the second write on top of the first)'),
    Refusal.WRITE_TO_OVERLAPPING_VIEW: ('an in-place op on a view whose elements overlap '
                                        '(`t.unfold(1, 3, 2).abs_()`, a step smaller than the window): eager '
                                        'writes the shared elements one after another, in the order its '
                                        'kernel runs, a functional program computes each element from '
                                        "the old value (torch's functionalization refuses it; "
                                        "torch.export's non-functional IR keeps the in-place op). Compute "
                                        'the result out of place (`.abs()`)'),
    Refusal.WRITE_TO_SPARSE: ('an in-place write to a sparse tensor (a sparse kernel may return '
                              'indices or values aliasing its inputs without saying so: '
                              '`gather_backward(..., sparse_grad=True)` returns values that view '
                              '`grad`)'),
    Refusal.GRAD_VALUE_THROUGH_DETACH: ('a value that requires grad written through a `detach()`-ed '
                                        'alias, `.data` or `view(dtype)` (eager keeps two autograd '
                                        'histories for one storage). Where nothing it is computed from '
                                        'requires grad in the export (plain float inputs, frozen '
                                        'parameters) no gradient changes: it is exported, and '
                                        "`ep.module()` refuses to run (grad on) with those inputs or "
                                        'parameters requiring grad, naming them and the line; inside a '
                                        "custom Function's, hook's or torch HOP's body it is refused"),
    Refusal.GRAD_VALUE_INTO_INTEGER: ('a value that requires grad written into an integer tensor '
                                      "(torch's functional `fill`/`masked_fill` fail under autograd; "
                                      'detach the value)'),
    Refusal.VIEW_REPLAY_AFTER_STRIDED_WRITE: ('a `.view()` of a tensor written through a '
                                              'non-contiguous alias (use `.reshape()`)'),
    Refusal.WRITE_THROUGH_AS_STRIDED_OF_VIEW: 'a write through `as_strided()` of another view',
    Refusal.VIEW_DTYPE_REBUILD: ('a `view(dtype)` made under `no_grad` of a tensor written before '
                                 "(torch's functionalization fails to rebuild it)"),
    Refusal.DYNAMIC_SHAPES_SPEC: ('a `dynamic_shapes` spec naming no argument, or an example outside '
                                  "its Dim's range"),
    Refusal.DIM_NOT_DYNAMIC: ('a declared Dim that the model specialises, turns into an expression, or '
                              'supports in a narrower range'),
    Refusal.AUTOGRAD_FUNCTION_AFTER_AUTOGRAD: ('a custom `autograd.Function` with `pre_dispatch=False` '
                                               '(its backward would be replaced by autograd of its '
                                               'forward)'),
    Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE: ('an `autograd.Function` whose forward or backward cannot '
                                              'be traced (`.item()`, data-dependent branches, a wrong '
                                              'number of gradients, a symbolic value kept on `ctx`)'),
    Refusal.AUTOGRAD_FUNCTION_IN_HOP_BODY: ('a custom `autograd.Function` called inside a '
                                            "`cond`/`map`/`scan`/`while_loop` body: torch's dynamo "
                                            'capture of the body inlines its forward when no operand '
                                            'requires grad, dropping the backward (call it outside the '
                                            'HOP)'),
    Refusal.UNMATERIALIZED_GRADS: ('`ctx.set_materialize_grads(False)` in a Function with two or more '
                                   'differentiable outputs: eager passes `None` for each output the '
                                   'loss leaves unused, which code after the program decides (with one '
                                   'differentiable output it is carried exactly)'),
    Refusal.RNG_STREAM_NOT_REPRODUCIBLE: ("an `LSTM`/`GRU`/`RNN` with dropout between layers in "
                                          "`export_joint`, training on CUDA with cuDNN: cuDNN draws that mask "
                                          "from its own dropout state, which no op of a program reads, so "
                                          "neither recomputing the node for its backward nor decomposing it "
                                          "drops what eager drops (`pf.export` keeps it one `lstm` node)"),
    Refusal.MODULE_BACKWARD_HOOK: ("a module's full backward hook (`register_full_backward_hook`, "
                                   '`register_full_backward_pre_hook`, or the global ones): torch runs it '
                                   "from the autograd nodes of the module call's inputs and outputs, which "
                                   'a program has no place for (torch.export drops it, so its '
                                   "`ep.module()` trains without it); register a tensor hook in `forward` "
                                   "(`out.register_hook`), which the program carries"),
    Refusal.TENSOR_HOOK_NOT_EXPRESSIBLE: ('a tensor hook registered and removed inside `forward`, or '
                                          'one that returns None (side effects only)'),
    Refusal.REQUIRES_GRAD_OFF_ON_INPUT: ('`requires_grad_(False)` on a parameter, buffer or input '
                                         'inside `forward` (use `.detach()`)'),
    Refusal.HOP_BODY_WRITES_OPERANDS: ('a `cond`/`while_loop`/`map`/`scan` body that writes its '
                                       'operands or a closed-over tensor (return the new value '
                                       'instead)'),
    Refusal.FUNC_TRANSFORM_IN_HOP_BODY: ('`torch.vmap` (or `torch.func.grad`, `jacrev`, ...) inside the body of a '
                                         '`cond`/`map`/`scan`/`while_loop`: torch captures the body with the '
                                         "transform's level calls, which its functionalization cannot trace; call "
                                         'the transform outside the HOP and pass its result in (in `forward` itself '
                                         'it is exported)'),
    Refusal.AUTOCAST_IN_HOP_BODY: ("an autocast region inside a torch HOP's body (put it around the "
                                   'call)'),
    Refusal.HOP_NOT_REPRESENTABLE: ('a torch HOP whose traced call no `ExportedProgram` accepts '
                                    '(`local_map`, `invoke_quant_packed` with options; torch.export '
                                    'fails both, strict and non-strict)'),
    Refusal.STORAGE_SWAP: ("`x.set_(y)` on a graph input or buffer `x` (or `set_` of a Storage) in forward: "
                           "eager leaves the caller's `x` sharing `y`'s memory, which a functional program "
                           'cannot hand back; use `y` itself, or `x.copy_(y)` when the shapes agree '
                           "(torch.export's non-functional IR keeps the `set_`). `set_` from a tensor onto an "
                           'intermediate is carried (the two are aliases from then on), except with grad on '
                           "and a tensor that requires grad: eager's `set_` has no derivative, so its backward "
                           "raises where the program's would not (call it under `no_grad`). A program exported "
                           'without grad and then run with the source requiring grad backpropagates through '
                           'the alias where eager raises'),
    Refusal.DATA_DEPENDENT_BRANCH: ('Python control flow on a value read from tensor data, or a size '
                                    'taken from it, that nothing constrains (`if x.sum().item() > 2`): '
                                    'torch.export fails there too. The refusal names the line and what '
                                    'to write: `torch._check(...)` before it '
                                    '(`torch._check_is_size(n)` for a size), `torch.cond`, or '
                                    "`torch.where`; it is also torch's `GuardOnDataDependentSymNode`"),
    Refusal.OP_NOT_IN_TARGET: ('with `export(..., target=)`, ops that cannot be lowered into the '
                               'target op set (each named, with its lines); add them to the set, or give '
                               'each a decomposition of your own (`target.with_decompositions`, '
                               '[backends](backends.md#your-own-decompositions-custom-ops))'),
    Refusal.EAGER_OP_UNREACHABLE: ('under `pf.eager.on(target)`, an op with no path into the target (no '
                                   'decomposition into it, no composite kernel); named with the target and '
                                   'the line that called it (see [eager execution](eager.md))'),
    Refusal.EAGER_BACKEND_LACKS_FLOOR: ('`pf.eager.register(key, target)` on a backend that has no kernel for '
                                        'an op of the runtime floor (`pf.eager.RUNTIME_FLOOR`: writes, '
                                        'allocation, views, random fills), named'),
    Refusal.REGION_NOT_INLINABLE: ('`interop.inline_regions` on an autocast region (use '
                                   '`ep.run_decompositions()`)'),
    Refusal.TENSOR_SUBCLASS_IN_FORWARD: ('what a functional program cannot say about a tensor subclass used in '
                                         '`forward`: a write in place to an inner tensor read from a subclass '
                                         '(`t.a.add_(1)`) or to a subclass built in `forward` (eager writes the '
                                         'tensors the subclass holds), a subclass built over a tensor made outside '
                                         'the trace, a tensor attribute its '
                                         '`__tensor_flatten__` does not list, and the API of a subclass without '
                                         '`__tensor_flatten__`/`__tensor_unflatten__`. Reading inner tensors and '
                                         "calling the subclass's methods (`t.a`, `t.get_elem_a()`) and building "
                                         'one (`TwoTensor(x, y)`) are exported, as torch.export writes them '
                                         '(`export.access_subclass_inner_tensor`, `flat_apply`). An inner tensor '
                                         "named like the tracing tensor's own attribute (`elem`) is refused where "
                                         'it is used: rename it'),
    Refusal.DTENSOR_BOUNDARY_IN_FORWARD: ('a step between a DTensor and its local shard in `forward`: '
                                          '`DTensor.from_local`, `to_local` or `redistribute` (the input and '
                                          "output hooks `parallelize_module`'s Colwise/Rowwise/SequenceParallel "
                                          'plans install call them). A pre-dispatch trace records ops on the '
                                          "DTensor and cannot also record its shard's; torch.export fails on the "
                                          'same models (`flat_apply` of a `DTensorSpec`). Models whose parameters '
                                          'and inputs are DTensors and whose forward stays on DTensors export, as a '
                                          'program over DTensors; `pf.distributed.export_local` gives each rank\'s '
                                          'inference program over local shards of either kind of model (see '
                                          '[distributed](distributed.md))'),
    Refusal.FULLY_SHARDED_MODULE: ("`pf.export` of a module sharded by FSDP2's `fully_shard`: its all-gather "
                                   'and reduce-scatter run in module hooks that resize storages and read data '
                                   'pointers, which no trace can record (torch.export fails too); '
                                   '`pf.distributed.export_local` exports each rank\'s program over its shards '
                                   'without tracing them. It refuses what it does not model: a mixed precision '
                                   'policy, CPU offload, shards other than `Shard(0)` on a 1-D mesh (HSDP, '
                                   '`shard_placement_fn`), settings that change the gradients (`set_requires_gradient_'
                                   'sync(False)`, `set_gradient_divide_factor`, `set_all_reduce_hook`) and FSDP2 '
                                   'mixed with DTensor (tensor-parallel) parameters '
                                   '(see [distributed](distributed.md))'),
    Refusal.SUBGRAPH_IN_PIPELINE_STAGE: ('with `pf.distributed.pipeline`, a program with an autocast region or '
                                         'a torch HOP (`cond`, `scan`, ...): torch\'s split rebuilds each stage '
                                         'from its graph alone and loses the subgraphs these calls read '
                                         '(torch.export\'s programs fail the same way, on `wrap_with_set_grad_'
                                         'enabled`). Grad regions are inlined for the split (values and gradients '
                                         'stay eager\'s), except one that updates a tensor in place under '
                                         '`no_grad` (its identity gradient would be lost): refused too'),
    Refusal.OUTPUT_NOT_A_PYTREE: ('an output of a type pytree does not know (transformers\' `DynamicCache`, '
                                  'returned by default by its decoder LMs): no program can return it, and '
                                  'torch.export refuses it too. The error names the type and where it sits in '
                                  'the output; register it with `torch.utils._pytree.register_pytree_node` '
                                  '(`torch.export.register_dataclass` for a dataclass), or use the library\'s '
                                  'helper (transformers: `transformers.integrations.executorch.'
                                  'register_dynamic_cache_export_support()`, or `use_cache=False`)'),
    Refusal.AUTOGRAD_CALL_IN_FORWARD: ('`torch.autograd.grad`, `torch.autograd.backward` or `Tensor.backward()` '
                                       'called inside `forward` (a gradient penalty, a physics-informed loss): '
                                       'the pre-dispatch trace runs `forward` before autograd, so there is no '
                                       'autograd graph to differentiate there. torch.export fails on it too. '
                                       'Use `torch.func.grad` or `torch.func.vjp` inside `forward` (exported), '
                                       'or export with `pre_dispatch=False`, where `torch.autograd.grad` is '
                                       'traced (without grad-mode and autocast regions)'),
}

# limits that are not refusals: where the program is eager's only up to a stated difference
OTHER_LIMITS = """\
- Python-level state written in `forward` (attributes, containers, buffers,
  parameters or submodules registered there) is refused (see [State outside
  the functional view](state.md)); so is `tensor.data = value` with another shape or
  dtype. `w.data = v` is carried as an in-place copy under `no_grad`, which is
  eager's storage swap wherever no other tensor can tell them apart; where one
  can (an alias of `w` alive, `v` kept and one of them written later), it is
  refused (`DATA_ASSIGN_ALIASED`).
- Under the caller's `no_grad`, a parameter updated in place and then read in
  the model's own `enable_grad()` region is refused
  (`IDENTITY_IN_NESTED_GRAD_REGION`): exported outside `no_grad`, it is
  carried. Under the caller's `inference_mode` the
  model sees `torch.is_inference_mode_enabled()` as False (it runs as
  `no_grad`). The `TransformerEncoder` fast-path equivalence assumes a
  trainable model: with grad on and every weight frozen, eager takes the
  fast path and the program the dense one.
- A `Parameter` held where `named_parameters()` does not look (in a dict
  attribute) is a constant of the program, as in torch.export's: values are
  eager's, but the program does not train it (its outputs through it do not
  require grad).
- torch's fake kernels of `linear`/`mm` (2.13 to 2.15) do not check dtypes, so a model
  eager refuses for a dtype mismatch (an int64 input to a float `Linear`)
  exports; the program raises when run (strict xfail in `tests/state/test_state.py`).
- `torch.inference_mode()` inside a model exports as a `no_grad` region
  (`inference_mode(False)` as `enable_grad`): values and gradients are eager's
  wherever eager runs; where eager raises because an inference tensor leaves
  the region into autograd ("Inference tensors cannot be saved for
  backward"), the program computes what `no_grad` would.
- A forward that calls `torch.set_grad_enabled(False)` and never restores it
  exports: the rest of it is a no_grad region and `ep.module()` leaves grad
  mode off as eager does; that last side effect is not kept by
  `torch.export.save`.
- `ep.run_decompositions()` inlines regions (torch's post-dispatch IR has no
  grad-mode regions): values and autocast numerics are kept, but the
  identity-carrying gradients of in-place updates under `no_grad` are not.
- Against PyTorch's own test databases ([runs/conformance.md](runs/conformance.md)), the cases where
  we fall short of `torch.export.export` are listed with their reasons, and the
  torch releases they apply to, in `tests/conformance/known_gaps.json` (the same
  8 cases on torch 2.13.0, 2.14.1 and 2.15.0): `silu_` of complex inputs that require grad (a torch bug:
  eager's in-place gradient lacks the conjugation, `silu` refuses complex
  autograd, so the program raises torch's error when run with grad), and
  `rrelu(training=True)` after OpInfo's `torch.manual_seed` in `forward`
  (`RNG_STATE_SET`: torch.export's program matches eager only because the
  sample's inputs are positive, so nothing is drawn).
- `x.copy_(y)` over the whole of a user input `x` that nothing wrote before,
  with grad on and `y` of `x`'s layout, records no op: `x`'s new value is `y`
  (so re-exporting `ep.module()`, whose write-backs are such copies, gives the
  same graph). If at run time `x` is a non-leaf that requires grad (an
  activation from an upstream layer) and `y` does not, eager's `x` still
  requires grad (with a zero gradient) and the program's does not; gradients
  are equal. A leaf input that requires grad cannot be written so in eager.
"""


def render() -> str:
    """The whole of ``docs/limits.md``."""
    missing = [kind.name for kind in Refusal if kind not in WHAT_IS_REFUSED]
    if missing:
        raise ValueError(f"no text for Refusal kinds {missing} in known_limits.WHAT_IS_REFUSED")
    rows = [f"| `{kind.name}` | {'*(torch)* ' if kind.torch_limit else ''}{text} |"
            for kind, text in WHAT_IS_REFUSED.items()]
    return "\n".join([
        "<!-- generated by scripts/gen_limits.py from predispatch_func/known_limits.py: do not edit -->",
        TITLE, "", INTRO.strip(), "", "| `Refusal` | what is refused |", "|---|---|", *rows, "",
        OTHER_LIMITS.strip(), ""])

"""Why each ``TestExport`` test that torch.export passes and ours does not is left so.

Read by ``run_torch_export_tests.py --report``: every such test in a results file
is listed with its disposition here, and one that has none is counted as
*unexplained*. Kinds:

- ``graph text``: the test fails on printed graphs, node names or op lists while
  the program is right (the report checks that the runner classed the failing
  line as graph text, and says so where it did not);
- ``region HOP``: it looks for torch's ``wrap_with_set_grad_enabled`` /
  ``wrap_with_autocast``, where ours holds its own region HOPs (docs/regions.md);
- ``documented refusal``: ours raises a clear error of its own, with a kind
  where it is an ``UnsupportedError``; listed in docs/usage.md (drop-in section);
- ``documented difference``: ours behaves differently on purpose or in a way a
  user can act on, listed in docs/usage.md (drop-in section) with the reason;
- ``open``: not yet understood or not yet fixed; the reason says what is known;
- ``strict-only``: never listed here; the report derives it from a result, where
  torch.export with ``strict=False`` forced fails the test too (``--torch-nonstrict``).
"""

from __future__ import annotations

GRAPH_TEXT = "graph text"
REGION_HOP = "region HOP"
REFUSAL = "documented refusal"
DIFFERENCE = "documented difference"
OPEN = "open"
STRICT_ONLY = "strict-only"

_TO_FAMILY = ("op list of the functional IR, as in torch's own training-IR branch of the test (`_to_copy`, or no "
              "node for a no-op `.to`; see docs/usage.md); the program was checked against the reference")

DISPOSITIONS: dict[str, tuple[str, str]] = {
    # graph text / node names
    "test_cond_branches_return_same_int": (GRAPH_TEXT, "printed graph of a cond whose branches return ints"),
    "test_issue_157289": (GRAPH_TEXT, "printed graph (sym_size nodes placed differently)"),
    "test_hints_wrapper": (GRAPH_TEXT, "printed graph of hints_wrapper (node names)"),
    "test_placeholder_naming_collisions": (GRAPH_TEXT, "placeholder names (`p_param_1` for `p_param`)"),
    "test_placeholder_naming_collisions_hoo_subgraphs": (GRAPH_TEXT, "names of HOP subgraph attributes"),
    "test_constant_input_naming": (GRAPH_TEXT, "node name (`div_1` for `div`)"),
    "test_device_to_static": (GRAPH_TEXT, _TO_FAMILY),
    "test_device_to_dynamic": (GRAPH_TEXT, _TO_FAMILY),
    "test_device_to_mutation": (GRAPH_TEXT, _TO_FAMILY),
    "test_device_to_mutation_float": (GRAPH_TEXT, _TO_FAMILY),
    "test_float_conversion": (GRAPH_TEXT, _TO_FAMILY),
    "test_float_conversion_from_int": (GRAPH_TEXT, _TO_FAMILY),
    # our region HOPs in place of torch's
    "test_export_with_set_grad_enabled": (REGION_HOP, "`pf_grad_region` in place of `wrap_with_set_grad_enabled`"),
    "test_export_with_autocast": (REGION_HOP, "`pf_autocast_region` in place of `wrap_with_autocast`"),
    # documented refusals
    "test_state_primitives": (REFUSAL, "PYTHON_STATE_CHANGED: forward rewrites Python attributes on every call "
                                       "(eager drifts from the program from the second call); "
                                       "`python_state='warn'` keeps torch.export's behaviour"),
    "test_state_tensors": (REFUSAL, "PYTHON_STATE_CHANGED: of its four models, the two that replace registered "
                                    "buffers are exported (buffer mutations, equal to eager over three calls: "
                                    "tests/state/test_state_tensors_ported.py); the two that replace a plain "
                                    "tensor attribute or list items drift from eager's second call, so ours "
                                    "refuses them after torch.export's warning; `python_state='warn'` keeps "
                                    "torch.export's behaviour"),
    # documented differences
    "test_derived_dim_1_2": (DIFFERENCE, "ours accepts a size torch's program rejects (dx = 1 within the declared "
                                         "range [1, 2]; torch's test says `TODO: this should not error?`)"),
    "test_detect_leak_nonstrict": (DIFFERENCE, "a tensor the model keeps is our tracing tensor (a FunctionalTensor "
                                               "over a fake), not a FakeTensor; the leak warning itself is torch's"),
    "test_detect_leak_nonstrict_with_stacktrace": (DIFFERENCE, "as test_detect_leak_nonstrict"),
    "test_capture_subclass_constructor": (GRAPH_TEXT, "printed graph: ours records the TwoTensor built in forward "
                                                      "as a `flat_apply` of its `__tensor_unflatten__` over the inner "
                                                      "tensors where an op first reads it, torch's as one of its "
                                                      "constructor; both replay equal to eager, and "
                                                      "`run_decompositions` gives torch's graph "
                                                      "(tests/program/test_tensor_subclasses_in_forward.py)"),
    "test_export_aten_to_unflatten_subclass": (DIFFERENCE, "`run_decompositions` of a program whose preserved "
                                                           "`bar` takes a subclass parameter: torch refuses it in "
                                                           "both programs, for ours in its verifier "
                                                           "(SpecViolationError naming p_param) instead of the "
                                                           "ValueError, as ours has no no-op `to` node between the "
                                                           "parameter and the call; the program itself equals "
                                                           "eager, unflattened too "
                                                           "(tests/program/test_tensor_subclasses_in_forward.py)"),
}

"""Every torch error text we translate into a refusal (``_torch_compat/error_texts.py``)
is provoked here on the installed torch.

For each entry, a tiny program (the one the suite already uses for that refusal)
goes through ``pf.export``: it must be refused with the entry's kind, and torch's
exception must be in the refusal's cause chain and match the entry. When torch
rewords a message the refusal stops firing and the test of that entry fails,
naming it; when torch fixes the limit the program exports and the test fails
too (then mark the release in the strict xfail of the case, tests/support/torch_release.py).
"""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.trace import refusals
from predispatch_func.trace.extensions import torch_limits
from tests.hops.test_func_transforms import VMAP_IN_HOP_BODY_ASSERTS_ON_2_11, VmapInsideCond
from tests.hops.test_torch_hops import (
    WHILE_LOOP_OPERAND_GUARDED_BEFORE_2_13,
    CondWritesOperand,
    RegionsInsideCondBranches,
    _WhileLoopResultIntoHop,
)
from tests.state.test_growing_resize import GrowTransposedView
from tests.state.test_state import ViewDtypeOfWrittenInputUnderNoGrad
from tests.test_refusals import AbsInPlaceOnOverlappingUnfold
from tests.trace.test_as_strided_writes import WriteThroughAsStridedOfAView
from tests.trace.test_grad_value_into_integer import GradValueWrittenIntoIntegerTensor
from tests.trace.test_writes_through_views import ViewOfBufferWrittenThroughTranspose

R = pf.Refusal

# entry name -> (the kind we refuse it as, a program that provokes it: () -> (model, args))
PROVOKED_BY = {
    "RESIZE_VIEW_TO_LARGER": (R.INPUT_METADATA_MUTATION, lambda: (GrowTransposedView(), (torch.randn(2, 3),))),
    "SET_STORAGE_OTHER_DEVICE": (R.VIEW_DTYPE_REBUILD, lambda: (ViewDtypeOfWrittenInputUnderNoGrad(),
                                                                (torch.randn(3),))),
    "MUTATION_WITH_INTERNAL_OVERLAP": (R.WRITE_TO_OVERLAPPING_VIEW, lambda: (AbsInPlaceOnOverlappingUnfold(),
                                                                           (torch.ones(1, 5),))),
    "CANNOT_VIEW": (R.VIEW_REPLAY_AFTER_STRIDED_WRITE, lambda: (ViewOfBufferWrittenThroughTranspose(),
                                                                (torch.randn(4, 2),))),
    "AS_STRIDED_IN_VIEW_CHAIN": (R.WRITE_THROUGH_AS_STRIDED_OF_VIEW, lambda: (WriteThroughAsStridedOfAView(),
                                                                              (torch.randn(6),))),
    "AUTOGRAD_NOT_SUPPORT_DTYPE": (R.GRAD_VALUE_INTO_INTEGER, lambda: (GradValueWrittenIntoIntegerTensor(),
                                                                       (torch.zeros(2, 3, dtype=torch.long),))),
    "WHILE_LOOP_RESULT_AS_HOP_OPERAND": (R.HOP_OPERAND_OF_WHILE_LOOP, lambda: (
        _WhileLoopResultIntoHop("cond"), (torch.randn(3, 2, requires_grad=True),))),
    "HOP_BODY_INPUT_MUTATION": (R.HOP_BODY_WRITES_OPERANDS, lambda: (CondWritesOperand(), (torch.randn(2, 3),))),
    "FUNCTIONAL_TENSOR_ON_ITS_OWN": (R.FUNC_TRANSFORM_IN_HOP_BODY, lambda: (VmapInsideCond(), (torch.randn(4, 3),))),
    "TENSOR_DTYPE_MISMATCH": (R.AUTOCAST_IN_HOP_BODY, lambda: (RegionsInsideCondBranches(), (torch.randn(2, 3),))),
}


def _causes(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    cause: BaseException | None = exc.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(cause)
        cause = cause.__cause__
    return chain


RELEASE_LIMITS = {"WHILE_LOOP_RESULT_AS_HOP_OPERAND": WHILE_LOOP_OPERAND_GUARDED_BEFORE_2_13,
                  "FUNCTIONAL_TENSOR_ON_ITS_OWN": VMAP_IN_HOP_BODY_ASSERTS_ON_2_11}


@pytest.mark.parametrize("name", [pytest.param(name, marks=RELEASE_LIMITS[name]) if name in RELEASE_LIMITS
                                  else name for name in sorted(PROVOKED_BY)])
def test_torch_still_raises_the_text_we_translate(name):
    entry = tc.error_texts.ENTRIES[name]
    kind, program = PROVOKED_BY[name]
    model, args = program()
    with pytest.raises(pf.UnsupportedError) as info:
        pf.export(model, args)
    assert info.value.kind is kind, f"refused as {info.value.kind}, expected {kind}"
    causes = _causes(info.value)
    assert any(entry.matches(c) for c in causes), (
        f"no exception in the cause chain matches {name} ({entry}): "
        + "; ".join(f"{type(c).__name__}: {str(c)[:200]}" for c in causes))


def _translations() -> dict[str, set[pf.Refusal]]:
    """Entry name -> the kinds our tables translate it into."""
    names = {id(entry): name for name, entry in tc.error_texts.ENTRIES.items()}
    found: dict[str, set[pf.Refusal]] = {}
    for entry, kind, _ in (*refusals._KNOWN_TORCH_LIMITS, *torch_limits._LIMITS):
        assert id(entry) in names, f"{entry} (for {kind}) is not an entry of _torch_compat/error_texts.py"
        found.setdefault(names[id(entry)], set()).add(kind)
    return found


def test_every_entry_has_a_provoking_program():
    assert sorted(PROVOKED_BY) == sorted(tc.error_texts.ENTRIES)


def test_every_entry_is_translated_into_the_kind_its_program_expects():
    translations = _translations()
    assert sorted(translations) == sorted(tc.error_texts.ENTRIES), "an entry no table translates"
    for name, kinds in translations.items():
        assert kinds == {PROVOKED_BY[name][0]}, name

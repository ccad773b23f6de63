"""Every CPU entry of torch's ``hop_db`` that eager runs, and the ExportDB ``cond_*``,
``map`` and ``autograd_function`` examples: exported, contract-checked and equal to
eager (gradients where eager has them). Where torch itself cannot represent the
program (torch.export fails the same way), a clear UnsupportedError: strict xfail."""

import pytest

import predispatch_func as pf
from predispatch_func.errors import UnsupportedError
from tests.support.hop_db_cases import exportdb_cases, hop_db_cases, skip_unless_eager_runs
from tests.support.torch_release import torch_limit

TORCH_CANNOT = {  # checked with torch 2.13.0, 2.14.1, 2.15.0: torch.export.export fails each, strict and non-strict;
    # refused as HOP_NOT_REPRESENTABLE before torch fails (tests/torch_compat/test_torch_assumptions.py checks torch still does)
    "hop/invoke_quant.simple/0": (
        "InvokeQuant options become a graph node without a value: torch.export.export fails with "
        "'Node.meta invoke_quant is missing val field', strict=True and strict=False alike"),
    "hop/local_map_hop.simple/0": (
        "local_map records a Python closure as the op: torch.export.export fails with 'is not an "
        "allowed operator type' (strict=False; from 2.14 on 'Node.meta inp1 is missing val field') and "
        "'Unexpected type in sourceless builder' (strict=True)"),
}
CASES = {name: (model, args, skip) for name, model, args, skip in [*hop_db_cases(1), *exportdb_cases()]}


def _params():
    from tests.hops.test_torch_hops import INVOKE_SUBGRAPH_NEEDS_2_13

    for name in CASES:
        marks = [torch_limit(TORCH_CANNOT[name], raises=UnsupportedError)] \
            if name in TORCH_CANNOT else []
        if name == "hop/invoke_subgraph.simple/0":
            marks.append(INVOKE_SUBGRAPH_NEEDS_2_13)
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_hop_db_and_exportdb(name):
    model, args, skip = CASES[name]
    skip_unless_eager_runs(model, args, skip)
    ep = pf.export(model, args)
    report = pf.verify(ep, model, args)
    assert report.ok, report  # gradients compared wherever eager's backward runs

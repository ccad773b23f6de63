"""Every CPU entry of torch's ``hop_db`` that eager runs, and the ExportDB ``cond_*``,
``map`` and ``autograd_function`` examples: exported, contract-checked and equal to
eager (gradients where eager has them). Where torch itself cannot represent the
program (torch.export fails the same way), a clear UnsupportedError: strict xfail."""

import pytest
import torch
from hop_db_cases import exportdb_cases, hop_db_cases

import predispatch_func as pf
from predispatch_func.errors import UnsupportedError

TORCH_CANNOT = {
    "hop/invoke_quant.simple/0": "InvokeQuant options become a graph node without a value",
    "hop/flex_attention_backward.simple/0": "flex_attention's internal backward HOP fails in torch.export",
    "hop/flex_attention_backward.explicit_buffers/0": "flex_attention's internal backward HOP fails in torch.export",
    "hop/local_map_hop.simple/0": "local_map records a Python closure as the op",
}
CASES = {name: (model, args, skip) for name, model, args, skip in [*hop_db_cases(1), *exportdb_cases()]}


def _params():
    for name in CASES:
        marks = [pytest.mark.xfail(strict=True, raises=UnsupportedError, reason=TORCH_CANNOT[name])] \
            if name in TORCH_CANNOT else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_hop_db_and_exportdb(name):
    model, args, skip = CASES[name]
    if skip:
        pytest.skip(skip)
    try:
        with torch.no_grad():
            model(*args)
    except RuntimeError as exc:
        pytest.skip(f"eager does not run it on CPU: {exc}")
    ep = pf.export(model, args)
    report = pf.verify(ep, model, args)
    assert report.ok, report  # gradients compared wherever eager's backward runs

"""op_schema.functional_twin: the one answer to "which overload computes what this op writes"."""

import pytest
import torch

from predispatch_func.op_schema import Match, functional_twin, out_argument_names, writes_besides_out

aten = torch.ops.aten


@pytest.mark.parametrize("op,match,twin", [
    (aten.add_.Tensor, Match.BY_NAME, aten.add.Tensor),
    (aten.add_.Tensor, Match.IN_ORDER, aten.add.Tensor),
    (aten.hardtanh_.default, Match.IN_ORDER, aten.hardtanh.default),
    # polygamma_(self, n) and polygamma(n, self): the same arguments by name, not in order
    (aten.polygamma_.default, Match.BY_NAME, aten.polygamma.default),
    (aten.polygamma_.default, Match.IN_ORDER, None),
    (aten.add.out, Match.BY_NAME, aten.add.Tensor),
    (aten.relu.default, Match.BY_NAME, None),  # writes nothing: no twin
])
def test_functional_twin(op, match, twin):
    assert functional_twin(op, match) is twin


def test_out_arguments_and_what_else_is_written():
    assert out_argument_names(aten.add.out) == ["out"]
    assert not writes_besides_out(aten.add.out)
    # writes the running stats besides out= (functionalization misorders those)
    assert writes_besides_out(aten._native_batch_norm_legit.out)


def test_the_twin_computes_what_the_op_writes():
    x, y = torch.randn(3), torch.randn(3)
    expected = x.clone().polygamma_(2)
    twin = functional_twin(aten.polygamma_.default)
    assert torch.equal(twin(n=2, self=x), expected)
    assert torch.equal(functional_twin(aten.add.out)(x, y), torch.add(x, y))

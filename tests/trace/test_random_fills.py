"""In-place random fills on views: the program draws the numbers eager draws *and puts them
where eager puts them*. Eager fills a non-contiguous view in its memory order (a transposed
view along its base's rows), and some kernels take another path for a non-contiguous
target (``normal_``); a program that drew into a fresh contiguous tensor got the same
numbers in other places (silently: same seed, another tensor). ``random_(from, to)`` is not
here: fx cannot print the overload named ``from`` (torch.export fails it too). A fill of an
input that requires grad trains: eager gives that input a zero gradient, and so must the program."""

import pytest
import torch

from tests.passes.test_writeback_guard import InPlaceOnInput
from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_checked

VIEWS = {
    "transposed": lambda x: x.t(),
    "strided": lambda x: x[:, ::2],
    "offset": lambda x: x[1:],
    "permuted_3d": lambda x: x.view(2, 3, 4).permute(2, 0, 1),
    "contiguous": lambda x: x,
}
FILLS = {
    "uniform_": lambda v: v.uniform_(),
    "normal_": lambda v: v.normal_(),
    "cauchy_": lambda v: v.cauchy_(),
    "exponential_": lambda v: v.exponential_(),
    "geometric_": lambda v: v.geometric_(0.3),
    "log_normal_": lambda v: v.log_normal_(),
    "bernoulli_p": lambda v: v.bernoulli_(0.5),
    "bernoulli_tensor": lambda v: v.bernoulli_(torch.full(v.shape, 0.3)),
    "random_to": lambda v: v.random_(10),
}


class FillView(torch.nn.Module):
    def __init__(self, view, fill, through_grad):
        super().__init__()
        self.view, self.fill, self.through_grad = view, fill, through_grad

    def forward(self, x):
        y = x * 1 if self.through_grad else x  # an activation that requires grad, or the input itself
        self.fill(self.view(y))
        return y + 1


@pytest.mark.parametrize("through_grad", [False, True], ids=["input", "activation"])
@pytest.mark.parametrize("fill", list(FILLS))
@pytest.mark.parametrize("view", list(VIEWS))
def test_random_fill_of_a_view_puts_eagers_numbers_where_eager_puts_them(view, fill, through_grad):
    x = torch.zeros(6, 4, requires_grad=through_grad)
    export_checked(FillView(VIEWS[view], FILLS[fill], through_grad), (x,))


_RANDOM_FILLS = {
    "normal_": lambda x: x.normal_(),
    "uniform_": lambda x: x.uniform_(-1, 1),
    "bernoulli_": lambda x: x.bernoulli_(0.5),
    "exponential_": lambda x: x.exponential_(),
}


@pytest.mark.parametrize("name", sorted(_RANDOM_FILLS))
def test_random_fill_of_an_input_that_requires_grad_trains(name):
    """``normal_functional`` has no derivative: backward through the program raised,
    where eager gives the input a zero gradient (and it keeps requiring grad)."""
    assert_ok(InPlaceOnInput(_RANDOM_FILLS[name]), (torch.randn(3, 4),))

"""deepcopy_without_history: copies as deepcopy does, tensors with autograd history detached."""

import torch

from predispatch_func.state.history_free_copy import deepcopy_without_history


class _Kept(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.kept = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept = {"last": [self.lin(x)]}
        return self.kept["last"][0]


def test_a_tensor_with_history_is_copied_detached_with_its_values() -> None:
    model = _Kept()
    model(torch.randn(2, 3))
    held = model.kept["last"][0]
    assert held.grad_fn is not None  # the case: deepcopy refuses it
    copied = deepcopy_without_history(model)
    assert copied.kept["last"][0].grad_fn is None
    assert torch.equal(copied.kept["last"][0], held)
    assert copied.kept["last"][0] is not held and model.kept["last"][0] is held
    assert copied.lin.weight is not model.lin.weight and torch.equal(copied.lin.weight, model.lin.weight)


def test_entries_already_in_the_memo_win_with_and_without_history() -> None:
    for called in (False, True):
        model = _Kept()
        if called:
            model(torch.randn(2, 3))
        stand_in = torch.nn.Parameter(torch.zeros(3, 3))
        memo = {id(model.lin.weight): stand_in}
        copied = deepcopy_without_history(model, memo)
        assert copied.lin.weight is stand_in
        assert memo[id(model.lin.bias)] is copied.lin.bias  # the memo records what was copied

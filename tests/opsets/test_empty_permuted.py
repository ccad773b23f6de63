"""``empty_permuted``: torch's ``empty_like`` reaches it for a tensor that is not contiguous
(channels-last activations), and torch has no decomposition for it, so every such model was
refused under ``target=core_aten`` (timm and torchvision training programs in the light zoo).
Ours allocates with ``empty_strided`` at the layout's strides; those strides are what the
program's later ops and the user see, so they must be eager's."""

import pytest
import torch

import predispatch_func as pf
from predispatch_func.opsets.decompositions.structure import empty_permuted
from tests.support.reference import export_checked, replay_calls

aten = torch.ops.aten


@pytest.mark.parametrize("size, layout", [((2, 3, 4, 5), (0, 2, 3, 1)), ((3, 4), (1, 0)), ((2, 0, 3), (2, 0, 1)),
                                          ((0, 4, 1), (1, 2, 0)), ((), ()), ((5,), (0,))])
def test_strides_are_eagers(size, layout):
    ours, eager = empty_permuted(size, layout, dtype=torch.float16), aten.empty_permuted(size, layout,
                                                                                        dtype=torch.float16)
    assert (ours.shape, ours.stride(), ours.dtype) == (eager.shape, eager.stride(), eager.dtype)


class FilledLikeChannelsLast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x.to(memory_format=torch.channels_last))
        mask = torch.empty_like(y).fill_(0.5)
        return y * mask, mask.is_contiguous(memory_format=torch.channels_last)


def test_a_model_allocating_like_a_channels_last_tensor_lowers_on_both_paths():
    model, x = FilledLikeChannelsLast(), torch.randn(2, 3, 6, 6)
    ep = export_checked(model, (x,), target=pf.OpSet.core_aten())
    assert not any(n.target is aten.empty_permuted.default for n in ep.graph.nodes)
    assert any(n.target is aten.empty_strided.default for n in ep.graph.nodes)
    replay_calls(ep, model, (x,), calls=2)
    with pf.eager.on(pf.OpSet.core_aten()) as session:
        out, channels_last = model(x)
    # eager's empty_like is its composite kernel, which calls empty_strided (Core ATen) at the
    # layout's strides: served as it is (eager.plans.SERVED_BY_COMPOSITE_KERNEL), no decomposition
    assert channels_last and "aten.empty_like.default" not in {str(op) for op in session.stats.decomposed}
    torch.testing.assert_close(out, model(x)[0])

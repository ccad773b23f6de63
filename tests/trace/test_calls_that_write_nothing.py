"""Composites torch tags maybe-aliasing-or-mutating whose writes the call's arguments decide
(``WRITES_ONLY_WHEN``) stay one node for the calls that write nothing, and are decomposed
(their writes in the signature) for the calls that write. Every program is replayed
against the reference and its graph run to show it writes none of its inputs."""

import pytest
import torch

from predispatch_func.trace.composite_policy import WRITES_ONLY_WHEN
from tests.support.reference import all_graph_modules, call_targets, export_checked, mutations

A = torch.ops.aten


def _conv_bn(track_running_stats: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, track_running_stats=track_running_stats),
                               torch.nn.ReLU())


@pytest.mark.parametrize("train,track,kept", [(False, True, True), (True, True, False), (True, False, True),
                                              (False, False, True)],
                         ids=["eval", "train-with-running-stats", "train-without", "eval-without"])
def test_batch_norm_is_one_node_exactly_when_it_writes_nothing(train, track, kept):
    model = _conv_bn(track).train(train)
    ep = export_checked(model, (torch.randn(2, 3, 8, 8),))
    assert ("aten.batch_norm.default" in call_targets(ep)) is kept
    written = {target for _, target in mutations(ep)}
    assert written == ({"1.running_mean", "1.running_var", "1.num_batches_tracked"} if train and track else set())


class _WithRunningStats(torch.nn.Module):
    """Running statistics as buffers, and a forward (``body(x, mean, var)``) that normalises with them."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        return self.body(x, self.mean, self.var)


def test_batch_norm_kept_under_no_grad_and_in_a_functional_call():
    def body(x, mean, var):
        with torch.no_grad():
            y = torch.nn.functional.batch_norm(x, mean, var, training=False)
        return torch.nn.functional.batch_norm(y + x, mean, var, training=True, momentum=0.5)

    ep = export_checked(_WithRunningStats(body), (torch.randn(2, 4, 5),))
    assert "aten.batch_norm.default" in call_targets(ep)  # the eval call
    assert {target for _, target in mutations(ep)} == {"mean", "var"}  # the training call's writes


def test_the_writes_predicate_reads_keyword_arguments():
    op = A.batch_norm.default
    writes = WRITES_ONLY_WHEN[op]
    stats = (torch.zeros(2), torch.ones(2))
    assert writes(op, (torch.randn(1, 2), None, None, *stats, True, 0.1, 1e-5, False), {})
    assert not writes(op, (torch.randn(1, 2), None, None, *stats, False, 0.1, 1e-5, False), {})
    assert not writes(op, (torch.randn(1, 2), None, None, None, None), {"training": True, "momentum": 0.1,
                                                                          "eps": 1e-5, "cudnn_enabled": False})


def _conv_instance_norm(track_running_stats: bool, affine: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3),
                               torch.nn.InstanceNorm2d(4, affine=affine, track_running_stats=track_running_stats),
                               torch.nn.ReLU(inplace=True))


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("train,track,kept", [(False, True, True), (True, True, False), (True, False, True),
                                              (False, False, True)],
                         ids=["eval", "train-with-running-stats", "train-without", "eval-without"])
def test_instance_norm_is_one_node_exactly_when_it_writes_nothing(train, track, kept, affine):
    """As torch.export keeps it; the audit finds it writing its running statistics, which it
    does only when normalising by the input's statistics with them given (training)."""
    model = _conv_instance_norm(track, affine).train(train)
    ep = export_checked(model, (torch.randn(2, 3, 8, 8),))
    assert ("aten.instance_norm.default" in call_targets(ep)) is kept
    written = {target for _, target in mutations(ep)}
    assert written == ({"1.running_mean", "1.running_var"} if train and track else set())


def test_instance_norm_kept_under_no_grad_and_written_back_in_a_functional_call():
    def body(x, mean, var):
        with torch.no_grad():
            y = torch.nn.functional.instance_norm(x)
        z = torch.nn.functional.instance_norm(y * x, mean, var, use_input_stats=False)
        return torch.nn.functional.instance_norm(z + x, mean, var, use_input_stats=True, momentum=0.5)

    ep = export_checked(_WithRunningStats(body), (torch.randn(2, 4, 5, requires_grad=True),))
    kept = [n for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.target is A.instance_norm.default]
    assert len(kept) == 2  # the calls that write nothing, one under no_grad
    assert {target for _, target in mutations(ep)} == {"mean", "var"}  # the last call's writes


def test_a_users_keep_override_still_decomposes_a_call_that_writes():
    model = _conv_bn(True).train()
    ep = export_checked(model, (torch.randn(2, 3, 8, 8),), composite_overrides={"aten.batch_norm.default": "keep"})
    assert "aten.batch_norm.default" not in call_targets(ep)
    assert {target for _, target in mutations(ep)} == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    ep = export_checked(model.eval(), (torch.randn(2, 3, 8, 8),),
                        composite_overrides={"aten.batch_norm.default": "decompose"})
    assert "aten.batch_norm.default" not in call_targets(ep)  # the user's "decompose" holds

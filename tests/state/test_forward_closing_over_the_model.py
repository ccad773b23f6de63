"""A forward that reaches the model other than through ``self``: a function set on the
instance that closes over the model, or a global name. ``deepcopy`` shares functions,
so the copies the Python-state judge and ``pf.verify`` call would run the caller's
model and write its tensors. Closures are rebuilt over the copies; a global name
cannot be, and the copy is stopped before it writes (``state/caller_tripwire.py``).
Found through transformers' rwkv in a joint export: the training step's forward
closed over the step."""

import torch
from expecttest import TestCase

import predispatch_func as pf
from predispatch_func.joint.loss import training_step


class RescalesOnce(torch.nn.Module):
    """rwkv's shape: the first call rescales a weight in place under no_grad and sets a flag."""

    def __init__(self, factor: float = 1.0):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros(()))
        self.rescaled = False
        self.factor = factor

    def forward(self, x):
        if not self.rescaled:
            with torch.no_grad():
                self.lin.weight.mul_(self.factor)
            self.rescaled = True
        self.calls.add_(1)
        return self.lin(x)


def closing_over(model):
    model.forward = lambda x: RescalesOnce.forward(model, x)
    return model


GLOBAL_MODEL = RescalesOnce(factor=2.0)
GLOBAL_MODEL.forward = lambda x: RescalesOnce.forward(GLOBAL_MODEL, x)


def snapshot(model):
    return {k: (v.clone(), v._version) for k, v in model.state_dict(keep_vars=True).items()}


class TestForwardClosingOverTheModel(TestCase):
    def assert_untouched(self, model, before, rescaled=False):
        self.assertEqual(model.rescaled, rescaled)
        for k, v in model.state_dict(keep_vars=True).items():
            self.assertTrue(torch.equal(v, before[k][0]), k)
            self.assertEqual(v._version, before[k][1], k)

    def test_a_closure_over_the_model_is_judged_on_the_copy(self):
        """factor 1: the one-time rescale changes nothing, so the flag is carried; the program
        equals eager over 3 calls and the caller's model is untouched."""
        torch.manual_seed(0)
        model, x = closing_over(RescalesOnce(factor=1.0)), torch.randn(2, 3)
        before = snapshot(model)
        ep = pf.export(model, (x,))
        self.assert_untouched(model, before)
        report = pf.verify(ep, model, (x,), calls=3)
        self.assertTrue(report.ok, report.problems)
        self.assert_untouched(model, before)

    def test_a_closure_over_the_model_that_rescales_for_real_is_refused_as_read_back(self):
        model, x = closing_over(RescalesOnce(factor=2.0)), torch.randn(2, 3)
        before = snapshot(model)
        with self.assertRaisesRegex(pf.UnsupportedError, r"(?s)'rescaled'.*later eager calls read it"):
            pf.export(model, (x,))
        self.assert_untouched(model, before)

    def test_a_global_model_name_is_stopped_before_it_writes_the_callers_tensors(self):
        x = torch.randn(2, 3)
        before = snapshot(GLOBAL_MODEL)
        with self.assertRaisesRegex(pf.UnsupportedError, r"(?s)'rescaled'.*reached the caller's tensors"):
            pf.export(GLOBAL_MODEL, (x,))
        self.assert_untouched(GLOBAL_MODEL, before)

    def test_verify_never_runs_the_callers_model(self):
        x = torch.randn(2, 3)
        ep = pf.export(GLOBAL_MODEL, (x,), python_state="warn")
        before = snapshot(GLOBAL_MODEL)
        report = pf.verify(ep, GLOBAL_MODEL, (x,))
        self.assertFalse(report.ok)
        self.assertRegex(" ".join(report.problems), "reached the caller's tensors")
        self.assert_untouched(GLOBAL_MODEL, before)

    def test_training_step_forward_runs_on_its_deep_copy(self):
        """The joint export's step object: its forward is bound, so a copy runs the copy."""
        import copy

        model = RescalesOnce()
        step = training_step(model, lambda out: out.sum())
        twin = copy.deepcopy(step)
        twin(torch.randn(2, 3))
        self.assertFalse(model.rescaled)
        self.assertEqual(model.calls.item(), 0)
        self.assertEqual(twin.calls.item(), 1)

    def test_joint_export_of_a_model_writing_state_once(self):
        torch.manual_seed(0)
        model, x = RescalesOnce(factor=1.0), torch.randn(2, 3)
        before = snapshot(model)
        ep = pf.export_joint(model, (x,), loss_fn=lambda out: out.pow(2).mean())
        self.assert_untouched(model, before)
        report = pf.verify_joint(ep, model, (x,), loss_fn=lambda out: out.pow(2).mean(), calls=2)
        self.assertTrue(report.ok, report.problems)

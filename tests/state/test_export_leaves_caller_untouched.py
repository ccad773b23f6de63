"""Exporting leaves the caller's model, inputs and RNG exactly as they were: values, versions,
training flags and grads, for every kind of state at once."""

import torch
from expecttest import TestCase

import predispatch_func as pf


class TestExportLeavesCallerUntouched(TestCase):
    def test_model_inputs_buffers_and_rng_unchanged_by_export(self):
        """export_checked checks this on every case; here every kind of state at once,
        including versions (a write undone later would still bump them) and grads."""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3),
                                    torch.nn.Dropout(0.5)).train()
        x = torch.randn(4, 3)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        versions = {k: v._version for k, v in model.state_dict(keep_vars=True).items()}
        x_before, x_version = x.clone(), x._version
        rng = torch.get_rng_state()
        pf.export(model, (x,))
        self.assertTrue(torch.equal(torch.get_rng_state(), rng))
        self.assertTrue(model.training and model[1].training)
        for k, v in model.state_dict(keep_vars=True).items():
            self.assertTrue(torch.equal(v, state[k]), k)
            self.assertEqual(v._version, versions[k], k)
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        self.assertTrue(torch.equal(x, x_before))
        self.assertEqual(x._version, x_version)

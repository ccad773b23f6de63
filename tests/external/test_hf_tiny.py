"""Tiny transformers models export and replay equal to eager (outputs and gradients).

transformers' masking code asks ``torch.compiler.is_exporting()``; without the
exporting state set while tracing it takes data-dependent branches.
"""

import unittest

import predispatch_func as pf
from tests.models.corpus import build
from tests.support.reference import call_targets, export_checked


def bert():
    """The corpus BERT with padding on the second row (exercises the mask path)."""
    model, args, kwargs = build("bert")
    kwargs["attention_mask"][1, -2:] = 0
    return model, args, kwargs


def gpt2():
    return build("gpt2")


class TestTinyTransformers(unittest.TestCase):
    def test_bert_exports_and_verifies(self):
        model, args, kwargs = bert()
        ep = export_checked(model, args, kwargs)
        self.assertIn("gradients", pf.verify(ep, model, args, kwargs).checked)
        self.assertTrue({"aten.linear.default", "aten.layer_norm.default",
                         "aten.scaled_dot_product_attention.default"} <= call_targets(ep))
        self.assertEqual([s.kind.name for s in ep.graph_signature.output_specs], ["USER_OUTPUT"] * 2)

    def test_gpt2_exports_and_verifies(self):
        model, args, kwargs = gpt2()
        ep = export_checked(model, args, kwargs)
        self.assertTrue({"aten.layer_norm.default", "aten.scaled_dot_product_attention.default"}
                        <= call_targets(ep))

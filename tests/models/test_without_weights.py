"""Export without weights: models built on ``meta`` or under FakeTensorMode.

A program exported from a weightless model is the same program: under
FakeTensorMode it runs, once real weights are loaded, exactly like the real
model; on ``meta`` its ops match the real export's. A 7B Llama on ``meta``
exports in a fresh process taking under 768 MiB of resident memory over its imports.
"""

import collections
import json
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import predispatch_func as pf
from tests.models.corpus import CASES, _ids, build

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                      use_cache=False)


def _op_counts(ep):
    """Ops of the program, clones aside: torch's ``aten.dropout`` takes its fused
    path (a clone) on meta but returns the input itself on CPU."""
    return collections.Counter(str(n.target) for n in ep.graph.nodes
                               if n.op == "call_function" and n.target is not torch.ops.aten.clone.default)


def test_model_built_under_fake_mode_runs_with_real_weights_loaded():
    from transformers import GPT2LMHeadModel

    with FakeTensorMode():
        fake_model = GPT2LMHeadModel(_gpt2_config()).eval()
        fake_ids = torch.zeros(2, 8, dtype=torch.long)
    ep = pf.export(fake_model, (fake_ids,))
    assert pf.check_contract(ep).ok
    torch.manual_seed(0)
    real = GPT2LMHeadModel(_gpt2_config()).eval()
    program = ep.module()
    program.load_state_dict(real.state_dict(), assign=True)  # strict: tied names too
    ids = _ids()
    torch.testing.assert_close(program(ids).logits, real(ids).logits)


def test_model_built_on_meta_exports_the_same_ops_as_the_real_model():
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        meta_model = GPT2LMHeadModel(_gpt2_config()).eval()
    meta_ep = pf.export(meta_model, (torch.zeros(2, 8, dtype=torch.long, device="meta"),))
    assert pf.check_contract(meta_ep).ok
    torch.manual_seed(0)
    real_ep = pf.export(GPT2LMHeadModel(_gpt2_config()).eval(), (_ids(),))
    assert _op_counts(meta_ep) == _op_counts(real_ep)
    assert all(v.device.type == "meta" for v in meta_ep.state_dict.values())


@pytest.mark.models
def test_llama_7b_on_meta_exports_in_under_768_mib_over_the_imports():
    out = subprocess.run(
        [sys.executable, os.path.join(_ROOT, "scripts", "export_7b_on_meta.py"), "--json"],
        capture_output=True, text=True, cwd=_ROOT, timeout=600,
        env={**os.environ, "PYTHONPATH": _ROOT, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["parameters"] > 6.5e9 and result["contract_ok"]
    # what the export itself takes: torch's CUDA builds (2.14, 2.15) hold ~900 MiB after import alone
    assert result["peak_rss_mib"] - result["peak_rss_mib_after_imports"] < 768, result


def _tied_names(model: torch.nn.Module) -> list[str]:
    seen: dict[int, str] = {}
    tied = []
    for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        if id(t) in seen:
            tied.append(f"{name}={seen[id(t)]}")
        seen.setdefault(id(t), name)
    return tied


@pytest.mark.models
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_exported_without_weights_takes_its_real_weights(name):
    """Every corpus model (tied embeddings included: GPT-2, T5, BART, Whisper, ...), built on
    ``meta``, given fake CPU weights (``to_empty`` under FakeTensorMode) and exported, runs like the real model once ``load_state_dict(real,
    assign=True)``: strict, so every name of the model's state dict is a name of the
    program's. (A model built on ``meta`` exports too, but ops that take their device from
    an input, ``arange(..., device=x.device)``, then hold ``meta`` in the program.)"""
    real, args, kwargs = build(name)
    with torch.device("meta"):
        weightless, _, _ = build(name)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        weightless.to_empty(device="cpu")  # fake CPU tensors: no memory, no init
    fake_args, fake_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, fake_mode.from_tensor, (args, kwargs))
    ep = pf.export(weightless, fake_args, fake_kwargs)
    program = ep.module()
    program.load_state_dict(real.state_dict(), assign=True)
    # non-persistent buffers (BERT's position_ids) are in no state dict, eager's either
    persistent = real.state_dict()
    for buffer_name, value in real.named_buffers():
        if buffer_name not in persistent:
            owner, _, leaf = buffer_name.rpartition(".")
            program.get_submodule(owner).register_buffer(leaf, value, persistent=False)
    torch.testing.assert_close(program(*args, **kwargs), real(*args, **kwargs))

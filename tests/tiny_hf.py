"""Tiny Hugging Face ``transformers`` models built from configs: random weights, no downloads.

Shared by tests/test_hf_tiny.py and scripts/bench_hf_export.py. Each factory
returns ``(model, args, kwargs)``; models are in eval mode (no dropout), and
GPT-2 runs without a KV cache, so every output is a tensor.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB, SEQ = 64, 7


def _token_inputs() -> tuple[tuple, dict]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, -2:] = 0  # padding on the second row exercises the mask path
    return (ids,), {"attention_mask": mask}


def bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    return (transformers.BertModel(cfg).eval(), *_token_inputs())


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                  use_cache=False, bos_token_id=0, eos_token_id=0)
    return (transformers.GPT2Model(cfg).eval(), *_token_inputs())


def distilbert():
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2,
                                        hidden_dim=32, max_position_embeddings=32)
    return (transformers.DistilBertModel(cfg).eval(), *_token_inputs())


MODELS = {"bert": bert, "gpt2": gpt2, "distilbert": distilbert}

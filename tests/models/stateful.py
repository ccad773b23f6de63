"""Real models that write Python state in ``forward``, built offline from tiny configs.

Each is one of the kinds :mod:`predispatch_func.state.python_state` judges: a memo
cache (levit), a flag guarding a one-time rescale (rwkv), output-capturing hooks
installed on the first call (segformer), values recomputed and stored each call
(funnel, recurrent_gemma). Each factory returns ``(model, args, kwargs)`` in eval mode.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _ids(batch: int = 2, seq: int = 8, vocab: int = 100) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _image(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def levit():
    from transformers import LevitConfig, LevitModel

    cfg = LevitConfig(image_size=64, patch_size=16, hidden_sizes=[16, 24, 32], num_attention_heads=[1, 2, 2],
                      depths=[1, 1, 1], key_dim=[8, 8, 8], drop_path_rate=0,
                      down_ops=[["Subsample", 8, 2, 4, 2, 2], ["Subsample", 8, 3, 4, 2, 2]])
    return LevitModel(cfg), (_image(64),), {}


def rwkv(rescale_every: int = 6):
    from transformers import RwkvConfig, RwkvModel

    cfg = RwkvConfig(vocab_size=100, context_length=16, hidden_size=16, num_hidden_layers=2,
                     attention_hidden_size=16, intermediate_size=32, use_cache=False, rescale_every=rescale_every)
    return RwkvModel(cfg), (_ids(),), {}


def segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                          patch_sizes=[3, 3], strides=[2, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                          classifier_dropout_prob=0.0, drop_path_rate=0.0)
    return SegformerForSemanticSegmentation(cfg), (_image(32),), {}


def funnel():
    from transformers import FunnelConfig, FunnelModel

    cfg = FunnelConfig(vocab_size=100, block_sizes=[1, 1], num_decoder_layers=1, d_model=16, n_head=2, d_head=8,
                       d_inner=32, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                       max_position_embeddings=64)
    return FunnelModel(cfg), (_ids(),), {}


def recurrent_gemma():
    from transformers import RecurrentGemmaConfig, RecurrentGemmaModel

    cfg = RecurrentGemmaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16, lru_width=32,
                               attention_window_size=8, conv1d_width=4, use_cache=False,
                               block_types=["recurrent", "recurrent", "attention"])
    return RecurrentGemmaModel(cfg), (_ids(),), {}


STATEFUL = {"levit": levit, "rwkv": rwkv, "segformer": segformer, "funnel": funnel,
            "recurrent_gemma": recurrent_gemma}


def build(name: str):
    torch.manual_seed(0)
    model, args, kwargs = STATEFUL[name]()
    return model.eval(), args, kwargs

"""Tiny real models from Hugging Face ``transformers`` configs, built offline.

Every case is a :class:`Case`: a name and a factory returning
``(model, args, kwargs)`` with random weights and small synthetic inputs.
Nothing is downloaded (configs are built in code, ``HF_HUB_OFFLINE=1``).
Dropout is 0 everywhere, so train mode replays exactly against the reference.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 100
SEQ = 8
BATCH = 2

_DROPOUT_KEYS = (
    "hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "summary_first_dropout", "dropout", "attention_dropout", "activation_dropout",
    "dropout_rate", "hidden_dropout", "feat_proj_dropout", "final_dropout", "layerdrop",
    "encoder_layerdrop", "decoder_layerdrop", "classifier_dropout", "mask_time_prob",
    "mask_feature_prob", "qa_dropout", "seq_classif_dropout", "projection_dropout",
    "feat_quantizer_dropout", "attention_dropout_prob",
)


def _no_dropout(config: Any) -> Any:
    """Dropout 0 (train mode replays exactly) and no KV cache (outputs are plain tensors)."""
    config.use_cache = False
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    return config


def _ids(batch: int = BATCH, seq: int = SEQ, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _floats(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


Built = tuple[torch.nn.Module, tuple, dict]


class UnderAutocast(torch.nn.Module):
    """``model`` called under ``torch.autocast(device, dtype)``, as a mixed-precision user calls it
    (the CPU and CUDA autocast tests, scripts/export_for_cuda.py)."""

    def __init__(self, model: torch.nn.Module, device: str, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.model, self.device, self.dtype = model, device, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device, dtype=self.dtype):
            return self.model(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Case:
    """One corpus model: ``build()`` gives a fresh model (eval mode) and its inputs."""

    name: str
    build: Callable[[], Built]
    quick: bool = False  # small and fast enough for the default suite
    decoder_llm: bool = False  # takes input_ids of shape (batch, seq) only


def _seeded(make: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        model, args, kwargs = make()
        return model.eval(), args, kwargs
    return build


# --- text encoders ---------------------------------------------------------------


def bert() -> Built:
    from transformers import BertConfig, BertModel

    cfg = _no_dropout(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64,
                                 max_position_embeddings=64))
    ids = _ids()
    return BertModel(cfg), (ids,), {"attention_mask": torch.ones_like(ids)}


def distilbert() -> Built:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = _no_dropout(DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                       hidden_dim=64, max_position_embeddings=64))
    return DistilBertModel(cfg), (_ids(),), {}


def clip_text() -> Built:
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = _no_dropout(CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=32))
    return CLIPTextModel(cfg), (_ids(),), {}


# --- decoder LLMs ----------------------------------------------------------------


def gpt2() -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = _no_dropout(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    return GPT2LMHeadModel(cfg), (_ids(),), {}


def _llama_like(config_cls: Any, model_cls: Any, **extra: Any) -> Built:
    cfg = _no_dropout(config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64, **extra))
    return model_cls(cfg), (_ids(),), {}


def llama() -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    return _llama_like(LlamaConfig, LlamaForCausalLM)


def mistral() -> Built:
    from transformers import MistralConfig, MistralForCausalLM

    return _llama_like(MistralConfig, MistralForCausalLM, sliding_window=4)


def qwen2() -> Built:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _llama_like(Qwen2Config, Qwen2ForCausalLM)


def mixtral() -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    return _llama_like(MixtralConfig, MixtralForCausalLM, num_local_experts=4,
                       num_experts_per_tok=2)


def mamba() -> Built:
    from transformers import MambaConfig, MambaForCausalLM

    cfg = _no_dropout(MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                  num_hidden_layers=2, expand=2, conv_kernel=4))
    return MambaForCausalLM(cfg), (_ids(),), {"use_cache": False}


# --- encoder-decoders ----------------------------------------------------------------


def t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = _no_dropout(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_heads=4, decoder_start_token_id=0))
    return T5ForConditionalGeneration(cfg), (_ids(),), {"decoder_input_ids": _ids(seq=4, seed=1)}


def bart() -> Built:
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = _no_dropout(BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64,
                                 max_position_embeddings=64))
    return BartForConditionalGeneration(cfg), (_ids(),), {"decoder_input_ids": _ids(seq=4, seed=1)}


def whisper() -> Built:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = _no_dropout(WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=32,
                                    encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4,
                                    encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    max_source_positions=16, max_target_positions=32,
                                    decoder_start_token_id=1, pad_token_id=0,
                                    bos_token_id=1, eos_token_id=2, suppress_tokens=None,
                                    begin_suppress_tokens=None))
    features = _floats(BATCH, 16, 32)  # (batch, mel bins, 2 * max_source_positions)
    return (WhisperForConditionalGeneration(cfg), (features,),
            {"decoder_input_ids": _ids(seq=4, seed=1)})


# --- vision and audio -------------------------------------------------------------------


def vit() -> Built:
    from transformers import ViTConfig, ViTModel

    cfg = _no_dropout(ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64))
    return ViTModel(cfg), (_floats(BATCH, 3, 16, 16),), {}


def clip_vision() -> Built:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = _no_dropout(CLIPVisionConfig(image_size=16, patch_size=4, hidden_size=32,
                                       intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4))
    return CLIPVisionModel(cfg), (_floats(BATCH, 3, 16, 16),), {}


def wav2vec2() -> Built:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = _no_dropout(Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                     conv_kernel=(10, 3), num_conv_pos_embeddings=8,
                                     num_conv_pos_embedding_groups=4, apply_spec_augment=False))
    return Wav2Vec2Model(cfg), (_floats(BATCH, 400),), {}


class SmallCNN(torch.nn.Module):
    """Conv + BatchNorm + ReLU + pool + linear: running stats are buffer mutations in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def small_cnn() -> Built:
    return SmallCNN(), (_floats(BATCH, 3, 8, 8),), {}


CASES: dict[str, Case] = {c.name: c for c in (
    Case("small_cnn", _seeded(small_cnn), quick=True),
    Case("bert", _seeded(bert), quick=True),
    Case("distilbert", _seeded(distilbert)),
    Case("gpt2", _seeded(gpt2), quick=True, decoder_llm=True),
    Case("llama", _seeded(llama), decoder_llm=True),
    Case("mistral", _seeded(mistral), decoder_llm=True),
    Case("qwen2", _seeded(qwen2), decoder_llm=True),
    Case("mixtral", _seeded(mixtral), decoder_llm=True),
    Case("mamba", _seeded(mamba)),
    Case("t5", _seeded(t5)),
    Case("bart", _seeded(bart)),
    Case("whisper", _seeded(whisper)),
    Case("vit", _seeded(vit), quick=True),
    Case("clip_text", _seeded(clip_text)),
    Case("clip_vision", _seeded(clip_vision)),
    Case("wav2vec2", _seeded(wav2vec2)),
)}


def build(name: str, *, train: bool = False) -> Built:
    model, args, kwargs = CASES[name].build()
    return model.train(train), args, kwargs

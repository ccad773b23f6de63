"""The third-party model zoo: models nobody here wrote, built offline with random weights.

torchvision and timm models by their registry names (small inputs, 10 classes),
transformers models from tiny configs: our corpus (``corpus.py``), the models that
write Python state in ``forward`` (``stateful.py``) and every further family through
one generic shrink of its default config (``_shrunk``). Each :class:`ZooModel` names
its library and family; ``build()`` returns ``(model, args, kwargs)`` in eval mode
(train mode where ``train`` is set: dropout is 0 there, so replays are exact).

torchvision (and timm, which imports it) load only where a torchvision wheel matches
the torch build; :func:`zoo` lists what this interpreter can build.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Built = tuple[torch.nn.Module, tuple, dict]


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str  # "<library>/<model>", unique
    library: str  # torchvision | timm | transformers
    family: str  # conv | vision-transformer | detection | segmentation | video | optical-flow | encoder | decoder
    #              | encoder-decoder | audio | state-space | moe | vision
    build: Callable[[], Built]
    train: bool = False  # replayed in training mode, gradients compared
    sample: bool = False  # one of the few the default suite runs
    heavy: bool = False  # tens of millions of parameters: minutes per model on a busy machine


def _image(size: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def _seeded(make: Callable[[], Built], train: bool) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        model, args, kwargs = make()
        return model.train(train), args, kwargs
    return build


def transformers_before(version: tuple[int, int]) -> bool:
    """Whether the installed transformers is older than ``version`` (False where none is installed)."""
    try:
        import transformers
    except ImportError:
        return False
    return tuple(int(p) for p in transformers.__version__.split(".")[:2]) < version


def _loads(module: str) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 (a wheel built for another torch fails in many ways)
        return False
    return True


# --- torchvision ------------------------------------------------------------------------

# name: (family, input size); classification models take 10 classes
_TORCHVISION = {
    "resnet18": ("conv", 64), "resnet50": ("conv", 64), "resnext50_32x4d": ("conv", 64),
    "wide_resnet50_2": ("conv", 64), "mobilenet_v2": ("conv", 64), "mobilenet_v3_small": ("conv", 64),
    "mobilenet_v3_large": ("conv", 64), "efficientnet_b0": ("conv", 64), "efficientnet_v2_s": ("conv", 64),
    "squeezenet1_0": ("conv", 64), "squeezenet1_1": ("conv", 64), "shufflenet_v2_x0_5": ("conv", 64),
    "mnasnet0_5": ("conv", 64), "densenet121": ("conv", 64), "googlenet": ("conv", 64),
    "inception_v3": ("conv", 96), "alexnet": ("conv", 64), "vgg11_bn": ("conv", 64),
    "regnet_x_400mf": ("conv", 64), "regnet_y_400mf": ("conv", 64), "convnext_tiny": ("conv", 64),
    "swin_t": ("vision-transformer", 64), "swin_v2_t": ("vision-transformer", 64),
    "vit_b_16": ("vision-transformer", 32), "maxvit_t": ("vision-transformer", 224),
}
_TORCHVISION_KWARGS = {"googlenet": {"aux_logits": False, "init_weights": True},
                       "inception_v3": {"aux_logits": False, "init_weights": True},
                       "vit_b_16": {"image_size": 32}, "maxvit_t": {"input_size": (224, 224)}}  # each stage a multiple of its partition size 7


def _torchvision_classifier(name: str, size: int) -> Callable[[], Built]:
    def make() -> Built:
        import torchvision.models as tvm

        model = tvm.get_model(name, weights=None, num_classes=10, **_TORCHVISION_KWARGS.get(name, {}))
        return model, (_image(size),), {}
    return make


def _torchvision_other() -> list[tuple[str, str, Callable[[], Built]]]:
    import torchvision.models as tvm
    from torchvision.models import detection, optical_flow, segmentation, video

    def clip() -> torch.Tensor:
        return torch.randn(1, 3, 4, 32, 32, generator=torch.Generator().manual_seed(0))
    return [
        ("deeplabv3_mobilenet_v3_large", "segmentation", lambda: (segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3), (_image(64),), {})),
        ("lraspp_mobilenet_v3_large", "segmentation", lambda: (segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3), (_image(64),), {})),
        ("fcn_resnet50", "segmentation", lambda: (segmentation.fcn_resnet50(
            weights=None, weights_backbone=None, num_classes=3), (_image(64),), {})),
        ("r3d_18", "video", lambda: (video.r3d_18(num_classes=10), (clip(),), {})),
        ("mc3_18", "video", lambda: (video.mc3_18(num_classes=10), (clip(),), {})),
        ("r2plus1d_18", "video", lambda: (video.r2plus1d_18(num_classes=10), (clip(),), {})),
        ("raft_small", "optical-flow", lambda: (optical_flow.raft_small(weights=None),
                                                (_image(128, 1), _image(128, 1)), {"num_flow_updates": 2})),
        ("ssdlite320_mobilenet_v3_large", "detection", lambda: (detection.ssdlite320_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3), ([_image(128, 1)[0]],), {})),
        ("fasterrcnn_mobilenet_v3_large_320_fpn", "detection", lambda: (
            detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3),
            ([_image(128, 1)[0]],), {})),
        ("quantized_mobilenet_v2", "conv", lambda: (tvm.quantization.mobilenet_v2(weights=None, quantize=False,
                                                                                   num_classes=10), (_image(64),), {})),
    ]


_HEAVY = {"torchvision/resnet50", "torchvision/resnext50_32x4d", "torchvision/wide_resnet50_2",
          "torchvision/vgg11_bn", "torchvision/alexnet", "torchvision/efficientnet_v2_s", "torchvision/convnext_tiny",
          "torchvision/swin_t", "torchvision/swin_v2_t", "torchvision/vit_b_16", "torchvision/maxvit_t",
          "torchvision/inception_v3", "torchvision/fcn_resnet50", "torchvision/r3d_18", "torchvision/mc3_18",
          "torchvision/r2plus1d_18", "timm/resnet50d", "timm/cspresnet50", "timm/xception41", "timm/mixer_s16_224"}


def _torchvision_zoo() -> list[ZooModel]:
    found = [ZooModel(f"torchvision/{name}", "torchvision", family,
                      _seeded(_torchvision_classifier(name, size), False), sample=name == "mobilenet_v3_small",
                      heavy=f"torchvision/{name}" in _HEAVY)
             for name, (family, size) in _TORCHVISION.items()]
    found += [ZooModel(f"torchvision/{name}", "torchvision", family, _seeded(make, False),
                       heavy=f"torchvision/{name}" in _HEAVY)
              for name, family, make in _torchvision_other()]
    found += [ZooModel(f"torchvision/{name}[train]", "torchvision", "conv",
                       _seeded(_torchvision_classifier(name, 64), True), train=True)
              for name in ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1")]
    return found


# --- timm -------------------------------------------------------------------------------

# name: (family, input size): 64 where the model takes any size, else its own
_TIMM = {
    "resnet10t": ("conv", 64), "resnet18": ("conv", 64), "resnet50d": ("conv", 64), "efficientnet_b0": ("conv", 64),
    "mobilenetv3_small_050": ("conv", 64), "mobilenetv3_large_100": ("conv", 64), "nf_regnet_b0": ("conv", 64),
    "convnext_atto": ("conv", 64), "regnetx_002": ("conv", 64), "regnety_002": ("conv", 64),
    "ghostnet_050": ("conv", 64), "poolformer_s12": ("conv", 64), "edgenext_xx_small": ("conv", 64),
    "dla34": ("conv", 64), "resnest14d": ("conv", 64), "cspresnet50": ("conv", 64), "rexnet_100": ("conv", 64),
    "lcnet_050": ("conv", 64), "tinynet_e": ("conv", 64), "fbnetc_100": ("conv", 64), "mnasnet_050": ("conv", 64),
    "densenet121": ("conv", 64), "dpn48b": ("conv", 64), "xception41": ("conv", 64),
    "hrnet_w18_small": ("conv", 64), "repvit_m1": ("conv", 64), "fastvit_t8": ("conv", 64),
    "levit_128s": ("vision-transformer", 224), "efficientformerv2_s0": ("vision-transformer", 224),
    "vit_tiny_patch16_224": ("vision-transformer", 224), "deit_tiny_patch16_224": ("vision-transformer", 224),
    "mixer_s16_224": ("vision-transformer", 224), "mobilevit_xxs": ("vision-transformer", 64),
    "efficientvit_b0": ("vision-transformer", 64), "tiny_vit_5m_224": ("vision-transformer", 64),
}


def _timm_model(name: str, size: int) -> Callable[[], Built]:
    def make() -> Built:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10), (_image(size),), {}
    return make


def _timm_zoo() -> list[ZooModel]:
    found = [ZooModel(f"timm/{name}", "timm", family, _seeded(_timm_model(name, size), False),
                      sample=name == "resnet10t", heavy=f"timm/{name}" in _HEAVY)
             for name, (family, size) in _TIMM.items()]
    found += [ZooModel(f"timm/{name}[train]", "timm", "conv", _seeded(_timm_model(name, 64), True), train=True)
              for name in ("resnet10t", "efficientnet_b0", "convnext_atto")]
    return found


# --- transformers -----------------------------------------------------------------------

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, vocab_size=100, head_dim=8, d_model=32, encoder_layers=2, decoder_layers=2,
              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
              num_layers=2, n_layer=2, n_head=4, n_embd=32, d_ff=64, num_heads=4, d_kv=8, ffn_dim=64,
              max_position_embeddings=128, n_positions=128, num_experts=4, num_local_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, image_size=32, embedding_size=32)
_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
            "dropout", "attention_dropout", "activation_dropout", "hidden_dropout", "dropout_rate",
            "classifier_dropout", "layerdrop", "mask_time_prob", "mask_feature_prob", "feat_proj_dropout")

# model type: family; each built by one generic shrink of its default config
_TRANSFORMERS = {
    "albert": "encoder", "bert-generation": "encoder", "big_bird": "encoder", "camembert": "encoder",
    "convbert": "encoder", "data2vec-text": "encoder", "deberta": "encoder", "deberta-v2": "encoder",
    "electra": "encoder", "ernie": "encoder", "roberta": "encoder", "xlm-roberta": "encoder",
    "mpnet": "encoder", "roformer": "encoder", "mobilebert": "encoder", "squeezebert": "encoder",
    "nystromformer": "encoder", "rembert": "encoder", "megatron-bert": "encoder",
    "apertus": "decoder", "arcee": "decoder", "biogpt": "decoder", "bitnet": "decoder", "bloom": "decoder",
    "cohere": "decoder", "cohere2": "decoder", "diffllama": "decoder", "doge": "decoder", "falcon": "decoder",
    "gemma": "decoder", "gemma2": "decoder", "gpt_neo": "decoder", "gpt_neox": "decoder", "gptj": "decoder",
    "granite": "decoder", "olmo": "decoder", "olmo2": "decoder", "opt": "decoder", "phi": "decoder",
    "phi3": "decoder", "qwen3": "decoder", "stablelm": "decoder", "starcoder2": "decoder", "helium": "decoder",
    "glm": "decoder", "nemotron": "decoder", "persimmon": "decoder", "xglm": "decoder", "codegen": "decoder",
    "bart": "encoder-decoder", "blenderbot": "encoder-decoder", "blenderbot-small": "encoder-decoder",
    "bigbird_pegasus": "encoder-decoder", "mbart": "encoder-decoder", "pegasus": "encoder-decoder",
    "m2m_100": "encoder-decoder", "marian": "encoder-decoder", "plbart": "encoder-decoder",
    "mt5": "encoder-decoder", "umt5": "encoder-decoder", "longt5": "encoder-decoder",
    "afmoe": "moe", "cohere2_moe": "moe", "qwen2_moe": "moe", "qwen3_moe": "moe", "olmoe": "moe",
    "granitemoe": "moe", "phimoe": "moe", "jetmoe": "moe",
    "mamba2": "state-space", "falcon_mamba": "state-space", "jamba": "state-space",
    "hubert": "audio", "wavlm": "audio", "data2vec-audio": "audio", "sew": "audio", "unispeech": "audio",
    "beit": "vision", "deit": "vision", "dinov2": "vision", "data2vec-vision": "vision", "swin": "vision",
    "convnext": "vision", "poolformer": "vision", "mobilevit": "vision", "regnet": "vision", "resnet": "vision",
}


def _shrunk(model_type: str) -> Callable[[], Built]:
    def make() -> Built:
        from transformers import CONFIG_MAPPING, AutoModel

        config = CONFIG_MAPPING[model_type]()
        known = config.to_dict()
        for key, value in [*_SMALL.items(), *((k, 0.0) for k in _DROPOUT)]:
            if key in known:
                setattr(config, key, value)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id"):
            if isinstance(getattr(config, key, None), int) and getattr(config, key) >= 100:
                setattr(config, key, 1)
        config.use_cache = False
        model = AutoModel.from_config(config)
        return model, (), _inputs(model)
    return make


def _inputs(model: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    main = model.main_input_name
    if main == "pixel_values":
        config = model.config
        size = config.image_size if isinstance(config.image_size, int) else 32
        return {main: torch.randn(2, getattr(config, "num_channels", 3), size, size, generator=generator)}
    if main == "input_values":
        return {main: torch.randn(2, 1600, generator=generator)}
    inputs = {"input_ids": torch.randint(1, 100, (2, 8), generator=generator)}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = torch.randint(1, 100, (2, 8), generator=generator)
    return inputs


def _transformers_zoo() -> list[ZooModel]:
    from tests.models import corpus, stateful

    corpus_families = {"bert": "encoder", "distilbert": "encoder", "clip_text": "encoder", "gpt2": "decoder",
                       "llama": "decoder", "mistral": "decoder", "qwen2": "decoder", "mixtral": "moe",
                       "mamba": "state-space", "t5": "encoder-decoder", "bart": "encoder-decoder",
                       "whisper": "audio", "vit": "vision", "clip_vision": "vision", "wav2vec2": "audio"}
    found = [ZooModel(f"transformers/{name}", "transformers", family,
                      lambda name=name: corpus.build(name), sample=name == "bert")
             for name, family in corpus_families.items()]
    found += [ZooModel(f"transformers/{name}[train]", "transformers", family,
                       lambda name=name: corpus.build(name, train=True), train=True)
              for name, family in (("bert", "encoder"), ("llama", "decoder"), ("t5", "encoder-decoder"))]
    stateful_families = {"levit": "vision", "rwkv": "state-space", "segformer": "vision", "funnel": "encoder",
                         "recurrent_gemma": "state-space"}
    found += [ZooModel(f"transformers/{name}", "transformers", family, lambda name=name: stateful.build(name))
              for name, family in stateful_families.items()]
    found += [ZooModel(f"transformers/{model_type}", "transformers", family, _seeded(_shrunk(model_type), False))
              for model_type, family in _TRANSFORMERS.items() if f"transformers/{model_type}" not in
              {m.name for m in found}]
    return found


def zoo() -> list[ZooModel]:
    """Every zoo model this interpreter's packages can build (torchvision and timm need torchvision)."""
    found = _transformers_zoo() if _loads("transformers") else []
    if _loads("torchvision"):
        found += _torchvision_zoo()
        if _loads("timm"):
            found += _timm_zoo()
    return found


def sample() -> list[ZooModel]:
    return [m for m in zoo() if m.sample]

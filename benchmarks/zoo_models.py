"""A zoo of Hugging Face architectures from tiny configs, as ckpt-plan model files (issue 27).

Each :class:`ZooModel` builds its model from the ``transformers`` config class with the
config's defaults as users ship them (``use_cache`` at its default, the default attention and
expert implementations, dropout as the config has it) and only the size fields made small: 2
layers, width 64, a vocabulary of 1000, 4 heads, 4 experts with 2 active per token. Where a
default token id would not fit the small vocabulary (Phi-3's pad token is 32000) it is moved
into it, and where a default layer pattern needs more than 2 layers to show its kinds
(Jamba's attention layer every 8th, DeepSeek-V3's first 3 layers dense) the pattern is set so
that the 2 layers hold both kinds. Random weights, nothing downloaded.

The batch is a dict with ``labels``, so the model's ``output.loss`` is the loss:

* decoder language models: ``input_ids`` and ``labels`` (a copy: the model shifts them), 4 x
  64 tokens;
* masked language models: ``input_ids`` and ``labels`` holding the token at 15% of the
  positions and -100 (ignored) at the others, 4 x 64 tokens;
* encoder-decoders: ``input_ids`` (4 x 64) and ``labels`` (4 x 32; the model shifts them
  right into its decoder inputs);
* image classifiers: ``pixel_values`` (4 x 3 x 32 x 32) and a class per image.

Nothing here imports ``planner``: :func:`write_model_file` writes the two-function model file
(``build_model()``, ``sample_batch()``) every ckpt-plan stage loads, importing this module
by its absolute path, so a checking process started elsewhere builds the same model.

    from benchmarks.zoo_models import ZOO, write_model_file
    path = write_model_file(ZOO["llama"], folder)   # then: ckpt-plan profile PATH --budget ...
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ZOO", "ZooModel", "sample_batch", "write_model_file"]

VOCAB_SIZE = 1000
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS  # 16
NUM_EXPERTS, EXPERTS_PER_TOKEN, EXPERT_SIZE = 4, 2, 32
MAX_POSITIONS = 128
BATCH_SIZE, SEQ_LEN, TARGET_LEN = 4, 64, 32
IMAGE_SIZE, NUM_CLASSES = 32, 10
MASKED_FRACTION = 0.15


@dataclass(frozen=True)
class ZooModel:
    """One architecture: its name, its family (``decoder``, ``moe``, ``state-space``,
    ``encoder``, ``encoder-decoder``, ``vision``), the config and model classes (names in
    ``transformers``), the config's arguments (size fields only, see the module docstring)
    and the batch it trains on (``causal-lm``, ``masked-lm``, ``seq2seq``, ``image``)."""

    name: str
    family: str
    config_class: str
    model_class: str
    config_arguments: tuple[tuple[str, Any], ...]
    batch_kind: str

    def build_model(self) -> Any:
        """The model, random weights from torch's global RNG (the caller seeds it)."""
        transformers = importlib.import_module("transformers")
        config = getattr(transformers, self.config_class)(**dict(self.config_arguments))
        return getattr(transformers, self.model_class)(config)

    def sample_batch(self) -> dict[str, Any]:
        """One training batch (module docstring), from torch's global RNG."""
        return sample_batch(self.batch_kind)


def sample_batch(
    batch_kind: str, image_shape: tuple[int, int, int] = (3, IMAGE_SIZE, IMAGE_SIZE)
) -> dict[str, Any]:
    """One training batch of ``batch_kind`` (module docstring), from torch's global RNG;
    images of ``image_shape`` (channels, height, width)."""
    import torch

    if batch_kind == "image":
        pixel_values = torch.randn(BATCH_SIZE, *image_shape)  # (B, C, H, W)
        labels = torch.randint(0, NUM_CLASSES, (BATCH_SIZE,))
        return {"pixel_values": pixel_values, "labels": labels}
    # Ids from 4 up: the small ids are the configs' special tokens (pad, bos, eos, ...).
    input_ids = torch.randint(4, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))  # (B, T)
    if batch_kind == "causal-lm":
        return {"input_ids": input_ids, "labels": input_ids.clone()}
    if batch_kind == "masked-lm":
        masked = torch.rand(BATCH_SIZE, SEQ_LEN) < MASKED_FRACTION
        labels = torch.where(masked, input_ids, torch.full_like(input_ids, -100))
        return {"input_ids": input_ids, "labels": labels}
    if batch_kind == "seq2seq":
        labels = torch.randint(4, VOCAB_SIZE, (BATCH_SIZE, TARGET_LEN))  # (B, T')
        return {"input_ids": input_ids, "labels": labels}
    raise ValueError(f"unknown batch kind {batch_kind!r}")


def _model(
    name: str, family: str, config_class: str, model_class: str, batch_kind: str, **arguments: Any
) -> ZooModel:
    return ZooModel(name, family, config_class, model_class, tuple(arguments.items()), batch_kind)


# The decoder size fields most configs name alike.
_DECODER = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": INTERMEDIATE_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_KV_HEADS,
    "max_position_embeddings": MAX_POSITIONS,
}
# Configs whose default head width is not hidden / heads (Gemma's 256, Qwen3's 128).
_HEAD_DIM = {"head_dim": HEAD_DIM}
_ENCODER = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": INTERMEDIATE_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "max_position_embeddings": MAX_POSITIONS,
}

_ZOO = [
    # -- decoders ------------------------------------------------------------------------
    _model(
        "gpt2",
        "decoder",
        "GPT2Config",
        "GPT2LMHeadModel",
        "causal-lm",
        vocab_size=VOCAB_SIZE,
        n_embd=HIDDEN_SIZE,
        n_layer=NUM_LAYERS,
        n_head=NUM_HEADS,
        n_positions=MAX_POSITIONS,
    ),
    _model(
        "gpt_neox",
        "decoder",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        "causal-lm",
        **{key: value for key, value in _DECODER.items() if key != "num_key_value_heads"},
    ),
    _model("llama", "decoder", "LlamaConfig", "LlamaForCausalLM", "causal-lm", **_DECODER),
    _model("mistral", "decoder", "MistralConfig", "MistralForCausalLM", "causal-lm", **_DECODER),
    _model("qwen2", "decoder", "Qwen2Config", "Qwen2ForCausalLM", "causal-lm", **_DECODER),
    _model(
        "qwen3", "decoder", "Qwen3Config", "Qwen3ForCausalLM", "causal-lm", **_DECODER, **_HEAD_DIM
    ),
    _model(
        "gemma", "decoder", "GemmaConfig", "GemmaForCausalLM", "causal-lm", **_DECODER, **_HEAD_DIM
    ),
    _model(
        "gemma2",
        "decoder",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "causal-lm",
        **_DECODER,
        **_HEAD_DIM,
        query_pre_attn_scalar=HEAD_DIM,  # the default 256 is Gemma-2's head width
    ),
    _model(
        "gemma3_text",
        "decoder",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "causal-lm",
        **_DECODER,
        **_HEAD_DIM,
        query_pre_attn_scalar=HEAD_DIM,
    ),
    _model(
        "phi3",
        "decoder",
        "Phi3Config",
        "Phi3ForCausalLM",
        "causal-lm",
        **_DECODER,
        original_max_position_embeddings=MAX_POSITIONS,
        # The defaults (32000) are outside a 1000-token vocabulary.
        pad_token_id=0,
        eos_token_id=2,
    ),
    _model("olmo2", "decoder", "Olmo2Config", "Olmo2ForCausalLM", "causal-lm", **_DECODER),
    # -- mixtures of experts ---------------------------------------------------------------
    _model(
        "mixtral",
        "moe",
        "MixtralConfig",
        "MixtralForCausalLM",
        "causal-lm",
        **{**_DECODER, "intermediate_size": EXPERT_SIZE},
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
    ),
    _model(
        "qwen3_moe",
        "moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        "causal-lm",
        **_DECODER,
        **_HEAD_DIM,
        moe_intermediate_size=EXPERT_SIZE,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
    ),
    _model(
        "olmoe",
        "moe",
        "OlmoeConfig",
        "OlmoeForCausalLM",
        "causal-lm",
        **{**_DECODER, "intermediate_size": EXPERT_SIZE},
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
    ),
    _model(
        "gpt_oss",
        "moe",
        "GptOssConfig",
        "GptOssForCausalLM",
        "causal-lm",
        **{**_DECODER, "intermediate_size": EXPERT_SIZE},
        **_HEAD_DIM,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
    ),
    _model(
        "deepseek_v3",
        "moe",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        "causal-lm",
        # Multi-head latent attention: as many key/value heads as query heads (its default).
        **{**_DECODER, "num_key_value_heads": NUM_HEADS},
        moe_intermediate_size=EXPERT_SIZE,
        n_routed_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        n_group=1,  # expert groups: the default 8 needs at least 8 experts
        topk_group=1,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 experts (the default 3 dense)
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
    ),
    # -- state space and hybrid -----------------------------------------------------------
    _model(
        "mamba",
        "state-space",
        "MambaConfig",
        "MambaForCausalLM",
        "causal-lm",
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
    ),
    _model(
        "jamba",
        "state-space",
        "JambaConfig",
        "JambaForCausalLM",
        "causal-lm",
        **{**_DECODER, "intermediate_size": EXPERT_SIZE},
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        attn_layer_period=2,  # layer 0 Mamba, layer 1 attention (the default: every 8th)
        attn_layer_offset=1,
    ),
    # -- encoders (masked language models) ----------------------------------------------------
    _model("bert", "encoder", "BertConfig", "BertForMaskedLM", "masked-lm", **_ENCODER),
    _model(
        "modernbert",
        "encoder",
        "ModernBertConfig",
        "ModernBertForMaskedLM",
        "masked-lm",
        **_ENCODER,
        # The defaults (50281-50283) are outside a 1000-token vocabulary.
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
    # -- encoder-decoders --------------------------------------------------------------------
    _model(
        "t5",
        "encoder-decoder",
        "T5Config",
        "T5ForConditionalGeneration",
        "seq2seq",
        vocab_size=VOCAB_SIZE,
        d_model=HIDDEN_SIZE,
        d_kv=HEAD_DIM,
        d_ff=INTERMEDIATE_SIZE,
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        decoder_start_token_id=0,  # T5's is its pad token (not in the config's defaults)
    ),
    _model(
        "bart",
        "encoder-decoder",
        "BartConfig",
        "BartForConditionalGeneration",
        "seq2seq",
        vocab_size=VOCAB_SIZE,
        d_model=HIDDEN_SIZE,
        encoder_layers=NUM_LAYERS,
        decoder_layers=NUM_LAYERS,
        encoder_attention_heads=NUM_HEADS,
        decoder_attention_heads=NUM_HEADS,
        encoder_ffn_dim=INTERMEDIATE_SIZE,
        decoder_ffn_dim=INTERMEDIATE_SIZE,
        max_position_embeddings=MAX_POSITIONS,
    ),
    # -- vision ------------------------------------------------------------------------------
    _model(
        "vit",
        "vision",
        "ViTConfig",
        "ViTForImageClassification",
        "image",
        image_size=IMAGE_SIZE,
        patch_size=4,  # (32 / 4)^2 = 64 patches + 1 class token
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        intermediate_size=INTERMEDIATE_SIZE,
        num_labels=NUM_CLASSES,
    ),
    _model(
        "convnext",
        "vision",
        "ConvNextConfig",
        "ConvNextForImageClassification",
        "image",
        image_size=IMAGE_SIZE,
        hidden_sizes=[16, 32, 48, HIDDEN_SIZE],  # 4 stages: 8x8, 4x4, 2x2, 1x1 pixels
        depths=[NUM_LAYERS] * 4,
        num_labels=NUM_CLASSES,
    ),
]

ZOO: dict[str, ZooModel] = {model.name: model for model in _ZOO}
"""Every architecture, by name, in the order above (decoders first, vision last)."""

_MODEL_FILE = '''"""ckpt-plan zoo: {name} ({config_class} -> {model_class}), written by
benchmarks/zoo_models.py; the config is that file's."""
import sys

sys.path.insert(0, {root!r})
from benchmarks.zoo_models import ZOO  # noqa: E402

_MODEL = ZOO[{name!r}]


def build_model():
    return _MODEL.build_model()


def sample_batch():
    return _MODEL.sample_batch()
'''


def write_model_file(model: ZooModel, folder: Path) -> Path:
    """Write ``folder/zoo_NAME.py``, a model file building ``model`` and its batch."""
    root = str(Path(__file__).resolve().parent.parent)
    path = Path(folder) / f"zoo_{model.name}.py"
    path.write_text(
        _MODEL_FILE.format(
            name=model.name,
            config_class=model.config_class,
            model_class=model.model_class,
            root=root,
        ),
        encoding="utf-8",
    )
    return path
